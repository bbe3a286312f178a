package decodeplanev1

import (
	"errors"
	"fmt"
)

// Wire-shape checks of the Staging service (see validate.go).

// MaxWatchTPRanks bounds WatchWatermarkRequest.decode_tp_ranks.
const MaxWatchTPRanks = 1024

// maxOutputIDs is what a 64-byte metadata slot holds after the 8-byte marker.
const maxOutputIDs = 14

// Validate implements the validator interceptor's contract.
func (x *SetupStagingRequest) Validate() error { return x.GetRank().validate("rank") }

// Validate implements the validator interceptor's contract.
func (x *AllocateStagingRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	if x.GetNumPages() == 0 {
		errs = append(errs, fieldErr("num_pages", "must be > 0 (the chunk's page count)"))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ChunkReadyRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	if x.GetNumPages() == 0 {
		errs = append(errs, fieldErr("num_pages", "must be > 0 (the region's page count)"))
	}
	if a := x.GetAux(); a != nil {
		if !x.GetLast() && (a.GetRoomMarker() != 0 || len(a.GetOutputIds()) > 0) {
			errs = append(errs, fieldErr("aux", "is set on a chunk that is not the last: only the last chunk carries the metadata"))
		}
		if n := len(a.GetOutputIds()); n > maxOutputIDs {
			errs = append(errs, fieldErr("aux.output_ids", "has %d ids; a 64-byte metadata slot holds at most %d", n, maxOutputIDs))
		}
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *WatchWatermarkRequest) Validate() error {
	if n := len(x.GetDecodeTpRanks()); n > MaxWatchTPRanks {
		return fieldErr("decode_tp_ranks", "has %d entries (at most %d)", n, MaxWatchTPRanks)
	}
	for i, tp := range x.GetDecodeTpRanks() {
		if tp >= MaxWatchTPRanks {
			return fieldErr(fmt.Sprintf("decode_tp_ranks[%d]", i), "%d is not a plausible TP rank", tp)
		}
	}
	return nil
}
