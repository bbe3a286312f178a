package client

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// offerRig is an offerTable with one member's session, without a daemon:
// the session's offers are fed to it as its reader would.
type offerRig struct {
	t *offerTable
	p *Prefill
	s *prefillSession
}

func newOfferRig() *offerRig {
	r := &offerRig{t: newOfferTable()}
	r.p = &Prefill{offers: r.t}
	r.s = &prefillSession{p: r.p, welcome: &pb.PrefillWelcome{Incarnation: 7},
		claims: map[uint64]*sessionClaim{}, offered: map[uint64]*sessionClaim{}, done: make(chan struct{})}
	return r
}

func (r *offerRig) offer(room uint64) {
	r.s.offer(&pb.PrefillRoomEvent{Room: room, Offer: true})
}

func (r *offerRig) event(room uint64, ev *pb.DestinationEvent) {
	r.s.offer(&pb.PrefillRoomEvent{Room: room, Event: ev})
}

// TestOfferTableTake: a hand-off waiting for its room is woken by the
// room's offer (and only by its room's), gets the offered claim with the
// destination that came before it took it, and the room is remembered on
// the member; a second take of the room gets the route. A take whose room
// is never offered fails with ErrNotFound once the wait passed, or with
// its context's end.
func TestOfferTableTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOfferRig()
		got := make(chan taken, 1)
		go func() {
			tk, err := r.t.take(context.Background(), "SendRoom", 5, time.Minute)
			if err != nil {
				t.Errorf("take(5) = %v", err)
			}
			got <- tk
		}()
		synctest.Wait()
		r.offer(6)
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("the offer of room 6 woke the take of room 5")
		default:
		}
		r.offer(5)
		r.event(5, &pb.DestinationEvent{Event: &pb.DestinationEvent_Destination{Destination: &pb.Destination{Room: 5, Attempt: 1, Incarnation: 7}}})
		tk := <-got
		if tk.e == nil || tk.e.p != r.p || tk.e.c.room != 5 || tk.e.c.seq != 0 || tk.e.c.inc != 7 {
			t.Fatalf("take(5) = %+v, want room 5's offer", tk)
		}
		ev, err := tk.e.c.Next()
		if err != nil || ev.Destination.GetRoom() != 5 {
			t.Fatalf("the offered claim's first event = %v, %v; want the destination", ev, err)
		}
		if again, err := r.t.take(context.Background(), "SendRoom", 5, time.Minute); err != nil || again.e != nil || again.r.p != r.p || again.r.inc != 7 {
			t.Fatalf("a second take of room 5 = %+v, %v; want its route", again, err)
		}
		if p, ok := r.t.owner(6); !ok || p != r.p {
			t.Fatalf("owner(6) = %v, %v", p, ok)
		}

		start := time.Now()
		if _, err := r.t.take(context.Background(), "SendRoom", 9, 3*time.Second); !errors.Is(err, ErrNotFound) || time.Since(start) != 3*time.Second {
			t.Fatalf("take of a room never offered = %v after %v, want ErrNotFound after 3s", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := r.t.take(ctx, "SendRoom", 9, time.Minute); !errors.Is(err, ErrDeadlineExceeded) {
			t.Fatalf("take bounded by its context = %v, want ErrDeadlineExceeded", err)
		}
		if len(r.t.waiters) != 0 {
			t.Fatalf("waiters left: %v", r.t.waiters)
		}
	})
}

// TestOfferTableEnds: an offer that ends before it was taken, or whose
// session ended, is no longer live: its claim is withdrawn and a take gets
// its route. Close fails the takes waiting and later ones.
func TestOfferTableEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOfferRig()
		r.offer(1)
		r.event(1, &pb.DestinationEvent{Event: &pb.DestinationEvent_Failure{Failure: &pb.Failure{Code: pb.FailureCode_FAILURE_CODE_ABORTED}}})
		if len(r.s.offered) != 0 {
			t.Fatalf("the ended offer is still the session's: %v", r.s.offered)
		}
		if tk, err := r.t.take(context.Background(), "SendRoom", 1, time.Minute); err != nil || tk.e != nil || tk.r.p != r.p {
			t.Fatalf("take of an ended offer = %+v, %v; want its route", tk, err)
		}
		r.offer(2)
		r.t.lost(r.s, map[uint64]*sessionClaim{2: r.s.offered[2]})
		if tk, err := r.t.take(context.Background(), "SendRoom", 2, time.Minute); err != nil || tk.e != nil || tk.r.inc != 7 {
			t.Fatalf("take of an offer whose session ended = %+v, %v; want its route", tk, err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := r.t.take(context.Background(), "SendRoom", 3, time.Minute)
			done <- err
		}()
		synctest.Wait()
		r.t.close()
		if err := <-done; !errors.Is(err, ErrCanceled) {
			t.Fatalf("take waiting at close = %v, want ErrCanceled", err)
		}
	})
}

// TestOfferTableRoutesBounded: the routes are forgotten oldest first
// beyond maxRoutes.
func TestOfferTableRoutesBounded(t *testing.T) {
	tb := newOfferTable()
	p := &Prefill{}
	tb.mu.Lock()
	for room := uint64(1); room <= maxRoutes+10; room++ {
		tb.routeLocked(room, route{p: p, inc: 1})
	}
	tb.routeLocked(maxRoutes+5, route{p: p, inc: 2}) // routed again: still once
	n, f := len(tb.routes), len(tb.fifo)
	_, first := tb.routes[1]
	_, last := tb.routes[maxRoutes+10]
	tb.mu.Unlock()
	if n != maxRoutes || f != maxRoutes || first || !last {
		t.Fatalf("%d routes, %d in order, room 1 kept %v, the last kept %v; want %d, the oldest forgotten", n, f, first, last, maxRoutes)
	}
}
