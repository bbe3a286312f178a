package decodeplanev1

import (
	"errors"
	"fmt"
)

// Wire-shape checks of the Staging service (see validate.go).

// MaxWatchTPRanks bounds WatchWatermarkRequest.decode_tp_ranks (length and
// values).
const MaxWatchTPRanks = 1024

// Validate implements the validator interceptor's contract.
func (x *SetupStagingRequest) Validate() error { return x.GetRank().validate("rank") }

// Validate implements the validator interceptor's contract.
func (x *AllocateStagingRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank"),
		checkMax("chunk_index", uint64(x.GetChunkIndex()), MaxChunkIndex)}
	switch {
	case x.GetNumPages() == 0:
		errs = append(errs, fieldErr("num_pages", "must be > 0 (the chunk's page count, allowed 1..%d)", MaxPages))
	case x.GetNumPages() > MaxPages:
		errs = append(errs, fieldErr("num_pages", "%d is out of range (allowed 1..%d)", x.GetNumPages(), MaxPages))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ChunkReadyRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	errs = append(errs, checkChunk(x.GetChunkIndex(), x.GetPageOffset(), x.GetNumPages(), false, "the region's page count")...)
	errs = append(errs, checkAux(x.GetAux(), x.GetLast())...)
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *WatchWatermarkRequest) Validate() error {
	errs := []error{checkMax("decode_dp_rank", uint64(x.GetDecodeDpRank()), MaxRank)}
	if n := len(x.GetDecodeTpRanks()); n > MaxWatchTPRanks {
		return errors.Join(append(errs, fieldErr("decode_tp_ranks", "has %d entries (at most %d)", n, MaxWatchTPRanks))...)
	}
	var rep repeated
	for i, tp := range x.GetDecodeTpRanks() {
		if tp >= MaxWatchTPRanks {
			rep.Add(fieldErr(fmt.Sprintf("decode_tp_ranks[%d]", i), "%d is not a plausible TP rank (allowed 0..%d)", tp, MaxWatchTPRanks-1))
		}
	}
	return errors.Join(append(errs, rep.Err("decode_tp_ranks"))...)
}
