package kvmanager

import (
	"sync"
	"testing"
)

// offerLog records the claims a subscription was offered and their events,
// as a session's sink would (under the room's shard lock).
type offerLog struct {
	mu     sync.Mutex
	claims map[uint64]*Claim
	events map[uint64][]DestinationEvent
	order  []uint64 // rooms in the order they were offered
}

func newOfferLog() *offerLog {
	return &offerLog{claims: map[uint64]*Claim{}, events: map[uint64][]DestinationEvent{}}
}

func (l *offerLog) sink(c *Claim) ClaimSink {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.Offered() {
		panic("the manager offered a claim it did not mark offered")
	}
	l.claims[c.Room()] = c
	l.order = append(l.order, c.Room())
	return func(ev DestinationEvent) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.events[c.room] = append(l.events[c.room], ev)
	}
}

func (l *offerLog) offered() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.order...)
}

func (l *offerLog) claim(room uint64) *Claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.claims[room]
}

func (l *offerLog) eventsOf(room uint64) []DestinationEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]DestinationEvent(nil), l.events[room]...)
}

// destinationOf returns the destination offered for room, delivered.
func (l *offerLog) destinationOf(t *testing.T, room uint64) *Destination {
	t.Helper()
	for _, ev := range l.eventsOf(room) {
		if ev.Destination != nil {
			l.claim(room).Delivered(ev.Destination)
			return ev.Destination
		}
	}
	t.Fatalf("room %d: no destination offered (events %+v)", room, l.eventsOf(room))
	return nil
}

// TestOfferRoomsOnResolve: a room opened for subscribed ranks is claimed
// for each of them when its DP rank resolves; the destination reaches them
// at admission without any claim of theirs, and the room runs to its end
// on those claims. A rank of another DP group, or another instance, is not
// offered the room.
func TestOfferRoomsOnResolve(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 2, dp: 2}
		h.register(in)
		h.register(instance{addr: addrB})
		logs := map[RankID]*offerLog{}
		for _, rk := range append(ranksOf(in), RankID{Addr: addrB}) {
			l := newOfferLog()
			logs[rk] = l
			stop := h.m.OfferRooms(rk, l.sink)
			t.Cleanup(stop)
		}
		// follow_bootstrap_room: room 4 is DP 0's (4 % 2).
		h.open(addrA, 4)
		for rk, l := range logs {
			want := rk.Addr == addrA && rk.DP == 0
			if got := l.offered(); (len(got) == 1 && got[0] == 4) != want || (!want && len(got) != 0) {
				t.Fatalf("rank %s was offered %v; want room 4 offered: %v", rk, got, want)
			}
		}
		h.wantPhase(4, PhaseAdmitted)
		pages := h.snapshot(4).NumPages
		for _, rk := range h.requiredRanks(4) {
			d := logs[rk].destinationOf(t, 4)
			if d.Room != 4 || d.Dummy || len(d.Pages) != pages {
				t.Fatalf("rank %s offered destination %+v", rk, d)
			}
		}
		h.wantPhase(4, PhaseClaimed)
		for _, rk := range h.requiredRanks(4) {
			if _, _, err := h.m.Transfer(t.Context(), chunk(4, rk, 0, 0, pages, true)); err != nil {
				t.Fatal(err)
			}
		}
		h.wantPhase(4, PhaseSucceeded)
		for _, rk := range h.requiredRanks(4) {
			evs := logs[rk].eventsOf(4)
			if last := evs[len(evs)-1]; last.Done == nil || *last.Done != PhaseSucceeded {
				t.Fatalf("rank %s: last offered event %+v, want done", rk, last)
			}
			logs[rk].claim(4).Close()
		}
		h.release(4)
		h.assertClean()
	})
}

// TestOfferRoomsAtSubscribe: a subscription is offered the rooms of its
// rank that are open and handing off, superseding the rank's own claim of
// them; not a room that ended, nor one whose DP rank is not resolved.
// Later, a room whose own claim came first is not offered, and after stop
// nothing is.
func TestOfferRoomsAtSubscribe(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		rk := RankID{Addr: addrA}
		h.open(addrA, 1)
		h.open(addrA, 2)
		own, _ := h.claim(2, rk)
		h.open(addrA, 3)
		h.complete(3)    // succeeded: its hand-off ended
		h.open(addrB, 9) // waits for its prefill: not resolved
		l := newOfferLog()
		stop := h.m.OfferRooms(rk, l.sink)
		if got := l.offered(); len(got) != 2 || got[0]+got[1] != 3 {
			t.Fatalf("offered at subscribe: %v, want rooms 1 and 2", got)
		}
		if ev, ok := nextEvent(t, own); !ok || ev.Failure == nil || ev.Failure.Message != "superseded by a newer AwaitDestination from the same rank" {
			t.Fatalf("the rank's own claim of room 2 got %+v (open %v), want superseded", ev, ok)
		}
		// The offered claim of room 2 got its destination again.
		d2 := l.destinationOf(t, 2)
		if d2.Attempt != 1 {
			t.Fatalf("room 2's destination re-offered with attempt %d", d2.Attempt)
		}
		// A claim made before the room opened stands.
		pending, err := h.m.AwaitDestination(5, rk)
		if err != nil {
			t.Fatal(err)
		}
		h.open(addrA, 5)
		h.destination(pending)
		// A second subscription of the rank replaces the first, and takes
		// the rooms over; its stop ends it, the first's stop changes
		// nothing.
		l2 := newOfferLog()
		stop2 := h.m.OfferRooms(rk, l2.sink)
		if got := l2.offered(); len(got) != 3 {
			t.Fatalf("the second subscription was offered %v, want rooms 1, 2 and 5", got)
		}
		stop()
		h.open(addrA, 6)
		if got := l2.offered(); len(got) != 4 || got[3] != 6 {
			t.Fatalf("offered after the first subscription's stop: %v, want room 6 last", got)
		}
		stop2()
		h.open(addrA, 7)
		if got := l.offered(); len(got) != 2 {
			t.Fatalf("the replaced subscription was offered %v", got)
		}
		if got := l2.offered(); len(got) != 4 {
			t.Fatalf("offered after stop: %v", got)
		}
		if n := h.m.offers.n.Load(); n != 0 || len(h.m.offers.byAddr) != 0 {
			t.Fatalf("%d subscriptions (%v) left after both stopped", n, h.m.offers.byAddr)
		}
		for _, id := range []uint64{1, 2, 5, 6, 7} {
			h.m.AbortRoom(id, "")
		}
		h.m.AbortRoom(9, "")
		h.release(3)
		h.assertClean()
	})
}

// TestOfferNeedsRegistration: a rank that subscribed before its instance
// registered is offered the rooms once they resolve, and a rank the
// instance lacks (a TP rank beyond its size) never is.
func TestOfferNeedsRegistration(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		rk := RankID{Addr: addrA}
		l := newOfferLog()
		defer h.m.OfferRooms(rk, l.sink)()
		stray := newOfferLog()
		defer h.m.OfferRooms(RankID{Addr: addrA, TP: 5}, stray.sink)()
		h.open(addrA, 1)
		if got := l.offered(); len(got) != 0 {
			t.Fatalf("offered %v before the instance registered", got)
		}
		h.register(instance{addr: addrA})
		if got := l.offered(); len(got) != 1 || got[0] != 1 {
			t.Fatalf("offered %v once the instance registered, want room 1", got)
		}
		if got := stray.offered(); len(got) != 0 {
			t.Fatalf("a rank the instance lacks was offered %v", got)
		}
		h.m.AbortRoom(1, "")
		if evs := l.eventsOf(1); len(evs) == 0 || evs[len(evs)-1].Failure == nil || evs[len(evs)-1].Failure.Code != FailureAborted {
			t.Fatalf("events of the aborted room: %+v, want its failure last", evs)
		}
		h.assertClean()
	})
}
