package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestFleet: against a real daemon (memory registry), decodectl fleet
// prints the registry line, the daemon itself and the prefill instance
// registered with it, column by column.
func TestFleet(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "fleet")
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "Registry: memory, ok since ") || !strings.HasSuffix(lines[0], " ago)") {
		t.Errorf("registry line = %q, want \"Registry: memory, ok since <start> (<age> ago)\"", lines[0])
	}
	for _, want := range []string{
		"\nDAEMON" + strings.Repeat(" ", len(d.addr)-len("DAEMON")+2) + "SELF  INCARNATION",
		"\nPREFILL        INSTANCE" + strings.Repeat(" ", len("prefill-"+prefillA)-len("INSTANCE")+2) + "RANKS  TP/DP/PP/CP  LIVENESS   LEASE  HEARD HERE",
		"  REGISTERED VIA\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("fleet output lacks %q:\n%s", want, out)
		}
	}
	if got, want := rowOf(out, "DAEMON"), []string{"DAEMON", "SELF", "INCARNATION", "READY", "VERSION", "TOKENS", "FREE/TOTAL", "QUEUE", "FINGERPRINT"}; !cmp.Equal(got, want) {
		t.Errorf("daemons header: %s\n%s", cmp.Diff(want, got), out)
	}
	// The daemon's own capacity, read now: free ≤ total tokens, and the
	// queue holds prefill B's room, which waits for a registration.
	row := rowOf(out, d.addr)
	if got, want := row[:min(len(row), 6)], []string{d.addr, "yes", fmt.Sprintf("%x", d.Incarnation()), "yes", "(serving)", "test-1.2.3"}; !cmp.Equal(got, want) {
		t.Errorf("daemon row: %s\n%s", cmp.Diff(want, got), out)
	}
	var free, total, queue int
	if len(row) != 9 || len(row[8]) != 16 {
		t.Fatalf("daemon row %q: want 9 fields, the last its 16-digit fingerprint digest", row)
	}
	if n, err := fmt.Sscanf(row[6]+" "+row[7], "%d/%d %d", &free, &total, &queue); n != 3 || err != nil || free > total || total == 0 || queue != 1 {
		t.Errorf("tokens %q queue %q: want free/total with free <= total and a queue of 1 (%v)\n%s", row[6], row[7], err, out)
	}
	p := rowOf(out, prefillA)
	if len(p) != 9 || p[7] != "ago" {
		t.Fatalf("prefill row = %q, want 9 fields with the age of its last heartbeat", p)
	}
	if _, err := time.ParseDuration(p[6]); err != nil {
		t.Errorf("heard here %q is not an age: %v", p[6], err)
	}
	if got, want := append(p[:6:6], p[8]), []string{prefillA, "prefill-" + prefillA, "1/1", "1/1/1/1", "heartbeat", "-", d.addr}; !cmp.Equal(got, want) {
		t.Errorf("prefill row: %s\n%s", cmp.Diff(want, got), out)
	}
	// The one daemon took the one prefill's registration: it can hand off to it.
	if want := "\nHand-offs:\n" + prefillA + " can hand off to " + d.addr + "\n"; !strings.HasSuffix(out, want) {
		t.Errorf("fleet output does not end with %q:\n%s", want, out)
	}
	// Prefill B has rooms waiting but never registered: not in the registry.
	if rowOf(out, prefillB) != nil {
		t.Errorf("fleet lists %s, which never registered:\n%s", prefillB, out)
	}
}

// TestFleetToken: Fleet.GetFleet needs the token when the daemon has one.
func TestFleetToken(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{token: "s3cret"})
	r := d.ctl("fleet")
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "decodectl: fleet: Unauthenticated: ") ||
		!strings.Contains(r.stderr, "pass --token or set DECODEPLANE_TOKEN") {
		t.Errorf("fleet without the token: %v", r)
	}
	if out := d.mustCtl(t, "fleet", "--token", "s3cret"); !strings.Contains(out, "No prefill instances in the registry.\n") || rowOf(out, d.addr) == nil {
		t.Errorf("fleet with the token:\n%s", out)
	}
}

// TestWriteFleet: an etcd registry's answer (which a memory daemon cannot
// give): the degraded state with its reason and the view's revision,
// capacity summed over shards, leases, a prefill not heard here, the
// truncation note.
func TestWriteFleet(t *testing.T) {
	f := &pb.GetFleetResponse{
		Registry: &pb.RegistryState{Backend: "etcd", State: "degraded", Reason: "etcd unreachable", Since: ts(-90 * time.Second),
			Revision: 4711, Prefix: "/decodeplane/", LeaseTtl: durationpb.New(15 * time.Second)},
		Daemons: []*pb.FleetDaemon{
			{Address: "decode-0:7600", Incarnation: 0xbeef, Self: true, Version: "v1", Capacity: &pb.CapacityUpdate{Ready: true, Readiness: "serving", Shards: []*pb.ShardCapacity{
				{TokensFree: 1000, TokensTotal: 4096, QueueDepth: 2}, {TokensFree: 24, TokensTotal: 4096, QueueDepth: 1},
			}}, Fingerprint: &pb.Fingerprint{Digest: "0778297221776bc7"}},
			{Address: "decode-1:7600", Incarnation: 0xf00d, Version: "v1", Fingerprint: &pb.Fingerprint{Digest: "0778297221776bc7"}},
			{Address: "decode-2:7600", Incarnation: 0xfeed, Version: "v1", Fingerprint: &pb.Fingerprint{Digest: "a0a0a0a0a0a0a0a0"}},
			{Address: "decode-3:7600", Incarnation: 0xface, Version: "v0"},
		},
		Prefills: []*pb.FleetPrefill{
			{BootstrapAddr: "10.0.0.1:8998", InstanceId: "p-1", RegisteredRanks: 2, ExpectedRanks: 4, AttnTpSize: 2, DpSize: 2, PpSize: 1, AttnCpSize: 1,
				Liveness: "lease", LeaseId: 0x694d, HeardHere: ts(-3 * time.Second), RegisteredVia: "decode-1:7600",
				HandOffDigests: []string{"0778297221776bc7"}, Refused: []*pb.FleetRefusal{{Digest: "a0a0a0a0a0a0a0a0", Differences: "Page size mismatch: ..."}}},
			{BootstrapAddr: "10.0.0.2:8998", RegisteredRanks: 1, ExpectedRanks: 1, AttnTpSize: 1, DpSize: 1, PpSize: 1, AttnCpSize: 1, Liveness: "lease", LeaseId: 7, RegisteredVia: "decode-0:7600",
				Refused: []*pb.FleetRefusal{{Digest: "0778297221776bc7", Differences: "KV cache dtype mismatch: ..."}, {Digest: "a0a0a0a0a0a0a0a0", Differences: "the prefill's model does not match ..."}}},
		},
		Truncated: true,
	}
	var b strings.Builder
	if err := writeFleet(&b, f, t0); err != nil {
		t.Fatal(err)
	}
	want := "Registry: etcd, degraded: etcd unreachable since " + timestamp(ts(-90*time.Second)) + " (1m30s ago); revision 4711, prefix /decodeplane/, lease ttl 15s\n" + `
DAEMON         SELF  INCARNATION  READY          VERSION  TOKENS FREE/TOTAL  QUEUE  FINGERPRINT
decode-0:7600  yes   beef         yes (serving)  v1       1024/8192          3      0778297221776bc7
decode-1:7600  no    f00d         -              v1       -                  -      0778297221776bc7
decode-2:7600  no    feed         -              v1       -                  -      a0a0a0a0a0a0a0a0
decode-3:7600  no    face         -              v0       -                  -      -

PREFILL        INSTANCE  RANKS  TP/DP/PP/CP  LIVENESS  LEASE  HEARD HERE  REGISTERED VIA
10.0.0.1:8998  p-1       2/4    2/2/1/1      lease     694d   3.0s ago    decode-1:7600
10.0.0.2:8998  -         1/1    1/1/1/1      lease     7      -           decode-0:7600

Hand-offs:
10.0.0.1:8998 can hand off to decode-0:7600, decode-1:7600
10.0.0.1:8998 cannot hand off to decode-2:7600: Page size mismatch: ...
10.0.0.2:8998 can hand off to no daemon of the fleet
10.0.0.2:8998 cannot hand off to decode-0:7600, decode-1:7600: KV cache dtype mismatch: ...
10.0.0.2:8998 cannot hand off to decode-2:7600: the prefill's model does not match ...
(truncated: the daemon lists at most 10000 daemons and 10000 prefill instances)
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("writeFleet (-want +got):\n%s", diff)
	}
	b.Reset()
	if err := writeFleet(&b, &pb.GetFleetResponse{}, t0); err != nil {
		t.Fatal(err)
	}
	if want := "Registry: - (the daemon did not say)\n\nNo decode daemons in the registry.\n\nNo prefill instances in the registry.\n"; b.String() != want {
		t.Errorf("writeFleet of an empty answer = %q, want %q", b.String(), want)
	}
}
