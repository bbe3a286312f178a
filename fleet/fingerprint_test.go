package fleet_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestFingerprintRefusals: daemons A and B serve model m1 with 64-token
// pages; C serves m2 with 32-token pages. Each publishes its fingerprint
// (its record, WatchCapacity). A prefill whose layout no daemon accepts is
// refused at registration naming the differences on every daemon; one that
// A and B accept, registered through C, is refused naming A and B; GetFleet
// says which fingerprints each instance can hand off to; C refuses the
// heartbeat of an instance it could not take, saying why.
func TestFingerprintRefusals(t *testing.T) {
	e := etcdtest.Start(t)
	m1 := func(c *config.Config) { c.Model.Name, c.Model.Revision = "m1", "r1" }
	a := startMemberWith(t, e, "10.9.0.1:7600", 30*time.Second, m1)
	startMemberWith(t, e, "10.9.0.2:7600", 30*time.Second, m1)
	c := startMemberWith(t, e, "10.9.0.3:7600", 30*time.Second, func(c *config.Config) { c.Model.Name, c.KVPool.PageSize = "m2", 32 })
	ctx := ctxFor(t, 30*time.Second)
	waitFor(t, "every daemon in A's view with its fingerprint", func() bool {
		f, _ := a.Fleet().GetFleet(ctx)
		n := 0
		for _, d := range f.GetDaemons() {
			if d.GetFingerprint().GetDigest() != "" {
				n++
			}
		}
		return n == 3
	})

	// No daemon accepts 16-token pages of model m3: refused through A,
	// naming A's own differences (SGLang's page size message first) and
	// each other daemon's.
	bad := rank("p-bad")
	bad.BootstrapAddr, bad.PageSize, bad.Model = "10.0.0.9:8998", 16, &pb.ModelFacts{ModelName: "m3"}
	_, err := a.c.Prefill(bad).Register(ctx)
	if !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("a layout no daemon accepts: %v; want FAILED_PRECONDITION", err)
	}
	for _, want := range []string{
		"Page size mismatch: prefill server has page_size=16, but decode server has page_size=64.",
		`model_name "m3" (decode: "m1")`,
		"no other live decode daemon of this fleet accepts it either: 10.9.0.2:7600: Page size mismatch: prefill server has page_size=16, but decode server has page_size=64.",
		` | 10.9.0.3:7600: Page size mismatch: prefill server has page_size=16, but decode server has page_size=32.`,
		`model_name "m3" (decode: "m2")`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal lacks %q:\n%v", want, err)
		}
	}

	// A and B accept a 64-token m1 prefill; through C it is refused naming them.
	good := rank("p1")
	good.Model = &pb.ModelFacts{ModelName: "m1", ModelRevision: "r1"}
	_, err = c.c.Prefill(good).Register(ctx)
	if !errors.Is(err, client.ErrFailedPrecondition) || !strings.Contains(err.Error(), "page_size=64, but decode server has page_size=32") ||
		!strings.Contains(err.Error(), "decode daemons of this fleet that accept this prefill: 10.9.0.1:7600, 10.9.0.2:7600 (register through one of them)") {
		t.Fatalf("registration through C: %v; want FAILED_PRECONDITION naming A and B", err)
	}
	// Another revision of m1 is refused by A and B too.
	rev := rank("p-rev")
	rev.BootstrapAddr, rev.Model = "10.0.0.8:8998", &pb.ModelFacts{ModelName: "m1", ModelRevision: "r0"}
	if _, err := a.c.Prefill(rev).Register(ctx); !errors.Is(err, client.ErrFailedPrecondition) || !strings.Contains(err.Error(), `model_revision "r0" (decode: "r1")`) {
		t.Fatalf("another revision: %v", err)
	}

	if _, err := a.c.Prefill(good).Register(ctx); err != nil {
		t.Fatal(err)
	}
	var fa *pb.GetFleetResponse
	waitFor(t, "C sees the registration", func() bool {
		f, _ := c.Fleet().GetFleet(ctx)
		return len(f.GetPrefills()) == 1
	})
	fa, err = a.c.Admin().GetFleet(ctx)
	if err != nil || len(fa.GetPrefills()) != 1 {
		t.Fatalf("GetFleet: %v %v", fa, err)
	}
	digest := map[string]string{}
	for _, d := range fa.GetDaemons() {
		digest[d.GetAddress()] = d.GetFingerprint().GetDigest()
	}
	if digest["10.9.0.1:7600"] != digest["10.9.0.2:7600"] || digest["10.9.0.1:7600"] == digest["10.9.0.3:7600"] {
		t.Fatalf("digests %v: A and B share one, C has another", digest)
	}
	p := fa.GetPrefills()[0]
	if got := p.GetHandOffDigests(); len(got) != 1 || got[0] != digest["10.9.0.1:7600"] {
		t.Errorf("hand_off_digests %v; want A's and B's %s", got, digest["10.9.0.1:7600"])
	}
	if r := p.GetRefused(); len(r) != 1 || r[0].GetDigest() != digest["10.9.0.3:7600"] || !strings.Contains(r[0].GetDifferences(), "page_size=32") {
		t.Errorf("refused %v; want C's digest with the page size", r)
	}

	// C knows the instance from the fleet but cannot take it: its ranks'
	// heartbeat (and session hello) there says why, not "not registered".
	if _, err := c.c.Prefill(good).Heartbeat(ctx); !errors.Is(err, client.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "registered in the fleet through 10.9.0.1:7600 is not accepted by this decode daemon") {
		t.Fatalf("heartbeat on C: %v; want FAILED_PRECONDITION saying why", err)
	}

	// Routers read the fingerprint in every capacity update.
	s, err := c.c.Admin().WatchCapacity(ctx, client.CapacityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if f := u.GetFingerprint(); f.GetPageSize() != 32 || f.GetModelName() != "m2" || f.GetDigest() != digest["10.9.0.3:7600"] || f.GetKvCacheDtype() != "bf16" ||
		f.GetKvPoolKind() != "gqa" || f.GetNumLayers() != 32 || f.GetTotalKvHeads() != 8 || f.GetHeadDim() != 128 || f.GetPageOwner() != "daemon" {
		t.Fatalf("C's capacity fingerprint = %v", f)
	}
}
