package registry

import "github.com/decodeplane/decodeplane/kvmanager/ranks"

// The ranks' own types (package ranks: identity, DP rules, SGLang's rank
// mapping and the per-room plan), under the registry's names.
type (
	RankID            = ranks.RankID
	RankKey           = ranks.RankKey
	DPRule            = ranks.DPRule
	Target            = ranks.Target
	HeadSlice         = ranks.HeadSlice
	DecodeRankMapping = ranks.DecodeRankMapping
	PrefillTopology   = ranks.PrefillTopology
	Plan              = ranks.Plan
	RankPlan          = ranks.RankPlan
)

// DP rank rules, in SGLang's resolution order.
const (
	DPRuleNone       = ranks.DPRuleNone
	DPRuleHint       = ranks.DPRuleHint
	DPRuleSingleDP   = ranks.DPRuleSingleDP
	DPRuleFollowRoom = ranks.DPRuleFollowRoom
	DPRuleBinding    = ranks.DPRuleBinding
)

// NumDPRules is the number of DPRule values (DPRuleNone included): the
// length of Lookup.ByRule.
const NumDPRules = ranks.NumDPRules

// MaxListedRanks bounds every list of ranks in a message or a status.
const MaxListedRanks = ranks.MaxListedRanks
