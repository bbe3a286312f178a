package kvmanager

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// reuseObserver counts PageReuseViolations.
type reuseObserver struct {
	NopObserver
	mu sync.Mutex
	n  int
}

func (o *reuseObserver) PageReuseViolations(_, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n += n
}

func (o *reuseObserver) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// lenient turns the package's strict invariants off for one test, so that
// an injected violation is counted and logged as in production instead of
// panicking. The package's tests do not run in parallel.
func lenient(t *testing.T) {
	strictInvariants = false
	t.Cleanup(func() { strictInvariants = true })
}

// reachedPages counts the pages of shard i's reuse record a writer may
// still reach.
func (h *harness) reachedPages(i int) int {
	sh := h.m.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := 0
	for _, c := range sh.reach.pages {
		n += int(c)
	}
	return n
}

// drainingRoom opens room 1 on drainPool, has its rank claim it and report
// a chunk it moved itself, and aborts it: its pages drain, waiting for the
// rank's AckRoomEnd. It returns the rank and its destination.
func drainingRoom(t *testing.T, h *harness) (RankID, *Destination) {
	t.Helper()
	h.register(instance{addr: addrA})
	h.open(addrA, 1)
	rank := h.requiredRanks(1)[0]
	_, d := h.claim(1, rank)
	if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.m.AbortRoom(1, ""); err != nil {
		t.Fatal(err)
	}
	if s := h.stats(0); s.Draining != 1 {
		t.Fatalf("room 1 is not draining: %+v", s)
	}
	return rank, d
}

// TestReuseInvariantFollowsTheWriters: a destination joins the shard's
// record when it goes out to a rank and stays while a writer may land
// (through a failure's drain), and leaves it when the writers stopped (the
// rank's acknowledgement, a success); a page handed out again after that
// is no violation.
func TestReuseInvariantFollowsTheWriters(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := &reuseObserver{}
		h := newHarness(t, withDecode(drainPool), withObserver(obs), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		if n := h.reachedPages(0); n != 0 {
			t.Fatalf("reachable pages before any room = %d", n)
		}
		rank, d := drainingRoom(t, h)
		if n := h.reachedPages(0); n != len(d.Pages) {
			t.Fatalf("reachable pages of the draining room = %d, want its %d", n, len(d.Pages))
		}
		h.open(addrA, 2)
		h.wantPhase(2, PhaseQueued) // the ledger keeps the draining pages
		if _, err := h.m.AckRoomEnd(1, rank, 1); err != nil {
			t.Fatal(err)
		}
		h.wantPhase(2, PhaseAdmitted) // room 1's pages, reused once its writer stopped
		if n := h.reachedPages(0); n != 0 {
			t.Fatalf("reachable pages after the ack = %d, want 0 (room 2's destination has not gone out)", n)
		}
		h.complete(2)
		if n := h.reachedPages(0); n != 0 {
			t.Fatalf("reachable pages after room 2 succeeded = %d, want 0", n)
		}
		h.release(2)
		if obs.count() != 0 {
			t.Fatalf("violations = %d, want 0", obs.count())
		}
	})
}

// TestReuseInvariantCountsAnInjectedViolation: the ledger is made to let
// go of a draining room's record behind the room's back (the bug class the
// check exists for: pages back while a prefill rank may still write into
// them); the next admission hands them to another room, and the check
// counts every page and the metadata row, and logs an error naming both
// rooms.
func TestReuseInvariantCountsAnInjectedViolation(t *testing.T) {
	bubble(t, func(t *testing.T) {
		lenient(t)
		obs := &reuseObserver{}
		var logs syncBuf
		h := newHarness(t, withDecode(drainPool), withObserver(obs), withLogger(slog.New(slog.NewTextHandler(&logs, nil))),
			withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		_, d := drainingRoom(t, h)
		if err := h.leds[0].Release(1); err != nil { // the injected fault
			t.Fatal(err)
		}
		h.open(addrA, 2)
		s2 := h.wantPhase(2, PhaseAdmitted)
		sh := h.m.shards[0]
		sh.mu.Lock()
		pages2 := sh.rooms[2].Pages()
		sh.mu.Unlock()
		want := 0
		for _, p := range pages2 {
			if slices.Contains(d.Pages, p) {
				want++
			}
		}
		if s2.MetadataSlot == d.MetadataSlot {
			want++
		}
		if want < len(d.Pages) {
			t.Fatalf("room 2 got %d of room 1's %d pages; the test expects all of them", want, len(d.Pages))
		}
		if obs.count() != want {
			t.Fatalf("violations = %d, want %d (room 1's pages and rows handed to room 2)", obs.count(), want)
		}
		if out := logs.String(); !strings.Contains(out, "page reuse") || !strings.Contains(out, "room=2") || !strings.Contains(out, "writers of room 1") {
			t.Fatalf("log does not name the violation and both rooms:\n%s", out)
		}
	})
}

// TestReuseInvariantEngineOwner: with the decode engine as the page owner
// the check covers its declarations: pages declared again once the
// hand-off ledger let go of them at the rank's ack are no violation; a
// hand-off ledger made to let go early (the injected fault) lets a
// declaration through that the check counts.
func TestReuseInvariantEngineOwner(t *testing.T) {
	for _, inject := range []bool{false, true} {
		name := map[bool]string{false: "acked", true: "injected"}[inject]
		t.Run(name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				if inject {
					lenient(t)
				}
				obs := &reuseObserver{}
				h := newHarness(t, withDecode(engineOwner), withObserver(obs), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
				h.register(instance{addr: addrA})
				h.open(addrA, 1)
				if _, _, err := h.declare(1, 0, 16, 0); err != nil {
					t.Fatal(err)
				}
				rank := h.requiredRanks(1)[0]
				h.claim(1, rank)
				if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
					t.Fatal(err)
				}
				if _, _, err := h.m.AbortRoom(1, ""); err != nil {
					t.Fatal(err)
				}
				if inject {
					if err := h.m.shards[0].holds.Release(1, false); err != nil {
						t.Fatal(err)
					}
				} else if _, err := h.m.AckRoomEnd(1, rank, 1); err != nil {
					t.Fatal(err)
				}
				h.open(addrA, 2)
				if _, _, err := h.declare(2, 0, 16, 0); err != nil {
					t.Fatalf("declaring room 1's pages for room 2 = %v", err)
				}
				want := 0
				if inject {
					want = 17 // 16 pages and the metadata row
				}
				if obs.count() != want {
					t.Fatalf("violations = %d, want %d", obs.count(), want)
				}
			})
		})
	}
}

// TestReuseInvariantWaitsForEngineCalls: the record keeps a destination
// while an engine call the executor started into it is running, whatever
// the room decided: the call's end takes it out.
func TestReuseInvariantWaitsForEngineCalls(t *testing.T) {
	bubble(t, func(t *testing.T) {
		g := newGate(t)
		h := newHarness(t, withDecode(drainPool), withEngine(func(s *sim.SimEngine) transfer.Engine {
			s.SetFault(g.hook)
			return s
		}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		rank := h.requiredRanks(1)[0]
		_, d := h.claim(1, rank)
		done := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(1, rank, 0, 0, len(d.Pages), true))
			done <- err
		}()
		<-g.entered
		sh := h.m.shards[0]
		sh.mu.Lock()
		e := sh.rooms[1]
		e.subs.reach.stopped = true // as if the room had said its writers stopped
		sh.settleReach(e)
		sh.mu.Unlock()
		if n := h.reachedPages(0); n != len(d.Pages) {
			t.Fatalf("reachable pages with the call running = %d, want %d", n, len(d.Pages))
		}
		g.release <- nil
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		h.wantPhase(1, PhaseSucceeded)
		if n := h.reachedPages(0); n != 0 {
			t.Fatalf("reachable pages after the call returned = %d, want 0", n)
		}
		h.release(1)
	})
}
