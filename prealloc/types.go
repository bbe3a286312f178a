package prealloc

import (
	"errors"
	"fmt"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Request is what the ledger needs to know about a room to admit it
// (the fields of SGLang's Req that the admission budget reads).
type Request struct {
	// Room is the bootstrap room id, unique per request.
	Room uint64
	// RID is the request id, used in messages.
	RID string
	// PromptLen is len(origin_input_ids).
	PromptLen int
	// OutputLen is len(output_ids) so far (non-zero for rebootstrap).
	OutputLen int
	// MaxNewTokens is the request's max_new_tokens.
	MaxNewTokens int
	// Priority orders the queue when AdmissionConfig.Priority is not fifo.
	Priority int
	// Rebootstrap marks a request re-bootstrapped after a retract for
	// recompute: its fill length has no -1 (SGLang's rebootstrap).
	Rebootstrap bool
}

// Allocation is what an admitted room holds. Slices are owned by the ledger
// and valid until the room is released; copy them to keep them longer.
type Allocation struct {
	// ReqSlot is the req_to_token row (>= 1; row 0 is padding as in SGLang).
	ReqSlot int32
	// MetadataSlot is the aux/metadata slot prefill writes the first token
	// and the room marker into.
	MetadataSlot int32
	// Pages are the destination KV page indices for the tokens prefill
	// writes, in token order (kv_to_page_indices of the allocated tokens).
	Pages []int32
	// FillLen is the number of tokens prefill writes (fill_len).
	FillLen int
	// AllocTokens is the page-rounded number of tokens allocated.
	AllocTokens int
	// State holds one entry per StateType of the pool's kind, in order.
	State []kvlayout.StateIndices
	// MambaPingPong are the extra-buffer ping-pong track slots a
	// hybrid-linear room holds besides its main state slot (SGLang's
	// req_index_to_mamba_ping_pong_track_buffer_mapping). Empty without the
	// Mamba extra buffer. They are not sent to prefill: the StateMamba entry
	// of State carries only the main slot.
	MambaPingPong []int32
}

// Admission is one room admitted by an admission pass.
type Admission struct {
	Room uint64
	// Resumed is true for a retracted room that got its pages back; it needs
	// no prefill transfer (its KV is restored from the engine's CPU copy).
	Resumed bool
	Alloc   Allocation
}

// BlockReason says why an admission pass stopped before the queue was empty.
type BlockReason int

// Block reasons, in the order SGLang checks them.
const (
	BlockNone BlockReason = iota
	// BlockRetracted: retracted requests are waiting to resume; new
	// admissions are blocked until they do (SGLang's process_decode_queue).
	BlockRetracted
	BlockReqSlots
	BlockMetadataSlots
	BlockMamba
	BlockTokens
	BlockSWA
	BlockDraining
)

var blockNames = [...]string{"none", "retracted", "req_slots", "metadata_slots", "mamba", "tokens", "swa", "draining"}

func (b BlockReason) String() string {
	if b < 0 || int(b) >= len(blockNames) {
		return fmt.Sprintf("BlockReason(%d)", int(b))
	}
	return blockNames[b]
}

// Errors returned by the ledger. Callers branch with errors.Is.
var (
	// ErrExceedsCapacity: the request can never fit in this pool; nothing was
	// allocated. The error is a *CapacityError carrying SGLang's message.
	// Map to InvalidArgument.
	ErrExceedsCapacity = errors.New("request exceeds the KV pool capacity")
	// ErrQueueFull: the admission queue is at admission.max_queued; retry later.
	// Map to ResourceExhausted with a retry hint.
	ErrQueueFull = errors.New("admission queue is full")
	// ErrNoCapacity: pages for a running room's growth are not available now.
	// The engine should retract a request. Map to ResourceExhausted.
	ErrNoCapacity = errors.New("no free KV pages")
	// ErrCannotResume: Retract refused a room that could not resume even
	// on an empty shard (it would stay retracted and block every admission
	// behind it); nothing changed. Map to FailedPrecondition.
	ErrCannotResume = fmt.Errorf("the room could never resume: %w", errWrongState)
	// ErrDraining: the ledger no longer takes new rooms. Map to Unavailable.
	ErrDraining = errors.New("ledger is draining")
	// ErrInvalidRequest: the request's lengths are malformed (negative,
	// absurdly large, or an output length that shrinks). Nothing changed.
	// Map to InvalidArgument.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrOwned: Adopt named a page or slot that another room of the ledger
	// already holds (the message names the index and the room). Nothing
	// changed. Map to FailedPrecondition.
	ErrOwned = errors.New("already held by another room")
)

// Adoption is one room the decode engine re-declares after a daemon restart
// (Adopt): a request it is decoding and exactly what it holds, in the
// engine's own numbering. The ledger copies the slices.
type Adoption struct {
	// Request is the room's request: Room, RID, PromptLen, OutputLen
	// (len(output_ids) so far) and MaxNewTokens as in Enqueue; Priority is
	// not used and Rebootstrap must be false (the room is running).
	Request Request
	// ReqSlot is the room's req_to_token row (1..request_slots +
	// pre_alloc_slots): the engine's row, which its own req_pool_indices
	// keep pointing at.
	ReqSlot int32
	// Pages are every full-pool KV page the room holds, in token order:
	// exactly ceil((PromptLen + OutputLen) / page_size) of them, the
	// pages a running room of that length holds in the ledger.
	Pages []int32
	// SWAPages (hybrid-swa only) are the room's live SWA pages, in token
	// order, backing the last len(SWAPages) of Pages. They must cover the
	// sliding window: at least the pages from
	// floor(max(0, seq − window) / page_size) on, seq = PromptLen + OutputLen.
	// Older pages the engine has not evicted yet may be included; the next
	// UpdateRunning evicts them.
	SWAPages []int32
	// MambaSlots (hybrid-linear only) are the room's Mamba state slots:
	// exactly slots_per_req of them, the main slot first, then the
	// ping-pong track slots.
	MambaSlots []int32
}

// CapacityError is a request that can never fit, with SGLang's message
// (SGLang's entry check): "Request {rid} exceeds the maximum number of tokens: {n} > {max}"
// or, for the SWA tail, "Request {rid} requires too many SWA KV tokens for
// decode preallocation: {n} > {max}".
type CapacityError struct {
	RID  string
	Need int64
	Max  int64
	SWA  bool
}

func (e *CapacityError) Error() string {
	if e.SWA {
		return fmt.Sprintf("Request %s requires too many SWA KV tokens for decode preallocation: %d > %d", e.RID, e.Need, e.Max)
	}
	return fmt.Sprintf("Request %s exceeds the maximum number of tokens: %d > %d", e.RID, e.Need, e.Max)
}

// Unwrap makes errors.Is(err, ErrExceedsCapacity) true.
func (e *CapacityError) Unwrap() error { return ErrExceedsCapacity }

// ResourceStats is one pool's accounting: Free + Used == Total always.
type ResourceStats struct {
	Total int64
	Free  int64
	Used  int64
	// Draining is the part of Used that draining rooms hold.
	Draining int64
}

// Stats is a snapshot of one shard's ledger.
type Stats struct {
	Shard      int
	Pages      ResourceStats
	ReqSlots   ResourceStats
	MetaSlots  ResourceStats
	MambaSlots ResourceStats // zero unless hybrid-linear
	SWAPages   ResourceStats // zero unless hybrid-swa
	Waiting    int           // enqueued, handshake not ready
	Ready      int           // ready, waiting for admission
	// QueuedTokens are the tokens the waiting and ready rooms would
	// pre-allocate (each one's fill length: prompt, plus the output so far
	// for a rebootstrap).
	QueuedTokens int64
	Admitted     int // pre-allocated, not yet claimed
	Claimed      int // claimed by prefill, transferring
	Running      int // transferred, decoding
	Retracted    int
	Held         int
	// Draining counts rooms that ended while a prefill rank may still write
	// into their pages (DrainRoom); what they hold is in each pool's
	// Draining.
	Draining    int
	LastBlocked BlockReason // why the last admission pass stopped
	FullBudget  int64       // the last pass's full-attention token budget
	Retractable int64       // Σ running (prompt + output)
	// Resumed counts retracted rooms whose pages were restored by an
	// admission pass and that have not yet called StartRunning (SGLang's
	// waiting_queue for resumed requests).
	Resumed int
	// SWABudget is the last pass's SWA token budget (hybrid-swa with a page
	// size > 1 only).
	SWABudget int64
	// Budget is the full-attention token budget now (fullBudget as the
	// next pass would compute it for a new room): the free tokens less
	// max(R × active rooms, the largest running room's need) and the
	// retracted rooms' needs. It may be negative. What a router may still
	// send (Capacity.WatchCapacity's tokens_free).
	Budget int64
}

// The room manager keeps each room's state and calls the ledger only in a
// way that state allows: a call the ledger refuses for a room's existence
// or state is an invariant broken between the two, not an answer, so these
// are not exported. A second release is errUnknownRoom, never a double free.
var (
	errRoomExists  = errors.New("room already in the ledger")
	errUnknownRoom = errors.New("room not in the ledger")
	errWrongState  = errors.New("operation not valid in the room's ledger state")
)
