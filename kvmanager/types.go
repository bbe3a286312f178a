package kvmanager

import "github.com/decodeplane/decodeplane/kvmanager/room"

// The room's value types (package room owns the state machine), re-exported
// so that callers of the Manager (the server, the fleet, client code) keep
// one import.
type (
	KVPoll           = room.KVPoll
	Phase            = room.Phase
	FailureCode      = room.FailureCode
	Failure          = room.Failure
	Transition       = room.Transition
	Destination      = room.Destination
	RoomSnapshot     = room.Snapshot
	RoomEvent        = room.Change
	DestinationEvent = room.DestinationEvent
	RankCoverage     = room.RankCoverage
	ChunkRequest     = room.ChunkRequest
	AckResult        = room.AckResult
	PhaseTime        = room.PhaseTime
)

// KVPoll values (SGLang's numbers).
const (
	PollFailed          = room.PollFailed
	PollBootstrapping   = room.PollBootstrapping
	PollWaitingForInput = room.PollWaitingForInput
	PollTransferring    = room.PollTransferring
	PollSuccess         = room.PollSuccess
)

// Phases, in lifecycle order.
const (
	PhaseUnspecified    = room.PhaseUnspecified
	PhaseWaitingPrefill = room.PhaseWaitingPrefill
	PhaseResolvingDP    = room.PhaseResolvingDP
	PhaseQueued         = room.PhaseQueued
	PhaseAdmitted       = room.PhaseAdmitted
	PhaseClaimed        = room.PhaseClaimed
	PhaseTransferring   = room.PhaseTransferring
	PhaseSucceeded      = room.PhaseSucceeded
	PhaseReleased       = room.PhaseReleased
	PhaseFailed         = room.PhaseFailed
	PhaseRetracted      = room.PhaseRetracted
	PhaseHeld           = room.PhaseHeld
)

// ParsePhase parses a phase name as printed by Phase.String.
func ParsePhase(s string) (Phase, bool) { return room.ParsePhase(s) }

// Failure codes (mirrored by decodeplane.v1.FailureCode).
const (
	FailureUnspecified        = room.FailureUnspecified
	FailureAborted            = room.FailureAborted
	FailurePrefillUnavailable = room.FailurePrefillUnavailable
	FailurePrefillLost        = room.FailurePrefillLost
	FailureDPRankUnresolved   = room.FailureDPRankUnresolved
	FailureDPRankConflict     = room.FailureDPRankConflict
	FailureBootstrapTimeout   = room.FailureBootstrapTimeout
	FailureClaimTimeout       = room.FailureClaimTimeout
	FailureWaitingTimeout     = room.FailureWaitingTimeout
	FailureTransferFailed     = room.FailureTransferFailed
	FailureMetadataCorruption = room.FailureMetadataCorruption
	FailureStagingFailed      = room.FailureStagingFailed
	FailureShutdown           = room.FailureShutdown
	FailureRetractTimeout     = room.FailureRetractTimeout
	FailureDeadlineExceeded   = room.FailureDeadlineExceeded
)

// MaxRoomTimeout bounds OpenRequest.Timeout (room.MaxTimeout).
const MaxRoomTimeout = room.MaxTimeout
