package client

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Offers (prefill_session.proto, Session: Offers): a FleetPrefill's member
// Prefills open their sessions with offers, and every daemon of the fleet
// claims for the rank each room it holds for it; the offer (claim_seq 0)
// tells the rank which daemon owns the room. The offerTable, shared by the
// members, holds each offered room until a hand-off takes it (then the
// hand-off reads the offered claim: the destination arrives on it with no
// claim of the rank's), and remembers where rooms went (routes), so that
// a hand-off of a room whose offer ended, or whose session ended, claims
// it on its daemon.

// maxRoutes bounds the rooms an offerTable remembers the daemon of (the
// oldest are forgotten first); the rooms offered and not taken yet are
// bounded by what the daemons hold for the rank.
const maxRoutes = 1 << 16

// offerTable is the rooms offered to one rank by the daemons of its
// fleet.
type offerTable struct {
	mu sync.Mutex
	// live are the offers not taken, by room.
	live map[uint64]*offerEntry
	// routes are the daemons of the rooms taken, ended or whose session
	// ended, by room; fifo is their order, for maxRoutes.
	routes map[uint64]route
	fifo   []uint64
	// waiters are the hand-offs waiting for a room's offer.
	waiters map[uint64][]chan struct{}
	closed  bool
}

// offerEntry is one offer: the member (daemon) and session it came on, and
// the offered claim, which receives the room's events.
type offerEntry struct {
	p *Prefill
	s *prefillSession
	c *sessionClaim
}

// route is where a room went: the member (daemon) that offered it, in its
// incarnation then.
type route struct {
	p   *Prefill
	inc uint64
}

func newOfferTable() *offerTable {
	return &offerTable{live: map[uint64]*offerEntry{}, routes: map[uint64]route{}, waiters: map[uint64][]chan struct{}{}}
}

// offer handles an event of an offered claim (claim_seq 0): the offer
// itself, then the claim's events. A session of a Prefill without offers
// gets none.
func (s *prefillSession) offer(re *pb.PrefillRoomEvent) {
	t := s.p.offers
	if t == nil {
		return
	}
	room := re.GetRoom()
	if re.GetOffer() {
		c := &sessionClaim{s: s, room: room, inc: s.welcome.GetIncarnation(), events: make(chan *pb.DestinationEvent, 4), closed: make(chan struct{})}
		s.mu.Lock()
		old := s.offered[room]
		s.offered[room] = c
		s.mu.Unlock()
		if old != nil {
			t.ended(room, old)
			old.Close()
		}
		t.add(room, &offerEntry{p: s.p, s: s, c: c})
		return
	}
	s.mu.Lock()
	c := s.offered[room]
	s.mu.Unlock()
	if c == nil {
		return // closed by its hand-off, or superseded
	}
	ev := re.GetEvent()
	c.deliver(ev)
	if ev.GetDone() != nil || ev.GetFailure() != nil {
		if t.ended(room, c) {
			c.Close() // nobody took it: a later hand-off claims it on its daemon (a route)
		}
	}
}

// add records an offer and wakes the hand-offs waiting for it. An earlier
// offer of the room (another daemon's) is replaced and withdrawn.
func (t *offerTable) add(room uint64, e *offerEntry) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		e.c.Close()
		return
	}
	old := t.live[room]
	t.live[room] = e
	ws := t.waiters[room]
	delete(t.waiters, room)
	t.mu.Unlock()
	if old != nil {
		old.c.Close()
	}
	for _, w := range ws {
		close(w)
	}
}

// ended takes an offer that ended (or was replaced) before a hand-off took
// it out of the live offers, and remembers its daemon; false when c is not
// the room's live offer (a hand-off took it).
func (t *offerTable) ended(room uint64, c *sessionClaim) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.live[room]
	if e == nil || e.c != c {
		return false
	}
	delete(t.live, room)
	t.routeLocked(room, route{p: e.p, inc: c.inc})
	return true
}

// lost takes the offers of a session that ended (offered, by room) out of
// the live ones and remembers their daemon: a hand-off of one of them
// claims it on the daemon's next session.
func (t *offerTable) lost(s *prefillSession, offered map[uint64]*sessionClaim) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for room, c := range offered {
		if e := t.live[room]; e != nil && e.c == c {
			delete(t.live, room)
			t.routeLocked(room, route{p: s.p, inc: c.inc})
		}
	}
}

// routeLocked remembers room's daemon (t.mu held), forgetting the oldest
// beyond maxRoutes.
func (t *offerTable) routeLocked(room uint64, r route) {
	if _, ok := t.routes[room]; !ok {
		t.fifo = append(t.fifo, room)
	}
	t.routes[room] = r
	for len(t.routes) > maxRoutes && len(t.fifo) > 0 { // fifo holds each routed room once
		delete(t.routes, t.fifo[0])
		t.fifo = t.fifo[1:]
	}
}

// taken is what a hand-off gets of its room: the offer (e set), or only
// its daemon (a route: the hand-off claims the room there).
type taken struct {
	e *offerEntry
	r route
}

// take returns room's offer, waiting for it at most wait (bounded by ctx);
// or, when the room was offered before, its route.
func (t *offerTable) take(ctx context.Context, op string, room uint64, wait time.Duration) (taken, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return taken{}, localError(op, codes.Canceled, "the fleet prefill is closed")
		}
		if e := t.live[room]; e != nil {
			delete(t.live, room)
			t.routeLocked(room, route{p: e.p, inc: e.c.inc})
			t.mu.Unlock()
			return taken{e: e}, nil
		}
		if r, ok := t.routes[room]; ok {
			t.mu.Unlock()
			return taken{r: r}, nil
		}
		w := make(chan struct{})
		t.waiters[room] = append(t.waiters[room], w)
		t.mu.Unlock()
		select {
		case <-w:
			continue
		case <-ctx.Done():
			t.unwait(room, w)
			return taken{}, toError(op, ctx.Err())
		case <-timer.C:
			t.unwait(room, w)
			return taken{}, localError(op, codes.NotFound,
				"room %d was not offered by any daemon of the fleet within %v (FleetOfferWait): no daemon holds it for this rank "+
					"(its bootstrap_addr or DP rank is another's, it was never opened, or its daemon is not in the fleet)", room, wait)
		}
	}
}

// unwait takes a waiter off room's.
func (t *offerTable) unwait(room uint64, w chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := t.waiters[room]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(t.waiters, room)
	} else {
		t.waiters[room] = ws
	}
}

// owner returns the member that offered room, if known.
func (t *offerTable) owner(room uint64) (*Prefill, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.live[room]; e != nil {
		return e.p, true
	}
	r, ok := t.routes[room]
	return r.p, ok
}

// close ends the table: the waiting hand-offs fail, the offers not taken
// are withdrawn.
func (t *offerTable) close() {
	t.mu.Lock()
	t.closed = true
	live := t.live
	t.live = map[uint64]*offerEntry{}
	ws := t.waiters
	t.waiters = map[uint64][]chan struct{}{}
	t.mu.Unlock()
	for _, e := range live {
		e.c.Close()
	}
	for _, list := range ws {
		for _, w := range list {
			close(w)
		}
	}
}
