package decodeplanev1

import (
	"errors"
	"math"
)

// Validate implements the validator interceptor's contract. The attempt is
// a generation the daemon handed out (Destination.attempt): any uint32 but
// 0; an attempt that is not the room's current one is the domain's
// refusal (FAILED_PRECONDITION STALE_ATTEMPT), not a bound.
func (x *AckRoomEndRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	if x.GetAttempt() == 0 {
		errs = append(errs, fieldErr("attempt", "0 is out of range (allowed 1..%d): the destination's attempt (Destination.attempt)", uint32(math.MaxUint32)))
	}
	return errors.Join(errs...)
}
