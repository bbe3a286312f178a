package kvmanager

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

func TestNewValidates(t *testing.T) {
	dec := kvlayout.DefaultConfig()
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		t.Fatal(err)
	}
	eng := sim.NewSimEngine(sim.SimConfig{Seed: 1}, nil)
	bad := DefaultConfig()
	bad.Timeouts.Waiting = 0
	tests := []struct {
		name string
		cfg  Config
		deps Deps
		want string
	}{
		{name: "config", cfg: bad, deps: Deps{Ledgers: []*prealloc.Ledger{led}, Engine: eng}, want: "timeouts.waiting"},
		{name: "no ledgers", cfg: DefaultConfig(), deps: Deps{Engine: eng}, want: "at least one ledger"},
		{name: "ledgers for dp", cfg: DefaultConfig(), deps: Deps{Ledgers: []*prealloc.Ledger{led, led}, Engine: eng}, want: "2 ledgers for parallel.dp = 1"},
		{name: "no engine", cfg: DefaultConfig(), deps: Deps{Ledgers: []*prealloc.Ledger{led}}, want: "transfer engine is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg, dec, tc.deps); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New() = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestShutdownFailsInFlightAndReleasesSucceeded: Shutdown ends every room:
// handing-off rooms fail (FailureShutdown, released like T18 once nothing is
// in flight), Success rooms (T12, T20, T21) are released.
func TestShutdownFailsInFlightAndReleasesSucceeded(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		g := newGate(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1) // succeeded: released
		h.open(addrA, 5)
		h.complete(5)
		if _, err := h.m.RetractRoom(5, RetractRebootstrap); err != nil { // held: released
			t.Fatal(err)
		}
		h.open(addrA, 2) // claimed, a chunk in flight
		claims := map[uint64]*Claim{}
		c2, _ := h.claim(2, RankID{Addr: addrA})
		claims[2] = c2
		h.open(addrA, 3) // admitted
		c3, err := h.m.AwaitDestination(3, RankID{Addr: addrA})
		if err != nil {
			t.Fatal(err)
		}
		h.destination(c3)
		claims[3] = c3
		h.open(addrB, 4) // waiting for its prefill
		pending, err := h.m.AwaitDestination(99, RankID{Addr: addrA})
		if err != nil {
			t.Fatal(err)
		}
		h.sim.SetFault(g.hook)
		done := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(2, RankID{Addr: addrA}, 0, 0, 16, true))
			done <- err
		}()
		<-g.entered
		synctest.Wait()

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.m.Shutdown(ctx)
		if el := time.Since(start); el != 10*time.Second {
			t.Errorf("Shutdown returned after %s, want 10s (rooms 2 and 3 kept handing off)", el)
		}
		// Room 2 is claimed: its only chunk is in flight, none landed yet.
		for room, phase := range map[uint64]Phase{2: PhaseClaimed, 3: PhaseAdmitted} {
			h.wantFailure(room, FailureShutdown, "decodeplane shut down before room "+strconv.FormatUint(room, 10)+" finished (phase "+phase.String()+")")
		}
		// Room 4 had nothing allocated for prefill: failed at once, not waited for.
		h.wantFailure(4, FailureShutdown, "decodeplane shut down before room 4 was admitted (phase waiting_prefill)")
		for _, room := range []uint64{1, 5} {
			h.wantPhase(room, PhaseReleased)
		}
		for room, c := range claims {
			if ev, ok := nextEvent(t, c); !ok || ev.Failure == nil || ev.Failure.Code != FailureShutdown {
				t.Errorf("claim of room %d got %+v (open %v), want the shutdown", room, ev, ok)
			}
		}
		if ev, ok := nextEvent(t, pending); !ok || ev.Failure == nil || ev.Failure.Code != FailureShutdown {
			t.Errorf("pending claim got %+v (open %v), want the shutdown", ev, ok)
		}
		// Room 2's chunk is still being written: its pages stay taken.
		if used := h.pagesUsed(0); used != 16 {
			t.Errorf("pages used while room 2's chunk is in flight = %d, want 16", used)
		}
		if _, _, err := h.m.OpenRoom(context.Background(), openReq(addrA, 6)); !errors.Is(err, ErrDraining) {
			t.Errorf("OpenRoom after Shutdown = %v, want ErrDraining", err)
		}
		if _, err := h.m.AwaitDestination(7, RankID{Addr: addrA}); !errors.Is(err, ErrDraining) {
			t.Errorf("AwaitDestination after Shutdown = %v, want ErrDraining", err)
		}
		g.release <- nil
		if err := <-done; !errors.Is(err, ErrWrongState) {
			t.Errorf("in-flight Transfer = %v, want ErrWrongState", err)
		}
		synctest.Wait()
		// Nothing armed before Shutdown fires afterwards.
		advance(time.Hour)
		h.assertClean()
	})
}

// TestShutdownWaitsForHandOff: Shutdown lets a transfer in flight reach T12.
func TestShutdownWaitsForHandOff(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// 1000 tokens × 131072 B at 1 GB/s: 131.072 ms.
		h := newHarness(t, withSim(sim.SimConfig{BandwidthGBytesPerS: 1, Seed: 1}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		done := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(1, RankID{Addr: addrA}, 0, 0, 16, true))
			done <- err
		}()
		synctest.Wait()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		h.m.Shutdown(ctx)
		if el := time.Since(start); (el - 131072*time.Microsecond).Abs() > time.Nanosecond {
			t.Errorf("Shutdown returned after %s, want 131.072ms (when room 1 succeeded)", el)
		}
		if err := <-done; err != nil {
			t.Errorf("Transfer = %v", err)
		}
		h.wantPhase(1, PhaseReleased)
		h.assertClean()
	})
}

// TestDrainRefusesNewRooms: no T1 while draining, no T11 for queued rooms;
// rooms already claimed reach T12.
func TestDrainRefusesNewRooms(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(oneSlot))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.open(addrA, 2) // queued behind room 1
		h.m.Drain()
		h.m.Drain() // idempotent
		if !h.m.Status().Draining {
			t.Errorf("Status().Draining = false after Drain")
		}
		if _, _, err := h.m.OpenRoom(context.Background(), openReq(addrA, 3)); !errors.Is(err, ErrDraining) {
			t.Errorf("OpenRoom while draining = %v, want ErrDraining", err)
		}
		if _, err := h.m.AwaitDestination(3, RankID{Addr: addrA}); !errors.Is(err, ErrDraining) {
			t.Errorf("AwaitDestination(unopened room) while draining = %v, want ErrDraining", err)
		}
		// Rooms already handing off go on.
		h.complete(1)
		h.release(1)
		// Rooms already open, queued ones included, go on: room 2 is
		// admitted once room 1's pages are back, and can finish.
		h.wantPhase(2, PhaseAdmitted)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		h.m.Shutdown(ctx)
		h.wantFailure(2, FailureShutdown, "decodeplane shut down before room 2 finished (phase admitted)")
		h.assertClean()
	})
}

func TestRunStopsWithContext(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.m.Run(ctx) }()
		advance(time.Hour)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v, want context.Canceled", err)
		}
	})
}

func TestLayoutAndShardStats(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withShards(3))
		if l := h.m.Layout(); l.DP != 3 || l.PageSize != 64 || l.HeadsPerRank != 8 {
			t.Errorf("Layout() = %+v", l)
		}
		st := h.m.ShardStats()
		if len(st) != 3 || st[2].Shard != 2 || st[0].Pages.Total != 16384 {
			t.Errorf("ShardStats() = %+v", st)
		}
	})
}

// gaugeObserver keeps the live-rooms-by-phase gauge a metrics exporter would
// keep from RoomPhase and RoomForgotten, and counts outcomes. Calls come with
// the manager's lock held.
type gaugeObserver struct {
	NopObserver
	live     map[Phase]int
	finished map[Phase]int
	codes    map[FailureCode]int
	lost     map[string]int
}

func newGaugeObserver() *gaugeObserver {
	return &gaugeObserver{live: map[Phase]int{}, finished: map[Phase]int{}, codes: map[FailureCode]int{}, lost: map[string]int{}}
}

func (g *gaugeObserver) RoomPhase(from, to Phase) {
	if from != PhaseUnspecified {
		g.live[from]--
	}
	g.live[to]++
}

func (g *gaugeObserver) RoomForgotten(p Phase) { g.live[p]-- }

func (g *gaugeObserver) RoomFinished(outcome Phase, code FailureCode, _ time.Duration) {
	g.finished[outcome]++
	g.codes[code]++
}

func (g *gaugeObserver) PrefillLost(addr string, rooms int) { g.lost[addr] += rooms }

// TestObserverGaugesMatchRooms: the observer's view of rooms by phase stays
// equal to the manager's across T1–T22 paths, timeouts and retention.
func TestObserverGaugesMatchRooms(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := newGaugeObserver()
		h := newHarness(t, withRun(), withObserver(obs), withConfig(func(c *Config) { c.Rooms.Retention = 90 * time.Second }))
		check := func(when string) {
			t.Helper()
			h.m.lockAll()
			got := map[Phase]int{}
			for p, n := range obs.live {
				if n != 0 {
					got[p] = n
				}
			}
			h.m.unlockAll()
			if diff := cmp.Diff(h.m.Status().RoomsByPhase, got); diff != "" {
				t.Errorf("%s: gauge differs from the rooms (-rooms +gauge):\n%s", when, diff)
			}
		}
		in := instance{addr: addrA}
		h.register(in)
		h.open(addrA, 1)
		h.complete(1)
		h.release(1)
		h.open(addrA, 2)
		h.complete(2)
		h.m.RetractRoom(2, RetractCPU)
		advance(RetractResumeAfter) // resumed by the pass after the call (no other room runs)
		h.m.RetractRoom(2, RetractRebootstrap)
		h.m.ContinueGeneration(context.Background())
		h.complete(2)
		h.open(addrA, 3)
		h.m.AbortRoom(3, "")
		h.open(addrB, 4) // never registers: T3 at 52 s
		check("after the first rooms")
		for range 20 {
			advance(4 * time.Second)
			h.heartbeatAll(in)
		}
		check("after 80 s")
		h.release(2)
		advance(4 * time.Minute) // instance lost, rooms forgotten
		check("after retention")
		// Room 2 succeeded twice (attempts 1 and 2); rooms 3 and 4 failed.
		want := map[Phase]int{PhaseSucceeded: 3, PhaseFailed: 2}
		h.m.lockAll()
		finished, codes := obs.finished, obs.codes
		h.m.unlockAll()
		if diff := cmp.Diff(want, finished); diff != "" {
			t.Errorf("RoomFinished outcomes (-want +got):\n%s", diff)
		}
		if codes[FailureAborted] != 1 || codes[FailurePrefillUnavailable] != 1 {
			t.Errorf("failure codes = %v", codes)
		}
		h.assertClean()
	})
}
