package room

import (
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
	"github.com/decodeplane/decodeplane/transfer"
)

// KVPoll is SGLang's per-room status with SGLang's numbers
// (disaggregation/base/conn.py): statuses only move forward and Failed is
// terminal.
type KVPoll int

// KVPoll values.
const (
	PollFailed          KVPoll = 0
	PollBootstrapping   KVPoll = 1
	PollWaitingForInput KVPoll = 2
	PollTransferring    KVPoll = 3
	PollSuccess         KVPoll = 4
)

func (p KVPoll) String() string {
	switch p {
	case PollFailed:
		return "Failed"
	case PollBootstrapping:
		return "Bootstrapping"
	case PollWaitingForInput:
		return "WaitingForInput"
	case PollTransferring:
		return "Transferring"
	case PollSuccess:
		return "Success"
	}
	return fmt.Sprintf("KVPoll(%d)", int(p))
}

// Phase is where a room is in decodeplane's lifecycle; it refines KVPoll.
type Phase uint8

// Phases, in lifecycle order.
const (
	PhaseUnspecified Phase = iota
	// PhaseWaitingPrefill: the prefill instance has not completed its
	// registration (KVPoll Bootstrapping).
	PhaseWaitingPrefill
	// PhaseResolvingDP: waiting for the prefill DP rank (Bootstrapping).
	PhaseResolvingDP
	// PhaseQueued: handshake done, waiting for admission (WaitingForInput).
	PhaseQueued
	// PhaseAdmitted: pages pre-allocated, destination offered (WaitingForInput).
	PhaseAdmitted
	// PhaseClaimed: every required prefill rank received the destination
	// (WaitingForInput); the waiting timeout runs.
	PhaseClaimed
	// PhaseTransferring: at least one chunk landed (Transferring).
	PhaseTransferring
	// PhaseSucceeded: all KV landed and the metadata slot holds the room's
	// marker (Success); the decode engine owns the pages until release.
	PhaseSucceeded
	// PhaseReleased: terminal; the engine released the room.
	PhaseReleased
	// PhaseFailed: terminal; failed or aborted.
	PhaseFailed
	// PhaseRetracted: a running room whose pages were retracted (Success).
	PhaseRetracted
	// PhaseHeld: a running room held for rebootstrap (Success).
	PhaseHeld
)

var phaseNames = [...]string{"unspecified", "waiting_prefill", "resolving_dp_rank", "queued", "admitted", "claimed", "transferring", "succeeded", "released", "failed", "retracted", "held"}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("Phase(%d)", int(p))
	}
	return phaseNames[p]
}

// ParsePhase parses a phase name as printed by String.
func ParsePhase(s string) (Phase, bool) {
	for i, n := range phaseNames {
		if n == s && i != 0 {
			return Phase(i), true
		}
	}
	return PhaseUnspecified, false
}

// Poll returns the KVPoll a phase reports.
func (p Phase) Poll() KVPoll {
	switch p {
	case PhaseWaitingPrefill, PhaseResolvingDP:
		return PollBootstrapping
	case PhaseQueued, PhaseAdmitted, PhaseClaimed:
		return PollWaitingForInput
	case PhaseTransferring:
		return PollTransferring
	case PhaseSucceeded, PhaseReleased, PhaseRetracted, PhaseHeld:
		return PollSuccess
	}
	return PollFailed
}

// Terminal reports whether the room has ended and holds nothing.
func (p Phase) Terminal() bool { return p == PhaseReleased || p == PhaseFailed }

// FailureCode classifies a room failure.
type FailureCode int

// Failure codes (mirrored by decodeplane.v1.FailureCode).
const (
	FailureUnspecified FailureCode = iota
	FailureAborted
	FailurePrefillUnavailable
	FailurePrefillLost
	FailureDPRankUnresolved
	FailureDPRankConflict
	FailureBootstrapTimeout
	FailureClaimTimeout
	FailureWaitingTimeout
	FailureTransferFailed
	FailureMetadataCorruption
	FailureStagingFailed
	FailureShutdown
	FailureRetractTimeout
	// FailureDeadlineExceeded: the request's deadline (OpenRoom's timeout)
	// passed before its hand-off succeeded.
	FailureDeadlineExceeded
)

var failureNames = [...]string{"unspecified", "aborted", "prefill_unavailable", "prefill_lost", "dp_rank_unresolved", "dp_rank_conflict", "bootstrap_timeout", "claim_timeout", "waiting_timeout", "transfer_failed", "metadata_corruption", "staging_failed", "shutdown", "retract_timeout", "deadline_exceeded"}

func (c FailureCode) String() string {
	if c < 0 || int(c) >= len(failureNames) {
		return fmt.Sprintf("FailureCode(%d)", int(c))
	}
	return failureNames[c]
}

// Failure is why a room failed; Message uses SGLang's wording where SGLang
// has one.
type Failure struct {
	Code            FailureCode
	Message         string
	FromAnotherRank bool
}

func (f Failure) Error() string { return f.Message }

// Transition is one step of a room's timeline.
type Transition struct {
	Phase   Phase
	Poll    KVPoll
	At      time.Time
	SGLang  string // SGLang's decode transitions T1–T23 (docs/sglang-transitions.md), "" where decodeplane adds a step
	Note    string
	Attempt uint32
}

// Destination is what a prefill rank needs to write a room's KV.
type Destination struct {
	Room               uint64
	DecodeDP           int
	Pages              []int32 // a copy; safe to keep
	PageSize           int
	FillLen            int
	MetadataSlot       int32
	State              []kvlayout.StateIndices
	RequiredDstInfoNum int
	DecodePrefixLen    int
	Targets            []transfer.Target
	Dummy              bool
	Staging            bool
	Attempt            uint32
	// TokenBytes and StateBytes weigh a chunk of this rank (transfer.RankWeights):
	// tokens x TokenBytes, plus StateBytes with the last chunk. With the
	// decode engine's buffer layouts (Layouts) a chunk weighs its pages x
	// PageBytes, plus AuxBytes and StateBytes with the last chunk
	// (transfer.LayoutWeights), and TokenBytes is 0.
	TokenBytes int64
	StateBytes int64
	PageBytes  int64
	AuxBytes   int64
	// Layouts are the decode engine's buffer layouts of the room's shard
	// (index = decode TP rank; nil: decodeplane's own buffers).
	Layouts []*kvlayout.BufferLayout
}

// Snapshot is a room's state at one moment.
type Snapshot struct {
	Room             uint64
	RID              string
	Addr             string
	DecodeDP         int
	PrefillDP        int // -1 until resolved
	DPRule           ranks.DPRule
	Poll             KVPoll
	Phase            Phase
	Failure          *Failure
	PromptLen        int
	MaxNewTokens     int
	Priority         int
	NumPages         int
	MetadataSlot     int32 // -1 until admitted
	BytesTransferred uint64
	ChunksDone       int
	OpenedAt         time.Time
	UpdatedAt        time.Time
	Attempt          uint32
	Transitions      []Transition // filled when asked
	Pages            []int32      // filled when asked
	TraceID          string
	Staging          bool
	// Coverage is, per required prefill rank of the current attempt, how
	// many destination pages landed (empty before the plan is known).
	Coverage []RankCoverage
	// WaitingFor says what a room that has not ended waits for and which
	// bound ends the wait; empty for ended rooms.
	WaitingFor string
	// Timeout is the request's time budget (OpenRoom's timeout, 0: none)
	// and Deadline when it ends (OpenedAt + Timeout; zero without one). It
	// bounds the first attempt's hand-off.
	Timeout  time.Duration
	Deadline time.Time
	// PhaseTimes is the time the current attempt's hand-off spent in each
	// phase it left, in the order entered (filled when asked: GetRoom; the
	// phase a live room is in started at UpdatedAt).
	PhaseTimes []PhaseTime
}

// PhaseTime is the time a room's hand-off spent in one of its phases
// (waiting_prefill through transferring): the budget that phase used.
type PhaseTime struct {
	Phase Phase
	Spent time.Duration
}

// Change is one transition and the room's state after it (what a watcher
// of the room receives).
type Change struct {
	Room       Snapshot
	Transition Transition
	Terminal   bool
	// PagesReusable: the room ended and gave its pages, rows and slots
	// back: nothing may write into them any more, so the engine may reuse
	// them. A room whose end had to wait (its drain, a transfer in flight,
	// a quarantine) gets one more step with it, after its terminal one.
	PagesReusable bool
	// Seq is the transition's position in the room's timeline (1: its
	// opening).
	Seq uint32
}

// DestinationEvent is what a prefill rank's claim stream carries: exactly
// one of Destination, Failure or Done.
type DestinationEvent struct {
	Destination *Destination
	Failure     *Failure
	Done        *Phase // the room succeeded (or was released): nothing more comes
	// AckRequired (with Failure): this rank must call AckRoomEnd once it
	// stopped writing (deferred release, drain.go).
	AckRequired bool
	// Refused (with Failure, which says the same): the claim itself was
	// refused when its room opened (the rank is not a source of the room,
	// or no longer registered), the room is not failed by it. The unary
	// AwaitDestination ends with it as its status.
	Refused error
}
