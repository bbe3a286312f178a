package registry

import (
	"fmt"
	"time"
)

// EventKind says what happened to an instance, a rank or a room binding.
type EventKind int

// Event kinds.
const (
	// RankRegistered: one rank registration was accepted (Addr, Rank;
	// Replaced: a new endpoint or instance for a known rank).
	RankRegistered EventKind = iota + 1
	// InstanceReplaced: a rank of Addr registered with a new instance_id;
	// the old instance and its bindings are forgotten. The rooms of Addr
	// still handing off fail with Message (prefill lost).
	InstanceReplaced
	// RankReplaced: Rank re-registered with a new endpoint. The rooms of
	// Addr bound to Rank.DP and still handing off fail with Message
	// (prefill lost).
	RankReplaced
	// InstanceComplete: every expected rank of Addr registered; Instance
	// holds its topology and its complete rank plan. Rooms waiting for Addr
	// go on.
	InstanceComplete
	// HeartbeatMissed: Count ranks of Addr were found with more whole
	// heartbeat intervals missed than at the previous check (one count per
	// such rank; an interval is counted once although checks run more often).
	HeartbeatMissed
	// InstanceLost: a rank of Addr was silent for MaxFailures heartbeat
	// intervals; the instance and its bindings are forgotten. Silent lists
	// the silent ranks (at most MaxListedRanks, longest silent first) of
	// SilentTotal; LostMessage is the rooms' failure (prefill lost). From
	// Lose, Message is the reason instead (and Silent is empty).
	InstanceLost
	// RoomBound: BindRoom recorded Room → DP at Addr.
	RoomBound
	// BindConflict: BindRoom reported a DP rank that follow_bootstrap_room
	// contradicts. Room, if open at Addr and still handing off, fails with
	// Message (DP rank conflict).
	BindConflict
)

// Event is one thing a mutating call did that rooms depend on. The
// registry returns events in the order they happened; the room manager
// applies them in that order, after the registry's lock is released. Only
// the fields its Kind documents are set.
type Event struct {
	Kind     EventKind
	Addr     string
	Rank     RankID
	Room     uint64
	DP       int
	Replaced bool
	Count    int
	Instance Instance
	Message  string

	Silent      []SilentRank
	SilentTotal int
	Interval    time.Duration
	MaxFailures int
}

// SilentList renders an InstanceLost event's silent ranks ("dp 0 cp 0 tp 1
// pp 0 for 10s, ..., and N more").
func (e Event) SilentList() string { return describeSilent(e.Silent, e.SilentTotal) }

// LostMessage is an InstanceLost event's room failure, naming how many
// requests it affects (rooms: the room manager's count). An instance lost
// by Lose is worded by its reason.
func (e Event) LostMessage(rooms int) string {
	if e.Message != "" {
		return fmt.Sprintf("Lost connection with prefill instance (bootstrap_addr: %s), %d requests affected: %s", e.Addr, rooms, e.Message)
	}
	return fmt.Sprintf(
		"Lost connection with prefill instance (bootstrap_addr: %s), %d requests affected; silent ranks (no heartbeat within %d × %s): %s",
		e.Addr, rooms, e.MaxFailures, e.Interval, e.SilentList())
}

// Instance is a view of one registered prefill instance, copied under the
// registry's lock. Plan is shared and read-only.
type Instance struct {
	Addr       string
	Topology   PrefillTopology
	Plan       *Plan
	Registered int
	Expected   int
	Complete   bool
}

// InstanceStatus is one known instance for operators.
type InstanceStatus struct {
	Addr string
	// InstanceID is the instance's incarnation as its ranks registered it
	// ("" when they gave none): a new one at the same address replaces the
	// instance.
	InstanceID       string
	Registered       int
	Expected         int
	Topology         PrefillTopology
	LastHeartbeat    time.Time
	MissedHeartbeats int
	// SilentRanks are the ranks that missed at least one heartbeat interval,
	// longest silent first (at most MaxListedRanks); SilentRankCount counts
	// them all.
	SilentRanks     []SilentRank
	SilentRankCount int
}

// Lookup is LookupDPRanks's answer: the rooms resolved (nil when none), the
// rooms no rule resolves (never guessed), and how many each rule resolved.
type Lookup struct {
	Resolved   []DPResolution
	Unresolved []uint64
	ByRule     [NumDPRules]int
}
