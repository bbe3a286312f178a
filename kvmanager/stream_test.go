package kvmanager

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// drain reads every event of a watcher until its channel is closed.
func drainWatcher(w *Watcher) []RoomEvent {
	var out []RoomEvent
	for ev := range w.Events() {
		out = append(out, ev)
	}
	return out
}

// TestWatcherReceivesEveryTransition: a watch sees T1 T2/T4/T8 T11 T11 T12/T17
// and the release, in order, the last one terminal.
func TestWatcherReceivesEveryTransition(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		hist, err := h.m.Watch(1, true)
		if err != nil {
			t.Fatalf("Watch(history) = %v", err)
		}
		cur, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatalf("Watch = %v", err)
		}
		rk := RankID{Addr: addrA}
		h.claimAll(1)
		h.m.Transfer(t.Context(), chunk(1, rk, 0, 0, 8, false))
		h.m.Transfer(t.Context(), chunk(1, rk, 1, 8, 8, true))
		h.release(1)

		want := []Phase{PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted, PhaseClaimed, PhaseTransferring, PhaseSucceeded, PhaseReleased}
		evs := drainWatcher(hist)
		var got []Phase
		for i, ev := range evs {
			got = append(got, ev.Transition.Phase)
			if ev.Terminal != (i == len(evs)-1) {
				t.Errorf("event %d (%s): terminal %v", i, ev.Transition.Phase, ev.Terminal)
			}
			if i >= 3 && ev.Room.Phase != ev.Transition.Phase {
				t.Errorf("live event %d: snapshot phase %s, transition %s", i, ev.Room.Phase, ev.Transition.Phase)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("history watcher phases (-want +got):\n%s", diff)
		}
		if err := hist.Err(); err != nil {
			t.Errorf("history watcher Err() = %v, want nil", err)
		}
		got = nil
		for _, ev := range drainWatcher(cur) {
			got = append(got, ev.Transition.Phase)
		}
		if diff := cmp.Diff(want[2:], got); diff != "" {
			t.Errorf("current watcher phases (-want +got):\n%s", diff)
		}
		// Watching a finished room: its last transition, terminal, then closed.
		end, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatalf("Watch(released room) = %v", err)
		}
		if evs := drainWatcher(end); len(evs) != 1 || !evs[0].Terminal || evs[0].Transition.Phase != PhaseReleased {
			t.Errorf("watch of a released room = %+v", evs)
		}
		if _, err := h.m.Watch(2, false); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("Watch(unknown) = %v, want ErrRoomNotFound", err)
		}
		h.assertClean()
	})
}

// TestWatcherSeesFailure: a watch ends with the T16 failure.
func TestWatcherSeesFailure(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.open(addrA, 1)
		w, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatal(err)
		}
		closed, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		closed.Close() // idempotent
		h.m.AbortRoom(1, "")
		evs := drainWatcher(w)
		if len(evs) != 2 || !evs[1].Terminal || evs[1].Room.Failure == nil || evs[1].Room.Failure.Code != FailureAborted || evs[1].Transition.SGLang != "T16" {
			t.Errorf("events = %+v, want the current state then the abort", evs)
		}
		if evs := drainWatcher(closed); len(evs) != 1 {
			t.Errorf("closed watcher got %d events after Close, want only the first", len(evs))
		}
		h.assertClean()
	})
}

// TestSlowWatcherDropped: a watcher that falls behind on T20 transitions is
// dropped with ErrSlowConsumer.
func TestSlowWatcherDropped(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1)
		w, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatal(err)
		}
		// Each retraction on a free pool resumes RetractResumeAfter after the call: two
		// transitions (T20 out, T20 back). 40 of them overflow the 64-event
		// buffer.
		for i := range 40 {
			if _, err := h.m.RetractRoom(1, RetractCPU); err != nil {
				t.Fatalf("RetractRoom #%d = %v", i, err)
			}
			advance(RetractResumeAfter)
			h.wantPhase(1, PhaseSucceeded)
		}
		evs := drainWatcher(w)
		if len(evs) != watchBuffer+1 {
			t.Errorf("slow watcher got %d events before it was dropped, want %d", len(evs), watchBuffer+1)
		}
		if err := w.Err(); !errors.Is(err, ErrSlowConsumer) {
			t.Errorf("Err() = %v, want ErrSlowConsumer", err)
		}
		// The room is unaffected and a new watch works.
		w2, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatal(err)
		}
		h.release(1)
		if evs := drainWatcher(w2); len(evs) != 2 || !evs[1].Terminal || w2.Err() != nil {
			t.Errorf("new watcher got %+v, err %v", evs, w2.Err())
		}
		h.assertClean()
	})
}

// TestClaimStreams: claim streams around T11 (supersede, close), T12
// (done) and T16 (failure).
func TestClaimStreams(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		rk := RankID{Addr: addrA}
		h.open(addrA, 1)
		first, err := h.m.AwaitDestination(1, rk)
		if err != nil {
			t.Fatal(err)
		}
		if first.Rank() != rk {
			t.Errorf("Rank() = %s, want %s", first.Rank(), rk)
		}
		// A newer claim from the same rank supersedes the first.
		second, d := h.claim(1, rk)
		h.destination(first)
		if ev, ok := nextEvent(t, first); !ok || ev.Failure == nil || ev.Failure.Message != "superseded by a newer AwaitDestination from the same rank" {
			t.Errorf("superseded claim got %+v (open %v)", ev.Failure, ok)
		}
		// A stale delivery (an earlier attempt) is ignored.
		stale := *d
		stale.Attempt = 0
		second.Delivered(&stale)
		h.wantPhase(1, PhaseClaimed)
		// Closing the stream does not withdraw the claim.
		second.Close()
		second.Close()
		h.sendAll(1)
		h.wantPhase(1, PhaseSucceeded)
		// Claims on a finished room end at once.
		late, err := h.m.AwaitDestination(1, rk)
		if err != nil {
			t.Fatal(err)
		}
		if ev, ok := nextEvent(t, late); !ok || ev.Done == nil || *ev.Done != PhaseSucceeded {
			t.Errorf("claim on a succeeded room got %+v (open %v), want done", ev, ok)
		}
		h.release(1)
		h.open(addrA, 2)
		h.m.AbortRoom(2, "")
		failed, err := h.m.AwaitDestination(2, rk)
		if err != nil {
			t.Fatal(err)
		}
		if ev, ok := nextEvent(t, failed); !ok || ev.Failure == nil || ev.Failure.Code != FailureAborted {
			t.Errorf("claim on a failed room got %+v (open %v), want the failure", ev, ok)
		}
		var inv *InvalidError
		if _, err := h.m.AwaitDestination(2, RankID{Addr: addrB}); !errors.As(err, &inv) || inv.Field != "rank.bootstrap_addr" {
			t.Errorf("AwaitDestination from another instance = %v, want InvalidError", err)
		}
		// A pending claim that is closed stops waiting.
		p, err := h.m.AwaitDestination(3, rk)
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
		h.m.lockAll()
		n := h.m.pendingCount()
		h.m.unlockAll()
		if n != 0 {
			t.Errorf("pendingCount = %d after closing the pending claim, want 0", n)
		}
		h.open(addrA, 3)
		if _, ok := <-p.Events(); ok {
			t.Errorf("closed pending claim received an event")
		}
		h.m.AbortRoom(3, "")
		h.assertClean()
	})
}

// TestPendingClaimForWrongInstance: a pending claim from another instance
// is refused at T1.
func TestPendingClaimForWrongInstance(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		c, err := h.m.AwaitDestination(1, RankID{Addr: addrB})
		if err != nil {
			t.Fatal(err)
		}
		h.open(addrA, 1)
		if ev, ok := nextEvent(t, c); !ok || ev.Failure == nil {
			t.Errorf("pending claim from another instance got %+v (open %v), want a failure", ev, ok)
		}
		h.m.AbortRoom(1, "")
		h.assertClean()
	})
}

// TestTooManyPendingClaims: claims for rooms that are not open are bounded
// (decodeplane; no SGLang transition).
func TestTooManyPendingClaims(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		rk := RankID{Addr: addrA}
		claims := make([]*Claim, 0, maxPendingClaims)
		for room := range uint64(maxPendingClaims) {
			c, err := h.m.AwaitDestination(room+1, rk)
			if err != nil {
				t.Fatalf("AwaitDestination #%d = %v", room+1, err)
			}
			claims = append(claims, c)
		}
		_, err := h.m.AwaitDestination(maxPendingClaims+1, rk)
		var re *RetryError
		if !errors.Is(err, ErrTooManyWaiters) || !errors.As(err, &re) || re.RetryAfter != time.Second {
			t.Fatalf("AwaitDestination beyond the bound = %v, want ErrTooManyWaiters with a 1s retry hint", err)
		}
		// Closing one makes room for one.
		claims[0].Close()
		if _, err := h.m.AwaitDestination(maxPendingClaims+1, rk); err != nil {
			t.Errorf("AwaitDestination after a pending claim closed = %v", err)
		}
		h.assertClean()
	})
}
