package kvmanager

import (
	"errors"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// Errors returned by the Manager. The server maps them to gRPC codes with
// errors.Is; ledger errors (prealloc.Err*) and the engine's
// (transfer.ErrTransferFailed, transfer.ErrEngineUnavailable) pass through
// wrapped.
var (
	// ErrRoomNotFound: the room is unknown (never opened, or forgotten after
	// its retention). NotFound.
	ErrRoomNotFound = errors.New("room not found")
	// ErrRoomExists: a room with this id is open under another idempotency
	// key. AlreadyExists.
	ErrRoomExists = errors.New("room already exists")
	// ErrPrefillNotFound: the prefill instance or rank is not registered (or
	// was declared dead). NotFound. The registry's value.
	ErrPrefillNotFound = registry.ErrPrefillNotFound
	// ErrPrefillMismatch: the prefill's layout cannot serve this decode side
	// (page size, KV dtype, parallel sizes, model facts). FailedPrecondition.
	// The registry's value.
	ErrPrefillMismatch = registry.ErrPrefillMismatch
	// ErrWrongState: the operation does not apply to the room now.
	// FailedPrecondition.
	ErrWrongState = room.ErrWrongState
	// ErrDPRankConflict: a binding contradicts follow_bootstrap_room or an
	// earlier resolution. FailedPrecondition. The registry's value.
	ErrDPRankConflict = registry.ErrDPRankConflict
	// ErrRegistryUnavailable: the fleet's shared registry (etcd) cannot
	// be reached, so a registration cannot be shared with the other daemons
	// and is refused (Unavailable, retry); rooms keep flowing on the cached
	// view meanwhile.
	ErrRegistryUnavailable = errors.New("the fleet registry is unavailable")
	// ErrDraining: the daemon no longer opens rooms. Unavailable.
	ErrDraining = errors.New("decodeplane is draining")
	// ErrTooManyWaiters: too many claims wait for rooms that are not open.
	// ResourceExhausted.
	ErrTooManyWaiters = errors.New("too many claims for rooms that are not open")
	// ErrSlowConsumer: a watch stream did not keep up and was dropped.
	// ResourceExhausted; watch again.
	ErrSlowConsumer = errors.New("watch stream too slow; events were dropped")
)

// InvalidError is a request field with a bad value. InvalidArgument. The
// registry's, the staging handler's and the engines' field errors are this
// same type (kvlayout.Invalid), so they reach the server as they are.
type InvalidError = kvlayout.Invalid

func invalid(field, format string, args ...any) error {
	return kvlayout.Invalidf(field, format, args...)
}

// RetryError carries a retry hint for ResourceExhausted answers.
type RetryError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }
