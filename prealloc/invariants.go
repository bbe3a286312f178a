package prealloc

import (
	"errors"
	"fmt"
)

// ownership marks for CheckInvariants.
const (
	markNone uint8 = iota
	markFree
	markOwned
)

// owners checks one pool: every index is either free exactly once or owned
// by exactly one live room, never both.
type owners struct {
	name  string
	first int // lowest valid index
	marks []uint8
	by    []uint64 // owning room per index (for messages)
	errs  *[]error
}

func newOwners(name string, first, n int, errs *[]error) *owners {
	return &owners{name: name, first: first, marks: make([]uint8, n), by: make([]uint64, n), errs: errs}
}

func (o *owners) fail(format string, args ...any) {
	*o.errs = append(*o.errs, fmt.Errorf("%s: "+format, append([]any{o.name}, args...)...))
}

func (o *owners) free(idx int32) {
	i := int(idx) - o.first
	if i < 0 || i >= len(o.marks) {
		o.fail("free index %d out of range", idx)
		return
	}
	if o.marks[i] != markNone {
		o.fail("index %d is free twice", idx)
		return
	}
	o.marks[i] = markFree
}

func (o *owners) own(idx int32, room uint64) {
	i := int(idx) - o.first
	if i < 0 || i >= len(o.marks) {
		o.fail("room %d holds out-of-range index %d", room, idx)
		return
	}
	switch o.marks[i] {
	case markFree:
		o.fail("index %d is both free and held by room %d", idx, room)
	case markOwned:
		o.fail("index %d is held by rooms %d and %d", idx, o.by[i], room)
	}
	o.marks[i] = markOwned
	o.by[i] = room
}

func (o *owners) complete() {
	missing := 0
	for _, m := range o.marks {
		if m == markNone {
			missing++
		}
	}
	if missing > 0 {
		o.fail("%d of %d indices are neither free nor held (leaked)", missing, len(o.marks))
	}
}

// CheckInvariants verifies the ledger's accounting and returns every
// violation found (nil if none): for every pool free + used == total, no
// index is free twice, held twice, or both free and held, and every held
// index belongs to exactly one live room; each room holds exactly what its
// state implies; the ready and running heaps, the retracted and
// held lists and the per-state counters match the rooms; the incrementally
// maintained budget terms and the draining rooms' totals equal their
// definitions recomputed from scratch; every free list's position index
// (used by Adopt) locates each free item (a mark left behind would show as
// an out-of-range free index).
// It is O(pool size + rooms) and meant for tests and debugging.
func (l *Ledger) CheckInvariants() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	pages := newOwners("pages", 0, l.pages.total, &errs)
	for _, p := range l.pages.free {
		pages.free(p)
	}
	swa := newOwners("swa pages", 0, l.swaPages.total, &errs)
	for _, p := range l.swaPages.free {
		swa.free(p)
	}
	req := newOwners("req slots", 1, len(l.reqSlots.buf), &errs)
	for i := 0; i < l.reqSlots.avail(); i++ {
		req.free(l.reqSlots.at(i))
	}
	meta := newOwners("metadata slots", 0, len(l.meta.buf), &errs)
	for i := 0; i < l.meta.avail(); i++ {
		s := l.meta.at(i)
		meta.free(s)
	}
	mamba := newOwners("mamba slots", 0, len(l.mambaS.buf), &errs)
	for i := 0; i < l.mambaS.avail(); i++ {
		mamba.free(l.mambaS.at(i))
	}

	var counts [numRoomStates]int
	var retractable, retractableSWA, retractedFull, retractedSWA int64
	var drained drainedRes
	for id, r := range l.rooms {
		if r.id != id {
			fail("room keyed %d records id %d", id, r.id)
		}
		if r.state < RoomWaiting || r.state > RoomDraining {
			fail("room %d has invalid state %d", id, int(r.state))
			continue
		}
		counts[r.state]++
		l.checkRoom(r, &errs)
		r := r.view()
		for _, p := range r.pages {
			pages.own(p, id)
		}
		if r.swa != nil {
			for _, p := range r.swa[r.swaOff:] {
				swa.own(p, id)
			}
		}
		if r.reqSlot != 0 {
			req.own(r.reqSlot, id)
		}
		if r.metaSlot >= 0 {
			meta.own(r.metaSlot, id)
		}
		for i := 0; i < r.nMamba; i++ {
			mamba.own(r.mamba[i], id)
		}
		switch r.state {
		case RoomRunning:
			retractable += int64(r.req.PromptLen) + int64(r.req.OutputLen)
			if l.swaMode == swaTail {
				retractableSWA += l.swaTailLen(int64(r.req.PromptLen)) + int64(r.req.OutputLen)
			}
		case RoomRetracted:
			retractedFull += r.retFull
			retractedSWA += r.retSWA
		case RoomDraining:
			drained.account(r, 1)
		}
	}
	pages.complete()
	swa.complete()
	req.complete()
	meta.complete()
	mamba.complete()

	if counts != l.counts {
		fail("state counters %v, rooms say %v", l.counts, counts)
	}
	if retractable != l.retractable {
		fail("retractable tokens %d, recomputed %d", l.retractable, retractable)
	}
	if retractableSWA != l.retractableSWA {
		fail("retractable SWA tokens %d, recomputed %d", l.retractableSWA, retractableSWA)
	}
	if drained != l.drained {
		fail("draining rooms hold %+v, recomputed %+v", l.drained, drained)
	}
	for i, v := range l.pages.free {
		if int(v) >= 0 && int(v) < len(l.pages.pos) && l.pages.pos[v] != int32(i) {
			fail("pages: page %d at %d, position says %d", v, i, l.pages.pos[v])
		}
	}
	for i, v := range l.swaPages.free {
		if int(v) >= 0 && int(v) < len(l.swaPages.pos) && l.swaPages.pos[v] != int32(i) {
			fail("swa pages: page %d at %d, position says %d", v, i, l.swaPages.pos[v])
		}
	}
	for _, ring := range []struct {
		name string
		r    *slotRing
	}{{"req slots", &l.reqSlots}, {"metadata slots", &l.meta}, {"mamba slots", &l.mambaS}} {
		r := ring.r
		for i := 0; i < r.avail(); i++ {
			j := r.head + i
			if j >= len(r.buf) {
				j -= len(r.buf)
			}
			if v := r.buf[j]; r.inRange(v) && r.pos[v-r.first] != int32(j) {
				fail("%s: slot %d at %d, position says %d", ring.name, v, j, r.pos[v-r.first])
			}
		}
	}
	if retractedFull != l.retractedFull || retractedSWA != l.retractedSWA {
		fail("retracted requirements (%d, %d), recomputed (%d, %d)", l.retractedFull, l.retractedSWA, retractedFull, retractedSWA)
	}

	checkHeap := func(name string, h *roomHeap, want int, member func(*room) bool) {
		if !h.valid() {
			fail("%s heap order or positions broken", name)
		}
		if h.len() != want {
			fail("%s heap has %d rooms, want %d", name, h.len(), want)
		}
		for _, r := range h.items {
			if got, ok := l.rooms[r.id]; !ok || got != r {
				fail("%s heap holds room %d that is not live", name, r.id)
			} else if !member(r) {
				fail("%s heap holds room %d in state %s", name, r.id, r.state)
			}
		}
	}
	checkHeap("ready", &l.ready, counts[RoomReady], func(r *room) bool { return r.state == RoomReady })
	checkHeap("running", &l.runMax, counts[RoomRunning], func(r *room) bool { return r.state == RoomRunning })
	wantSWA := 0
	if l.swaMode == swaTail {
		wantSWA = counts[RoomRunning]
	}
	checkHeap("running swa", &l.runSWAMax, wantSWA, func(r *room) bool { return r.state == RoomRunning })

	checkList := func(name string, lst *roomList, state RoomState) {
		n := 0
		var prev *room
		for r := lst.head; r != nil; r = r.next {
			if r.prev != prev {
				fail("%s list back link broken at room %d", name, r.id)
				break
			}
			if r.state != state {
				fail("%s list holds room %d in state %s", name, r.id, r.state)
			}
			if got, ok := l.rooms[r.id]; !ok || got != r {
				fail("%s list holds room %d that is not live", name, r.id)
			}
			prev = r
			n++
			if n > len(l.rooms) {
				fail("%s list has a cycle", name)
				break
			}
		}
		if lst.tail != prev {
			fail("%s list tail is wrong", name)
		}
		if n != lst.n || n != counts[state] {
			fail("%s list has %d rooms, records %d, state count %d", name, n, lst.n, counts[state])
		}
	}
	checkList("retracted", &l.retracted, RoomRetracted)
	checkList("held", &l.held, RoomHeld)

	for _, h := range l.freeHeld {
		for id, r := range l.rooms {
			if r.held == h {
				fail("recycled admission state of room %d is still live", id)
			}
		}
	}
	return errors.Join(errs...)
}

// view is r with an empty admission state when it has none, for reading.
func (r *room) view() *room {
	if r.held != nil {
		return r
	}
	v := *r
	v.held = &held{runIdx: -1, runSWAIdx: -1, metaSlot: -1}
	return &v
}

// checkRoom verifies that r holds exactly what its state implies.
func (l *Ledger) checkRoom(r *room, errs *[]error) {
	if r.held == nil && r.state.holdsAllocation() {
		*errs = append(*errs, fmt.Errorf("room %d (%s): holds an allocation but has no admission state", r.id, r.state))
		return
	}
	r = r.view()
	fail := func(format string, args ...any) {
		*errs = append(*errs, fmt.Errorf("room %d (%s): "+format, append([]any{r.id, r.state}, args...)...))
	}
	holds := r.state.holdsAllocation()
	if !holds {
		if r.reqSlot != 0 || r.metaSlot >= 0 || len(r.pages) != 0 || r.swa != nil || r.nMamba != 0 || len(r.retired) != 0 {
			fail("holds resources (req %d, meta %d, %d pages, %d mamba)", r.reqSlot, r.metaSlot, len(r.pages), r.nMamba)
		}
	} else {
		if r.reqSlot == 0 {
			fail("holds no req slot")
		}
		wantMeta := r.state == RoomAdmitted || r.state == RoomClaimed
		if (r.metaSlot >= 0) != wantMeta && r.state != RoomDraining {
			fail("metadata slot %d, want one: %v", r.metaSlot, wantMeta)
		}
		if r.nMamba != l.mambaPerReq {
			fail("holds %d mamba slots, want %d", r.nMamba, l.mambaPerReq)
		}
		base := int(ceilDiv(r.fill, l.page))
		switch r.state {
		case RoomRunning, RoomDraining:
			// A draining room keeps what it held as admitted, claimed,
			// resumed or running: at most its running extent.
			seq := int(ceilDiv(int64(r.req.PromptLen)+int64(r.req.OutputLen), l.page))
			if len(r.pages) < base || len(r.pages) > max(base, seq) {
				fail("holds %d pages, want between %d and %d", len(r.pages), base, max(base, seq))
			}
		default:
			if len(r.pages) != base {
				fail("holds %d pages for fill %d, want %d", len(r.pages), r.fill, base)
			}
			if r.xferPages > len(r.pages) {
				fail("transfer view of %d pages exceeds %d held", r.xferPages, len(r.pages))
			}
		}
		if l.swaMode != swaNone {
			if end := r.swaFirst + len(r.swa) - r.swaOff; end != len(r.pages) {
				fail("SWA pages end at page %d, full pages at %d", end, len(r.pages))
			}
		}
	}
	if (r.readyIdx >= 0) != (r.state == RoomReady) {
		fail("ready heap position %d", r.readyIdx)
	}
	if (r.runIdx >= 0) != (r.state == RoomRunning) {
		fail("running heap position %d", r.runIdx)
	}
	if r.state == RoomRunning {
		if want := l.clipped(r.req.MaxNewTokens) + int64(r.req.PromptLen); r.runKey != want {
			fail("running key %d, want %d", r.runKey, want)
		}
		if r.runTokens != int64(r.req.PromptLen)+int64(r.req.OutputLen) {
			fail("running tokens %d, want %d", r.runTokens, int64(r.req.PromptLen)+int64(r.req.OutputLen))
		}
	}
	if r.state == RoomRetracted {
		if f := fillLen(r.req); r.retFill != f || r.retFull != f+l.reserve {
			fail("retracted needs (%d, %d), want (%d, %d)", r.retFill, r.retFull, f, f+l.reserve)
		}
		if l.swaMode == swaTail && r.retSWA != l.swaTailLen(r.retFill) {
			fail("retracted SWA need %d, want %d", r.retSWA, l.swaTailLen(r.retFill))
		}
	}
}
