package kvmanager

import (
	"fmt"
	"slices"
)

// DecodeRankMapping is SGLang's _resolve_rank_mapping for one decode
// attention-TP rank (spec §4.4).
type DecodeRankMapping struct {
	DecodeTP                   int
	TargetTPRanks              []int
	TargetTPRank               int
	TargetCPRanks              []int
	TargetPPRanks              []int
	RequiredDstInfoNum         int
	RequiredPrefillResponseNum int
	DummyTPRanks               []int
}

// PrefillTopology is what the decode side needs to know of a prefill
// instance to map ranks: SGLang's PrefillServerInfo.
type PrefillTopology struct {
	AttnTP              int
	AttnCP              int
	DP                  int
	PP                  int
	FollowBootstrapRoom bool
	DSACacheLayerSplit  bool
}

// rankMapping computes the mapping of every decode TP rank (0..decodeTP-1)
// against a prefill. isMLA follows the decode pool; hybridMLA pulls from every
// prefill CP rank.
func rankMapping(decodeTP, decodePP int, isMLA, allCP bool, p PrefillTopology) ([]DecodeRankMapping, error) {
	D, P := decodeTP, p.AttnTP
	if D <= 0 || P <= 0 {
		return nil, fmt.Errorf("attention TP sizes must be positive (decode %d, prefill %d)", D, P)
	}
	if D%P != 0 && P%D != 0 {
		return nil, fmt.Errorf("prefill attn_tp_size=%d and decode attn_tp_size=%d: one must divide the other for the rank mapping", P, D)
	}
	if decodePP != p.PP && decodePP != 1 {
		return nil, fmt.Errorf("decode pp_size=%d must equal the prefill's pp_size=%d or be 1", decodePP, p.PP)
	}
	var cp []int
	respCP := 1
	switch {
	case p.AttnCP <= 1:
		cp = []int{0}
	case allCP || p.DSACacheLayerSplit:
		for i := range p.AttnCP {
			cp = append(cp, i)
		}
		respCP = p.AttnCP
	default:
		cp = []int{0}
	}
	var pp []int
	respPP := 1
	if decodePP == p.PP {
		// Each decode stage pulls from the matching prefill stage; seen from
		// the whole decode instance, every prefill stage is a source.
		for i := range p.PP {
			pp = append(pp, i)
		}
	} else {
		for i := range p.PP {
			pp = append(pp, i)
		}
		respPP = p.PP
	}
	out := make([]DecodeRankMapping, D)
	for e := range D {
		m := DecodeRankMapping{DecodeTP: e, TargetCPRanks: cp, TargetPPRanks: pp}
		switch {
		case D == P:
			m.TargetTPRanks = []int{e}
			m.TargetTPRank = e
			m.RequiredDstInfoNum = 1
			m.RequiredPrefillResponseNum = 1
		case D > P:
			t := e / (D / P)
			m.TargetTPRanks = []int{t}
			m.TargetTPRank = t
			m.RequiredDstInfoNum = D / P
			m.RequiredPrefillResponseNum = 1
		default: // D < P
			k := P / D
			for t := e * k; t < (e+1)*k; t++ {
				m.TargetTPRanks = append(m.TargetTPRanks, t)
			}
			m.TargetTPRank = e * k
			m.RequiredDstInfoNum = 1
			if isMLA {
				m.RequiredPrefillResponseNum = 1
				m.DummyTPRanks = slices.Clone(m.TargetTPRanks[1:])
			} else {
				m.RequiredPrefillResponseNum = k
			}
		}
		m.RequiredPrefillResponseNum *= respCP * respPP
		out[e] = m
	}
	return out, nil
}

// HeadSlice is compute_head_slice_params's answer for one (prefill rank,
// decode rank) pair (spec §5.4).
type HeadSlice struct {
	SrcHeadStart int
	DstHeadStart int
	NumHeads     int
}

// ComputeHeadSliceParams mirrors SGLang's compute_head_slice_params: which
// heads of a prefill rank (src) go to which heads of a decode rank (dst) when
// their attention TP sizes differ, with GQA replication when TP exceeds the
// KV head count.
func ComputeHeadSliceParams(srcTP, dstTP, srcRank, dstRank, totalHeads int) HeadSlice {
	srcPer := max(1, totalHeads/srcTP)
	dstPer := max(1, totalHeads/dstTP)
	if srcTP > dstTP {
		srcRepl := max(1, srcTP/totalHeads)
		return HeadSlice{
			SrcHeadStart: 0,
			DstHeadStart: ((srcRank % srcTP) / srcRepl * srcPer) % dstPer,
			NumHeads:     srcPer,
		}
	}
	dstRepl := max(1, dstTP/totalHeads)
	return HeadSlice{
		SrcHeadStart: ((dstRank % dstTP) / dstRepl * dstPer) % srcPer,
		DstHeadStart: 0,
		NumHeads:     dstPer,
	}
}

// roomPlan is, for one prefill instance's DP group, which prefill ranks a
// room needs and what each writes where. It depends only on the topology, so
// it is computed once per prefill instance.
type roomPlan struct {
	// required are the ranks whose KV must land (non-dummy), in a stable order.
	required []rankKey
	// perRank maps every addressed rank (real or dummy) to its targets.
	perRank map[rankKey]*rankPlan
	staging bool
}

type rankPlan struct {
	targets            []Target
	dummy              bool // dummy for every decode rank that addresses it
	requiredDstInfoNum int
}

// buildPlan derives the room plan from the rank mapping.
func buildPlan(mapping []DecodeRankMapping, p PrefillTopology, decodeTP, totalHeads int, isMLA, staging bool) *roomPlan {
	plan := &roomPlan{perRank: map[rankKey]*rankPlan{}}
	for _, m := range mapping {
		for _, cp := range m.TargetCPRanks {
			for _, pp := range m.TargetPPRanks {
				for _, t := range m.TargetTPRanks {
					k := rankKey{CP: cp, TP: t, PP: pp}
					rp := plan.perRank[k]
					if rp == nil {
						rp = &rankPlan{dummy: true, requiredDstInfoNum: m.RequiredDstInfoNum}
						plan.perRank[k] = rp
					}
					dummy := slices.Contains(m.DummyTPRanks, t)
					tg := Target{DecodeTP: m.DecodeTP, Dummy: dummy}
					if !isMLA && !dummy {
						hs := ComputeHeadSliceParams(p.AttnTP, decodeTP, t, m.DecodeTP, totalHeads)
						tg.SrcHeadStart, tg.DstHeadStart, tg.NumHeads = hs.SrcHeadStart, hs.DstHeadStart, hs.NumHeads
					}
					rp.targets = append(rp.targets, tg)
					if !dummy {
						rp.dummy = false
					}
				}
			}
		}
	}
	for k, rp := range plan.perRank {
		if !rp.dummy {
			plan.required = append(plan.required, k)
		}
	}
	slices.SortFunc(plan.required, func(a, b rankKey) int {
		if a.PP != b.PP {
			return a.PP - b.PP
		}
		if a.CP != b.CP {
			return a.CP - b.CP
		}
		return a.TP - b.TP
	})
	plan.staging = staging && !isMLA && p.AttnTP != decodeTP
	return plan
}
