package ranks

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRankMapping checks Mapping against SGLang's _resolve_rank_mapping
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
			got, err := Mapping(tc.decodeTP, tc.decodePP, tc.isMLA, tc.allCP, tc.prefill)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("Mapping() = %v, want an error mentioning %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatalf("Mapping() = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Mapping() (-want +got):\n%s", diff)
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
			mapping, err := Mapping(tc.decodeTP, 1, tc.isMLA, false, tc.prefill)
			if err != nil {
				t.Fatal(err)
			}
			plan := BuildPlan(mapping, tc.prefill, tc.decodeTP, tc.heads, tc.isMLA, tc.staging)
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
