package room

import (
	"errors"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Errors a room answers with; callers branch with errors.Is.
var (
	// ErrWrongState: the operation does not apply to the room now.
	// FailedPrecondition.
	ErrWrongState = errors.New("operation not valid in the room's state")
	// ErrStaleAttempt: an acknowledgement names an attempt (generation)
	// that is not the room's current one; it changes nothing.
	ErrStaleAttempt = errors.New("stale attempt")
)

func invalid(field, format string, args ...any) error {
	return kvlayout.Invalidf(field, format, args...)
}
