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
	return errors.Join(append(errs, checkDeclared("", x.GetPageIndices(), x.GetMetadataSlot(), x.GetState(), x.GetDecodePrefixLen())...)...)
}

// checkDeclared checks a declared destination's fields, named under at
// ("" or "rooms[3]."): DeclareDestinationRequest's, and a ResyncRoom's in
// flight.
func checkDeclared(at string, pages []int32, slot int32, state []*StateIndices, prefix uint32) []error {
	var errs []error
	if n := len(pages); n > MaxPages {
		errs = append(errs, fieldErr(at+"page_indices", "has %d entries (at most %d)", n, MaxPages))
	} else {
		errs = append(errs, checkIndices(at+"page_indices", pages))
	}
	if slot < 0 {
		errs = append(errs, fieldErr(at+"metadata_slot", "%d is not a metadata row (rows are 0..metadata slots-1)", slot))
	}
	errs = append(errs, checkMax(at+"decode_prefix_len", uint64(prefix), MaxTokens))
	return append(errs, checkStates(at+"state", state, MaxDeclaredStates)...)
}

// checkStates checks a list of typed state indices named f (a
// declaration's, a resync's, a chunk's source): at most most entries, each
// of a state type named once, its indices within their bounds.
func checkStates(f string, state []*StateIndices, most int) []error {
	if len(state) > most {
		return []error{fieldErr(f, "has %d entries (at most %d: one per state type)", len(state), most)}
	}
	var errs []error
	seen := map[StateType]int{}
	for i, s := range state {
		fi := fmt.Sprintf("%s[%d]", f, i)
		if s == nil {
			errs = append(errs, fieldErr(fi, "is empty"))
			continue
		}
		t := s.GetType()
		if _, ok := StateType_name[int32(t)]; !ok || t == StateType_STATE_TYPE_UNSPECIFIED {
			errs = append(errs, fieldErr(fi+".type", "%d is not a state type (allowed STATE_TYPE_MAMBA, STATE_TYPE_SWA, STATE_TYPE_DSA)", int32(t)))
		} else if j, dup := seen[t]; dup {
			errs = append(errs, fieldErr(fi+".type", "%s is named twice (also %s[%d])", t, f, j))
		} else {
			seen[t] = i
		}
		if n := len(s.GetIndices()); n > MaxPages {
			errs = append(errs, fieldErr(fi+".indices", "has %d entries (at most %d)", n, MaxPages))
		} else {
			errs = append(errs, checkIndices(fi+".indices", s.GetIndices()))
		}
	}
	return errs
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
