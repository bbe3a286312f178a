package transfer_test

import (
	"testing"

	"github.com/decodeplane/decodeplane/transfer"
)

// TestComputeHeadSliceParams checks SGLang's compute_head_slice_params
// (spec §5.4): src_per = max(1, H/src_tp), dst_per = max(1, H/dst_tp).
func TestComputeHeadSliceParams(t *testing.T) {
	type hs = transfer.HeadSlice
	tests := []struct {
		name         string
		srcTP, dstTP int
		heads        int
		// want[i] is the slice for pair i: src rank = i when srcTP > dstTP
		// (every prefill rank into decode rank 0 … ), else dst rank = i.
		pairs [][2]int // (srcRank, dstRank)
		want  []transfer.HeadSlice
	}{
		{
			// src_per 2, dst_per 4, src_repl 1: dst_start = (r·2) % 4.
			name: "prefill TP 4 to decode TP 2, 8 heads", srcTP: 4, dstTP: 2, heads: 8,
			pairs: [][2]int{{0, 0}, {1, 0}, {2, 1}, {3, 1}},
			want:  []hs{{0, 0, 2}, {0, 2, 2}, {0, 0, 2}, {0, 2, 2}},
		},
		{
			// src_per 4, dst_per 2, dst_repl 1: src_start = (d·2) % 4.
			name: "prefill TP 2 to decode TP 4, 8 heads", srcTP: 2, dstTP: 4, heads: 8,
			pairs: [][2]int{{0, 0}, {0, 1}, {1, 2}, {1, 3}},
			want:  []hs{{0, 0, 2}, {2, 0, 2}, {0, 0, 2}, {2, 0, 2}},
		},
		{
			// src_per 1, dst_per 8, src_repl 1: prefill rank r → decode head r.
			name: "prefill TP 8 to decode TP 1, 8 heads", srcTP: 8, dstTP: 1, heads: 8,
			pairs: [][2]int{{0, 0}, {1, 0}, {5, 0}, {7, 0}},
			want:  []hs{{0, 0, 1}, {0, 1, 1}, {0, 5, 1}, {0, 7, 1}},
		},
		{
			// Equal TP: src_start = (d·4) % 4 = 0, all 4 heads.
			name: "equal TP 2, 8 heads", srcTP: 2, dstTP: 2, heads: 8,
			pairs: [][2]int{{0, 0}, {1, 1}},
			want:  []hs{{0, 0, 4}, {0, 0, 4}},
		},
		{
			// 2 KV heads at decode TP 4 (heads replicated): src_per 2,
			// dst_per max(1, 0) = 1, dst_repl 4/2 = 2: src_start = (d/2) % 2.
			name: "prefill TP 1 to decode TP 4, 2 heads", srcTP: 1, dstTP: 4, heads: 2,
			pairs: [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}},
			want:  []hs{{0, 0, 1}, {0, 0, 1}, {1, 0, 1}, {1, 0, 1}},
		},
		{
			// 2 KV heads at prefill TP 8: src_per 1, dst_per 2, src_repl 4:
			// dst_start = (r/4) % 2: ranks 0–3 carry head 0, ranks 4–7 head 1.
			name: "prefill TP 8 to decode TP 1, 2 heads", srcTP: 8, dstTP: 1, heads: 2,
			pairs: [][2]int{{0, 0}, {3, 0}, {4, 0}, {7, 0}},
			want:  []hs{{0, 0, 1}, {0, 0, 1}, {0, 1, 1}, {0, 1, 1}},
		},
		{
			// 2 KV heads at prefill TP 8 → decode TP 4: src_per 1, dst_per 1,
			// src_repl 4: dst_start = (r/4) % 1 = 0 for all.
			name: "prefill TP 8 to decode TP 4, 2 heads", srcTP: 8, dstTP: 4, heads: 2,
			pairs: [][2]int{{0, 0}, {4, 2}, {7, 3}},
			want:  []hs{{0, 0, 1}, {0, 0, 1}, {0, 0, 1}},
		},
		{
			// 2 KV heads at prefill TP 4 → decode TP 8: src_per 1, dst_per 1,
			// dst_repl 4: src_start = (d/4) % 1 = 0.
			name: "prefill TP 4 to decode TP 8, 2 heads", srcTP: 4, dstTP: 8, heads: 2,
			pairs: [][2]int{{0, 0}, {2, 5}, {3, 7}},
			want:  []hs{{0, 0, 1}, {0, 0, 1}, {0, 0, 1}},
		},
		{
			// 8 heads at prefill TP 16 (replicated ×2) → decode TP 2:
			// src_per 1, dst_per 4, src_repl 2: dst_start = (r/2) % 4.
			name: "prefill TP 16 to decode TP 2, 8 heads", srcTP: 16, dstTP: 2, heads: 8,
			pairs: [][2]int{{0, 0}, {1, 0}, {2, 0}, {7, 0}, {8, 1}, {15, 1}},
			want:  []hs{{0, 0, 1}, {0, 0, 1}, {0, 1, 1}, {0, 3, 1}, {0, 0, 1}, {0, 3, 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, p := range tc.pairs {
				if got := transfer.ComputeHeadSliceParams(tc.srcTP, tc.dstTP, p[0], p[1], tc.heads); got != tc.want[i] {
					t.Errorf("ComputeHeadSliceParams(%d, %d, %d, %d, %d) = %+v, want %+v", tc.srcTP, tc.dstTP, p[0], p[1], tc.heads, got, tc.want[i])
				}
			}
		})
	}
}

// Expected values are computed by hand from SGLang's formulas (spec §5.4):
// src_per = max(1, H/src_tp), dst_per = max(1, H/dst_tp); src_tp > dst_tp:
// dst_start = ((src_rank % src_tp) / max(1, src_tp/H) · src_per) % dst_per;
// else src_start = ((dst_rank % dst_tp) / max(1, dst_tp/H) · dst_per) % src_per.
func TestComputeHeadSliceParamsByHand(t *testing.T) {
	type hs = transfer.HeadSlice
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
				got := transfer.ComputeHeadSliceParams(tc.srcTP, tc.dstTP, p[0], p[1], tc.heads)
				if got != want {
					t.Errorf("ComputeHeadSliceParams(%d, %d, %d, %d, %d) = %+v, want %+v", tc.srcTP, tc.dstTP, p[0], p[1], tc.heads, got, want)
				}
			}
		})
	}
}
