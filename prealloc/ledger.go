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
	p, a := cfg.Pool, cfg.Admission
	if !p.Kind.Known() {
		return nil, fmt.Errorf("new ledger: unknown kv pool kind %d", int(p.Kind))
	}
	if p.PageSize <= 0 || p.PageSize > 1<<20 {
		return nil, fmt.Errorf("new ledger: page size %d out of range (1..%d)", p.PageSize, 1<<20)
	}
	nPages := p.Pages()
	if nPages <= 0 || nPages > math.MaxInt32 {
		return nil, fmt.Errorf("new ledger: pool of %d pages cannot be represented (need 1..%d)", nPages, math.MaxInt32)
	}
	nReq := p.ReqSlots()
	if p.RequestSlots <= 0 || nReq <= 0 || nReq >= math.MaxInt32 {
		return nil, fmt.Errorf("new ledger: %d request slots cannot be represented (need 1..%d)", nReq, math.MaxInt32-1)
	}
	nMeta := p.Metadata()
	if nMeta <= 0 || nMeta > math.MaxInt32 {
		return nil, fmt.Errorf("new ledger: %d metadata slots cannot be represented (need 1..%d)", nMeta, math.MaxInt32)
	}
	if a.ReservedDecodeTokens < 0 || a.ReservedDecodeTokens > maxRequestTokens {
		return nil, fmt.Errorf("new ledger: reserved decode tokens %d out of range", a.ReservedDecodeTokens)
	}
	if a.ClipMaxNewTokens <= 0 {
		return nil, fmt.Errorf("new ledger: clip max new tokens %d must be > 0", a.ClipMaxNewTokens)
	}
	if a.MaxQueued < 0 {
		return nil, fmt.Errorf("new ledger: negative max queued %d", a.MaxQueued)
	}
	if a.MaxBypass < 0 || a.MaxBypass > kvlayout.MaxBypassLimit {
		return nil, fmt.Errorf("new ledger: max bypass %d out of range (0..%d)", a.MaxBypass, kvlayout.MaxBypassLimit)
	}
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
	var nSWA int64
	switch p.Kind {
	case kvlayout.KindHybridSWA:
		if p.SWA.Window <= 0 {
			return nil, fmt.Errorf("new ledger: hybrid-swa sliding window %d must be > 0", p.SWA.Window)
		}
		nSWA = p.SWA.TotalTokens / l.page
		if nSWA <= 0 || nSWA > math.MaxInt32 {
			return nil, fmt.Errorf("new ledger: SWA pool of %d pages cannot be represented (need 1..%d)", nSWA, math.MaxInt32)
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
			return nil, fmt.Errorf("new ledger: %d mamba slots per request (ping_pong %d) not supported", l.mambaPerReq, p.Mamba.PingPong)
		}
		if p.Mamba.StateSlots < l.mambaPerReq || p.Mamba.StateSlots > math.MaxInt32 {
			return nil, fmt.Errorf("new ledger: %d mamba state slots cannot hold one request (%d slots each)", p.Mamba.StateSlots, l.mambaPerReq)
		}
		l.mambaS = newSlotRing(0, p.Mamba.StateSlots)
	}
	l.pages = newPageStack(int(nPages))
	l.swaPages = newPageStack(int(nSWA))
	l.reqSlots = newSlotRing(1, nReq) // row 0 is padding (DecodeReqToTokenPool)
	l.meta = newSlotRing(0, nMeta)
	l.pool.limit = 2*int(nPages+nSWA) + 4096

	l.ready = roomHeap{less: l.readyLess, pos: func(r *room) *int32 { return &r.readyIdx }}
	l.runMax = roomHeap{less: func(a, b *room) bool { return a.runKey > b.runKey }, pos: func(r *room) *int32 { return &r.runIdx }}
	l.runSWAMax = roomHeap{less: func(a, b *room) bool { return a.runSWAKey > b.runSWAKey }, pos: func(r *room) *int32 { return &r.runSWAIdx }}
	return l, nil
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
	}
	r.state = s
	l.counts[s]++
}

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

func (l *Ledger) addRunning(r *room) {
	r.runTokens = int64(r.req.PromptLen) + int64(r.req.OutputLen)
	r.runKey = l.clipped(r.req.MaxNewTokens) + int64(r.req.PromptLen)
	l.retractable += r.runTokens
	l.runMax.push(r)
	if l.swaMode == swaTail {
		r.runSWATok = l.swaTailLen(int64(r.req.PromptLen)) + int64(r.req.OutputLen)
		r.runSWAKey = l.swaTailLen(int64(r.req.PromptLen)) + l.clipped(r.req.MaxNewTokens)
		l.retractableSWA += r.runSWATok
		l.runSWAMax.push(r)
	}
}

func (l *Ledger) removeRunning(r *room) {
	l.retractable -= r.runTokens
	l.runMax.remove(r)
	if l.swaMode == swaTail {
		l.retractableSWA -= r.runSWATok
		l.runSWAMax.remove(r)
	}
	r.runTokens, r.runSWATok = 0, 0
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

// Enqueue adds a room to the admission queue, not yet ready (waiting for its
// handshake). It runs SGLang's entry capacity check first: a request that
// can never fit returns a *CapacityError whose Error() is SGLang's exact
// message (unwrapped, so it can be returned to the client verbatim) and
// nothing is allocated. Other errors: ErrInvalidRequest, ErrDraining,
// errRoomExists, ErrQueueFull. The room's queue position is fixed here:
// arrival order, or priority then arrival order.
func (l *Ledger) Enqueue(req Request) error { return l.EnqueueEntry(new(Entry), req) }

// EnqueueEntry is Enqueue with the room's record kept in e, which the
// caller owns (see Entry): e must not be in a ledger already, and the
// ledger uses it until the room is gone (Release, a dropped held
// room).
func (l *Ledger) EnqueueEntry(e *Entry, req Request) error {
	if err := checkRequest("enqueue", req); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining {
		return fmt.Errorf("enqueue room %d: %w", req.Room, ErrDraining)
	}
	if _, ok := l.rooms[req.Room]; ok {
		return fmt.Errorf("enqueue room %d: %w", req.Room, errRoomExists)
	}
	if err := l.capacityCheck(req); err != nil {
		return err
	}
	if l.queued() >= l.maxQueued {
		return fmt.Errorf("enqueue room %d: %d rooms queued: %w", req.Room, l.queued(), ErrQueueFull)
	}
	r := &e.r
	l.newRoom(r, req)
	l.setState(r, RoomWaiting)
	return nil
}

// SetReady marks a waiting room's handshake as done (prefill known, DP rank
// resolved) so that admission passes consider it, at its original queue
// position. Idempotent for a ready room; errWrongState otherwise.
func (l *Ledger) SetReady(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("set ready", id)
	if err != nil {
		return err
	}
	switch r.state {
	case RoomReady:
		return nil
	case RoomWaiting:
		l.setState(r, RoomReady)
		l.ready.push(r)
		return nil
	}
	return wrongState("set ready", r)
}

// Claim records that every required prefill rank claimed the room's
// destination. Idempotent for a claimed
// room; errWrongState unless the room is admitted.
func (l *Ledger) Claim(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("claim", id)
	if err != nil {
		return err
	}
	switch r.state {
	case RoomClaimed:
		return nil
	case RoomAdmitted:
		l.setState(r, RoomClaimed)
		return nil
	}
	return wrongState("claim", r)
}

// Allocation returns what the room holds. ok is false if the room is unknown
// or holds nothing (waiting, ready, retracted, held). For an admitted or
// claimed room Pages are the transfer destination (kv_to_page_indices of the
// tokens prefill writes); for a resumed, running or draining room they are
// every page it holds (and State its live state). MetadataSlot is -1 when
// the room holds none (resumed, running, and draining rooms drained from
// those).
// The slices are owned by the ledger; see the package documentation.
func (l *Ledger) Allocation(id uint64) (Allocation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.rooms[id]
	if !ok || !r.state.holdsAllocation() {
		return Allocation{}, false
	}
	return l.allocationOf(r), true
}

// stateOf is the room's state component as SGLang's pop_preallocated builds
// it (one entry per kv_args.state_types; decodeplane kinds have at most one).
func (l *Ledger) stateOf(r *room, xfer bool, pages []int32) kvlayout.StateIndices {
	si := kvlayout.StateIndices{Type: l.stateType}
	switch l.stateType {
	case kvlayout.StateMamba:
		// _mamba_payload: the request's main Mamba slot only.
		si.Indices = r.mamba[0:1:1]
	case kvlayout.StateSWA:
		if xfer {
			si.Indices = r.swa[r.swaOff+r.xferSWA[0] : r.swaOff+r.xferSWA[1]]
		} else {
			si.Indices = r.swa[r.swaOff:]
		}
	case kvlayout.StateDSA:
		// _dsa_payload: full-sequence page ids at the device page size.
		si.Indices = pages
	}
	return si
}

// allocationOf renders r's allocation. A room in its admission view
// (admitted, claimed, resumed) shares the State entry written once by
// admissionView; a running room gets a fresh State slice, so a caller's
// earlier view never changes under it.
func (l *Ledger) allocationOf(r *room) Allocation {
	a := Allocation{
		ReqSlot:      r.reqSlot,
		MetadataSlot: r.metaSlot,
		FillLen:      int(r.fill),
		AllocTokens:  int(int64(len(r.pages)) * l.page),
		Pages:        r.pages,
	}
	xfer := r.state == RoomAdmitted || r.state == RoomClaimed
	if xfer {
		a.Pages = r.pages[:r.xferPages:r.xferPages]
	}
	if r.nMamba > 1 {
		a.MambaPingPong = r.mamba[1:r.nMamba:r.nMamba]
	}
	if l.stateType == 0 {
		return a
	}
	if r.state == RoomRunning || r.state == RoomDraining {
		a.State = []kvlayout.StateIndices{l.stateOf(r, false, a.Pages)}
	} else {
		a.State = r.stateBuf[:1:1]
	}
	return a
}

// admissionView writes the room's admission-time State entry (once per
// admission or resumption) and returns its allocation.
func (l *Ledger) admissionView(r *room) Allocation {
	if l.stateType != 0 {
		xfer := r.state == RoomAdmitted
		pages := r.pages
		if xfer {
			pages = r.pages[:r.xferPages:r.xferPages]
		}
		r.stateBuf[0] = l.stateOf(r, xfer, pages)
	}
	return l.allocationOf(r)
}

// StartRunning records that the room's transfer succeeded (admitted or
// claimed room) or that its CPU copy was restored (resumed room): it joins
// the running set with PromptLen + OutputLen tokens and keeps its pages; its
// metadata slot is reset and freed (pop_transferred). A rebootstrap room
// stops being one (the recompute is done). errWrongState otherwise.
func (l *Ledger) StartRunning(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("start running", id)
	if err != nil {
		return err
	}
	switch r.state {
	case RoomAdmitted, RoomClaimed, RoomResumed:
	default:
		return wrongState("start running", r)
	}
	l.freeMeta(r)
	r.req.Rebootstrap = false
	l.setState(r, RoomRunning)
	l.addRunning(r)
	return nil
}

// UpdateRunning records that a running room's output now has outputLen
// tokens (len(output_ids)). It allocates KV pages when the sequence
// (prompt + outputLen tokens, the KV the next decode step writes) crosses a
// page boundary and returns the new page indices in token order (nil if
// none). On a hybrid-swa pool it also grows the room's SWA pages and frees
// the SWA pages that slid out of the window (see the package documentation).
// If the pools are short it returns ErrNoCapacity and allocates nothing.
// outputLen may not shrink (ErrInvalidRequest, nothing changed). Every call
// that is not refused — grown, unchanged or ErrNoCapacity — is also the
// engine's decode-step report that lets rooms retracted before it resume
// (see Retract).
func (l *Ledger) UpdateRunning(id uint64, outputLen int) ([]int32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("update running", id)
	if err != nil {
		return nil, err
	}
	if r.state != RoomRunning {
		return nil, wrongState("update running", r)
	}
	if outputLen < r.req.OutputLen || outputLen > maxRequestTokens {
		return nil, fmt.Errorf("update running room %d: output length %d (was %d): %w", id, outputLen, r.req.OutputLen, ErrInvalidRequest)
	}
	// A valid report, grown or not: rooms retracted before it may resume.
	l.steps++
	seq := int64(r.req.PromptLen) + int64(outputLen)
	have := len(r.pages)
	want := max(have, int(ceilDiv(seq, l.page)))
	newFull := want - have

	// SWA: ScheduleBatch._evict_swa frees the SWA KV of tokens before
	// page_floor(max(evicted, pre_len - window - page)) with pre_len = seq - 1.
	var swaEvict, swaAlloc, newFirst int
	if l.swaMode != swaNone {
		liveEnd := r.swaFirst + len(r.swa) - r.swaOff
		evTok := max(int64(r.swaFirst)*l.page, seq-1-l.window-l.page)
		newFirst = max(r.swaFirst, int(evTok/l.page))
		swaEvict = min(newFirst, liveEnd) - r.swaFirst
		swaAlloc = max(0, want-max(liveEnd, newFirst))
		if l.swaPages.avail()+swaEvict < swaAlloc {
			return nil, fmt.Errorf("update running room %d: %d SWA pages needed, %d free: %w", id, swaAlloc, l.swaPages.avail()+swaEvict, ErrNoCapacity)
		}
	}
	if l.pages.avail() < newFull {
		return nil, fmt.Errorf("update running room %d: %d pages needed, %d free: %w", id, newFull, l.pages.avail(), ErrNoCapacity)
	}
	// Commit.
	delta := int64(outputLen - r.req.OutputLen)
	r.req.OutputLen = outputLen
	r.runTokens += delta
	l.retractable += delta
	if l.swaMode == swaTail {
		r.runSWATok += delta
		l.retractableSWA += delta
	}
	if l.swaMode != swaNone {
		if swaEvict > 0 {
			l.swaPages.give(r.swa[r.swaOff : r.swaOff+swaEvict])
			r.swaOff += swaEvict
		}
		if newFirst > r.swaFirst+swaEvict {
			// Every live SWA page was evicted and the window starts past them.
			r.swaOff = len(r.swa)
		}
		r.swaFirst = newFirst
		if swaAlloc > 0 {
			if cap(r.swa)-len(r.swa) < swaAlloc {
				live := r.swa[r.swaOff:]
				ns := append(l.pool.get(len(live)+swaAlloc), live...)
				if r.swa != nil {
					r.retired = append(r.retired, r.swa)
				}
				r.swa, r.swaOff = ns, 0
			}
			r.swa = l.swaPages.take(r.swa, swaAlloc)
		}
	}
	if newFull == 0 {
		return nil, nil
	}
	if cap(r.pages)-have < newFull {
		np := append(l.pool.get(want), r.pages...)
		if r.pages != nil {
			r.retired = append(r.retired, r.pages)
		}
		r.pages = np
	}
	r.pages = l.pages.take(r.pages, newFull)
	return r.pages[have:want:want], nil
}

// Retract moves a running room to the retracted queue (KV pressure; the
// engine keeps a CPU copy): its req slot, pages and state slots are freed at
// once. Admission passes resume retracted rooms first, in retraction order,
// and admit nothing new while any remain. SGLang retracts inside
// update_running_batch: the running batch then grows into the freed pages,
// and only the next process_decode_queue resumes retracted requests. The
// ledger keeps that order across separate calls: while rooms are running, a
// retracted room is not resumed before the next UpdateRunning (the engine's
// next decode-step report); with no running room it may resume at the next
// pass. Refused unless running; ErrCannotResume if the room could not resume even
// on an empty shard (fill_len + R beyond the pool, or its SWA tail beyond
// the SWA pool): nothing changes then (Hold or Release it instead).
func (l *Ledger) Retract(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("retract", id)
	if err != nil {
		return err
	}
	if r.state != RoomRunning {
		return wrongState("retract", r)
	}
	// _prealloc_required_tokens of the retracted request: fill_len + R for
	// the full pool and swa_tail_len(fill_len) (+0, no radix cache) for SWA.
	fill := fillLen(r.req)
	full := fill + l.reserve
	var swaNeed int64
	if l.swaMode == swaTail {
		swaNeed = l.swaTailLen(fill)
	}
	// A room that could not resume even on an empty shard would stay
	// retracted forever and block every admission behind it: refuse.
	_, swaPages := l.need(fill)
	if full > l.maxTotal || swaNeed > l.swaCap || swaPages > l.swaPages.total {
		return fmt.Errorf("retract room %d: it could never resume: fill_len %d + %d reserved tokens > %d pool tokens (or its SWA tail > %d): %w",
			id, fill, l.reserve, l.maxTotal, l.swaCap, ErrCannotResume)
	}
	l.removeRunning(r)
	l.freeResources(r)
	r.retFill, r.retFull, r.retSWA = fill, full, swaNeed
	r.retStep = l.steps
	l.retractedFull += r.retFull
	l.retractedSWA += r.retSWA
	l.setState(r, RoomRetracted)
	l.retracted.pushBack(r)
	return nil
}

// Hold moves a running room to the held rebootstrap list
// (pause_generation(mode="retract")): its resources are freed and it is not
// admitted again until ResumeHeld. Like SGLang, the boundary token is popped
// from the output (OutputLen decreases by one if positive); it is replayed
// at commit. errWrongState unless running.
func (l *Ledger) Hold(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("hold", id)
	if err != nil {
		return err
	}
	if r.state != RoomRunning {
		return wrongState("hold", r)
	}
	l.removeRunning(r)
	l.freeResources(r)
	r.req.OutputLen = max(r.req.OutputLen-1, 0)
	r.req.Rebootstrap = true
	l.setState(r, RoomHeld)
	l.held.pushBack(r)
	return nil
}

// ResumeHeld is continue_generation: every held room re-enters the queue, in
// hold order, behind the rooms already queued, as a rebootstrap request
// (fill_len with no -1) that is NOT ready (it needs a new handshake). It
// returns the rooms that re-entered. A held room that fails the entry
// capacity check (SGLang's add() aborts it) is released and omitted. Held
// rooms re-enter even beyond admission.max_queued or while draining: they
// are existing requests, not new ones.
func (l *Ledger) ResumeHeld() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held.n == 0 {
		return nil
	}
	out := make([]uint64, 0, l.held.n)
	for r := l.held.head; r != nil; {
		next := r.next
		if l.capacityCheck(r.req) != nil {
			l.drop(r)
			r = next
			continue
		}
		l.held.remove(r)
		r.seq = l.nextSeq
		r.bypassed = 0
		l.nextSeq++
		l.setState(r, RoomWaiting)
		out = append(out, r.id)
		r = next
	}
	return out
}

// Release ends the room from any state and returns exactly what it holds to
// the pools. An unknown or already released room is errUnknownRoom (never a
// double free). Unlike SGLang, held rebootstrap rooms can be released too.
// For a draining room this is the deferred release: its pages, slots and
// metadata slot become free at once.
func (l *Ledger) Release(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("release", id)
	if err != nil {
		return err
	}
	l.drop(r)
	return nil
}

// Drain stops taking new rooms (Enqueue returns ErrDraining) and stops
// admitting queued rooms (Admit reports BlockDraining). Existing rooms can
// still be claimed, run, retracted, resumed from retraction (so that running
// requests can finish) and released. Drain cannot be undone.
func (l *Ledger) Drain() {
	l.mu.Lock()
	l.draining = true
	l.mu.Unlock()
}

// State returns the room's lifecycle state; ok is false for an unknown room.
func (l *Ledger) State(id uint64) (RoomState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.rooms[id]
	if !ok {
		return 0, false
	}
	return r.state, true
}

// RoomRequest returns the ledger's view of the room's request: OutputLen as
// last reported (UpdateRunning), popped by Hold, and Rebootstrap as set by
// Hold or cleared by StartRunning.
func (l *Ledger) RoomRequest(id uint64) (Request, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.rooms[id]
	if !ok {
		return Request{}, false
	}
	return r.req, true
}

// Stats returns a snapshot of the shard's accounting.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	rs := func(total, free int, draining int64) ResourceStats {
		return ResourceStats{Total: int64(total), Free: int64(free), Used: int64(total - free), Draining: draining}
	}
	d := &l.drained
	s := Stats{
		Shard:       l.shard,
		Pages:       rs(l.pages.total, l.pages.avail(), d.pages),
		ReqSlots:    rs(len(l.reqSlots.buf), l.reqSlots.avail(), d.req),
		MetaSlots:   rs(len(l.meta.buf), l.meta.avail(), d.meta),
		Waiting:     l.counts[RoomWaiting],
		Ready:       l.counts[RoomReady],
		Admitted:    l.counts[RoomAdmitted],
		Claimed:     l.counts[RoomClaimed],
		Resumed:     l.counts[RoomResumed],
		Running:     l.counts[RoomRunning],
		Retracted:   l.counts[RoomRetracted],
		Held:        l.counts[RoomHeld],
		Draining:    l.counts[RoomDraining],
		LastBlocked: l.lastBlocked,
		FullBudget:  l.lastFull,
		Budget:      l.fullBudget(true, true),
		SWABudget:   l.lastSWABudget,
		Retractable: l.retractable,
	}
	if l.mambaPerReq > 0 {
		s.MambaSlots = rs(len(l.mambaS.buf), l.mambaS.avail(), d.mamba)
	}
	if l.swaMode != swaNone {
		s.SWAPages = rs(l.swaPages.total, l.swaPages.avail(), d.swa)
	}
	return s
}
