package registry

import (
	"fmt"
	"time"

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

// ParallelInfo is a prefill rank's parallel layout (SGLang's PUT /route body).
type ParallelInfo struct {
	AttnTP, AttnTPRank     int
	AttnCP, AttnCPRank     int
	AttnDP, AttnDPRank     int
	PP, PPRank             int
	SystemDP, SystemDPRank int
}

// dp returns the prefill's DP size and this rank's DP group as SGLang's
// bootstrap server keys them: attention DP when system_dp_size == 1, else
// the system DP rank.
func (p ParallelInfo) dp() (size, group int) {
	if p.SystemDP <= 1 {
		return max(1, p.AttnDP), p.AttnDPRank
	}
	return p.SystemDP, p.SystemDPRank
}

// ModelFacts are the prefill's KV layout facts; zero fields are not checked.
type ModelFacts struct {
	Kind          string
	NumLayers     int
	TotalKVHeads  int
	HeadDim       int
	KVLoraRank    int
	QKRopeHeadDim int
}

// Registration is one prefill rank registering (RegisterPrefill).
type Registration struct {
	Addr               string
	Endpoint           string
	InstanceID         string
	Parallel           ParallelInfo
	PageSize           int
	KVDType            string
	LoadBalanceMethod  string
	DSACacheLayerSplit bool
	HTTPPort           int
	Model              ModelFacts
}

// RegistrationResult is what a prefill rank learns when it registers.
type RegistrationResult struct {
	Mapping []DecodeRankMapping
	// Rank view: the decode TP ranks addressing this rank, whether it is a
	// dummy for all of them, and how many destinations it receives.
	ServesDecodeTP     []int
	Dummy              bool
	RequiredDstInfoNum int
	Staging            bool
	HeartbeatInterval  time.Duration
	MaxFailures        int
	Registered         int
	Expected           int
	Replaced           bool
	// RoomsFailed is left zero by the registry: the rooms are the room
	// manager's, which fills it in when it applies the registration's events.
	RoomsFailed int
}

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

// PrefillServerInfo is SGLang's PrefillServerInfo for one instance (the
// answer of GET /route with the -1 sentinels), plus the registration count.
type PrefillServerInfo struct {
	Topology   PrefillTopology
	PageSize   int
	KVDType    string
	HTTPPort   int
	InstanceID string
	Registered int
	Expected   int
	// Complete: every expected rank registered (SGLang answers 503 before).
	Complete bool
}

// SilentRank is a registered prefill rank whose heartbeat is overdue.
type SilentRank struct {
	Rank RankID
	// Silent is the time since its last heartbeat (or its registration).
	Silent time.Duration
	// Missed is how many whole heartbeat intervals that is.
	Missed int
}

func (s SilentRank) String() string {
	return fmt.Sprintf("dp %d cp %d tp %d pp %d for %s", s.Rank.DP, s.Rank.CP, s.Rank.TP, s.Rank.PP, s.Silent.Round(100*time.Millisecond))
}

// DPResolution is one room resolved by LookupDPRanks.
type DPResolution struct {
	Room uint64
	DP   int
	Rule DPRule
}
