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
	c := &invariantCheck{l: l}
	c.owners()
	c.rooms()
	c.totals()
	c.freePositions()
	c.heaps()
	c.lists()
	c.recycled()
	return errors.Join(c.errs...)
}

// invariantCheck is one run of CheckInvariants: what it recomputed and the
// problems found.
type invariantCheck struct {
	l    *Ledger
	errs []error

	pages, swa, req, meta, mamba *owners

	counts                                                                 [numRoomStates]int
	queuedTokens, retractable, retractableSWA, retractedFull, retractedSWA int64
	drained                                                                drainedRes
}

func (c *invariantCheck) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// owners marks every free item of every pool.
func (c *invariantCheck) owners() {
	l := c.l
	c.pages = newOwners("pages", 0, l.pages.total, &c.errs)
	for _, p := range l.pages.free {
		c.pages.free(p)
	}
	c.swa = newOwners("swa pages", 0, l.swaPages.total, &c.errs)
	for _, p := range l.swaPages.free {
		c.swa.free(p)
	}
	c.req = newOwners("req slots", 1, len(l.reqSlots.buf), &c.errs)
	for i := 0; i < l.reqSlots.avail(); i++ {
		c.req.free(l.reqSlots.at(i))
	}
	c.meta = newOwners("metadata slots", 0, len(l.meta.buf), &c.errs)
	for i := 0; i < l.meta.avail(); i++ {
		c.meta.free(l.meta.at(i))
	}
	c.mamba = newOwners("mamba slots", 0, len(l.mambaS.buf), &c.errs)
	for i := 0; i < l.mambaS.avail(); i++ {
		c.mamba.free(l.mambaS.at(i))
	}
}

// rooms marks what every room holds and recomputes the counts and budget
// terms; then every item of every pool must be free or held exactly once.
func (c *invariantCheck) rooms() {
	l := c.l
	for id, r := range l.rooms {
		if r.id != id {
			c.fail("room keyed %d records id %d", id, r.id)
		}
		if r.state < RoomWaiting || r.state > RoomDraining {
			c.fail("room %d has invalid state %d", id, int(r.state))
			continue
		}
		c.counts[r.state]++
		l.checkRoom(r, &c.errs)
		r := r.view()
		for _, p := range r.pages {
			c.pages.own(p, id)
		}
		if r.swa != nil {
			for _, p := range r.swa[r.swaOff:] {
				c.swa.own(p, id)
			}
		}
		if r.reqSlot != 0 {
			c.req.own(r.reqSlot, id)
		}
		if r.metaSlot >= 0 {
			c.meta.own(r.metaSlot, id)
		}
		for i := 0; i < r.nMamba; i++ {
			c.mamba.own(r.mamba[i], id)
		}
		if isQueued(r.state) {
			c.queuedTokens += fillLen(r.req)
		}
		switch r.state {
		case RoomRunning:
			c.retractable += int64(r.req.PromptLen) + int64(r.req.OutputLen)
			if l.swaMode == swaTail {
				c.retractableSWA += l.swaTailLen(int64(r.req.PromptLen)) + int64(r.req.OutputLen)
			}
		case RoomRetracted:
			c.retractedFull += r.retFull
			c.retractedSWA += r.retSWA
		case RoomDraining:
			c.drained.account(r, 1)
		}
	}
	c.pages.complete()
	c.swa.complete()
	c.req.complete()
	c.meta.complete()
	c.mamba.complete()
}

// totals compares the maintained counts and budget terms with the
// recomputed ones.
func (c *invariantCheck) totals() {
	l := c.l
	if c.counts != l.counts {
		c.fail("state counters %v, rooms say %v", l.counts, c.counts)
	}
	if c.queuedTokens != l.queuedTokens {
		c.fail("queued tokens %d, recomputed %d", l.queuedTokens, c.queuedTokens)
	}
	if c.retractable != l.retractable {
		c.fail("retractable tokens %d, recomputed %d", l.retractable, c.retractable)
	}
	if c.retractableSWA != l.retractableSWA {
		c.fail("retractable SWA tokens %d, recomputed %d", l.retractableSWA, c.retractableSWA)
	}
	if c.drained != l.drained {
		c.fail("draining rooms hold %+v, recomputed %+v", l.drained, c.drained)
	}
	if c.retractedFull != l.retractedFull || c.retractedSWA != l.retractedSWA {
		c.fail("retracted requirements (%d, %d), recomputed (%d, %d)", l.retractedFull, l.retractedSWA, c.retractedFull, c.retractedSWA)
	}
}

// freePositions checks that every free list's position index locates each
// free item.
func (c *invariantCheck) freePositions() {
	l := c.l
	for i, v := range l.pages.free {
		if int(v) >= 0 && int(v) < len(l.pages.pos) && l.pages.pos[v] != int32(i) {
			c.fail("pages: page %d at %d, position says %d", v, i, l.pages.pos[v])
		}
	}
	for i, v := range l.swaPages.free {
		if int(v) >= 0 && int(v) < len(l.swaPages.pos) && l.swaPages.pos[v] != int32(i) {
			c.fail("swa pages: page %d at %d, position says %d", v, i, l.swaPages.pos[v])
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
				c.fail("%s: slot %d at %d, position says %d", ring.name, v, j, r.pos[v-r.first])
			}
		}
	}
}

// heaps checks the ready and running heaps: order, positions, members.
func (c *invariantCheck) heaps() {
	l := c.l
	c.heap("ready", &l.ready, c.counts[RoomReady], func(r *room) bool { return r.state == RoomReady })
	c.heap("running", &l.runMax, c.counts[RoomRunning], func(r *room) bool { return r.state == RoomRunning })
	wantSWA := 0
	if l.swaMode == swaTail {
		wantSWA = c.counts[RoomRunning]
	}
	c.heap("running swa", &l.runSWAMax, wantSWA, func(r *room) bool { return r.state == RoomRunning })
}

func (c *invariantCheck) heap(name string, h *roomHeap, want int, member func(*room) bool) {
	if !h.valid() {
		c.fail("%s heap order or positions broken", name)
	}
	if h.len() != want {
		c.fail("%s heap has %d rooms, want %d", name, h.len(), want)
	}
	for _, r := range h.items {
		if got, ok := c.l.rooms[r.id]; !ok || got != r {
			c.fail("%s heap holds room %d that is not live", name, r.id)
		} else if !member(r) {
			c.fail("%s heap holds room %d in state %s", name, r.id, r.state)
		}
	}
}

// lists checks the retracted and held lists: links, members, counts.
func (c *invariantCheck) lists() {
	c.list("retracted", &c.l.retracted, RoomRetracted)
	c.list("held", &c.l.held, RoomHeld)
}

func (c *invariantCheck) list(name string, lst *roomList, state RoomState) {
	n := 0
	var prev *room
	for r := lst.head; r != nil; r = r.next {
		if r.prev != prev {
			c.fail("%s list back link broken at room %d", name, r.id)
			break
		}
		if r.state != state {
			c.fail("%s list holds room %d in state %s", name, r.id, r.state)
		}
		if got, ok := c.l.rooms[r.id]; !ok || got != r {
			c.fail("%s list holds room %d that is not live", name, r.id)
		}
		prev = r
		n++
		if n > len(c.l.rooms) {
			c.fail("%s list has a cycle", name)
			break
		}
	}
	if lst.tail != prev {
		c.fail("%s list tail is wrong", name)
	}
	if n != lst.n || n != c.counts[state] {
		c.fail("%s list has %d rooms, records %d, state count %d", name, n, lst.n, c.counts[state])
	}
}

// recycled checks that no recycled admission state is still a room's.
func (c *invariantCheck) recycled() {
	for _, h := range c.l.freeHeld {
		for id, r := range c.l.rooms {
			if r.held == h {
				c.fail("recycled admission state of room %d is still live", id)
			}
		}
	}
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
