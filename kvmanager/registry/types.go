package registry

import (
	"fmt"
	"time"
)

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
	// ModelName and ModelRevision name the prefill's model; each is
	// checked against the decode's model.name / model.revision when both
	// sides set it.
	ModelName     string `json:",omitempty"`
	ModelRevision string `json:",omitempty"`
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
