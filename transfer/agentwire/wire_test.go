package agentwire

import (
	"fmt"
	"strings"
	"testing"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// TestBufferKindMappingCoversEveryValue walks every kvcopy buffer kind and
// every wire BufferKind: each maps to the other side, back to itself and
// under the same name; an undefined value maps to UNSPECIFIED.
func TestBufferKindMappingCoversEveryValue(t *testing.T) {
	named := 0
	for v := -4; v < 256; v++ {
		k := kvcopy.BufferKind(v)
		w := BufferKindToProto(k)
		if k.String() == fmt.Sprintf("BufferKind(%d)", v) {
			if w != transferv1.BufferKind_BUFFER_KIND_UNSPECIFIED {
				t.Errorf("undefined kind %d maps to %v, want UNSPECIFIED", v, w)
			}
			continue
		}
		named++
		wn, ok := transferv1.BufferKind_name[int32(w)]
		if !ok {
			t.Errorf("kind %v (%d) maps to wire %d, which the wire does not define", k, v, w)
			continue
		}
		if got := strings.ToLower(strings.TrimPrefix(wn, "BUFFER_KIND_")); got != k.String() {
			t.Errorf("kind %v (%d) maps to wire %s: the names disagree", k, v, wn)
		}
		if back := BufferKindFromProto(w); back != k {
			t.Errorf("kind %v → %s → %v, want it back", k, wn, back)
		}
	}
	if named != len(transferv1.BufferKind_name) {
		t.Errorf("kvcopy names %d buffer kinds, the wire %d", named, len(transferv1.BufferKind_name))
	}
	for w, wn := range transferv1.BufferKind_name {
		k := BufferKindFromProto(transferv1.BufferKind(w))
		if got := BufferKindToProto(k); int32(got) != w {
			t.Errorf("wire %s → %v → %v, want it back", wn, k, got)
		}
	}
	if got := BufferKindFromProto(99); got != kvcopy.KindUnspecified {
		t.Errorf("BufferKindFromProto(99) = %v, want unspecified", got)
	}
}
