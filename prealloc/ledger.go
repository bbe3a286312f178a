package prealloc

import (
	"fmt"
	"math"
	"sync"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// maxRequestTokens bounds PromptLen and OutputLen so that every budget term
// fits comfortably in an int64. Real requests are many orders of magnitude
// smaller; anything larger is ErrInvalidRequest.
const maxRequestTokens = 1 << 40

// defaultMaxQueued is AdmissionConfig.MaxQueued's default.
const defaultMaxQueued = 65536

// maxMambaSlotsPerReq is the largest slots_per_req (1 + ping_pong, ping_pong
// at most 2).
const maxMambaSlotsPerReq = 3

// swaMode is how a hybrid-swa pool is pre-allocated.
type swaMode uint8

const (
	swaNone swaMode = iota
	// swaTail: page size > 1. SGLang's _uses_swa_tail_prealloc path: full KV
	// for the whole fill, SWA KV only for the page-aligned sliding-window
	// tail (alloc_extend_swa_tail), with its own SWA budget.
	swaTail
	// swaMirror: page size 1. SGLang falls back to allocating the SWA pool at
	// full length (SWATokenToKVPoolAllocator.alloc gives every full token an
	// SWA token) and caps max_total_num_tokens at the SWA pool size.
	swaMirror
)

// queueOrder is AdmissionConfig.Priority.
type queueOrder uint8

const (
	orderFIFO queueOrder = iota
	orderLowFirst
	orderHighFirst
)

// room is one request in the ledger. A queued room (waiting or ready) is
// only its identity, its request and its queue position; what admission
// gives it lives in *held, made at its first admission (recycled through
// Ledger.freeHeld when the room is dropped), so that a queued room costs
// ~112 bytes. Code that reads a held field checks r.held first unless the
// room's state implies an admission (RoomState.admitted).
type room struct {
	id  uint64
	req Request
	seq uint64 // queue position (FIFO order within a priority class)
	*held
	readyIdx int32 // position in Ledger.ready, or -1
	bypassed int32 // rooms admitted ahead of this ready room while it did not fit
	state    RoomState
}

// held is what a room holds from its first admission until it is dropped.
type held struct {
	runIdx    int32 // position in Ledger.runMax, or -1
	runSWAIdx int32 // position in Ledger.runSWAMax, or -1

	prev, next *room // Ledger.retracted or Ledger.held

	reqSlot  int32 // 0 = none (row 0 is padding)
	metaSlot int32 // -1 = none

	fill      int64   // tokens pre-allocated at admission (fill_len)
	xferPages int     // leading pages prefill writes (kv_to_page_indices of [0, origin_len))
	pages     []int32 // every full-pool page the room holds, token order
	swa       []int32 // swa[swaOff:] are the live SWA pages
	swaOff    int
	swaFirst  int       // sequence page index of swa[swaOff]
	xferSWA   [2]int    // [lo, hi) into swa: the SWA window sent at admission
	retired   [][]int32 // page arrays outgrown by this room, recycled at release
	mamba     [maxMambaSlotsPerReq]int32
	nMamba    int
	stateBuf  [1]kvlayout.StateIndices // admission-time State entry
	runKey    int64
	runSWAKey int64
	runTokens int64  // prompt + output while running
	runSWATok int64  // swa_tail_len(prompt) + output while running
	retFill   int64  // fill_len to restore when retracted
	retFull   int64  // full_required while retracted
	retSWA    int64  // swa_required while retracted
	retStep   uint64 // Ledger.steps when retracted
}

// Entry is the memory of one room's ledger record, for a caller that keeps
// it inside its own record of the room (EnqueueEntry): the room is then one
// object, not two. Its fields are the ledger's; the zero value is ready for
// EnqueueEntry, and an Entry may be enqueued again once its room is gone
// from the ledger.
type Entry struct{ r room }

// Request is the room's request as the ledger holds it now (OutputLen and
// Rebootstrap follow UpdateRunning, Hold, ResumeHeld and StartRunning); it
// stays readable after the room is gone. The ledger writes it only inside
// those calls, so a caller that makes every call on the room itself reads
// it without the ledger's lock.
func (e *Entry) Request() Request { return e.r.req }

// metaSlotOf is the room's metadata slot, -1 when it holds none.
func (r *room) metaSlotOf() int32 {
	if r.held == nil {
		return -1
	}
	return r.metaSlot
}

// Ledger is one decode data-parallel shard's allocator of record: it owns
// the shard's KV pages, req_to_token rows, metadata slots, and (per kind)
// SWA pages and Mamba state slots, and decides admission exactly as SGLang's
// DecodePreallocQueue does. All methods are safe for concurrent use; they
// serialize on one mutex. See the package documentation for the lifecycle,
// the budget and the ownership of returned slices.
type Ledger struct {
	mu    sync.Mutex
	shard int

	kind        kvlayout.Kind
	stateType   kvlayout.StateType // 0 when the kind sends no state component
	page        int64              // page size in tokens
	reserve     int64              // R: num_reserved_decode_tokens
	clip        int64              // CLIP: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
	order       queueOrder
	maxQueued   int
	swaMode     swaMode
	window      int64 // sliding window (tokens)
	mambaPerReq int   // slots_per_req (0 unless hybrid-linear)
	maxTotal    int64 // max_total_num_tokens for the entry check
	swaCap      int64 // SWA pool size in tokens (size_swa)

	pages    pageStack
	swaPages pageStack
	reqSlots slotRing
	meta     slotRing
	mambaS   slotRing
	pool     slicePool

	rooms    map[uint64]*room
	freeHeld []*held // recycled from dropped rooms
	nextSeq  uint64

	ready     roomHeap // ready rooms by (priority class, seq)
	runMax    roomHeap // running rooms by min(max_new, CLIP) + prompt, max first
	runSWAMax roomHeap // running rooms by swa_tail_len(prompt) + min(max_new, CLIP), max first
	retracted roomList
	held      roomList

	counts         [numRoomStates]int
	queuedTokens   int64      // Σ waiting and ready fillLen: what the queue would pre-allocate
	retractable    int64      // Σ running (prompt + output)
	retractableSWA int64      // Σ running (swa_tail_len(prompt) + output)
	retractedFull  int64      // Σ retracted full_required
	retractedSWA   int64      // Σ retracted swa_required
	drained        drainedRes // what draining rooms hold

	maxBypass int    // admission.max_bypass
	steps     uint64 // UpdateRunning calls so far: the engine's decode-step reports

	draining      bool
	lastBlocked   BlockReason
	lastFull      int64
	lastSWABudget int64
}

// NewLedger builds the ledger of DP shard shard. cfg should already have
// passed Config.Validate; NewLedger still refuses sizes it cannot represent
// (empty pools, more than 2^31-1 pages or slots) with an error. It does not apply Validate's cross-checks (e.g. metadata slots >=
// request slots), so a deliberately odd but representable pool is accepted.
func NewLedger(cfg kvlayout.Config, shard int) (*Ledger, error) {
	nPages, nReq, nMeta, err := checkSizes(cfg)
	if err != nil {
		return nil, err
	}
	p, a := cfg.Pool, cfg.Admission
	l := &Ledger{
		shard:     shard,
		kind:      p.Kind,
		page:      int64(p.PageSize),
		reserve:   int64(a.ReservedDecodeTokens),
		clip:      int64(a.ClipMaxNewTokens),
		maxQueued: a.MaxQueued,
		maxBypass: a.MaxBypass,
		rooms:     make(map[uint64]*room),
	}
	switch a.Priority {
	case kvlayout.PriorityFIFO, "":
		l.order = orderFIFO
	case kvlayout.PriorityLowFirst:
		l.order = orderLowFirst
	case kvlayout.PriorityHighFirst:
		l.order = orderHighFirst
	default:
		return nil, fmt.Errorf("new ledger: unknown priority order %q", a.Priority)
	}
	if l.maxQueued == 0 {
		l.maxQueued = defaultMaxQueued
	}
	if st := p.Kind.StateTypes(); len(st) > 0 {
		l.stateType = st[0]
	}
	l.maxTotal = nPages * l.page
	nSWA, err := l.kindPools(p)
	if err != nil {
		return nil, err
	}
	l.pages = newPageStack(int(nPages))
	l.swaPages = newPageStack(int(nSWA))
	l.reqSlots = newSlotRing(1, int(nReq)) // row 0 is padding (DecodeReqToTokenPool)
	l.meta = newSlotRing(0, int(nMeta))
	l.pool.limit = 2*int(nPages+nSWA) + 4096

	l.ready = roomHeap{less: l.readyLess, pos: func(r *room) *int32 { return &r.readyIdx }}
	l.runMax = roomHeap{less: func(a, b *room) bool { return a.runKey > b.runKey }, pos: func(r *room) *int32 { return &r.runIdx }}
	l.runSWAMax = roomHeap{less: func(a, b *room) bool { return a.runSWAKey > b.runSWAKey }, pos: func(r *room) *int32 { return &r.runSWAIdx }}
	return l, nil
}

// checkSizes refuses the sizes a ledger cannot represent and returns the
// pool's pages, req_to_token rows and metadata slots.
func checkSizes(cfg kvlayout.Config) (nPages, nReq, nMeta int64, err error) {
	p, a := cfg.Pool, cfg.Admission
	if !p.Kind.Known() {
		return 0, 0, 0, fmt.Errorf("new ledger: unknown kv pool kind %d", int(p.Kind))
	}
	if p.PageSize <= 0 || p.PageSize > 1<<20 {
		return 0, 0, 0, fmt.Errorf("new ledger: page size %d out of range (1..%d)", p.PageSize, 1<<20)
	}
	nPages = p.Pages()
	if nPages <= 0 || nPages > math.MaxInt32 {
		return 0, 0, 0, fmt.Errorf("new ledger: pool of %d pages cannot be represented (need 1..%d)", nPages, math.MaxInt32)
	}
	nReq = int64(p.ReqSlots())
	if p.RequestSlots <= 0 || nReq <= 0 || nReq >= math.MaxInt32 {
		return 0, 0, 0, fmt.Errorf("new ledger: %d request slots cannot be represented (need 1..%d)", nReq, math.MaxInt32-1)
	}
	nMeta = int64(p.Metadata())
	if nMeta <= 0 || nMeta > math.MaxInt32 {
		return 0, 0, 0, fmt.Errorf("new ledger: %d metadata slots cannot be represented (need 1..%d)", nMeta, math.MaxInt32)
	}
	if a.ReservedDecodeTokens < 0 || a.ReservedDecodeTokens > maxRequestTokens {
		return 0, 0, 0, fmt.Errorf("new ledger: reserved decode tokens %d out of range", a.ReservedDecodeTokens)
	}
	if a.ClipMaxNewTokens <= 0 {
		return 0, 0, 0, fmt.Errorf("new ledger: clip max new tokens %d must be > 0", a.ClipMaxNewTokens)
	}
	if a.MaxQueued < 0 {
		return 0, 0, 0, fmt.Errorf("new ledger: negative max queued %d", a.MaxQueued)
	}
	if a.MaxBypass < 0 || a.MaxBypass > kvlayout.MaxBypassLimit {
		return 0, 0, 0, fmt.Errorf("new ledger: max bypass %d out of range (0..%d)", a.MaxBypass, kvlayout.MaxBypassLimit)
	}
	return nPages, nReq, nMeta, nil
}

// kindPools sets up the pools of the kind beyond the full-attention one
// (hybrid-swa's SWA pages, hybrid-linear's Mamba slots) and returns the SWA
// pool's page count (0 without one).
func (l *Ledger) kindPools(p kvlayout.PoolConfig) (int64, error) {
	var nSWA int64
	switch p.Kind {
	case kvlayout.KindHybridSWA:
		if p.SWA.Window <= 0 {
			return 0, fmt.Errorf("new ledger: hybrid-swa sliding window %d must be > 0", p.SWA.Window)
		}
		nSWA = p.SWA.TotalTokens / l.page
		if nSWA <= 0 || nSWA > math.MaxInt32 {
			return 0, fmt.Errorf("new ledger: SWA pool of %d pages cannot be represented (need 1..%d)", nSWA, math.MaxInt32)
		}
		l.window = int64(p.SWA.Window)
		l.swaCap = nSWA * l.page
		if l.page > 1 {
			l.swaMode = swaTail
		} else {
			// DecodePreallocQueue.__init__: without tail pre-allocation the
			// SWA pool is allocated at full length, so max_total_num_tokens
			// is capped at swa_max_total_num_tokens.
			l.swaMode = swaMirror
			l.maxTotal = min(l.maxTotal, l.swaCap)
		}
	case kvlayout.KindHybridLinear:
		l.mambaPerReq = p.Mamba.MambaSlotsPerReq()
		if l.mambaPerReq > maxMambaSlotsPerReq {
			return 0, fmt.Errorf("new ledger: %d mamba slots per request (ping_pong %d) not supported", l.mambaPerReq, p.Mamba.PingPong)
		}
		if p.Mamba.StateSlots < l.mambaPerReq || p.Mamba.StateSlots > math.MaxInt32 {
			return 0, fmt.Errorf("new ledger: %d mamba state slots cannot hold one request (%d slots each)", p.Mamba.StateSlots, l.mambaPerReq)
		}
		l.mambaS = newSlotRing(0, p.Mamba.StateSlots)
	}
	return nSWA, nil
}

// readyLess orders the ready heap. SGLang sorts the queue by
// priority × sign with a stable sort (pop_preallocated), so ties keep
// arrival order; FIFO ignores priority.
func (l *Ledger) readyLess(a, b *room) bool {
	switch l.order {
	case orderLowFirst:
		if a.req.Priority != b.req.Priority {
			return a.req.Priority < b.req.Priority
		}
	case orderHighFirst:
		if a.req.Priority != b.req.Priority {
			return a.req.Priority > b.req.Priority
		}
	}
	return a.seq < b.seq
}

// ---- request arithmetic (SGLang DecodePreallocQueue helpers) ----

// fillLen is _pre_alloc_fill_len: prompt + max(output - 1, 0), or
// prompt + output for a rebootstrap (the boundary token was popped at
// retract time, so nothing is pending).
func fillLen(r Request) int64 {
	if r.Rebootstrap {
		return int64(r.PromptLen) + int64(r.OutputLen)
	}
	return int64(r.PromptLen) + int64(max(r.OutputLen-1, 0))
}

// originLen is _rebootstrap_prefill_len: the tokens prefill holds and
// writes, len(origin_input_ids) (+ len(output_ids) for a rebootstrap).
func originLen(r Request) int64 {
	if r.Rebootstrap {
		return int64(r.PromptLen) + int64(r.OutputLen)
	}
	return int64(r.PromptLen)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// requiredAlloc is _required_alloc_tokens with no prefix: fill_len for page
// size 1, else num_new_pages(seq=fill_len, prefix=0) × page_size, i.e. the
// fill rounded up to whole pages.
func (l *Ledger) requiredAlloc(fill int64) int64 {
	if l.page == 1 {
		return fill
	}
	return ceilDiv(fill, l.page) * l.page
}

// swaTailLen is _swa_tail_len: with tail pre-allocation the SWA tokens kept
// for a sequence of seqLen tokens, from the window start floored to a page
// boundary (max(0, seq - window) // page × page) to the end; otherwise the
// whole sequence.
func (l *Ledger) swaTailLen(seqLen int64) int64 {
	if l.swaMode != swaTail || seqLen <= 0 {
		return max(seqLen, 0)
	}
	ws := max(0, seqLen-l.window) / l.page * l.page
	return seqLen - ws
}

// swaFirstPage is the sequence page index where the SWA pages of a fresh
// pre-allocation of fill tokens start.
func (l *Ledger) swaFirstPage(fill int64) int {
	if l.swaMode != swaTail {
		return 0
	}
	return int(max(0, fill-l.window) / l.page)
}

func (l *Ledger) clipped(maxNew int) int64 { return min(int64(maxNew), l.clip) }

// checkRequest rejects malformed lengths before anything is touched.
func checkRequest(op string, req Request) error {
	switch {
	case req.PromptLen < 0 || req.PromptLen > maxRequestTokens:
		return fmt.Errorf("%s room %d: prompt length %d out of range: %w", op, req.Room, req.PromptLen, ErrInvalidRequest)
	case req.OutputLen < 0 || req.OutputLen > maxRequestTokens:
		return fmt.Errorf("%s room %d: output length %d out of range: %w", op, req.Room, req.OutputLen, ErrInvalidRequest)
	case req.MaxNewTokens < 0:
		return fmt.Errorf("%s room %d: negative max new tokens %d: %w", op, req.Room, req.MaxNewTokens, ErrInvalidRequest)
	}
	return nil
}

// capacityCheck refuses a request that can never be admitted, nothing
// allocated, with SGLang's messages. It is SGLang's
// _check_if_req_exceed_kv_capacity — the prefill length (origin_len) against
// max_total_num_tokens and, with tail SWA, the SWA requirement
// (_prealloc_required_tokens: swa_tail_len(fill_len) + 0, decode runs with
// disable_radix_cache) against size_swa — extended with the admission
// test of pop_preallocated evaluated on an empty shard, where the budget is
// at its largest (every page free, no active room, no running room, so
// R × active = need_single = retractable = 0):
//
//	max(page_round(fill_len) + R, origin_len + min(max_new, CLIP)) ≤ max_total_num_tokens
//	swa_tail_len(fill_len) + min(max_new, CLIP) ≤ size_swa (tail SWA)
//
// plus the physical page count of the pre-allocation. A request failing
// these would wait at the head of its queue forever (SGLang checks only
// the first terms, so a short prompt with a long output_len or a
// max_new_tokens estimate beyond the pool blocks its queue; here it is
// refused). Whatever Rebootstrap says, fill_len is what is pre-allocated.
// Mamba needs no term: NewLedger guarantees one request's slots exist.
// The returned *CapacityError carries SGLang's exact message, with the
// number the request needs.
func (l *Ledger) capacityCheck(req Request) error {
	origin, fill := originLen(req), fillLen(req)
	if origin > l.maxTotal {
		return &CapacityError{RID: req.RID, Need: origin, Max: l.maxTotal}
	}
	if l.swaMode == swaTail {
		if need := l.swaTailLen(fill); need > l.swaCap {
			return &CapacityError{RID: req.RID, Need: need, Max: l.swaCap, SWA: true}
		}
	}
	maxNew := l.clipped(req.MaxNewTokens)
	if need := max(l.requiredAlloc(fill)+l.reserve, origin+maxNew); need > l.maxTotal {
		return &CapacityError{RID: req.RID, Need: need, Max: l.maxTotal}
	}
	if l.swaMode == swaTail {
		_, swaPages := l.need(fill)
		if need := max(l.swaTailLen(fill)+maxNew, int64(swaPages)*l.page); need > l.swaCap {
			return &CapacityError{RID: req.RID, Need: need, Max: l.swaCap, SWA: true}
		}
	}
	return nil
}

// ---- room bookkeeping ----

func (l *Ledger) newRoom(r *room, req Request) {
	*r = room{id: req.Room, req: req, readyIdx: -1, seq: l.nextSeq}
	l.nextSeq++
	l.rooms[r.id] = r
}

// hold gives r its admission state (recycled when one is free).
func (l *Ledger) hold(r *room) {
	if r.held != nil {
		return
	}
	if n := len(l.freeHeld); n > 0 {
		r.held = l.freeHeld[n-1]
		l.freeHeld[n-1] = nil
		l.freeHeld = l.freeHeld[:n-1]
	} else {
		r.held = &held{}
	}
	r.runIdx, r.runSWAIdx, r.metaSlot = -1, -1, -1
}

func (l *Ledger) setState(r *room, s RoomState) {
	if r.state != 0 {
		l.counts[r.state]--
		if isQueued(r.state) {
			l.queuedTokens -= fillLen(r.req)
		}
	}
	r.state = s
	l.counts[s]++
	if isQueued(s) {
		l.queuedTokens += fillLen(r.req)
	}
}

// isQueued: a room in the queue before admission (SGLang's prealloc queue).
func isQueued(s RoomState) bool { return s == RoomWaiting || s == RoomReady }

// active is _active_req_count without extra: running + transfer queue
// (admitted and claimed) + waiting queue (resumed, not yet running).
func (l *Ledger) active() int64 {
	return int64(l.counts[RoomRunning] + l.counts[RoomAdmitted] + l.counts[RoomClaimed] + l.counts[RoomResumed])
}

func (l *Ledger) queued() int { return l.counts[RoomWaiting] + l.counts[RoomReady] }

// need returns the pages, SWA pages and Mamba slots a fresh pre-allocation
// of fill tokens takes.
func (l *Ledger) need(fill int64) (pages, swa int) {
	pages = int(ceilDiv(fill, l.page))
	if l.swaMode != swaNone {
		swa = pages - l.swaFirstPage(fill)
	}
	return pages, swa
}

// fitsPages reports whether the page pools physically hold a
// pre-allocation of fill tokens. The budget normally guarantees it; this
// guard turns SGLang's "KV cache is full! Bug in memory estimation."
// assertion into a stop for the cases where the budget does not (unrounded
// retracted requirements, SWA page rounding).
func (l *Ledger) fitsPages(fill int64) (pagesOK, swaOK bool) {
	p, s := l.need(fill)
	return l.pages.avail() >= p, l.swaPages.avail() >= s
}

// preAlloc is _pre_alloc without a prefix: a req_to_token row, fill tokens
// of page-rounded KV (alloc_extend / alloc_extend_swa_tail) and the
// per-request state slots. The caller has checked that everything fits.
func (l *Ledger) preAlloc(r *room, fill, origin int64) {
	l.hold(r)
	r.reqSlot = l.reqSlots.pop()
	nPages, nSWA := l.need(fill)
	r.fill = fill
	r.pages = l.pages.take(l.pool.get(nPages), nPages)
	r.xferPages = min(int(ceilDiv(origin, l.page)), nPages)
	if l.swaMode != swaNone {
		r.swa = l.swaPages.take(l.pool.get(nSWA), nSWA)
		r.swaOff = 0
		r.swaFirst = l.swaFirstPage(fill)
		// _swa_payload: the window of the transferred sequence
		// (seq_len = origin_len), window start floored to a page, translated
		// to SWA pages. Clamped to the pages that exist (they differ only
		// for a fresh request that already carries two or more output
		// tokens).
		lo := int(max(0, origin-l.window)/l.page) - r.swaFirst
		hi := r.xferPages - r.swaFirst
		lo = max(0, min(lo, len(r.swa)))
		hi = max(lo, min(hi, len(r.swa)))
		r.xferSWA = [2]int{lo, hi}
	}
	for i := 0; i < l.mambaPerReq; i++ {
		r.mamba[i] = l.mambaS.pop()
	}
	r.nMamba = l.mambaPerReq
}

// freeResources returns everything the room holds to the pools.
func (l *Ledger) freeResources(r *room) {
	if r.held == nil {
		return
	}
	if r.reqSlot != 0 {
		l.reqSlots.push(r.reqSlot)
		r.reqSlot = 0
	}
	l.freeMeta(r)
	if r.pages != nil {
		l.pages.give(r.pages)
		l.pool.put(r.pages)
		r.pages = nil
	}
	if r.swa != nil {
		l.swaPages.give(r.swa[r.swaOff:])
		l.pool.put(r.swa)
		r.swa, r.swaOff, r.swaFirst = nil, 0, 0
	}
	for i, s := range r.retired {
		l.pool.put(s)
		r.retired[i] = nil
	}
	r.retired = r.retired[:0]
	for i := 0; i < r.nMamba; i++ {
		l.mambaS.push(r.mamba[i])
	}
	r.nMamba = 0
	r.fill, r.xferPages, r.xferSWA = 0, 0, [2]int{}
	r.stateBuf[0] = kvlayout.StateIndices{}
}

// freeMeta frees the room's metadata slot (the room marker a slot holds is
// its room's, kept by the room manager: a new owner starts from "not yet
// written", SGLang PR #27374).
func (l *Ledger) freeMeta(r *room) {
	if r.metaSlot >= 0 {
		l.meta.push(r.metaSlot)
		r.metaSlot = -1
	}
}

// detach removes r from whatever queue structure its state puts it in.
func (l *Ledger) detach(r *room) {
	switch r.state {
	case RoomReady:
		l.ready.remove(r)
	case RoomRunning:
		l.removeRunning(r)
	case RoomRetracted:
		l.retracted.remove(r)
		l.retractedFull -= r.retFull
		l.retractedSWA -= r.retSWA
	case RoomHeld:
		l.held.remove(r)
	case RoomDraining:
		l.drained.account(r, -1)
	}
}

// drop ends a room: detach, free, forget, recycle.
func (l *Ledger) drop(r *room) {
	l.detach(r)
	l.freeResources(r)
	l.counts[r.state]--
	if isQueued(r.state) {
		l.queuedTokens -= fillLen(r.req)
	}
	delete(l.rooms, r.id)
	if h := r.held; h != nil {
		retired := h.retired[:0]
		*h = held{retired: retired}
		l.freeHeld = append(l.freeHeld, h)
	}
	*r = room{id: r.id, req: r.req, readyIdx: -1} // the request stays readable (Entry.Request)
}

func (l *Ledger) lookup(op string, id uint64) (*room, error) {
	r, ok := l.rooms[id]
	if !ok {
		return nil, fmt.Errorf("%s room %d: %w", op, id, errUnknownRoom)
	}
	return r, nil
}

func wrongState(op string, r *room) error {
	return fmt.Errorf("%s room %d (%s): %w", op, r.id, r.state, errWrongState)
}

// ---- public API ----
