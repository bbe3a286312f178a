package decodeplanev1

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/proto/decodeplane/internal/fieldcheck"
)

// Wire-shape checks, enforced by the validator interceptor (InvalidArgument)
// before any handler runs: this file and the *_validate.go files are the one place
// where the bounds of every request field are checked, and the bounds below
// are the ones the .proto comments state ("bounds: ..."). Each error names the
// field path as in the proto (parallel.pp_size, rooms[3], source.page_indices),
// the value given and what is allowed; every problem of a request is reported
// at once. Domain rules (a DP rank within the prefill's dp_size, a page range
// within the destination) are checked by the domain packages.

const maxRoom = 1<<63 - 1

// Bounds of the decodeplane.v1 request fields. They cover real deployments
// with a wide margin and make sure nothing downstream is asked to hold more.
const (
	// MaxParallelSize bounds attn_tp_size, attn_cp_size, attn_dp_size,
	// pp_size and system_dp_size; every rank is below its size.
	MaxParallelSize = 1024
	// MaxInstanceRanks bounds dp × attn_cp × attn_tp × pp of one prefill
	// instance (dp is system_dp_size when > 1, else attn_dp_size): the number
	// of ranks the daemon waits for.
	MaxInstanceRanks = 1 << 16
	// MaxRank bounds every rank that is not checked against a size in the
	// same message (PrefillRank's ranks, dp_rank, hints, decode_dp_rank).
	MaxRank = MaxParallelSize - 1
	// MaxTokens bounds prompt_len, output_len, max_new_tokens and
	// running output lengths (each ≤ 2^24, so their sum fits in uint32).
	MaxTokens = 1 << 24
	// MaxPages bounds num_pages, page_offset and page_offset + num_pages of a
	// chunk (a request holds at most MaxTokens tokens, pages hold ≥ 1).
	MaxPages = 1 << 24
	// MaxChunkIndex bounds chunk_index (a chunk holds at least one page).
	MaxChunkIndex = MaxPages - 1
	// MaxPageSize bounds page_size (a power of two).
	MaxPageSize = 1 << 16
	// MaxBytes bounds ReportTransfer.bytes (1 PiB).
	MaxBytes = 1 << 50
	// MaxAttempt bounds the attempt of a chunk.
	MaxAttempt = 1 << 20
	// MaxPriority bounds |priority|.
	MaxPriority = 1 << 20
	// MaxModelLayers bounds model.num_layers.
	MaxModelLayers = 4096
	// MaxModelHeads bounds model.total_kv_heads.
	MaxModelHeads = 4096
	// MaxModelDim bounds model.head_dim, model.kv_lora_rank and
	// model.qk_rope_head_dim.
	MaxModelDim = 1 << 14

	// String lengths, in bytes.
	MaxRIDLen            = 512  // rid
	MaxIdempotencyKeyLen = 256  // idempotency_key
	MaxAddrLen           = 261  // bootstrap_addr, rank_endpoint: a 255-byte host, ':' and a port
	MaxInstanceIDLen     = 256  // instance_id
	MaxReasonLen         = 4096 // reason, failure_reason
	MaxDTypeLen          = 32   // kv_cache_dtype
	MaxKindLen           = 32   // model.kv_pool_kind
	MaxModelNameLen      = 256  // model.model_name, Fingerprint.model_name
	MaxModelRevisionLen  = 128  // model.model_revision, Fingerprint.model_revision
	MaxBufferNameLen     = 256  // source.buffer

	// Repeated-field lengths, to bound the work of one call.
	MaxLookupRooms  = 100000 // LookupDPRanks rooms and hints
	MaxRunningRooms = 100000 // ReportRunning rooms
	MaxListLimit    = 100000 // ListRooms limit
	MaxListPhases   = 16     // ListRooms phases
	MaxOutputIDs    = 14     // aux.output_ids: a 64-byte metadata slot after the 8-byte marker
)

// LoadBalanceMethods are the values RegisterPrefillRequest.load_balance_method
// accepts (SGLang's --load-balance-method choices); "" means
// follow_bootstrap_room.
var LoadBalanceMethods = []string{"follow_bootstrap_room", "round_robin", "shortest_queue", "minimum_tokens", "total_requests", "total_tokens", "auto"}

// KVPoolKinds are the values model.kv_pool_kind accepts (case-insensitive,
// "_" for "-"); "" is not checked.
var KVPoolKinds = []string{"mha", "gqa", "mla", "hybrid-mla", "hybrid-swa", "hybrid-linear"}

func fieldErr(field, format string, args ...any) error {
	return fieldcheck.Err(field, format, args...)
}

// short quotes s for a message, cut to 64 bytes: a hostile peer's megabyte
// string is not echoed back.
func short(s string) string {
	if len(s) <= 64 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:64], len(s))
}

// checkRoom checks a room named by field: 1 <= room < 2^63 (room 0 is
// reserved wherever a room is named).
func checkRoom(field string, room uint64) error {
	switch {
	case room == 0:
		return fieldErr(field, "0 is reserved: the metadata slot's room marker uses 0 for \"not written yet\" (SGLang's metadata gate), so room 0 could never succeed; use 1..2^63-1")
	case room > maxRoom:
		return fieldErr(field, "%d is out of range: bootstrap rooms are in [1, 2^63-1]", room)
	}
	return nil
}

// checkLen bounds a string's length; required refuses "".
func checkLen(field, s string, required bool, maxLen int, what string) error {
	switch {
	case s == "" && required:
		return fieldErr(field, "is required (%s, at most %d bytes)", what, maxLen)
	case len(s) > maxLen:
		return fieldErr(field, "is %d bytes long (at most %d)", len(s), maxLen)
	}
	return nil
}

// checkHostPort checks a "host:port" endpoint: at most MaxAddrLen bytes, a
// non-empty host without spaces or control characters, a decimal port in
// 1..65535.
func checkHostPort(field, addr, what string) error {
	if addr == "" {
		return fieldErr(field, "is required: %s, \"host:port\"", what)
	}
	if len(addr) > MaxAddrLen {
		return fieldErr(field, "is %d bytes long (at most %d: \"host:port\")", len(addr), MaxAddrLen)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || strings.ContainsFunc(host, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return fieldErr(field, "%s is not \"host:port\"", short(addr))
	}
	if p, ok := decimal(port); !ok || p <= 0 || p > 65535 {
		return fieldErr(field, "%s has an invalid port (allowed 1..65535)", short(addr))
	}
	return nil
}

// decimal parses 1 to 5 ASCII digits (no sign, no spaces).
func decimal(s string) (int, bool) {
	if s == "" || len(s) > 5 {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func checkAddr(field, addr string) error {
	return checkHostPort(field, addr, "the prefill instance's bootstrap address")
}

// checkMax bounds a number: v <= maxV.
func checkMax(field string, v, maxV uint64) error {
	if v > maxV {
		return fieldErr(field, "%d is out of range (allowed 0..%d)", v, maxV)
	}
	return nil
}

// repeated reports a repeated field's bad entries (fieldcheck.Repeated).
type repeated = fieldcheck.Repeated

// validate checks a PrefillRank named by field.
func (x *PrefillRank) validate(field string) error {
	if x == nil {
		return fieldErr(field, "is required")
	}
	// A valid rank (every call of the room path) builds no field names.
	if x.GetDpRank() <= MaxRank && x.GetCpRank() <= MaxRank && x.GetTpRank() <= MaxRank && x.GetPpRank() <= MaxRank &&
		checkAddr(field, x.GetBootstrapAddr()) == nil {
		return nil
	}
	return errors.Join(
		checkAddr(field+".bootstrap_addr", x.GetBootstrapAddr()),
		checkMax(field+".dp_rank", uint64(x.GetDpRank()), MaxRank),
		checkMax(field+".cp_rank", uint64(x.GetCpRank()), MaxRank),
		checkMax(field+".tp_rank", uint64(x.GetTpRank()), MaxRank),
		checkMax(field+".pp_rank", uint64(x.GetPpRank()), MaxRank),
	)
}

func checkRank(field string, rank, size uint32, sizeName string) error {
	s := min(max(size, 1), MaxParallelSize)
	if rank >= s {
		return fieldErr(field, "%d is out of range: %s is %d (allowed 0..%d)", rank, sizeName, s, s-1)
	}
	return nil
}

// checkSize checks a parallel size: 1..MaxParallelSize, or 0 (unset, read
// as 1) when optional.
func checkSize(field string, size uint32, optional bool) error {
	switch {
	case size == 0 && !optional:
		return fieldErr(field, "must be >= 1 (allowed 1..%d)", MaxParallelSize)
	case size > MaxParallelSize:
		lo := 1
		if optional {
			lo = 0
		}
		return fieldErr(field, "%d is out of range (allowed %d..%d)", size, lo, MaxParallelSize)
	}
	return nil
}

// InstanceRanks is the number of ranks of the instance p describes, as the
// domain counts them: dp × attn_cp × attn_tp × pp, with dp = system_dp_size
// when > 1, else attn_dp_size, and 0 read as 1.
func (x *ParallelInfo) InstanceRanks() uint64 {
	dp := x.GetAttnDpSize()
	if x.GetSystemDpSize() > 1 {
		dp = x.GetSystemDpSize()
	}
	one := func(v uint32) uint64 { return uint64(max(v, 1)) }
	return one(dp) * one(x.GetAttnCpSize()) * one(x.GetAttnTpSize()) * one(x.GetPpSize())
}

func (x *ParallelInfo) validate(field string) error {
	if x == nil {
		return fieldErr(field, "is required")
	}
	errs := []error{
		checkSize(field+".attn_tp_size", x.GetAttnTpSize(), false),
		checkSize(field+".attn_cp_size", x.GetAttnCpSize(), true),
		checkSize(field+".attn_dp_size", x.GetAttnDpSize(), true),
		checkSize(field+".pp_size", x.GetPpSize(), false),
		checkSize(field+".system_dp_size", x.GetSystemDpSize(), true),
		checkRank(field+".attn_tp_rank", x.GetAttnTpRank(), x.GetAttnTpSize(), field+".attn_tp_size"),
		checkRank(field+".attn_cp_rank", x.GetAttnCpRank(), x.GetAttnCpSize(), field+".attn_cp_size"),
		checkRank(field+".attn_dp_rank", x.GetAttnDpRank(), x.GetAttnDpSize(), field+".attn_dp_size"),
		checkRank(field+".pp_rank", x.GetPpRank(), x.GetPpSize(), field+".pp_size"),
		checkRank(field+".system_dp_rank", x.GetSystemDpRank(), x.GetSystemDpSize(), field+".system_dp_size"),
	}
	if n := x.InstanceRanks(); n > MaxInstanceRanks {
		errs = append(errs, fieldErr(field, "dp × attn_cp_size × attn_tp_size × pp_size is %d ranks (at most %d per instance)", n, MaxInstanceRanks))
	}
	return errors.Join(errs...)
}

func (x *ModelFacts) validate(field string) error {
	if x == nil {
		return nil
	}
	var errs []error
	kind := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(x.GetKvPoolKind())), "_", "-")
	switch {
	case len(x.GetKvPoolKind()) > MaxKindLen:
		errs = append(errs, fieldErr(field+".kv_pool_kind", "is %d bytes long (at most %d)", len(x.GetKvPoolKind()), MaxKindLen))
	case x.GetKvPoolKind() != "" && !contains(KVPoolKinds, kind):
		errs = append(errs, fieldErr(field+".kv_pool_kind", "%s is not a KV pool kind (allowed: %s, or empty)", short(x.GetKvPoolKind()), strings.Join(KVPoolKinds, ", ")))
	}
	errs = append(errs,
		checkMax(field+".num_layers", uint64(x.GetNumLayers()), MaxModelLayers),
		checkMax(field+".total_kv_heads", uint64(x.GetTotalKvHeads()), MaxModelHeads),
		checkMax(field+".head_dim", uint64(x.GetHeadDim()), MaxModelDim),
		checkMax(field+".kv_lora_rank", uint64(x.GetKvLoraRank()), MaxModelDim),
		checkMax(field+".qk_rope_head_dim", uint64(x.GetQkRopeHeadDim()), MaxModelDim),
	)
	if x.GetKvPoolKind() != "" && kind != "mla" && kind != "hybrid-mla" {
		if x.GetKvLoraRank() != 0 {
			errs = append(errs, fieldErr(field+".kv_lora_rank", "is set on a %s model: only MLA models (mla, hybrid-mla) have a KV LoRA rank", kind))
		}
		if x.GetQkRopeHeadDim() != 0 {
			errs = append(errs, fieldErr(field+".qk_rope_head_dim", "is set on a %s model: only MLA models (mla, hybrid-mla) have a rope head dim", kind))
		}
	}
	errs = append(errs, checkModelID(field+".model_name", x.GetModelName(), MaxModelNameLen),
		checkModelID(field+".model_revision", x.GetModelRevision(), MaxModelRevisionLen))
	return errors.Join(errs...)
}

// checkModelID checks a model name or revision: empty, or at most maxLen
// bytes of printable UTF-8 without whitespace.
func checkModelID(field, s string, maxLen int) error {
	switch {
	case len(s) > maxLen:
		return fieldErr(field, "is %d bytes long (at most %d)", len(s), maxLen)
	case strings.ContainsFunc(s, func(r rune) bool { return r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) }):
		return fieldErr(field, "%s holds whitespace or a character that is not printable (allowed: printable UTF-8 without whitespace, e.g. meta-llama/Llama-3.1-8B-Instruct)", short(s))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Validate implements the validator interceptor's contract.
func (x *RegisterPrefillRequest) Validate() error {
	errs := []error{
		checkAddr("bootstrap_addr", x.GetBootstrapAddr()),
		checkHostPort("rank_endpoint", x.GetRankEndpoint(), "this rank's own endpoint (\"rank_ip:rank_port\")"),
		x.GetParallel().validate("parallel"),
	}
	if ps := x.GetPageSize(); ps == 0 || ps&(ps-1) != 0 || ps > MaxPageSize {
		errs = append(errs, fieldErr("page_size", "%d must be a power of two in 1..%d (the prefill's --page-size)", ps, MaxPageSize))
	}
	dt := x.GetKvCacheDtype()
	switch {
	case dt == "":
		errs = append(errs, fieldErr("kv_cache_dtype", "is required (the prefill's --kv-cache-dtype)"))
	case len(dt) > MaxDTypeLen:
		errs = append(errs, fieldErr("kv_cache_dtype", "is %d bytes long (at most %d: the prefill's --kv-cache-dtype)", len(dt), MaxDTypeLen))
	case strings.ContainsFunc(dt, func(r rune) bool { return r < 0x20 || r > 0x7e }):
		errs = append(errs, fieldErr("kv_cache_dtype", "%s must be printable ASCII (the prefill's --kv-cache-dtype, e.g. bf16, fp8_e4m3, auto)", short(dt)))
	}
	if lb := x.GetLoadBalanceMethod(); lb != "" && !contains(LoadBalanceMethods, lb) {
		errs = append(errs, fieldErr("load_balance_method", "%s is not a load-balance method (allowed: %s, or empty for follow_bootstrap_room)", short(lb), strings.Join(LoadBalanceMethods, ", ")))
	}
	errs = append(errs,
		checkMax("prefill_http_port", uint64(x.GetPrefillHttpPort()), 65535),
		x.GetModel().validate("model"),
		checkLen("instance_id", x.GetInstanceId(), false, MaxInstanceIDLen, "the prefill process's id"),
	)
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *HeartbeatRequest) Validate() error {
	return errors.Join(x.GetRank().validate("rank"), checkLen("instance_id", x.GetInstanceId(), false, MaxInstanceIDLen, "the prefill process's id"))
}

// Validate implements the validator interceptor's contract.
func (x *DeregisterPrefillRequest) Validate() error {
	return errors.Join(checkAddr("bootstrap_addr", x.GetBootstrapAddr()),
		checkLen("instance_id", x.GetInstanceId(), false, MaxInstanceIDLen, "the prefill process's id"),
		checkLen("reason", x.GetReason(), false, MaxReasonLen, "why the instance stops"))
}

// Validate implements the validator interceptor's contract.
func (x *BindRoomRequest) Validate() error {
	return errors.Join(checkAddr("bootstrap_addr", x.GetBootstrapAddr()), checkRoom("room", x.GetRoom()),
		checkMax("dp_rank", uint64(x.GetDpRank()), MaxRank))
}

// Validate implements the validator interceptor's contract.
func (x *LookupDPRanksRequest) Validate() error {
	errs := []error{checkAddr("bootstrap_addr", x.GetBootstrapAddr())}
	if n := len(x.GetRooms()); n > MaxLookupRooms {
		errs = append(errs, fieldErr("rooms", "has %d entries (at most %d per call)", n, MaxLookupRooms))
	} else {
		var rep repeated
		// The field name is formatted only for a bad room: this check runs
		// on every lookup (the HTTP /query_dp_ranks path included).
		for i, r := range x.GetRooms() {
			if r != 0 && r <= maxRoom {
				continue
			}
			rep.Add(checkRoom(fmt.Sprintf("rooms[%d]", i), r))
		}
		errs = append(errs, rep.Err("rooms"))
	}
	if n := len(x.GetHints()); n > MaxLookupRooms {
		errs = append(errs, fieldErr("hints", "has %d entries (at most %d per call)", n, MaxLookupRooms))
	} else {
		var rep repeated
		for i, h := range x.GetHints() {
			rep.Add(checkRoom(fmt.Sprintf("hints[%d].room", i), h.GetRoom()))
			rep.Add(checkMax(fmt.Sprintf("hints[%d].dp_rank", i), uint64(h.GetDpRank()), MaxRank))
		}
		errs = append(errs, rep.Err("hints"))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *OpenRoomRequest) Validate() error {
	errs := make([]error, 0, 16) // on the stack: errors.Join keeps none of it
	switch {
	case x.GetRid() == "":
		errs = append(errs, fieldErr("rid", "is required (the request id)"))
	case len(x.GetRid()) > MaxRIDLen:
		errs = append(errs, fieldErr("rid", "is %d bytes long (at most %d)", len(x.GetRid()), MaxRIDLen))
	}
	errs = append(errs, checkAddr("bootstrap_addr", x.GetBootstrapAddr()), checkRoom("room", x.GetRoom()))
	if x.GetPromptLen() == 0 {
		errs = append(errs, fieldErr("prompt_len", "must be > 0 (len(origin_input_ids), allowed 1..%d)", MaxTokens))
	}
	errs = append(errs,
		checkTokens("prompt_len", x.GetRid(), x.GetPromptLen()),
		checkTokens("output_len", x.GetRid(), x.GetOutputLen()),
		checkTokens("max_new_tokens", x.GetRid(), x.GetMaxNewTokens()))
	if x.GetMaxNewTokens() == 0 {
		errs = append(errs, fieldErr("max_new_tokens", "must be > 0 (allowed 1..%d)", MaxTokens))
	}
	if x.PrefillDpRank != nil && x.GetPrefillDpRank() > MaxRank {
		errs = append(errs, fieldErr("prefill_dp_rank", "%d is not a plausible DP rank (allowed 0..%d)", x.GetPrefillDpRank(), MaxRank))
	}
	if x.DecodeDpRank != nil && x.GetDecodeDpRank() > MaxRank {
		errs = append(errs, fieldErr("decode_dp_rank", "%d is not a plausible DP rank (allowed 0..%d)", x.GetDecodeDpRank(), MaxRank))
	}
	if p := x.GetPriority(); p < -MaxPriority || p > MaxPriority {
		errs = append(errs, fieldErr("priority", "%d is out of range (allowed %d..%d)", p, -MaxPriority, MaxPriority))
	}
	errs = append(errs, checkLen("idempotency_key", x.GetIdempotencyKey(), false, MaxIdempotencyKeyLen, "the retry key"))
	if _, err := RoomTimeout(x.GetTimeout()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Bounds of OpenRoomRequest.timeout.
const (
	MinRoomTimeout = time.Millisecond
	MaxRoomTimeout = 24 * time.Hour
)

// RoomTimeout reads OpenRoomRequest.timeout: 0 when unset, else its value
// in whole milliseconds within [MinRoomTimeout, MaxRoomTimeout] (an error
// naming the field otherwise).
func RoomTimeout(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fieldErr("timeout", "is not a valid duration (%v); allowed %s..%s, or unset for none", err, MinRoomTimeout, MaxRoomTimeout)
	}
	v := d.AsDuration()
	if v < MinRoomTimeout || v > MaxRoomTimeout {
		return 0, fieldErr("timeout", "%s is out of range: allowed %s..%s, or unset for none (the request's time budget)", v, MinRoomTimeout, MaxRoomTimeout)
	}
	return v.Truncate(time.Millisecond), nil
}

// checkTokens bounds a token count by MaxTokens, in the words of SGLang's
// refusal of a request that can never fit.
func checkTokens(field, rid string, n uint32) error {
	if n > MaxTokens {
		return fieldErr(field, "%d is out of range (allowed up to %d tokens): Request %s exceeds the maximum number of tokens any decode pool holds", n, MaxTokens, short(rid))
	}
	return nil
}

// Validate implements the validator interceptor's contract.
func (x *AwaitDestinationRequest) Validate() error {
	return errors.Join(checkRoom("room", x.GetRoom()), x.GetRank().validate("rank"))
}

// checkChunk checks the page range of a chunk: chunk_index, page_offset and
// num_pages bounded, page_offset + num_pages <= MaxPages, num_pages > 0
// unless emptyOK.
func checkChunk(index, offset, pages uint32, emptyOK bool, emptyWhy string) []error {
	var errs []error // nil for a valid chunk: nothing allocated
	for _, err := range [...]error{checkMax("chunk_index", uint64(index), MaxChunkIndex), checkMax("page_offset", uint64(offset), MaxPages)} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case pages == 0 && !emptyOK:
		errs = append(errs, fieldErr("num_pages", "must be > 0 (%s; allowed 1..%d)", emptyWhy, MaxPages))
	case pages > MaxPages:
		errs = append(errs, fieldErr("num_pages", "%d is out of range (allowed 1..%d)", pages, MaxPages))
	case uint64(offset)+uint64(pages) > MaxPages:
		errs = append(errs, fieldErr("page_offset", "page_offset + num_pages is %d (at most %d pages)", uint64(offset)+uint64(pages), MaxPages))
	}
	return errs
}

// checkAux checks a chunk's aux: only the last chunk carries it, and it must
// (every rank's last chunk carries the room marker), at most MaxOutputIDs ids.
func checkAux(a *Aux, last bool) []error {
	var errs []error
	switch {
	case last && a == nil:
		errs = append(errs, fieldErr("aux", "is required on the last chunk (last = true): every rank's last chunk carries the metadata, aux.room_marker = room"))
	case last && a.GetRoomMarker() == 0:
		errs = append(errs, fieldErr("aux.room_marker", "0 on the last chunk: every rank's last chunk carries the room marker (aux.room_marker = room)"))
	case !last && (a.GetRoomMarker() != 0 || len(a.GetOutputIds()) > 0):
		errs = append(errs, fieldErr("aux", "is set on a chunk that is not the last: only the last chunk carries the metadata"))
	}
	if n := len(a.GetOutputIds()); n > MaxOutputIDs {
		errs = append(errs, fieldErr("aux.output_ids", "has %d ids; a 64-byte metadata slot holds at most %d", n, MaxOutputIDs))
	}
	return errs
}

// Validate implements the validator interceptor's contract.
func (x *TransferRequest) Validate() error {
	errs := make([]error, 0, 16) // on the stack: errors.Join keeps none of it
	errs = append(errs, checkRoom("room", x.GetRoom()), x.GetRank().validate("rank"))
	errs = append(errs, checkChunk(x.GetChunkIndex(), x.GetPageOffset(), x.GetNumPages(), x.GetLast(), "only the last chunk may carry no pages")...)
	if src := x.GetSource(); src != nil {
		errs = append(errs, checkLen("source.buffer", src.GetBuffer(), false, MaxBufferNameLen, "the prefill KV buffer's name"))
		if n := len(src.GetPageIndices()); n > 0 && n != int(x.GetNumPages()) {
			errs = append(errs, fieldErr("source.page_indices", "has %d entries for num_pages %d", n, x.GetNumPages()))
		} else {
			var rep repeated
			for i, p := range src.GetPageIndices() {
				if p < 0 {
					rep.Add(fieldErr(fmt.Sprintf("source.page_indices[%d]", i), "%d is negative (page indices are 0..2^31-1)", p))
				}
			}
			errs = append(errs, rep.Err("source.page_indices"))
		}
		errs = append(errs, checkSourceLast(src, x.GetLast())...)
	}
	errs = append(errs, checkAux(x.GetAux(), x.GetLast())...)
	errs = append(errs, checkMax("attempt", uint64(x.GetAttempt()), MaxAttempt))
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ReportTransferRequest) Validate() error {
	errs := make([]error, 0, 16) // on the stack: errors.Join keeps none of it
	errs = append(errs, checkRoom("room", x.GetRoom()), x.GetRank().validate("rank"))
	errs = append(errs, checkChunk(x.GetChunkIndex(), x.GetPageOffset(), x.GetNumPages(), !x.GetSuccess() || x.GetLast(), "only the last chunk may carry no pages")...)
	if x.GetSuccess() && x.GetFailureReason() != "" {
		errs = append(errs, fieldErr("failure_reason", "is set on a successful report"))
	}
	errs = append(errs, checkLen("failure_reason", x.GetFailureReason(), false, MaxReasonLen, "the prefill's reason"))
	errs = append(errs, checkMax("bytes", x.GetBytes(), MaxBytes))
	switch {
	case x.GetSuccess() && x.GetLast() && x.GetMetadataRoomMarker() == 0:
		errs = append(errs, fieldErr("metadata_room_marker", "0 on a successful last chunk: every rank's last chunk carries the room marker (metadata_room_marker = room)"))
	case !x.GetLast() && x.GetMetadataRoomMarker() != 0:
		errs = append(errs, fieldErr("metadata_room_marker", "is set on a chunk that is not the last: only the last chunk carries the metadata"))
	}
	errs = append(errs, checkMax("attempt", uint64(x.GetAttempt()), MaxAttempt))
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *WatchRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *GetRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *AbortRoomRequest) Validate() error {
	return errors.Join(checkRoom("room", x.GetRoom()), checkLen("reason", x.GetReason(), false, MaxReasonLen, "the abort reason"))
}

// Validate implements the validator interceptor's contract.
func (x *ReleaseRoomRequest) Validate() error { return checkRoom("room", x.GetRoom()) }

// Validate implements the validator interceptor's contract.
func (x *ListRoomsRequest) Validate() error {
	var errs []error
	if x.GetLimit() > MaxListLimit {
		errs = append(errs, fieldErr("limit", "%d is above the maximum %d", x.GetLimit(), MaxListLimit))
	}
	if n := len(x.GetPhases()); n > MaxListPhases {
		errs = append(errs, fieldErr("phases", "has %d entries (at most %d)", n, MaxListPhases))
	} else {
		for i, p := range x.GetPhases() {
			if _, ok := RoomPhase_name[int32(p)]; !ok || p == RoomPhase_ROOM_PHASE_UNSPECIFIED {
				errs = append(errs, fieldErr(fmt.Sprintf("phases[%d]", i), "%d is not a room phase (allowed: ROOM_PHASE_WAITING_PREFILL .. ROOM_PHASE_HELD)", int32(p)))
			}
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
	var rep repeated
	for i, u := range x.GetRooms() {
		if u == nil {
			continue
		}
		rep.Add(checkRoom(fmt.Sprintf("rooms[%d].room", i), u.GetRoom()))
		rep.Add(checkMax(fmt.Sprintf("rooms[%d].output_len", i), uint64(u.GetOutputLen()), MaxTokens))
	}
	return rep.Err("rooms")
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
