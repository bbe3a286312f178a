package kvmanager

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// queuedRoomEvents takes every event a watcher has queued; the channel must be
// closed after them (the room ended).
func queuedRoomEvents(t *testing.T, room uint64, w *Watcher) []RoomEvent {
	t.Helper()
	var out []RoomEvent
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					t.Errorf("watcher of room %d closed with %v, want nil (after the terminal event)", room, err)
				}
				return out
			}
			out = append(out, ev)
		default:
			t.Fatalf("watcher of room %d: %d events queued and the channel is still open", room, len(out))
		}
	}
}

// wantShutdownEnd checks a claim's next event is the room's FailureShutdown
// with the message prefix, and that the stream then ends.
func wantShutdownEnd(t *testing.T, what string, c *Claim, prefix string) {
	t.Helper()
	ev, ok := nextEvent(t, c)
	if !ok || ev.Failure == nil || ev.Failure.Code != FailureShutdown || !strings.HasPrefix(ev.Failure.Message, prefix) || ev.Destination != nil || ev.Done != nil {
		t.Errorf("%s: got %+v (open %v), want Failure(shutdown, %q...)", what, ev, ok, prefix)
		return
	}
	if _, ok := nextEvent(t, c); ok {
		t.Errorf("%s: the claim stream goes on after the shutdown failure", what)
	}
}

// TestShutdownTellsEveryStream: on Shutdown, every room that is not done
// gets its terminal event on every claim stream and every watcher. The rooms
// not admitted yet (queued, waiting for their prefill) and the claims for a
// room never opened end at once; the admitted ones (admitted with one claim
// of two, claimed, transferring with a chunk in flight) get until the
// deadline, then fail with FailureShutdown and SGLang's abort wording; the
// succeeded room is released (its watcher sees RELEASED). Pages come back
// once, and not while the in-flight chunk may still write.
func TestShutdownTellsEveryStream(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// Four request slots: rooms 1–4 are admitted, room 5 queues.
		h := newHarness(t, withDecode(func(c *kvlayout.Config) { c.Pool.RequestSlots, c.Pool.PreAllocSlots = 4, 0 }))
		g := newGate(t)
		tp2 := instance{addr: addrA, tp: 2}
		h.register(tp2)
		rank0, rank1 := RankID{Addr: addrA, TP: 0}, RankID{Addr: addrA, TP: 1}
		claims := map[string]*Claim{}

		h.open(addrA, 1) // admitted: rank 0 claimed, rank 1 not yet
		if got := h.requiredRanks(1); len(got) != 2 {
			t.Fatalf("room 1 requires %v, want the two TP ranks", got)
		}
		claims["room 1 rank 0"], _ = h.claim(1, rank0)
		h.wantPhase(1, PhaseAdmitted)

		h.open(addrA, 2) // claimed
		claims["room 2 rank 0"], _ = h.claim(2, rank0)
		claims["room 2 rank 1"], _ = h.claim(2, rank1)
		h.wantPhase(2, PhaseClaimed)

		h.open(addrA, 3) // transferring: one chunk landed, one in flight
		claims["room 3 rank 0"], _ = h.claim(3, rank0)
		claims["room 3 rank 1"], _ = h.claim(3, rank1)
		if _, _, err := h.m.Transfer(context.Background(), chunk(3, rank0, 0, 0, 8, false)); err != nil {
			t.Fatal(err)
		}
		h.wantPhase(3, PhaseTransferring)

		h.open(addrA, 4) // succeeded, not released yet
		h.complete(4)

		h.open(addrA, 5) // queued: no request slot; both ranks wait on it
		h.wantPhase(5, PhaseQueued)
		for _, rk := range []RankID{rank0, rank1} {
			c, err := h.m.AwaitDestination(5, rk)
			if err != nil {
				t.Fatal(err)
			}
			claims["room 5 rank "+strconv.Itoa(rk.TP)] = c
		}
		h.open(addrB, 6) // its prefill never registered
		h.wantPhase(6, PhaseWaitingPrefill)
		pending, err := h.m.AwaitDestination(99, rank0) // room 99 is never opened
		if err != nil {
			t.Fatal(err)
		}

		watchers := map[uint64]*Watcher{}
		for room := uint64(1); room <= 6; room++ {
			w, err := h.m.Watch(room, false)
			if err != nil {
				t.Fatal(err)
			}
			watchers[room] = w
		}

		h.sim.SetFault(g.hook)
		inflight := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(3, rank0, 1, 8, 8, true))
			inflight <- err
		}()
		<-g.entered
		synctest.Wait()

		start := time.Now()
		const deadline = 10 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		done := make(chan struct{})
		go func() {
			h.m.Shutdown(ctx)
			close(done)
		}()
		synctest.Wait()

		// 1. At once: the rooms not admitted and the claim on a room never
		// opened; the admitted rooms are still given their time.
		select {
		case <-done:
			t.Fatal("Shutdown returned before its deadline although rooms 1–3 were handing off")
		default:
		}
		early := map[uint64]string{
			5: "decodeplane shut down before room 5 was admitted (phase queued): Request rid-5 aborted: decode server shutting down",
			6: "decodeplane shut down before room 6 was admitted (phase waiting_prefill): Request rid-6 aborted: decode server shutting down",
		}
		for room, msg := range early {
			if got := h.wantFailure(room, FailureShutdown, msg); got != msg {
				t.Errorf("room %d message %q, want %q", room, got, msg)
			}
		}
		for _, k := range []string{"room 5 rank 0", "room 5 rank 1"} {
			wantShutdownEnd(t, k, claims[k], early[5])
			delete(claims, k)
		}
		wantShutdownEnd(t, "claim on room 99", pending, "decodeplane shut down before room 99 was opened: Request 99 aborted: decode server shutting down")
		for room, phase := range map[uint64]Phase{1: PhaseAdmitted, 2: PhaseClaimed, 3: PhaseTransferring, 4: PhaseSucceeded} {
			h.wantPhase(room, phase)
		}
		if got, want := h.m.ShutdownSummary(), (ShutdownSummary{Failed: 2, PendingClaims: 1}); got != want {
			t.Errorf("summary while waiting = %+v, want %+v", got, want)
		}

		// 2. At the deadline: the rest fail, the succeeded room is released.
		<-done
		if el := time.Since(start); el != deadline {
			t.Errorf("Shutdown returned after %s, want %s", el, deadline)
		}
		late := map[uint64]Phase{1: PhaseAdmitted, 2: PhaseClaimed, 3: PhaseTransferring}
		for room, phase := range late {
			msg := "decodeplane shut down before room " + strconv.FormatUint(room, 10) + " finished (phase " + phase.String() + "): Request rid-" + strconv.FormatUint(room, 10) + " aborted: decode server shutting down"
			if got := h.wantFailure(room, FailureShutdown, msg); got != msg {
				t.Errorf("room %d message %q, want %q", room, got, msg)
			}
		}
		h.wantPhase(4, PhaseReleased)
		for k, c := range claims {
			room, _ := strconv.ParseUint(k[len("room "):len("room ")+1], 10, 64)
			wantShutdownEnd(t, k, c, "decodeplane shut down before room "+strconv.FormatUint(room, 10)+" finished")
		}
		if got, want := h.m.ShutdownSummary(), (ShutdownSummary{Failed: 5, PendingClaims: 1, Released: 1}); got != want || !got.CutShort() {
			t.Errorf("summary = %+v (cut short %v), want %+v, cut short", got, got.CutShort(), want)
		}

		// Every watcher's last event is its room's end, stamped when the
		// room ended: the early ones at once, the others at the deadline.
		for room, w := range watchers {
			evs := queuedRoomEvents(t, room, w)
			if len(evs) < 2 {
				t.Errorf("room %d watcher got %d events, want its state then its end", room, len(evs))
				continue
			}
			for _, ev := range evs[:len(evs)-1] {
				if ev.Terminal {
					t.Errorf("room %d watcher: terminal event %+v before the last", room, ev.Transition)
				}
			}
			last := evs[len(evs)-1]
			wantAt := start.Add(deadline)
			if _, ok := early[room]; ok {
				wantAt = start
			}
			switch {
			case !last.Terminal || !last.Transition.At.Equal(wantAt):
				t.Errorf("room %d watcher's last event: terminal %v at %s, want terminal at +%s", room, last.Terminal, last.Transition.At, wantAt.Sub(start))
			case room == 4:
				if last.Room.Phase != PhaseReleased || last.Room.Failure != nil || last.Transition.Note != "released at shutdown" {
					t.Errorf("room 4 watcher's last event: %s %+v (%q), want RELEASED at shutdown", last.Room.Phase, last.Room.Failure, last.Transition.Note)
				}
			default:
				if last.Room.Phase != PhaseFailed || last.Room.Failure == nil || last.Room.Failure.Code != FailureShutdown || last.Room.Poll != PollFailed {
					t.Errorf("room %d watcher's last event: %s %+v, want FAILED with shutdown", room, last.Room.Phase, last.Room.Failure)
				}
			}
		}

		// Room 3's chunk is still being written: its 16 pages stay taken,
		// every other room's are back.
		if used := h.pagesUsed(0); used != 16 {
			t.Errorf("pages used while room 3's chunk is in flight = %d, want 16", used)
		}
		g.release <- nil
		if err := <-inflight; !errors.Is(err, ErrWrongState) {
			t.Errorf("in-flight Transfer = %v, want ErrWrongState", err)
		}
		synctest.Wait()
		advance(time.Hour) // nothing armed before the shutdown fires
		h.assertClean()
	})
}

// TestShutdownSummaryCleanStop: rooms that finish within the deadline leave
// nothing cut short; the succeeded room is released, not failed.
func TestShutdownSummaryCleanStop(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// 1000 tokens × 131072 B at 1 GB/s: 131.072 ms.
		h := newHarness(t, withSim(sim.SimConfig{BandwidthGBytesPerS: 1, Seed: 1}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		c, _ := h.claim(1, RankID{Addr: addrA})
		w, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(1, RankID{Addr: addrA}, 0, 0, 16, true))
			done <- err
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		h.m.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Transfer = %v", err)
		}
		if got, want := h.m.ShutdownSummary(), (ShutdownSummary{Released: 1}); got != want || got.CutShort() {
			t.Errorf("summary = %+v (cut short %v), want %+v, not cut short", got, got.CutShort(), want)
		}
		if ev, ok := nextEvent(t, c); !ok || ev.Done == nil || *ev.Done != PhaseSucceeded {
			t.Errorf("claim got %+v (open %v), want Done(succeeded)", ev, ok)
		}
		evs := queuedRoomEvents(t, 1, w)
		var phases []Phase
		for _, ev := range evs {
			phases = append(phases, ev.Room.Phase)
		}
		if len(evs) == 0 || !evs[len(evs)-1].Terminal || phases[len(phases)-1] != PhaseReleased || !slices.Contains(phases, PhaseSucceeded) {
			t.Errorf("watcher phases %v, want ... succeeded, released (terminal)", phases)
		}
		h.assertClean()
	})
}
