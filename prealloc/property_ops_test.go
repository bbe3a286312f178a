package prealloc

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// The property test's operations (property_test.go): each draws its
// arguments, predicts the outcome on the shadow model, runs the ledger and
// compares.

func (s *sim) opEnqueue() {
	r := Request{
		Room:         s.nextID + 1,
		RID:          fmt.Sprintf("r%d", s.nextID+1),
		PromptLen:    s.src.intn(int(s.maxTotal/24) + 1),
		MaxNewTokens: s.src.intn(int(s.clip) * 2),
		Priority:     s.src.intn(4),
	}
	switch s.src.intn(12) {
	case 0:
		r.PromptLen = int(s.maxTotal) + s.src.intn(3) - 1 // around the capacity
	case 4, 5, 6:
		r.PromptLen = s.src.intn(int(s.maxTotal/3) + 1) // large
	case 1:
		r.OutputLen = s.src.intn(20)
	case 2:
		r.OutputLen = s.src.intn(20)
		r.Rebootstrap = true
	case 3:
		if id, old := s.pick(nil); old != nil {
			r.Room = id // duplicate id
		}
	}
	err := s.l.Enqueue(r)
	_, exists := s.rooms[r.Room]
	c := s.tally()
	queued := c[RoomWaiting] + c[RoomReady]
	switch {
	case s.draining:
		s.expectErr("enqueue", err, ErrDraining)
	case exists:
		s.expectErr("enqueue", err, errRoomExists)
	case !s.fits(r):
		var ce *CapacityError
		if !errors.As(err, &ce) || ce.RID != r.RID {
			s.fatalf("enqueue %+v: got %v, want a capacity error", r, err)
		}
		s.seen["enqueue: capacity"]++
	case queued >= s.maxQueued:
		s.expectErr("enqueue", err, ErrQueueFull)
	default:
		if err != nil {
			s.fatalf("enqueue %+v: %v", r, err)
		}
		s.rooms[r.Room] = &shadowRoom{id: r.Room, req: r, state: RoomWaiting, seq: s.nextSeq}
		s.nextSeq++
	}
	s.nextID = max(s.nextID, r.Room)
}

func (s *sim) expectErr(op string, err, want error) {
	s.t.Helper()
	if !errors.Is(err, want) {
		s.fatalf("%s: got %v, want %v", op, err, want)
	}
	s.seen[op+": "+want.Error()]++
}

func (s *sim) opSetReady() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomWaiting || s.src.intn(12) == 0 })
	err := s.l.SetReady(id)
	switch {
	case r == nil:
		s.expectErr("set ready", err, errUnknownRoom)
	case r.state == RoomWaiting || r.state == RoomReady:
		if err != nil {
			s.fatalf("set ready %d: %v", id, err)
		}
		r.state = RoomReady
	default:
		s.expectErr("set ready", err, errWrongState)
	}
}

func (s *sim) opClaim() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomAdmitted || s.src.intn(12) == 0 })
	err := s.l.Claim(id)
	switch {
	case r == nil:
		s.expectErr("claim", err, errUnknownRoom)
	case r.state == RoomAdmitted || r.state == RoomClaimed:
		if err != nil {
			s.fatalf("claim %d: %v", id, err)
		}
		r.state = RoomClaimed
	default:
		s.expectErr("claim", err, errWrongState)
	}
}

func (s *sim) opStart() {
	id, r := s.pick(func(r *shadowRoom) bool {
		return r.state == RoomAdmitted || r.state == RoomClaimed || r.state == RoomResumed || s.src.intn(12) == 0
	})
	err := s.l.StartRunning(id)
	switch {
	case r == nil:
		s.expectErr("start", err, errUnknownRoom)
	case r.state == RoomAdmitted || r.state == RoomClaimed || r.state == RoomResumed:
		if err != nil {
			s.fatalf("start %d: %v", id, err)
		}
		r.state = RoomRunning
		r.meta = false
		r.req.Rebootstrap = false
	default:
		s.expectErr("start", err, errWrongState)
	}
}

func (s *sim) opUpdate() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomRunning || s.src.intn(12) == 0 })
	out := 0
	if r != nil {
		out = r.req.OutputLen + s.src.intn(int(s.page)*3+2)
		if s.src.intn(6) == 0 {
			out = r.req.OutputLen + s.src.intn(int(s.maxTotal/2)+1) // big jump
		}
		if s.src.intn(25) == 0 {
			out = r.req.OutputLen - 1 // shrinking
		}
	}
	before := s.l.Stats()
	np, err := s.l.UpdateRunning(id, out)
	switch {
	case r == nil:
		s.expectErr("update", err, errUnknownRoom)
		return
	case r.state != RoomRunning:
		s.expectErr("update", err, errWrongState)
		return
	case out < r.req.OutputLen:
		s.expectErr("update", err, ErrInvalidRequest)
		return
	}
	s.steps++ // grown or not, a decode-step report
	seq := int64(r.req.PromptLen) + int64(out)
	want := max(r.pages, s.pagesFor(seq))
	newFull := want - r.pages
	ok := int(before.Pages.Free) >= newFull
	newFirst := r.swaFirst
	if s.swa != swaNone {
		ev := max(int64(r.swaFirst)*s.page, seq-1-s.window-s.page)
		newFirst = max(r.swaFirst, int(ev/s.page))
		evict := min(newFirst, r.pages) - r.swaFirst
		alloc := max(0, want-max(r.pages, newFirst))
		if int(before.SWAPages.Free)+evict < alloc {
			ok = false
		}
	}
	if !ok {
		s.expectErr("update", err, ErrNoCapacity)
		if after := s.l.Stats(); after != before {
			s.fatalf("failed update changed stats:\n%+v\n%+v", before, after)
		}
		return
	}
	if err != nil || len(np) != newFull {
		s.fatalf("update %d to %d: %d new pages (want %d), %v", id, out, len(np), newFull, err)
	}
	if newFull > 0 {
		s.seen["update: grew"]++
	}
	if newFirst > r.swaFirst {
		s.seen["update: swa evicted"]++
	}
	r.req.OutputLen = out
	r.pages = want
	r.swaFirst = newFirst
	a, _ := s.l.Allocation(id)
	if len(a.Pages) != want || (newFull > 0 && !slices.Equal(np, a.Pages[want-newFull:])) {
		s.fatalf("update %d: allocation has %d pages, want %d", id, len(a.Pages), want)
	}
}

func (s *sim) opRetract() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomRunning || s.src.intn(12) == 0 })
	err := s.l.Retract(id)
	switch {
	case r == nil:
		s.expectErr("retract", err, errUnknownRoom)
	case r.state == RoomRunning && !s.resumable(r.req):
		// It could never resume: refused, nothing changed.
		s.expectErr("retract", err, errWrongState)
		s.seen["retract: could never resume"]++
	case r.state == RoomRunning:
		if err != nil {
			s.fatalf("retract %d: %v", id, err)
		}
		r.state = RoomRetracted
		r.pages, r.fill, r.swaFirst = 0, 0, 0
		r.retStep = s.steps
		s.retracted = append(s.retracted, id)
	default:
		s.expectErr("retract", err, errWrongState)
	}
}

func (s *sim) opHold() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomRunning || s.src.intn(12) == 0 })
	err := s.l.Hold(id)
	switch {
	case r == nil:
		s.expectErr("hold", err, errUnknownRoom)
	case r.state == RoomRunning:
		if err != nil {
			s.fatalf("hold %d: %v", id, err)
		}
		r.state = RoomHeld
		r.pages, r.fill, r.swaFirst = 0, 0, 0
		r.req.OutputLen = max(r.req.OutputLen-1, 0)
		r.req.Rebootstrap = true
		s.held = append(s.held, id)
	default:
		s.expectErr("hold", err, errWrongState)
	}
}

func (s *sim) opResumeHeld() {
	got := s.l.ResumeHeld()
	var want []uint64
	for _, id := range s.held {
		r := s.rooms[id]
		if !s.fits(r.req) {
			delete(s.rooms, id)
			continue
		}
		r.state = RoomWaiting
		r.seq = s.nextSeq
		r.bypassed = 0
		s.nextSeq++
		want = append(want, id)
		s.seen["resume held: room"]++
	}
	s.held = nil
	if !slices.Equal(got, want) {
		s.fatalf("resume held: got %v, want %v", got, want)
	}
}

func (s *sim) opRelease() {
	id, r := s.pick(nil)
	err := s.l.Release(id)
	if r == nil {
		s.expectErr("release", err, errUnknownRoom)
		return
	}
	if err != nil {
		s.fatalf("release %d: %v", id, err)
	}
	if r.state == RoomDraining {
		s.seen["release: draining"]++
	}
	s.forget(id)
	s.expectErr("second release", s.l.Release(id), errUnknownRoom)
}

func (s *sim) forget(id uint64) {
	delete(s.rooms, id)
	s.retracted = slices.DeleteFunc(s.retracted, func(x uint64) bool { return x == id })
	s.held = slices.DeleteFunc(s.held, func(x uint64) bool { return x == id })
}

// opClaimTimeout is what the room manager does when an admitted room's
// claim timeout passes: it releases the room (or drains it, opDrain, when a
// prefill rank may still write into it).
func (s *sim) opClaimTimeout() {
	if s.timeout <= 0 {
		return
	}
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomAdmitted })
	if r == nil || r.state != RoomAdmitted {
		return
	}
	if err := s.l.Release(id); err != nil {
		s.fatalf("release %d at its claim timeout: %v", id, err)
	}
	s.forget(id)
	s.seen["claim timeout: room"]++
}

// opDrain drains a random room: rooms holding an allocation drain (and stay
// exactly as big), others are refused.
func (s *sim) opDrain() {
	id, r := s.pick(func(r *shadowRoom) bool { return s.holds(r) || s.src.intn(8) == 0 })
	before := s.l.Stats()
	err := s.l.DrainRoom(id)
	switch {
	case r == nil:
		s.expectErr("drain", err, errUnknownRoom)
	case r.state == RoomDraining:
		if err != nil {
			s.fatalf("drain again %d: %v", id, err)
		}
		s.seen["drain: again"]++
	case s.holds(r):
		if err != nil {
			s.fatalf("drain %d (%s): %v", id, r.state, err)
		}
		after := s.l.Stats()
		if after.Pages.Used != before.Pages.Used || after.SWAPages.Used != before.SWAPages.Used ||
			after.ReqSlots.Used != before.ReqSlots.Used || after.MetaSlots.Used != before.MetaSlots.Used {
			s.fatalf("drain %d changed the pools:\n%+v\n%+v", id, before, after)
		}
		r.state = RoomDraining
		s.seen["drain: room"]++
	default:
		s.expectErr("drain", err, errWrongState)
	}
}

// opAdopt re-declares a running room on free pages and slots read from the
// ledger's free lists, with at most one defect, and predicts the outcome.
func (s *sim) opAdopt() {
	l := s.l
	l.mu.Lock()
	freeP := slices.Clone(l.pages.free)
	freeS := slices.Clone(l.swaPages.free)
	var freeR, freeM []int32
	for i := 0; i < l.reqSlots.avail(); i++ {
		freeR = append(freeR, l.reqSlots.at(i))
	}
	for i := 0; i < l.mambaS.avail(); i++ {
		freeM = append(freeM, l.mambaS.at(i))
	}
	// Something held, to name in a conflict: a holding room's first page,
	// SWA page, row and Mamba slot.
	var heldP, heldS, heldR, heldM []int32
	for _, id := range slices.Sorted(maps.Keys(l.rooms)) {
		r := l.rooms[id]
		if !r.state.holdsAllocation() {
			continue
		}
		if len(r.pages) > 0 {
			heldP = append(heldP, r.pages[0])
		}
		if r.swa != nil && len(r.swa) > r.swaOff {
			heldS = append(heldS, r.swa[r.swaOff])
		}
		heldR = append(heldR, r.reqSlot)
		if r.nMamba > 0 {
			heldM = append(heldM, r.mamba[0])
		}
	}
	l.mu.Unlock()
	choose := func(from []int32, n int) []int32 {
		from = slices.Clone(from)
		out := make([]int32, 0, n)
		for i := 0; i < n; i++ {
			j := i + s.src.intn(len(from)-i)
			from[i], from[j] = from[j], from[i]
			out = append(out, from[i])
		}
		return out
	}
	req := Request{
		Room:         s.nextID + 1,
		RID:          fmt.Sprintf("a%d", s.nextID+1),
		PromptLen:    s.src.intn(int(s.maxTotal/24) + 1),
		OutputLen:    s.src.intn(int(s.page)*3 + 2),
		MaxNewTokens: s.src.intn(int(s.clip) * 2),
		Priority:     s.src.intn(4),
	}
	seq := int64(req.PromptLen + req.OutputLen)
	nP := s.pagesFor(seq)
	minLive, nS := 0, 0
	if s.swa != swaNone {
		minLive = nP - int(max(0, seq-s.window)/s.page)
		nS = minLive + s.src.intn(nP-minLive+1)
	}
	if nP > len(freeP) || nS > len(freeS) || len(freeR) == 0 || s.spr > len(freeM) {
		s.seen["adopt: no room"]++
		return
	}
	a := Adoption{Request: req, ReqSlot: choose(freeR, 1)[0], Pages: choose(freeP, nP)}
	if s.swa != swaNone {
		a.SWAPages = choose(freeS, nS)
	}
	if s.spr > 0 {
		a.MambaSlots = choose(freeM, s.spr)
	}
	var want error = nil
	switch s.src.intn(14) {
	case 0:
		if len(heldP) > 0 && nP > 0 {
			a.Pages[s.src.intn(nP)] = heldP[s.src.intn(len(heldP))]
			want = ErrOwned
		}
	case 1:
		if nP > 1 {
			a.Pages[nP-1] = a.Pages[0]
			want = ErrInvalidRequest
		}
	case 2:
		if nP > 0 {
			a.Pages[s.src.intn(nP)] = int32(s.totalPages + s.src.intn(3))
			want = ErrInvalidRequest
		}
	case 3:
		if s.src.intn(2) == 0 && nP > 0 {
			a.Pages = a.Pages[:nP-1]
		} else {
			a.Request.OutputLen += int(s.page) // one more page's worth of tokens
		}
		want = ErrInvalidRequest
	case 4:
		if len(heldR) > 0 {
			a.ReqSlot = heldR[s.src.intn(len(heldR))]
			want = ErrOwned
		}
	case 5:
		a.ReqSlot = int32(s.src.intn(2)) << 20 // 0 (padding) or far out of range
		want = ErrInvalidRequest
	case 6:
		switch {
		case s.swa != swaNone && len(heldS) > 0 && nS > 0:
			a.SWAPages[0] = heldS[s.src.intn(len(heldS))]
			want = ErrOwned
		case s.swa != swaNone && minLive > 0:
			a.SWAPages = a.SWAPages[:minLive-1]
			want = ErrInvalidRequest
		case s.spr > 0 && len(heldM) > 0:
			a.MambaSlots[s.spr-1] = heldM[s.src.intn(len(heldM))]
			want = ErrOwned
		case s.spr > 1:
			a.MambaSlots[1] = a.MambaSlots[0]
			want = ErrInvalidRequest
		}
	case 7:
		if id, old := s.pick(nil); old != nil {
			a.Request.Room = id
			want = errRoomExists
		}
	}
	before, lists := s.l.Stats(), freeLists(s.l)
	err := s.l.Adopt(a)
	if want != nil {
		s.expectErr("adopt", err, want)
		if after := s.l.Stats(); after != before || freeLists(s.l) != lists {
			s.fatalf("refused adopt changed the ledger:\n%+v\n%+v", before, after)
		}
		return
	}
	if err != nil {
		s.fatalf("adopt %+v: %v", a, err)
	}
	s.rooms[req.Room] = &shadowRoom{id: req.Room, req: req, state: RoomRunning, seq: s.nextSeq,
		fill: seq, pages: nP, swaFirst: nP - nS}
	s.nextSeq++
	s.nextID = max(s.nextID, req.Room)
	s.seen["adopt: room"]++
}
