package ranks

import (
	"fmt"
	"slices"

	"github.com/decodeplane/decodeplane/transfer"
)

// Mapping computes the mapping of every decode TP rank (0..decodeTP-1)
// against a prefill. isMLA follows the decode pool; hybridMLA pulls from every
// prefill CP rank.
func Mapping(decodeTP, decodePP int, isMLA, allCP bool, p PrefillTopology) ([]DecodeRankMapping, error) {
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
	if n := mappingEntries(D, isMLA, allCP, p); n > maxMappingEntries {
		return nil, fmt.Errorf("the rank mapping of prefill attn_tp_size=%d attn_cp_size=%d pp_size=%d against decode attn_tp_size=%d would list %d target ranks; decodeplane lists at most %d (no real deployment comes near: check the prefill's parallel sizes)",
			P, p.AttnCP, p.PP, D, n, maxMappingEntries)
	}
	cp := []int{0}
	respCP := 1
	if p.AttnCP > 1 && (allCP || p.DSACacheLayerSplit) {
		cp = upTo(0, p.AttnCP)
		respCP = p.AttnCP
	}
	// Each decode stage pulls from the matching prefill stage (decode PP ==
	// prefill PP); seen from the whole decode instance, every prefill stage
	// is a source either way.
	pp := upTo(0, p.PP)
	respPP := 1
	if decodePP != p.PP {
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
			m.TargetTPRanks = upTo(e*k, (e+1)*k)
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

// upTo returns [from, to) (to > from; the caller bounded the length).
func upTo(from, to int) []int {
	out := make([]int, to-from)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// maxMappingEntries bounds what Mapping materialises (the target lists of
// every decode rank together). The lists grow with the sum of the prefill's
// sizes, never with their product; this budget caps even that before
// anything is allocated, whatever the wire layer let through. Sizes within
// the documented wire bounds (each <= 1024) list at most 4,096 entries.
const maxMappingEntries = 1 << 16

// mappingEntries counts, without allocating, the list entries Mapping
// would build: TP targets (max(P, D) over all decode ranks), MLA dummies (up
// to P), the shared CP and PP lists.
func mappingEntries(decodeTP int, isMLA, allCP bool, p PrefillTopology) int64 {
	n := int64(max(p.AttnTP, decodeTP)) + int64(max(1, p.PP))
	if isMLA {
		n += int64(p.AttnTP)
	}
	if p.AttnCP > 1 && (allCP || p.DSACacheLayerSplit) {
		n += int64(p.AttnCP)
	} else {
		n++
	}
	return n
}

// Plan is, for one prefill instance's DP group, which prefill ranks a
// room needs and what each writes where: the per-instance rank plan. It
// depends only on the topology, is made by the registry and never changes
// once the instance is complete, so rooms share it (read-only).
//
// Nothing in it is sized by the prefill's parallel sizes until the instance
// is fully registered: before that, one rank's view is computed from the
// shape (O(decode TP)); once every expected rank registered, required and
// perRank are enumerated once, which costs at most one entry per registered
// rank (each of them a RegisterPrefill call already received).
type Plan struct {
	shape planShape
	// required are the ranks whose KV must land (non-dummy), in a stable
	// order; nil until the instance is complete.
	required []RankKey
	// perRank maps every addressed rank (real or dummy) to its targets; nil
	// until the instance is complete.
	perRank map[RankKey]*RankPlan
	staging bool
}

// RankPlan is what one prefill rank writes for a room: its targets, whether
// it is a dummy for every decode rank addressing it, and how many
// destinations it receives. Read-only: plans are shared.
type RankPlan struct {
	targets            []Target
	dummy              bool // dummy for every decode rank that addresses it
	requiredDstInfoNum int
}

// planShape is what the rank plan is derived from: SGLang's mapping rules
// in closed form (the target lists of Mapping are contiguous ranges), so
// that a rank's targets are computed without enumerating the prefill's ranks.
type planShape struct {
	decodeTP, prefillTP int
	cpAll               bool // every prefill CP rank is a source (else CP rank 0 only)
	cp, pp              int  // prefill CP and PP sizes
	totalHeads          int
	isMLA               bool
}

func newPlanShape(p PrefillTopology, decodeTP, totalHeads int, isMLA, allCP bool) planShape {
	return planShape{decodeTP: decodeTP, prefillTP: p.AttnTP, cpAll: p.AttnCP > 1 && (allCP || p.DSACacheLayerSplit),
		cp: p.AttnCP, pp: p.PP, totalHeads: totalHeads, isMLA: isMLA}
}

// rank returns the plan of one prefill rank: the decode TP ranks that
// address it, with head slices; nil when no decode rank addresses it (a CP
// rank beyond 0 without all-CP transfer, or a rank outside the layout). It
// costs O(number of targets) <= O(decode TP).
func (s planShape) rank(k RankKey) *RankPlan {
	D, P := s.decodeTP, s.prefillTP
	if D <= 0 || P <= 0 || k.TP < 0 || k.TP >= P || k.PP < 0 || k.PP >= s.pp || k.CP < 0 || k.CP >= max(1, s.cp) {
		return nil
	}
	if k.CP != 0 && !s.cpAll {
		return nil
	}
	rp := &RankPlan{dummy: true, requiredDstInfoNum: 1}
	add := func(e int, dummy bool) {
		tg := Target{DecodeTP: e, Dummy: dummy}
		if !s.isMLA && !dummy {
			hs := transfer.ComputeHeadSliceParams(P, D, k.TP, e, s.totalHeads)
			tg.SrcHeadStart, tg.DstHeadStart, tg.NumHeads = hs.SrcHeadStart, hs.DstHeadStart, hs.NumHeads
		}
		rp.targets = append(rp.targets, tg)
		if !dummy {
			rp.dummy = false
		}
	}
	switch {
	case D >= P: // decode ranks t·(D/P) .. (t+1)·(D/P)-1 each pull all of rank t
		n := D / P
		rp.requiredDstInfoNum = n
		for e := k.TP * n; e < (k.TP+1)*n; e++ {
			add(e, false)
		}
	default: // one decode rank pulls P/D prefill ranks; under MLA only the first sends KV
		n := P / D
		add(k.TP/n, s.isMLA && k.TP%n != 0)
	}
	return rp
}

// IsRequired reports whether a rank's KV must land for a room.
func (p *Plan) IsRequired(k RankKey) bool {
	rp := p.Rank(k)
	return rp != nil && !rp.dummy
}

// Rank returns one rank's plan (nil for a rank no decode rank addresses):
// from the enumerated table once the instance is complete, from the shape
// before.
func (p *Plan) Rank(k RankKey) *RankPlan {
	if p.perRank != nil {
		return p.perRank[k]
	}
	return p.shape.rank(k)
}

// NewPlan returns the plan of an instance that is still registering: only
// the shape, nothing enumerated.
func NewPlan(p PrefillTopology, decodeTP, totalHeads int, isMLA, allCP, staging bool) *Plan {
	return &Plan{shape: newPlanShape(p, decodeTP, totalHeads, isMLA, allCP), staging: staging && !isMLA && p.AttnTP != decodeTP}
}

// enumerate fills required and perRank. Call it once the instance is fully
// registered: the addressed ranks are a subset of the registered ones, so
// the cost is bounded by the RegisterPrefill calls already received.
func (p *Plan) Enumerate() {
	s := p.shape
	cps := 1
	if s.cpAll {
		cps = s.cp
	}
	p.perRank = map[RankKey]*RankPlan{}
	p.required = nil
	for pp := range s.pp {
		for cp := range cps {
			for tp := range s.prefillTP {
				k := RankKey{CP: cp, TP: tp, PP: pp}
				rp := s.rank(k)
				if rp == nil {
					continue
				}
				p.perRank[k] = rp
				if !rp.dummy {
					p.required = append(p.required, k) // in (PP, CP, TP) order
				}
			}
		}
	}
}

// Required are the ranks whose KV must land for a room (non-dummy), in
// (PP, CP, TP) order; nil until the instance is complete. The slice is the
// plan's own: read-only.
func (p *Plan) Required() []RankKey { return p.required }

// Staging reports whether rooms of this instance go through the staging
// rings (heterogeneous TP on a non-MLA pool, staging enabled).
func (p *Plan) Staging() bool { return p.staging }

// Targets are the decode TP ranks this prefill rank writes to (read-only).
func (rp *RankPlan) Targets() []Target { return rp.targets }

// Dummy reports whether the rank is a dummy for every decode rank that
// addresses it.
func (rp *RankPlan) Dummy() bool { return rp.dummy }

// RequiredDstInfoNum is how many destinations the rank receives.
func (rp *RankPlan) RequiredDstInfoNum() int { return rp.requiredDstInfoNum }

// BuildPlan derives the complete room plan of a topology whose mapping is
// known (the mapping says whether every CP rank is a source).
func BuildPlan(mapping []DecodeRankMapping, p PrefillTopology, decodeTP, totalHeads int, isMLA, staging bool) *Plan {
	allCP := len(mapping) > 0 && len(mapping[0].TargetCPRanks) > 1
	plan := NewPlan(p, decodeTP, totalHeads, isMLA, allCP, staging)
	plan.Enumerate()
	return plan
}
