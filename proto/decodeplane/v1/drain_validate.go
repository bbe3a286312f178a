package decodeplanev1

import "errors"

// Validate implements the validator interceptor's contract.
func (x *AckRoomEndRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	if x.GetAttempt() == 0 {
		errs = append(errs, fieldErr("attempt", "must be >= 1: the destination's attempt (Destination.attempt)"))
	}
	errs = append(errs, checkMax("attempt", uint64(x.GetAttempt()), MaxAttempt))
	return errors.Join(errs...)
}
