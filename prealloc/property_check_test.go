package prealloc

import (
	"fmt"
	"slices"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// The property test's checks after every operation and at the end of a
// run (property_test.go).

// checkAllocation verifies an admission's allocation against the shadow.
func (s *sim) checkAllocation(r *shadowRoom, a Admission) {
	al := a.Alloc
	xfer := r.pages
	if !a.Resumed {
		xfer = min(s.pagesFor(s.origin(r.req)), r.pages)
	}
	if al.FillLen != int(r.fill) || al.AllocTokens != r.pages*int(s.page) || len(al.Pages) != xfer || al.ReqSlot < 1 {
		s.fatalf("room %d allocation: fill %d alloc %d pages %d req %d; want fill %d alloc %d pages %d",
			r.id, al.FillLen, al.AllocTokens, len(al.Pages), al.ReqSlot, r.fill, r.pages*int(s.page), xfer)
	}
	if (al.MetadataSlot >= 0) != !a.Resumed {
		s.fatalf("room %d metadata slot %d (resumed %v)", r.id, al.MetadataSlot, a.Resumed)
	}
	switch s.cfg.Pool.Kind {
	case kvlayout.KindHybridLinear:
		if len(al.State) != 1 || len(al.State[0].Indices) != 1 || len(al.MambaPingPong) != s.spr-1 {
			s.fatalf("room %d mamba state %+v", r.id, al)
		}
	case kvlayout.KindHybridMLA:
		if len(al.State) != 1 || !slices.Equal(al.State[0].Indices, al.Pages) {
			s.fatalf("room %d DSA state differs from pages", r.id)
		}
	case kvlayout.KindHybridSWA:
		live := r.pages - r.swaFirst
		wantN := live
		if !a.Resumed {
			o := s.origin(r.req)
			lo := max(0, min(int(max(0, o-s.window)/s.page)-r.swaFirst, live))
			hi := max(lo, min(xfer-r.swaFirst, live))
			wantN = hi - lo
		}
		if len(al.State) != 1 || len(al.State[0].Indices) != wantN {
			s.fatalf("room %d SWA state %d pages, want %d", r.id, len(al.State[0].Indices), wantN)
		}
	default:
		if len(al.State) != 0 {
			s.fatalf("room %d unexpected state %+v", r.id, al.State)
		}
	}
}

// check compares the ledger with the shadow after every operation: the
// invariants, every room's state, request and metadata slot (read under one lock,
// white-box, plus one room through the public accessors), and the stats.
func (s *sim) check(n int) {
	s.t.Helper()
	if err := s.l.CheckInvariants(); err != nil {
		s.fatalf("op %d: invariants: %v", n, err)
	}
	st := s.l.Stats()
	var pages, swaPages, req, meta int
	var dPages, dSWA, dReq, dMeta int
	var retractable int64
	var counts [numRoomStates]int
	var mismatch string
	s.l.mu.Lock()
	if len(s.l.rooms) != len(s.rooms) {
		mismatch = fmt.Sprintf("ledger has %d rooms, shadow %d", len(s.l.rooms), len(s.rooms))
	}
	for id, r := range s.rooms {
		counts[r.state]++
		lr, ok := s.l.rooms[id]
		if ok {
			lr = lr.view()
		}
		switch {
		case !ok:
			mismatch = fmt.Sprintf("room %d missing from the ledger", id)
		case lr.state != r.state:
			mismatch = fmt.Sprintf("room %d state %s, shadow %s", id, lr.state, r.state)
		case lr.req.OutputLen != r.req.OutputLen || lr.req.Rebootstrap != r.req.Rebootstrap:
			mismatch = fmt.Sprintf("room %d request %+v, shadow %+v", id, lr.req, r.req)
		case r.meta != (lr.metaSlot >= 0):
			mismatch = fmt.Sprintf("room %d metadata slot %d, shadow has one: %v", id, lr.metaSlot, r.meta)
		}
		if s.holds(r) {
			pages += r.pages
			req++
			if s.swa != swaNone {
				swaPages += r.pages - r.swaFirst
			}
		}
		if r.meta {
			meta++
		}
		if r.state == RoomDraining {
			dPages += r.pages
			dReq++
			if s.swa != swaNone {
				dSWA += r.pages - r.swaFirst
			}
			if r.meta {
				dMeta++
			}
		}
		if r.state == RoomRunning {
			retractable += int64(r.req.PromptLen + r.req.OutputLen)
		}
	}
	s.l.mu.Unlock()
	if mismatch != "" {
		s.fatalf("op %d: %s", n, mismatch)
	}
	if id, r := s.pick(nil); r != nil {
		got, _ := s.l.State(id)
		gr, _ := s.l.RoomRequest(id)
		al, ok := s.l.Allocation(id)
		if got != r.state || gr != r.req || (ok && (al.MetadataSlot >= 0) != r.meta) {
			s.fatalf("op %d: accessors of room %d: %s %+v metadata slot %d %v; shadow %s %+v %v", n, id, got, gr, al.MetadataSlot, ok, r.state, r.req, r.meta)
		}
	}
	want := [...]int{counts[RoomWaiting], counts[RoomReady], counts[RoomAdmitted], counts[RoomClaimed], counts[RoomResumed], counts[RoomRunning], counts[RoomRetracted], counts[RoomHeld], counts[RoomDraining]}
	got := [...]int{st.Waiting, st.Ready, st.Admitted, st.Claimed, st.Resumed, st.Running, st.Retracted, st.Held, st.Draining}
	if want != got {
		s.fatalf("op %d: state counts %v, shadow %v", n, got, want)
	}
	if int(st.Pages.Used) != pages || int(st.SWAPages.Used) != swaPages || int(st.ReqSlots.Used) != req ||
		int(st.MetaSlots.Used) != meta || int(st.MambaSlots.Used) != req*s.spr || st.Retractable != retractable {
		s.fatalf("op %d: stats %+v; shadow pages %d swa %d req %d meta %d retractable %d", n, st, pages, swaPages, req, meta, retractable)
	}
	if int(st.Pages.Draining) != dPages || int(st.SWAPages.Draining) != dSWA || int(st.ReqSlots.Draining) != dReq ||
		int(st.MetaSlots.Draining) != dMeta || int(st.MambaSlots.Draining) != dReq*s.spr {
		s.fatalf("op %d: draining stats %+v; shadow pages %d swa %d req %d meta %d", n, st, dPages, dSWA, dReq, dMeta)
	}
}

// releaseAll releases every room (in random order) and checks the ledger is
// back to full.
func (s *sim) releaseAll() {
	s.t.Helper()
	ids := make([]uint64, 0, len(s.rooms))
	for id := range s.rooms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i := len(ids) - 1; i > 0; i-- {
		j := s.src.intn(i + 1)
		ids[i], ids[j] = ids[j], ids[i]
	}
	for _, id := range ids {
		if err := s.l.Release(id); err != nil {
			s.fatalf("final release %d: %v", id, err)
		}
		s.forget(id)
		if err := s.l.CheckInvariants(); err != nil {
			s.fatalf("after final release of %d: %v", id, err)
		}
	}
	assertFull(s.t, s.l)
}
