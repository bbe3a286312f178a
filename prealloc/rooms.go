package prealloc

import (
	"fmt"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// A room's way through the ledger up to running, its end, and the reads.

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
		Shard:        l.shard,
		Pages:        rs(l.pages.total, l.pages.avail(), d.pages),
		ReqSlots:     rs(len(l.reqSlots.buf), l.reqSlots.avail(), d.req),
		MetaSlots:    rs(len(l.meta.buf), l.meta.avail(), d.meta),
		Waiting:      l.counts[RoomWaiting],
		Ready:        l.counts[RoomReady],
		QueuedTokens: l.queuedTokens,
		Admitted:     l.counts[RoomAdmitted],
		Claimed:      l.counts[RoomClaimed],
		Resumed:      l.counts[RoomResumed],
		Running:      l.counts[RoomRunning],
		Retracted:    l.counts[RoomRetracted],
		Held:         l.counts[RoomHeld],
		Draining:     l.counts[RoomDraining],
		LastBlocked:  l.lastBlocked,
		FullBudget:   l.lastFull,
		Budget:       l.fullBudget(true, true),
		SWABudget:    l.lastSWABudget,
		Retractable:  l.retractable,
	}
	if l.mambaPerReq > 0 {
		s.MambaSlots = rs(len(l.mambaS.buf), l.mambaS.avail(), d.mamba)
	}
	if l.swaMode != swaNone {
		s.SWAPages = rs(l.swaPages.total, l.swaPages.avail(), d.swa)
	}
	return s
}
