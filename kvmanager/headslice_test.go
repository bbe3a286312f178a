package kvmanager_test

import (
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/kvmanager/staging"
)

// TestStagingHeadSlicesMatchMapping: the staging plan's writers carry the
// head slices of transfer.ComputeHeadSliceParams, the formula the registry
// plans destinations with; every
// writer slice it plans must be the registry's for the same pair.
func TestStagingHeadSlicesMatchMapping(t *testing.T) {
	tps := []int{1, 2, 3, 4, 8, 16}
	checked := 0
	for _, P := range tps {
		for _, D := range tps {
			for _, heads := range []int{1, 2, 3, 4, 8, 16, 32} {
				s := staging.New(kvlayout.Layout{AttnTP: D, PP: 1, DP: 1, NumLayers: 4, HeadDim: 128, DTypeBytes: 2, PageSize: 16}, 1<<20)
				for e := range D {
					ws := s.Writers(P, 1, heads, e, 0)
					if len(ws) == 0 {
						t.Fatalf("P %d D %d heads %d: decode rank %d has no writers", P, D, heads, e)
					}
					for _, w := range ws {
						want := kvmanager.ComputeHeadSliceParams(P, D, w.PrefillTP, e, heads)
						if got := kvmanager.HeadSlice(w.Slice); got != want {
							t.Errorf("P %d D %d heads %d: writer %d -> decode %d: staging plans %+v, ComputeHeadSliceParams says %+v", P, D, heads, w.PrefillTP, e, got, want)
						}
						checked++
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("nothing compared")
	}
}
