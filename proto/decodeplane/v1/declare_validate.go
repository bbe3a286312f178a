package decodeplanev1

import (
	"errors"
	"fmt"
)

// Bounds of Rooms.DeclareDestination and Capacity.ReportCapacity (see
// their messages' comments).
const (
	// MaxDeclaredStates bounds DeclareDestinationRequest.state: one entry
	// per state type.
	MaxDeclaredStates = 4
	// MaxCapacityFigure bounds ReportCapacityRequest's 64-bit figures.
	MaxCapacityFigure = 1 << 40
	// MaxCapacityCount bounds its 32-bit counts.
	MaxCapacityCount = 1<<31 - 1
)

// Validate implements the validator interceptor's contract: every problem,
// each named by its path (page_indices[3], state[1].type). The pool's
// ranges, the page count and ownership are the daemon's to check.
func (x *DeclareDestinationRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom())}
	switch n := len(x.GetPageIndices()); {
	case n > MaxPages:
		errs = append(errs, fieldErr("page_indices", "has %d entries (at most %d)", n, MaxPages))
	default:
		errs = append(errs, checkIndices("page_indices", x.GetPageIndices()))
	}
	if x.GetMetadataSlot() < 0 {
		errs = append(errs, fieldErr("metadata_slot", "%d is not a metadata row (rows are 0..metadata slots-1)", x.GetMetadataSlot()))
	}
	errs = append(errs, checkMax("decode_prefix_len", uint64(x.GetDecodePrefixLen()), MaxTokens))
	st := x.GetState()
	if len(st) > MaxDeclaredStates {
		return errors.Join(append(errs, fieldErr("state", "has %d entries (at most %d: one per state type)", len(st), MaxDeclaredStates))...)
	}
	seen := map[StateType]int{}
	for i, s := range st {
		at := fmt.Sprintf("state[%d]", i)
		if s == nil {
			errs = append(errs, fieldErr(at, "is empty"))
			continue
		}
		t := s.GetType()
		if _, ok := StateType_name[int32(t)]; !ok || t == StateType_STATE_TYPE_UNSPECIFIED {
			errs = append(errs, fieldErr(at+".type", "%d is not a state type (allowed STATE_TYPE_MAMBA, STATE_TYPE_SWA, STATE_TYPE_DSA)", int32(t)))
		} else if j, dup := seen[t]; dup {
			errs = append(errs, fieldErr(at+".type", "%s is named twice (also state[%d])", t, j))
		} else {
			seen[t] = i
		}
		if n := len(s.GetIndices()); n > MaxPages {
			errs = append(errs, fieldErr(at+".indices", "has %d entries (at most %d)", n, MaxPages))
		} else {
			errs = append(errs, checkIndices(at+".indices", s.GetIndices()))
		}
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ReportCapacityRequest) Validate() error {
	return errors.Join(
		checkMax("decode_dp_rank", uint64(x.GetDecodeDpRank()), MaxRank),
		checkMax("tokens_free", x.GetTokensFree(), MaxCapacityFigure),
		checkMax("pages_free", x.GetPagesFree(), MaxCapacityFigure),
		checkMax("req_slots_free", uint64(x.GetReqSlotsFree()), MaxCapacityCount),
		checkMax("metadata_slots_free", uint64(x.GetMetadataSlotsFree()), MaxCapacityCount),
		checkMax("state_slots_free", x.GetStateSlotsFree(), MaxCapacityFigure),
		checkMax("queue_depth", uint64(x.GetQueueDepth()), MaxCapacityCount),
		checkMax("running", uint64(x.GetRunning()), MaxCapacityCount),
	)
}
