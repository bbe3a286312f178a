package prealloc

import "fmt"

// Outcomes of checkIndices.
const (
	idxOK = iota
	idxRange
	idxTwice
	idxHeld
)

// freeList is a free list indexed by item (pageStack, slotRing).
type freeList interface {
	inRange(v int32) bool
	// loc is where v sits in slots() if it is free (or marked), else -1.
	loc(v int32) int
	slots() []int32
}

// checkIndices tests indices against a free list: each must be in range,
// free and named once. It returns idxOK, or the first problem and the index
// concerned. To recognise a second mention it marks each free index it has
// seen in place (slots()[loc(v)] = ^v, never a valid index) and restores
// every mark before returning: O(len(idx)), nothing changed, no allocation.
func checkIndices[F freeList](f F, idx []int32) (int, int32) {
	res, bad, k := idxOK, int32(0), 0
	arr := f.slots()
	for ; k < len(idx); k++ {
		v := idx[k]
		if !f.inRange(v) {
			res, bad = idxRange, v
			break
		}
		i := f.loc(v)
		if i < 0 || (arr[i] != v && arr[i] != ^v) {
			res, bad = idxHeld, v
			break
		}
		if arr[i] == ^v {
			res, bad = idxTwice, v
			break
		}
		arr[i] = ^v
	}
	for _, v := range idx[:k] { // distinct, free and marked
		arr[f.loc(v)] = v
	}
	return res, bad
}

// ownerOf names the live room that holds index v of a pool (for messages;
// O(rooms + their pages), on the error path only).
func (l *Ledger) ownerOf(pool string, v int32) (uint64, bool) {
	for id, r := range l.rooms {
		if r.held == nil {
			continue
		}
		var held []int32
		switch pool {
		case "page":
			held = r.pages
		case "swa page":
			if r.swa != nil {
				held = r.swa[r.swaOff:]
			}
		case "mamba slot":
			held = r.mamba[:r.nMamba]
		case "req slot":
			if r.reqSlot == v {
				return id, true
			}
		}
		for _, x := range held {
			if x == v {
				return id, true
			}
		}
	}
	return 0, false
}

// indexError renders a checkIndices problem.
func (l *Ledger) indexError(room uint64, pool string, res int, v int32, limit string) error {
	switch res {
	case idxRange:
		return fmt.Errorf("adopt room %d: %s %d out of range (%s): %w", room, pool, v, limit, ErrInvalidRequest)
	case idxTwice:
		return fmt.Errorf("adopt room %d: %s %d named twice: %w", room, pool, v, ErrInvalidRequest)
	}
	if owner, ok := l.ownerOf(pool, v); ok {
		return fmt.Errorf("adopt room %d: %s %d is held by room %d: %w", room, pool, v, owner, ErrOwned)
	}
	return fmt.Errorf("adopt room %d: %s %d is not free: %w", room, pool, v, ErrOwned)
}

// Adopt is AdoptEntry with a record the ledger allocates.
func (l *Ledger) Adopt(a Adoption) error { return l.AdoptEntry(new(Entry), a) }

// AdoptEntry makes a RUNNING room that owns exactly what the decode engine
// re-declares for it after a daemon restart (the engine resync): the
// req_to_token row it names (the engine's own row, which its
// req_pool_indices keep using), the pages, and per kind the live SWA pages
// or the Mamba slots (see Adoption). PromptLen and OutputLen come from the
// request; the room holds no metadata slot (its transfer is over). From then
// on it is any running room: UpdateRunning, Retract, Hold, DrainRoom and
// Release apply, and it counts in the budget (active, retractable,
// need_single). Adopted rooms are existing requests: they are taken while
// the ledger drains and beyond admission.max_queued. e is kept as in
// EnqueueEntry.
//
// Nothing changes and the error names the problem when: the request is
// malformed or marked Rebootstrap (ErrInvalidRequest); the room exists
// (errRoomExists); the page count is not ceil((PromptLen + OutputLen) /
// page_size); the req slot, a page, an SWA page or a Mamba slot is out of
// range or named twice; the kind needs SWA pages or Mamba slots that are not
// given (or too few), or given ones it has no pool for (ErrInvalidRequest);
// an index is already held: ErrOwned, naming the index and the room holding
// it. Validating and taking are O(items adopted): the free lists are
// indexed by item (pageStack.takePage, slotRing.takeSlot); only the error
// that names an owner scans the rooms.
func (l *Ledger) AdoptEntry(e *Entry, a Adoption) error {
	req := a.Request
	if err := checkRequest("adopt", req); err != nil {
		return err
	}
	if req.Rebootstrap {
		return fmt.Errorf("adopt room %d: a running room is not a rebootstrap request: %w", req.Room, ErrInvalidRequest)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.rooms[req.Room]; ok {
		return fmt.Errorf("adopt room %d: %w", req.Room, errRoomExists)
	}
	seq := int64(req.PromptLen) + int64(req.OutputLen)
	nPages := ceilDiv(seq, l.page)
	if int64(len(a.Pages)) != nPages {
		return fmt.Errorf("adopt room %d: %d pages for %d tokens (prompt %d + output %d) at page size %d, want %d: %w",
			req.Room, len(a.Pages), seq, req.PromptLen, req.OutputLen, l.page, nPages, ErrInvalidRequest)
	}
	if res, v := checkIndices(&l.pages, a.Pages); res != idxOK {
		return l.indexError(req.Room, "page", res, v, fmt.Sprintf("0..%d", l.pages.total-1))
	}
	switch {
	case l.swaMode == swaNone && len(a.SWAPages) > 0:
		return fmt.Errorf("adopt room %d: %d SWA pages given, kind %s has no SWA pool: %w", req.Room, len(a.SWAPages), l.kind, ErrInvalidRequest)
	case l.swaMode != swaNone:
		// The live SWA pages back the last len(SWAPages) full pages and must
		// reach back to the window start of the next decode step.
		minLive := nPages - max(0, seq-l.window)/l.page
		if n := int64(len(a.SWAPages)); n > nPages || n < minLive {
			return fmt.Errorf("adopt room %d: %d SWA pages for %d pages, want %d..%d (window %d): %w",
				req.Room, n, nPages, minLive, nPages, l.window, ErrInvalidRequest)
		}
		if res, v := checkIndices(&l.swaPages, a.SWAPages); res != idxOK {
			return l.indexError(req.Room, "swa page", res, v, fmt.Sprintf("0..%d", l.swaPages.total-1))
		}
	}
	if len(a.MambaSlots) != l.mambaPerReq {
		return fmt.Errorf("adopt room %d: %d mamba slots given, kind %s needs %d: %w", req.Room, len(a.MambaSlots), l.kind, l.mambaPerReq, ErrInvalidRequest)
	}
	if l.mambaPerReq > 0 {
		if res, v := checkIndices(&l.mambaS, a.MambaSlots); res != idxOK {
			return l.indexError(req.Room, "mamba slot", res, v, fmt.Sprintf("0..%d", len(l.mambaS.buf)-1))
		}
	}
	if !l.reqSlots.inRange(a.ReqSlot) {
		return fmt.Errorf("adopt room %d: req slot %d out of range (1..%d): %w", req.Room, a.ReqSlot, len(l.reqSlots.buf), ErrInvalidRequest)
	}
	if !l.reqSlots.isFree(a.ReqSlot) {
		return l.indexError(req.Room, "req slot", idxHeld, a.ReqSlot, "")
	}

	// Commit: everything was checked.
	r := &e.r
	l.newRoom(r, req)
	l.hold(r)
	l.reqSlots.takeSlot(a.ReqSlot)
	r.reqSlot = a.ReqSlot
	r.pages = append(l.pool.get(len(a.Pages)), a.Pages...)
	for _, p := range a.Pages {
		l.pages.takePage(p)
	}
	r.fill, r.xferPages = seq, len(a.Pages)
	if l.swaMode != swaNone {
		r.swa = append(l.pool.get(len(a.SWAPages)), a.SWAPages...)
		for _, p := range a.SWAPages {
			l.swaPages.takePage(p)
		}
		r.swaOff = 0
		r.swaFirst = len(a.Pages) - len(a.SWAPages)
		r.xferSWA = [2]int{0, len(a.SWAPages)}
	}
	for i, s := range a.MambaSlots {
		l.mambaS.takeSlot(s)
		r.mamba[i] = s
	}
	r.nMamba = l.mambaPerReq
	l.setState(r, RoomRunning)
	l.addRunning(r)
	return nil
}
