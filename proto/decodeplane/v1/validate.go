package decodeplanev1

import (
	"errors"
	"fmt"
	"net"
	"strconv"
)

// Wire-shape checks, enforced by the validator interceptor (InvalidArgument).
// Each error names the field, the value given and what is allowed. Domain
// rules (a DP rank within the prefill's dp_size, a page range within the
// destination) are checked by the domain packages.

const maxRoom = 1<<63 - 1

// Limits on repeated fields, to bound the work of one call.
const (
	MaxLookupRooms  = 100000
	MaxRunningRooms = 100000
	MaxListLimit    = 100000
	maxRIDLen       = 512
)

func fieldErr(field string, format string, args ...any) error {
	return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
}

func checkRoom(field string, room uint64) error {
	if room > maxRoom {
		return fieldErr(field, "%d is out of range: bootstrap rooms are in [0, 2^63-1]", room)
	}
	return nil
}

func checkAddr(field, addr string) error {
	if addr == "" {
		return fieldErr(field, "is required: the prefill instance's bootstrap address, \"host:port\"")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fieldErr(field, "%q is not \"host:port\"", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fieldErr(field, "%q has an invalid port (allowed 1..65535)", addr)
	}
	return nil
}

// validate checks a PrefillRank named by field.
func (x *PrefillRank) validate(field string) error {
	if x == nil {
		return fieldErr(field, "is required")
	}
	return checkAddr(field+".bootstrap_addr", x.GetBootstrapAddr())
}

func checkRank(field string, rank, size uint32, sizeName string) error {
	s := max(size, 1)
	if rank >= s {
		return fieldErr(field, "%d is out of range: %s is %d (allowed 0..%d)", rank, sizeName, s, s-1)
	}
	return nil
}

// Validate implements the validator interceptor's contract.
func (x *RegisterPrefillRequest) Validate() error {
	errs := []error{checkAddr("bootstrap_addr", x.GetBootstrapAddr())}
	if x.GetRankEndpoint() == "" {
		errs = append(errs, fieldErr("rank_endpoint", "is required: this rank's own endpoint, \"rank_ip:rank_port\""))
	}
	p := x.GetParallel()
	if p == nil {
		errs = append(errs, fieldErr("parallel", "is required"))
	} else {
		if p.GetAttnTpSize() == 0 {
			errs = append(errs, fieldErr("parallel.attn_tp_size", "must be >= 1"))
		}
		if p.GetPpSize() == 0 {
			errs = append(errs, fieldErr("parallel.pp_size", "must be >= 1"))
		}
		errs = append(errs,
			checkRank("parallel.attn_tp_rank", p.GetAttnTpRank(), p.GetAttnTpSize(), "parallel.attn_tp_size"),
			checkRank("parallel.attn_cp_rank", p.GetAttnCpRank(), p.GetAttnCpSize(), "parallel.attn_cp_size"),
			checkRank("parallel.attn_dp_rank", p.GetAttnDpRank(), p.GetAttnDpSize(), "parallel.attn_dp_size"),
			checkRank("parallel.pp_rank", p.GetPpRank(), p.GetPpSize(), "parallel.pp_size"),
			checkRank("parallel.system_dp_rank", p.GetSystemDpRank(), p.GetSystemDpSize(), "parallel.system_dp_size"),
		)
	}
	if ps := x.GetPageSize(); ps == 0 || ps&(ps-1) != 0 {
		errs = append(errs, fieldErr("page_size", "%d must be a power of two (the prefill's --page-size)", ps))
	}
	if x.GetKvCacheDtype() == "" {
		errs = append(errs, fieldErr("kv_cache_dtype", "is required (the prefill's --kv-cache-dtype)"))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *HeartbeatRequest) Validate() error { return x.GetRank().validate("rank") }

// Validate implements the validator interceptor's contract.
func (x *BindRoomRequest) Validate() error {
	return errors.Join(checkAddr("bootstrap_addr", x.GetBootstrapAddr()), checkRoom("room", x.GetRoom()))
}

// Validate implements the validator interceptor's contract.
func (x *LookupDPRanksRequest) Validate() error {
	errs := []error{checkAddr("bootstrap_addr", x.GetBootstrapAddr())}
	if len(x.GetRooms()) > MaxLookupRooms {
		errs = append(errs, fieldErr("rooms", "has %d entries (at most %d per call)", len(x.GetRooms()), MaxLookupRooms))
	}
	// The field name is formatted only for a bad room: this check runs on
	// every lookup (the HTTP /query_dp_ranks path included).
	for i, r := range x.GetRooms() {
		if r > maxRoom {
			errs = append(errs, checkRoom(fmt.Sprintf("rooms[%d]", i), r))
			break
		}
	}
	for i, h := range x.GetHints() {
		if h.GetRoom() > maxRoom {
			errs = append(errs, checkRoom(fmt.Sprintf("hints[%d].room", i), h.GetRoom()))
			break
		}
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *OpenRoomRequest) Validate() error {
	var errs []error
	switch {
	case x.GetRid() == "":
		errs = append(errs, fieldErr("rid", "is required (the request id)"))
	case len(x.GetRid()) > maxRIDLen:
		errs = append(errs, fieldErr("rid", "is %d bytes long (at most %d)", len(x.GetRid()), maxRIDLen))
	}
	errs = append(errs, checkAddr("bootstrap_addr", x.GetBootstrapAddr()), checkRoom("room", x.GetRoom()))
	if x.GetRoom() == 0 {
		errs = append(errs, fieldErr("room", "0 is reserved: the metadata slot's room marker uses 0 for \"not written yet\" (SGLang's metadata gate), so room 0 could never succeed; use 1..2^63-1"))
	}
	if x.GetPromptLen() == 0 {
		errs = append(errs, fieldErr("prompt_len", "must be > 0 (len(origin_input_ids))"))
	}
	if x.GetMaxNewTokens() == 0 {
		errs = append(errs, fieldErr("max_new_tokens", "must be > 0"))
	}
	if x.PrefillDpRank != nil && x.GetPrefillDpRank() > 1<<20 {
		errs = append(errs, fieldErr("prefill_dp_rank", "%d is not a plausible DP rank", x.GetPrefillDpRank()))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *AwaitDestinationRequest) Validate() error {
	return errors.Join(checkRoom("room", x.GetRoom()), x.GetRank().validate("rank"))
}

// Validate implements the validator interceptor's contract.
func (x *TransferRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	if x.GetNumPages() == 0 && !x.GetLast() {
		errs = append(errs, fieldErr("num_pages", "must be > 0 (only the last chunk may carry no pages)"))
	}
	if src := x.GetSource(); src != nil && len(src.GetPageIndices()) > 0 && len(src.GetPageIndices()) != int(x.GetNumPages()) {
		errs = append(errs, fieldErr("source.page_indices", "has %d entries for num_pages %d", len(src.GetPageIndices()), x.GetNumPages()))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ReportTransferRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom()), x.GetRank().validate("rank")}
	if x.GetSuccess() && x.GetNumPages() == 0 && !x.GetLast() {
		errs = append(errs, fieldErr("num_pages", "must be > 0 (only the last chunk may carry no pages)"))
	}
	if x.GetSuccess() && x.GetFailureReason() != "" {
		errs = append(errs, fieldErr("failure_reason", "is set on a successful report"))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *WatchRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *GetRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *AbortRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *ReleaseRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *ListRoomsRequest) Validate() error {
	var errs []error
	if x.GetLimit() > MaxListLimit {
		errs = append(errs, fieldErr("limit", "%d is above the maximum %d", x.GetLimit(), MaxListLimit))
	}
	for i, p := range x.GetPhases() {
		if _, ok := RoomPhase_name[int32(p)]; !ok || p == RoomPhase_ROOM_PHASE_UNSPECIFIED {
			errs = append(errs, fieldErr(fmt.Sprintf("phases[%d]", i), "%d is not a room phase (allowed: ROOM_PHASE_WAITING_PREFILL .. ROOM_PHASE_HELD)", int32(p)))
		}
	}
	if a := x.GetBootstrapAddr(); a != "" {
		errs = append(errs, checkAddr("bootstrap_addr", a))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ReportRunningRequest) Validate() error {
	if n := len(x.GetRooms()); n > MaxRunningRooms {
		return fieldErr("rooms", "has %d entries (at most %d per call)", n, MaxRunningRooms)
	}
	for i, u := range x.GetRooms() {
		if err := checkRoom(fmt.Sprintf("rooms[%d].room", i), u.GetRoom()); err != nil {
			return err
		}
	}
	return nil
}

// Validate implements the validator interceptor's contract.
func (x *RetractRoomRequest) Validate() error {
	errs := []error{checkRoom("room", x.GetRoom())}
	switch x.GetMode() {
	case RetractMode_RETRACT_MODE_RETRACT, RetractMode_RETRACT_MODE_REBOOTSTRAP:
	default:
		errs = append(errs, fieldErr("mode", "%s is not allowed (RETRACT_MODE_RETRACT or RETRACT_MODE_REBOOTSTRAP)", x.GetMode()))
	}
	return errors.Join(errs...)
}
