package kvmanager_test

import (
	"testing"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/kvmanager/staging"
	"github.com/decodeplane/decodeplane/prealloc"
)

// Expected values are computed by hand from SGLang's formulas (spec §5.4):
// src_per = max(1, H/src_tp), dst_per = max(1, H/dst_tp); src_tp > dst_tp:
// dst_start = ((src_rank % src_tp) / max(1, src_tp/H) · src_per) % dst_per;
// else src_start = ((dst_rank % dst_tp) / max(1, dst_tp/H) · dst_per) % src_per.
func TestComputeHeadSliceParams(t *testing.T) {
	type hs = kvmanager.HeadSlice
	tests := []struct {
		name                string
		srcTP, dstTP, heads int
		pairs               map[[2]int]hs // (src rank, dst rank) → slice
	}{
		{
			name: "prefill TP 4 to decode TP 2, 8 KV heads", srcTP: 4, dstTP: 2, heads: 8,
			// src_per 2, dst_per 4: each prefill rank sends its 2 heads into
			// half of a decode rank's 4.
			pairs: map[[2]int]hs{
				{0, 0}: {SrcHeadStart: 0, DstHeadStart: 0, NumHeads: 2},
				{1, 0}: {SrcHeadStart: 0, DstHeadStart: 2, NumHeads: 2},
				{2, 1}: {SrcHeadStart: 0, DstHeadStart: 0, NumHeads: 2},
				{3, 1}: {SrcHeadStart: 0, DstHeadStart: 2, NumHeads: 2},
			},
		},
		{
			name: "prefill TP 2 to decode TP 4, 8 KV heads", srcTP: 2, dstTP: 4, heads: 8,
			// src_per 4, dst_per 2: each decode rank takes 2 of its prefill
			// rank's 4 heads.
			pairs: map[[2]int]hs{
				{0, 0}: {SrcHeadStart: 0, DstHeadStart: 0, NumHeads: 2},
				{0, 1}: {SrcHeadStart: 2, DstHeadStart: 0, NumHeads: 2},
				{1, 2}: {SrcHeadStart: 0, DstHeadStart: 0, NumHeads: 2},
				{1, 3}: {SrcHeadStart: 2, DstHeadStart: 0, NumHeads: 2},
			},
		},
		{
			name: "prefill TP 8 to decode TP 1, 8 KV heads", srcTP: 8, dstTP: 1, heads: 8,
			pairs: map[[2]int]hs{
				{0, 0}: {DstHeadStart: 0, NumHeads: 1}, {1, 0}: {DstHeadStart: 1, NumHeads: 1},
				{2, 0}: {DstHeadStart: 2, NumHeads: 1}, {3, 0}: {DstHeadStart: 3, NumHeads: 1},
				{4, 0}: {DstHeadStart: 4, NumHeads: 1}, {5, 0}: {DstHeadStart: 5, NumHeads: 1},
				{6, 0}: {DstHeadStart: 6, NumHeads: 1}, {7, 0}: {DstHeadStart: 7, NumHeads: 1},
			},
		},
		{
			name: "prefill TP 4 above 2 KV heads to decode TP 1 (replicated prefill heads)", srcTP: 4, dstTP: 1, heads: 2,
			// src_per max(1, 0) = 1, src_repl 2: ranks 0,1 hold head 0 and
			// ranks 2,3 hold head 1.
			pairs: map[[2]int]hs{
				{0, 0}: {DstHeadStart: 0, NumHeads: 1}, {1, 0}: {DstHeadStart: 0, NumHeads: 1},
				{2, 0}: {DstHeadStart: 1, NumHeads: 1}, {3, 0}: {DstHeadStart: 1, NumHeads: 1},
			},
		},
		{
			name: "prefill TP 1 to decode TP 4 above 2 KV heads (replicated decode heads)", srcTP: 1, dstTP: 4, heads: 2,
			// dst_per 1, dst_repl 2: decode ranks 0,1 hold head 0, 2,3 head 1.
			pairs: map[[2]int]hs{
				{0, 0}: {SrcHeadStart: 0, NumHeads: 1}, {0, 1}: {SrcHeadStart: 0, NumHeads: 1},
				{0, 2}: {SrcHeadStart: 1, NumHeads: 1}, {0, 3}: {SrcHeadStart: 1, NumHeads: 1},
			},
		},
		{
			name: "prefill TP 8 to decode TP 4, both above 4 KV heads", srcTP: 8, dstTP: 4, heads: 4,
			// src_per = dst_per = 1: every pair moves its one head to 0.
			pairs: map[[2]int]hs{
				{0, 0}: {NumHeads: 1}, {1, 0}: {NumHeads: 1}, {6, 3}: {NumHeads: 1}, {7, 3}: {NumHeads: 1},
			},
		},
		{
			name: "equal TP 2, 8 KV heads", srcTP: 2, dstTP: 2, heads: 8,
			pairs: map[[2]int]hs{{0, 0}: {NumHeads: 4}, {1, 1}: {NumHeads: 4}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for p, want := range tc.pairs {
				got := kvmanager.ComputeHeadSliceParams(tc.srcTP, tc.dstTP, p[0], p[1], tc.heads)
				if got != want {
					t.Errorf("ComputeHeadSliceParams(%d, %d, %d, %d, %d) = %+v, want %+v", tc.srcTP, tc.dstTP, p[0], p[1], tc.heads, got, want)
				}
			}
		})
	}
}

// TestStagingHeadSlicesMatchMapping: the staging package keeps its own copy
// of compute_head_slice_params (it may not import the registry); every
// writer slice it plans must be the registry's for the same pair.
func TestStagingHeadSlicesMatchMapping(t *testing.T) {
	tps := []int{1, 2, 3, 4, 8, 16}
	checked := 0
	for _, P := range tps {
		for _, D := range tps {
			for _, heads := range []int{1, 2, 3, 4, 8, 16, 32} {
				s := staging.New(prealloc.Layout{AttnTP: D, PP: 1, DP: 1, NumLayers: 4, HeadDim: 128, DTypeBytes: 2, PageSize: 16}, 1<<20)
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
