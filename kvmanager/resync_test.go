package kvmanager

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// resyncObs records the resync observer's calls.
type resyncObs struct {
	NopObserver
	mu      sync.Mutex
	adopted int
	ended   []time.Duration
	expired int
}

func (o *resyncObs) RoomsAdopted(n int) { o.mu.Lock(); o.adopted += n; o.mu.Unlock() }
func (o *resyncObs) ResyncEnded(d time.Duration, _ int, expired bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = append(o.ended, d)
	if expired {
		o.expired++
	}
}

func pageRange(from, n int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = from + int32(i)
	}
	return p
}

// declared is a running room of prompt 1000 + output 10 tokens (16 pages
// of 64) in req slot slot.
func declared(room uint64, slot int32, pages []int32) ResyncRoom {
	return ResyncRoom{Room: room, RID: "engine-" + string(rune('a'+room%26)), PromptLen: 1000, OutputLen: 10, MaxNewTokens: 128,
		ReqSlot: slot, Pages: pages, PrefillDP: -1}
}

// TestResyncHoldsAdmission: during the resync wait a room opens and
// queues but gets nothing; the declared rooms own exactly their pages and
// run; refusals name the field and change nothing; done admits the queued
// room into other pages; a later resync is refused.
func TestResyncHoldsAdmission(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := &resyncObs{}
		h := newHarness(t, withDecode(smallPool(128)), withObserver(obs))
		h.m.HoldForResync(30 * time.Second)
		start := time.Now()
		h.register(instance{addr: addrA})
		h.open(addrA, 10)
		h.wantPhase(10, PhaseQueued)
		if st := h.stats(0); st.Pages.Used != 0 || st.Admitted != 0 {
			t.Fatalf("during the wait: %d pages used, %d admitted; want none", st.Pages.Used, st.Admitted)
		}
		n, st, err := h.m.Resync([]ResyncRoom{declared(1, 1, pageRange(0, 16)), declared(2, 2, pageRange(16, 16))}, false)
		if err != nil || n != 2 || !st.Waiting || st.Declared != 2 || st.Pages != 32 {
			t.Fatalf("Resync = %d, %+v, %v; want 2 adopted, still waiting, 32 pages", n, st, err)
		}
		s, err := h.m.GetRoom(1, true)
		if err != nil || s.Phase != PhaseSucceeded || !slices.Equal(s.Pages, pageRange(0, 16)) {
			t.Fatalf("adopted room 1 = %s with pages %v, %v; want succeeded with 0..15", s.Phase, s.Pages, err)
		}
		h.wantPhase(10, PhaseQueued)

		// Refusals: nothing changes.
		for _, c := range []struct {
			room  ResyncRoom
			is    error
			field string
		}{
			{declared(3, 3, append(pageRange(40, 15), 5)), prealloc.ErrOwned, "rooms[0].page_indices"},
			{declared(3, 3, pageRange(40, 15)), nil, "rooms[0].page_indices"},
			{declared(3, 1, pageRange(40, 16)), prealloc.ErrOwned, "rooms[0].req_slot"},
			{declared(3, 3, append(pageRange(40, 15), 128)), nil, "rooms[0].page_indices"},
			{declared(1, 3, pageRange(40, 16)), ErrRoomExists, "rooms[0].room"},
			{func() ResyncRoom { r := declared(3, 3, pageRange(40, 16)); r.DecodeDP = 1; return r }(), nil, "rooms[0].decode_dp_rank"},
		} {
			n, _, err := h.m.Resync([]ResyncRoom{c.room}, false)
			var inv *InvalidError
			switch {
			case n != 0 || err == nil:
				t.Errorf("Resync(%+v) = %d, %v; want refused", c.room, n, err)
			case c.is != nil && !errors.Is(err, c.is):
				t.Errorf("Resync(%+v) = %v; want %v", c.room, err, c.is)
			case c.is == nil && (!errors.As(err, &inv) || inv.Field != c.field):
				t.Errorf("Resync(%+v) = %v; want an InvalidError on %s", c.room, err, c.field)
			case !strings.Contains(err.Error(), c.field):
				t.Errorf("Resync(%+v) = %v; want it to name %s", c.room, err, c.field)
			}
		}
		if st := h.stats(0); st.Pages.Used != 32 || st.Running != 2 {
			t.Fatalf("after the refusals: %d pages used, %d running; want 32, 2", st.Pages.Used, st.Running)
		}
		if err := h.leds[0].CheckInvariants(); err != nil {
			t.Fatal(err)
		}

		advance(2 * time.Second)
		n, st, err = h.m.Resync(nil, true)
		if err != nil || n != 0 || st.Waiting || st.Expired {
			t.Fatalf("Resync(done) = %d, %+v, %v; want the wait over", n, st, err)
		}
		s = h.wantPhase(10, PhaseAdmitted)
		got, _ := h.m.GetRoom(10, true)
		for _, p := range got.Pages {
			if p < 32 {
				t.Errorf("room 10 got page %d, held by an adopted room", p)
			}
		}
		if _, _, err := h.m.Resync([]ResyncRoom{declared(4, 4, pageRange(48, 16))}, true); !errors.Is(err, ErrResyncClosed) {
			t.Errorf("Resync after done = %v; want ErrResyncClosed", err)
		}
		obs.mu.Lock()
		if obs.adopted != 2 || len(obs.ended) != 1 || obs.ended[0] != time.Since(start) || obs.expired != 0 {
			t.Errorf("observer: %d adopted, ended %v, %d expired; want 2, [%v], 0", obs.adopted, obs.ended, obs.expired, time.Since(start))
		}
		obs.mu.Unlock()

		// Adopted rooms are running rooms: they grow, retract, resume and release.
		if grown, noCap, notRunning, _ := h.m.ReportRunning([]Usage{{Room: 1, OutputLen: 100}}); len(grown) != 1 || len(grown[0].NewPages) != 2 || noCap != nil || notRunning != nil {
			t.Fatalf("ReportRunning(adopted room 1) = %v, %v, %v; want 2 new pages", grown, noCap, notRunning)
		}
		if _, err := h.m.RetractRoom(2, RetractCPU); err != nil {
			t.Fatalf("RetractRoom(adopted room 2) = %v", err)
		}
		h.complete(10)
		h.m.ReportRunning([]Usage{{Room: 1, OutputLen: 101}, {Room: 10, OutputLen: 1}})
		h.wantPhase(2, PhaseSucceeded)
		for _, room := range []uint64{1, 2, 10} {
			h.release(room)
		}
		h.assertClean()
	})
}

// TestResyncExpires: without the engine's done the wait ends at
// engine.resync_timeout: the queued room is admitted (around the declared
// room's pages), the expiry is counted, and a late resync is refused.
func TestResyncExpires(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := &resyncObs{}
		h := newHarness(t, withDecode(smallPool(128)), withObserver(obs))
		h.m.HoldForResync(5 * time.Second)
		h.register(instance{addr: addrA})
		if _, _, err := h.m.Resync([]ResyncRoom{declared(1, 1, pageRange(0, 16))}, false); err != nil {
			t.Fatal(err)
		}
		h.open(addrA, 10)
		advance(5*time.Second - time.Nanosecond)
		h.wantPhase(10, PhaseQueued)
		if st := h.m.ResyncStatus(); !st.Waiting || st.Declared != 1 {
			t.Fatalf("ResyncStatus = %+v; want waiting, 1 declared", st)
		}
		advance(time.Nanosecond)
		h.wantPhase(10, PhaseAdmitted)
		if st := h.m.ResyncStatus(); st.Waiting || !st.Expired {
			t.Fatalf("ResyncStatus after the timeout = %+v; want expired", st)
		}
		if _, _, err := h.m.Resync([]ResyncRoom{declared(2, 2, pageRange(16, 16))}, true); !errors.Is(err, ErrResyncClosed) {
			t.Errorf("Resync after expiry = %v; want ErrResyncClosed", err)
		}
		obs.mu.Lock()
		if obs.expired != 1 || len(obs.ended) != 1 || obs.ended[0] != 5*time.Second {
			t.Errorf("observer: ended %v, %d expired; want [5s], 1", obs.ended, obs.expired)
		}
		obs.mu.Unlock()
		h.complete(10)
		h.release(10)
		h.release(1)
		h.assertClean()
	})
}

// TestResyncWithoutWaitRefused: with no resync wait (engine.resync_timeout
// 0) admission runs from the start and a resync is refused.
func TestResyncWithoutWaitRefused(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.m.HoldForResync(0)
		if _, _, err := h.m.Resync([]ResyncRoom{declared(1, 1, pageRange(0, 16))}, true); !errors.Is(err, ErrResyncClosed) {
			t.Fatalf("Resync without a wait = %v; want ErrResyncClosed", err)
		}
		h.register(instance{addr: addrA})
		h.open(addrA, 10)
		h.wantPhase(10, PhaseAdmitted)
		h.complete(10)
		h.release(10)
		h.assertClean()
	})
}

// TestResyncAnswersPendingClaims: a prefill's claim of a room that the
// engine then declares at its resync (the prefill claimed again after the
// restart) gets the adopted room's state at once (succeeded: nothing to
// write), instead of waiting for timeouts.bootstrap.
func TestResyncAnswersPendingClaims(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(smallPool(128)))
		h.m.HoldForResync(30 * time.Second)
		h.register(instance{addr: addrA})
		c, err := h.m.AwaitDestination(7, RankID{Addr: addrA})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		d := declared(7, 1, pageRange(0, 16))
		d.Addr = addrA
		if n, _, err := h.m.Resync([]ResyncRoom{d}, true); err != nil || n != 1 {
			t.Fatalf("Resync = %d, %v; want room 7 adopted", n, err)
		}
		select {
		case ev := <-c.Events():
			if ev.Done == nil || *ev.Done != PhaseSucceeded {
				t.Errorf("the pending claim's event = %+v, want Done (succeeded)", ev)
			}
		default:
			t.Fatal("the pending claim got nothing when its room was adopted")
		}
		h.release(7)
		h.assertClean()
	})
}
