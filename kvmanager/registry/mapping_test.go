package registry

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRankMapping checks rankMapping against SGLang's _resolve_rank_mapping
// (spec §4.4) with decode D = attn_tp_size, prefill P, e = decode rank.
func TestRankMapping(t *testing.T) {
	type dm = DecodeRankMapping
	tests := []struct {
		name      string
		decodeTP  int
		decodePP  int
		isMLA     bool
		allCP     bool
		prefill   PrefillTopology
		want      []DecodeRankMapping
		wantError string
	}{
		{
			// D == P: e → [e], one destination, one response.
			name: "D == P", decodeTP: 2, decodePP: 1, prefill: PrefillTopology{AttnTP: 2, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetTPRank: 0, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1},
				{DecodeTP: 1, TargetTPRanks: []int{1}, TargetTPRank: 1, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1},
			},
		},
		{
			// D > P, decode 4 / prefill 1: e // 4 = 0 for all; the prefill
			// rank receives D/P = 4 destinations.
			name: "D > P decode 4 prefill 1", decodeTP: 4, decodePP: 1, prefill: PrefillTopology{AttnTP: 1, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 4, RequiredPrefillResponseNum: 1},
				{DecodeTP: 1, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 4, RequiredPrefillResponseNum: 1},
				{DecodeTP: 2, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 4, RequiredPrefillResponseNum: 1},
				{DecodeTP: 3, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 4, RequiredPrefillResponseNum: 1},
			},
		},
		{
			// D > P, decode 4 / prefill 2: e // 2 → 0, 0, 1, 1; D/P = 2.
			name: "D > P decode 4 prefill 2", decodeTP: 4, decodePP: 1, prefill: PrefillTopology{AttnTP: 2, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetTPRank: 0, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 2, RequiredPrefillResponseNum: 1},
				{DecodeTP: 1, TargetTPRanks: []int{0}, TargetTPRank: 0, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 2, RequiredPrefillResponseNum: 1},
				{DecodeTP: 2, TargetTPRanks: []int{1}, TargetTPRank: 1, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 2, RequiredPrefillResponseNum: 1},
				{DecodeTP: 3, TargetTPRanks: []int{1}, TargetTPRank: 1, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 2, RequiredPrefillResponseNum: 1},
			},
		},
		{
			// D < P, prefill 4 → decode 2, non-MLA: e·2 … e·2+1, every
			// prefill rank answers (P/D = 2 responses), no dummies.
			name: "D < P prefill 4 decode 2 non-MLA", decodeTP: 2, decodePP: 1, prefill: PrefillTopology{AttnTP: 4, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0, 1}, TargetTPRank: 0, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 2},
				{DecodeTP: 1, TargetTPRanks: []int{2, 3}, TargetTPRank: 2, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 2},
			},
		},
		{
			// Same for MLA: one response; the other rank of each pair is a dummy.
			name: "D < P prefill 4 decode 2 MLA", decodeTP: 2, decodePP: 1, isMLA: true, prefill: PrefillTopology{AttnTP: 4, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0, 1}, TargetTPRank: 0, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1, DummyTPRanks: []int{1}},
				{DecodeTP: 1, TargetTPRanks: []int{2, 3}, TargetTPRank: 2, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1, DummyTPRanks: []int{3}},
			},
		},
		{
			// Prefill 8 → decode 1, non-MLA: all 8 ranks answer.
			name: "D < P prefill 8 decode 1 non-MLA", decodeTP: 1, decodePP: 1, prefill: PrefillTopology{AttnTP: 8, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0, 1, 2, 3, 4, 5, 6, 7}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 8},
			},
		},
		{
			// Prefill 8 → decode 1, MLA: rank 0 answers, 1–7 are dummies.
			name: "D < P prefill 8 decode 1 MLA", decodeTP: 1, decodePP: 1, isMLA: true, prefill: PrefillTopology{AttnTP: 8, AttnCP: 1, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0, 1, 2, 3, 4, 5, 6, 7}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1, DummyTPRanks: []int{1, 2, 3, 4, 5, 6, 7}},
			},
		},
		{
			// Decode PP 1, prefill PP 2: pull from every stage; responses × 2.
			name: "decode pp 1 prefill pp 2", decodeTP: 1, decodePP: 1, prefill: PrefillTopology{AttnTP: 1, AttnCP: 1, PP: 2},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0, 1}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 2},
			},
		},
		{
			// Equal PP: each decode stage pulls from its own stage (one
			// response); seen from the whole instance both stages are sources.
			name: "decode pp 2 prefill pp 2", decodeTP: 1, decodePP: 2, prefill: PrefillTopology{AttnTP: 1, AttnCP: 1, PP: 2},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0, 1}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1},
			},
		},
		{
			// Non-MLA P/D = 2 responses × 2 stages = 4.
			name: "prefill TP 2 PP 2 to decode TP 1 PP 1", decodeTP: 1, decodePP: 1, prefill: PrefillTopology{AttnTP: 2, AttnCP: 1, PP: 2},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0, 1}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0, 1}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 4},
			},
		},
		{
			// Prefill CP 2 without all-CP transfer: truncated to CP rank 0.
			name: "CP truncated", decodeTP: 1, decodePP: 1, prefill: PrefillTopology{AttnTP: 1, AttnCP: 2, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetCPRanks: []int{0}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 1},
			},
		},
		{
			// Hybrid-MLA decode pulls from every CP rank: responses × 2.
			name: "CP all ranks for hybrid MLA", decodeTP: 1, decodePP: 1, isMLA: true, allCP: true, prefill: PrefillTopology{AttnTP: 1, AttnCP: 2, PP: 1},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetCPRanks: []int{0, 1}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 2},
			},
		},
		{
			// The prefill's enable_dsa_cache_layer_split does the same.
			name: "CP all ranks for DSA layer split", decodeTP: 1, decodePP: 1, prefill: PrefillTopology{AttnTP: 1, AttnCP: 4, PP: 1, DSACacheLayerSplit: true},
			want: []dm{
				{DecodeTP: 0, TargetTPRanks: []int{0}, TargetCPRanks: []int{0, 1, 2, 3}, TargetPPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponseNum: 4},
			},
		},
		{name: "TP sizes that do not divide", decodeTP: 2, decodePP: 1, prefill: PrefillTopology{AttnTP: 3, AttnCP: 1, PP: 1}, wantError: "one must divide the other"},
		{name: "zero TP", decodeTP: 0, decodePP: 1, prefill: PrefillTopology{AttnTP: 1, AttnCP: 1, PP: 1}, wantError: "must be positive"},
		{name: "decode pp 2 prefill pp 1", decodeTP: 1, decodePP: 2, prefill: PrefillTopology{AttnTP: 1, AttnCP: 1, PP: 1}, wantError: "decode pp_size=2 must equal the prefill's pp_size=1 or be 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rankMapping(tc.decodeTP, tc.decodePP, tc.isMLA, tc.allCP, tc.prefill)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("rankMapping() = %v, want an error mentioning %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatalf("rankMapping() = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("rankMapping() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestComputeHeadSliceParams checks SGLang's compute_head_slice_params
// (spec §5.4): src_per = max(1, H/src_tp), dst_per = max(1, H/dst_tp).
func TestComputeHeadSliceParams(t *testing.T) {
	type hs = HeadSlice
	tests := []struct {
		name         string
		srcTP, dstTP int
		heads        int
		// want[i] is the slice for pair i: src rank = i when srcTP > dstTP
		// (every prefill rank into decode rank 0 … ), else dst rank = i.
		pairs [][2]int // (srcRank, dstRank)
		want  []HeadSlice
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
				if got := ComputeHeadSliceParams(tc.srcTP, tc.dstTP, p[0], p[1], tc.heads); got != tc.want[i] {
					t.Errorf("ComputeHeadSliceParams(%d, %d, %d, %d, %d) = %+v, want %+v", tc.srcTP, tc.dstTP, p[0], p[1], tc.heads, got, tc.want[i])
				}
			}
		})
	}
}

func TestBuildPlan(t *testing.T) {
	tests := []struct {
		name         string
		decodeTP     int
		heads        int
		isMLA        bool
		staging      bool
		prefill      PrefillTopology
		wantRequired []RankKey
		wantDummy    map[RankKey]bool
		wantStaging  bool
	}{
		{
			name: "prefill TP 4 to decode TP 2 GQA", decodeTP: 2, heads: 8, staging: true, prefill: PrefillTopology{AttnTP: 4, AttnCP: 1, PP: 1},
			wantRequired: []RankKey{{TP: 0}, {TP: 1}, {TP: 2}, {TP: 3}},
			wantDummy:    map[RankKey]bool{{TP: 0}: false, {TP: 1}: false, {TP: 2}: false, {TP: 3}: false},
			wantStaging:  true,
		},
		{
			name: "prefill TP 4 to decode TP 2 MLA", decodeTP: 2, isMLA: true, staging: true, prefill: PrefillTopology{AttnTP: 4, AttnCP: 1, PP: 1},
			wantRequired: []RankKey{{TP: 0}, {TP: 2}},
			wantDummy:    map[RankKey]bool{{TP: 0}: false, {TP: 1}: true, {TP: 2}: false, {TP: 3}: true},
		},
		{
			// Required ranks are ordered by PP, then CP, then TP.
			name: "prefill TP 2 PP 2 to decode TP 1", decodeTP: 1, heads: 8, prefill: PrefillTopology{AttnTP: 2, AttnCP: 1, PP: 2},
			wantRequired: []RankKey{{TP: 0}, {TP: 1}, {PP: 1, TP: 0}, {PP: 1, TP: 1}},
			wantDummy:    map[RankKey]bool{{TP: 0}: false, {TP: 1}: false, {PP: 1}: false, {PP: 1, TP: 1}: false},
		},
		{
			name: "equal TP no staging", decodeTP: 2, heads: 8, staging: true, prefill: PrefillTopology{AttnTP: 2, AttnCP: 1, PP: 1},
			wantRequired: []RankKey{{TP: 0}, {TP: 1}},
			wantDummy:    map[RankKey]bool{{TP: 0}: false, {TP: 1}: false},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mapping, err := rankMapping(tc.decodeTP, 1, tc.isMLA, false, tc.prefill)
			if err != nil {
				t.Fatal(err)
			}
			plan := buildPlan(mapping, tc.prefill, tc.decodeTP, tc.heads, tc.isMLA, tc.staging)
			if diff := cmp.Diff(tc.wantRequired, plan.required, cmp.AllowUnexported(RankKey{})); diff != "" {
				t.Errorf("required (-want +got):\n%s", diff)
			}
			got := map[RankKey]bool{}
			for k, rp := range plan.perRank {
				got[k] = rp.dummy
			}
			if diff := cmp.Diff(tc.wantDummy, got, cmp.AllowUnexported(RankKey{})); diff != "" {
				t.Errorf("dummy by rank (-want +got):\n%s", diff)
			}
			if plan.staging != tc.wantStaging {
				t.Errorf("staging = %v, want %v", plan.staging, tc.wantStaging)
			}
		})
	}
}
