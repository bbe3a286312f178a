package fleet

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestParseFingerprint: a daemon record's fingerprint is used only when it
// keeps its bounds and its digest is its fields'; a record without one has
// none.
func TestParseFingerprint(t *testing.T) {
	c := kvlayout.DefaultConfig()
	c.Model.Name = "m1"
	f := c.Layout().Fingerprint()
	wire := func(mod func(*pb.Fingerprint)) []byte {
		w := &pb.Fingerprint{PageSize: uint32(f.PageSize), KvCacheDtype: f.DType, KvPoolKind: f.Kind.String(), NumLayers: uint32(f.NumLayers),
			TotalKvHeads: uint32(f.TotalKVHeads), HeadDim: uint32(f.HeadDim), PageOwner: f.Owner.String(), ModelName: f.ModelName, Digest: f.Digest()}
		if mod != nil {
			mod(w)
		}
		b, err := protojson.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	got, err := parseFingerprint(wire(nil))
	if err != nil || got == nil || got.fp != f || got.wire.GetDigest() != f.Digest() {
		t.Fatalf("parseFingerprint(a good one) = %+v, %v; want %+v", got, err, f)
	}
	if got, err := parseFingerprint(nil); got != nil || err != nil {
		t.Fatalf("parseFingerprint(none) = %v, %v; want none", got, err)
	}
	for name, tc := range map[string]struct {
		raw  []byte
		want string
	}{
		"another digest":      {wire(func(w *pb.Fingerprint) { w.Digest = "0000000000000000" }), "is not its fields'"},
		"a field changed":     {wire(func(w *pb.Fingerprint) { w.PageSize = 32 }), "is not its fields'"},
		"out of bounds":       {wire(func(w *pb.Fingerprint) { w.KvPoolKind = "paged" }), "kv_pool_kind"},
		"not protobuf JSON":   {[]byte(`{"page_size": "many"}`), "invalid value"},
		"an unknown field ok": {[]byte(strings.Replace(string(wire(nil)), "{", `{"futureField":1,`, 1)), ""},
	} {
		got, err := parseFingerprint(tc.raw)
		switch {
		case tc.want == "" && (err != nil || got == nil):
			t.Errorf("%s: parseFingerprint = %v, %v; want it accepted", name, got, err)
		case tc.want != "" && (got != nil || err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: parseFingerprint = %v, %v; want an error containing %q", name, got, err, tc.want)
		}
	}
}
