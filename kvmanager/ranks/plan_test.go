package ranks

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/transfer"
)

// referencePlan is the plan derived by enumerating Mapping's lists (the
// derivation decodeplane used before the closed form): the closed form must
// agree with it on every topology.
func referencePlan(mapping []DecodeRankMapping, p PrefillTopology, decodeTP, totalHeads int, isMLA bool) (map[RankKey]*RankPlan, []RankKey) {
	perRank := map[RankKey]*RankPlan{}
	var order []RankKey
	for _, m := range mapping {
		for _, cp := range m.TargetCPRanks {
			for _, pp := range m.TargetPPRanks {
				for _, t := range m.TargetTPRanks {
					k := RankKey{CP: cp, TP: t, PP: pp}
					rp := perRank[k]
					if rp == nil {
						rp = &RankPlan{dummy: true, requiredDstInfoNum: m.RequiredDstInfoNum}
						perRank[k] = rp
						order = append(order, k)
					}
					dummy := false
					for _, d := range m.DummyTPRanks {
						dummy = dummy || d == t
					}
					tg := Target{DecodeTP: m.DecodeTP, Dummy: dummy}
					if !isMLA && !dummy {
						hs := transfer.ComputeHeadSliceParams(p.AttnTP, decodeTP, t, m.DecodeTP, totalHeads)
						tg.SrcHeadStart, tg.DstHeadStart, tg.NumHeads = hs.SrcHeadStart, hs.DstHeadStart, hs.NumHeads
					}
					rp.targets = append(rp.targets, tg)
					rp.dummy = rp.dummy && dummy
				}
			}
		}
	}
	var required []RankKey
	for _, pp := range upTo(0, p.PP) {
		for _, cp := range upTo(0, max(1, p.AttnCP)) {
			for _, tp := range upTo(0, p.AttnTP) {
				if rp := perRank[RankKey{CP: cp, TP: tp, PP: pp}]; rp != nil && !rp.dummy {
					required = append(required, RankKey{CP: cp, TP: tp, PP: pp})
				}
			}
		}
	}
	return perRank, required
}

// TestPlanClosedFormMatchesMapping sweeps topologies: the closed-form plan
// (one rank at a time, and enumerated once complete) equals the plan
// enumerated from SGLang's rank mapping.
func TestPlanClosedFormMatchesMapping(t *testing.T) {
	n := 0
	for _, D := range []int{1, 2, 4, 8} {
		for _, P := range []int{1, 2, 4, 8, 16} {
			if D%P != 0 && P%D != 0 {
				continue
			}
			for _, cp := range []int{1, 2, 3} {
				for _, pp := range []int{1, 2, 3} {
					for _, isMLA := range []bool{false, true} {
						for _, allCP := range []bool{false, true} {
							for _, dsa := range []bool{false, true} {
								topo := PrefillTopology{AttnTP: P, AttnCP: cp, DP: 2, PP: pp, DSACacheLayerSplit: dsa}
								mapping, err := Mapping(D, 1, isMLA, allCP, topo)
								if err != nil {
									t.Fatal(err)
								}
								wantRanks, wantRequired := referencePlan(mapping, topo, D, 8, isMLA)
								plan := NewPlan(topo, D, 8, isMLA, allCP, false)
								name := fmt.Sprintf("D %d P %d cp %d pp %d mla %v allCP %v dsa %v", D, P, cp, pp, isMLA, allCP, dsa)
								for c := range cp + 1 {
									for tp := range P + 1 {
										for p := range pp + 1 {
											k := RankKey{CP: c, TP: tp, PP: p}
											if diff := cmp.Diff(wantRanks[k], plan.Rank(k), cmp.AllowUnexported(RankPlan{})); diff != "" {
												t.Fatalf("%s: rank %+v before completion (-want +got):\n%s", name, k, diff)
											}
										}
									}
								}
								plan.Enumerate()
								if diff := cmp.Diff(wantRanks, plan.perRank, cmp.AllowUnexported(RankPlan{}, RankKey{})); diff != "" {
									t.Fatalf("%s: perRank (-want +got):\n%s", name, diff)
								}
								if diff := cmp.Diff(wantRequired, plan.required, cmp.AllowUnexported(RankKey{})); diff != "" {
									t.Fatalf("%s: required (-want +got):\n%s", name, diff)
								}
								n++
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d topologies agree", n)
}
