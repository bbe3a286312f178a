package decodeplanev1

import (
	"errors"
	"fmt"
)

// Bounds of Rooms.Resync (see the ResyncRoom and ResyncRequest comments).
const (
	// MaxResyncRooms bounds the rooms of one Resync call.
	MaxResyncRooms = 4096
	// MaxMambaSlots bounds a ResyncRoom's mamba_slots.
	MaxMambaSlots = 16
)

// Validate implements the validator interceptor's contract: every problem
// of every room, each named by its path (rooms[3].page_indices).
func (x *ResyncRequest) Validate() error {
	if n := len(x.GetRooms()); n > MaxResyncRooms {
		return fieldErr("rooms", "has %d entries (at most %d per call: send the rest in further calls, the last with done)", n, MaxResyncRooms)
	}
	var rep repeated
	for i, r := range x.GetRooms() {
		if r == nil {
			continue
		}
		rep.Add(r.validate(fmt.Sprintf("rooms[%d]", i)))
	}
	return rep.Err("rooms")
}

func (x *ResyncRoom) validate(at string) error {
	f := func(name string) string { return at + "." + name }
	errs := []error{checkRoom(f("room"), x.GetRoom()), checkLen(f("rid"), x.GetRid(), true, MaxRIDLen, "the request id")}
	if x.GetPromptLen() == 0 {
		errs = append(errs, fieldErr(f("prompt_len"), "must be > 0 (len(origin_input_ids), allowed 1..%d)", MaxTokens))
	}
	errs = append(errs,
		checkTokens(f("prompt_len"), x.GetRid(), x.GetPromptLen()),
		checkTokens(f("output_len"), x.GetRid(), x.GetOutputLen()),
		checkTokens(f("max_new_tokens"), x.GetRid(), x.GetMaxNewTokens()),
		checkMax(f("decode_dp_rank"), uint64(x.GetDecodeDpRank()), MaxRank))
	if x.GetMaxNewTokens() == 0 {
		errs = append(errs, fieldErr(f("max_new_tokens"), "must be > 0 (allowed 1..%d)", MaxTokens))
	}
	if x.GetInFlight() {
		return errors.Join(append(errs, x.validateInFlight(f)...)...)
	}
	if x.GetReqSlot() <= 0 {
		errs = append(errs, fieldErr(f("req_slot"), "%d is not a req_to_token row (rows are 1..request slots + pre-alloc slots)", x.GetReqSlot()))
	}
	np := len(x.GetPageIndices())
	switch {
	case np == 0:
		errs = append(errs, fieldErr(f("page_indices"), "is empty: a running room holds ceil((prompt_len + output_len) / page_size) pages"))
	case np > MaxPages:
		errs = append(errs, fieldErr(f("page_indices"), "has %d entries (at most %d)", np, MaxPages))
	}
	errs = append(errs, checkIndices(f("page_indices"), x.GetPageIndices()))
	if n := len(x.GetSwaPageIndices()); n > np {
		errs = append(errs, fieldErr(f("swa_page_indices"), "has %d entries for %d pages (at most one per page)", n, np))
	} else {
		errs = append(errs, checkIndices(f("swa_page_indices"), x.GetSwaPageIndices()))
	}
	if n := len(x.GetMambaSlots()); n > MaxMambaSlots {
		errs = append(errs, fieldErr(f("mamba_slots"), "has %d entries (at most %d)", n, MaxMambaSlots))
	} else {
		errs = append(errs, checkIndices(f("mamba_slots"), x.GetMambaSlots()))
	}
	if a := x.GetBootstrapAddr(); a != "" {
		errs = append(errs, checkAddr(f("bootstrap_addr"), a))
	}
	if x.PrefillDpRank != nil && x.GetPrefillDpRank() > MaxRank {
		errs = append(errs, fieldErr(f("prefill_dp_rank"), "%d is not a plausible DP rank (allowed 0..%d)", x.GetPrefillDpRank(), MaxRank))
	}
	return errors.Join(errs...)
}

// validateInFlight checks a hand-off in flight (in_flight): a declaration's
// fields, as DeclareDestinationRequest's.
func (x *ResyncRoom) validateInFlight(f func(string) string) []error {
	errs := checkDeclared(f(""), x.GetPageIndices(), x.GetMetadataSlot(), x.GetState(), x.GetDecodePrefixLen())
	if len(x.GetPageIndices()) == 0 {
		errs = append(errs, fieldErr(f("page_indices"), "is empty: a hand-off in flight holds the pages of ceil((prompt_len - decode_prefix_len) / page_size) tokens"))
	}
	if a := x.GetBootstrapAddr(); a != "" {
		errs = append(errs, checkAddr(f("bootstrap_addr"), a))
	}
	if x.PrefillDpRank != nil && x.GetPrefillDpRank() > MaxRank {
		errs = append(errs, fieldErr(f("prefill_dp_rank"), "%d is not a plausible DP rank (allowed 0..%d)", x.GetPrefillDpRank(), MaxRank))
	}
	return errs
}

// checkIndices refuses a negative index (the first one); ranges, repeats
// and ownership are the ledger's to check.
func checkIndices(field string, idx []int32) error {
	for i, v := range idx {
		if v < 0 {
			return fieldErr(fmt.Sprintf("%s[%d]", field, i), "%d is negative (indices are 0..pool size - 1)", v)
		}
	}
	return nil
}
