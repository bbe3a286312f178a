package registry

import (
	"errors"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// Errors returned by the Registry (kvmanager re-exports the same values, so
// errors.Is holds on either name).
var (
	// ErrPrefillNotFound: the prefill instance or rank is not registered (or
	// was declared dead). NotFound.
	ErrPrefillNotFound = ranks.ErrPrefillNotFound
	// ErrPrefillMismatch: the prefill's layout cannot serve this decode side
	// (page size, KV dtype, parallel sizes, model facts). FailedPrecondition.
	ErrPrefillMismatch = errors.New("prefill incompatible with the decode side")
	// ErrDPRankConflict: a binding contradicts follow_bootstrap_room or an
	// earlier resolution. FailedPrecondition.
	ErrDPRankConflict = ranks.ErrDPRankConflict
)

// InvalidError is a request field with a bad value (InvalidArgument): the
// domain's one field error (kvlayout.Invalid, kvmanager.InvalidError).
type InvalidError = kvlayout.Invalid

func invalid(field, format string, args ...any) error {
	return kvlayout.Invalidf(field, format, args...)
}
