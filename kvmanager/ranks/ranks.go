// Package ranks is a prefill instance's ranks as the decode side sees
// them: a rank's identity, the rules that resolve a room's prefill DP rank,
// SGLang's rank mapping between prefill and decode tensor-parallel ranks,
// and the per-room plan of which prefill ranks write what to which decode
// ranks. It is pure values and arithmetic (no lock, no clock): the room
// state machine (kvmanager/room) reads a plan, the prefill registry
// (kvmanager/registry) builds it.
package ranks

import (
	"errors"
	"fmt"

	"github.com/decodeplane/decodeplane/transfer"
)

// RankID identifies one prefill scheduler rank.
type RankID struct {
	Addr string
	DP   int
	CP   int
	TP   int
	PP   int
}

func (r RankID) String() string {
	return fmt.Sprintf("%s[dp %d cp %d tp %d pp %d]", r.Addr, r.DP, r.CP, r.TP, r.PP)
}

// RankKey is a rank within one prefill DP group.
type RankKey struct{ CP, TP, PP int }

// Key is the rank's key within its DP group.
func (r RankID) Key() RankKey { return RankKey{CP: r.CP, TP: r.TP, PP: r.PP} }

// DPRule says which rule resolved a room's prefill DP rank.
type DPRule uint8

// DP rank rules, in SGLang's resolution order.
const (
	DPRuleNone DPRule = iota
	DPRuleHint
	DPRuleSingleDP
	DPRuleFollowRoom
	DPRuleBinding
)

var dpRuleNames = [...]string{"none", "hint", "single_dp", "follow_room", "binding"}

// NumDPRules is the number of DPRule values (DPRuleNone included): the
// length of Lookup.ByRule.
const NumDPRules = len(dpRuleNames)

func (r DPRule) String() string {
	if r < 0 || int(r) >= len(dpRuleNames) {
		return fmt.Sprintf("DPRule(%d)", int(r))
	}
	return dpRuleNames[r]
}

// Target is one decode TP rank a prefill rank writes to, with the head slice
// for heterogeneous TP (SGLang compute_head_slice_params): the engine
// contract's type, since the destination hands it to the engine as is.
type Target = transfer.Target

// HeadSlice is the engine contract's head slice (transfer.ComputeHeadSliceParams).
type HeadSlice = transfer.HeadSlice

// DecodeRankMapping is SGLang's _resolve_rank_mapping for one decode
// attention-TP rank.
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

// MaxListedRanks bounds every list of ranks in a message or a status.
const MaxListedRanks = 8

// Errors about ranks (the registry and kvmanager re-export the same values,
// so errors.Is holds on every name).
var (
	// ErrPrefillNotFound: the prefill instance or rank is not registered (or
	// was declared dead). NotFound.
	ErrPrefillNotFound = errors.New("prefill not registered")
	// ErrDPRankConflict: a binding contradicts follow_bootstrap_room or an
	// earlier resolution. FailedPrecondition.
	ErrDPRankConflict = errors.New("prefill DP rank conflict")
)
