package kvmanager

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// countingHarness is a harness whose manager runs on rvCountingClock (it
// counts the timers armed on the clock and not yet fired or stopped).
func countingHarness(t *testing.T, dec kvlayout.Config, cfg Config, obs Observer) (*harness, *rvCountingClock) {
	t.Helper()
	clk := &rvCountingClock{}
	if err := dec.Validate(); err != nil {
		t.Fatal(err)
	}
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(cfg, dec, Deps{Ledgers: []*prealloc.Ledger{led}, Engine: sim.NewSimEngine(sim.SimConfig{}, nil), Clock: clk, Logger: slog.New(slog.DiscardHandler), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, m: m, dec: dec, cfg: cfg, leds: []*prealloc.Ledger{led}}, clk
}

// Every deadline of every room, pending claim, shard and prefill wait is an
// entry of one heap driven by one timer on the clock: however many rooms
// wait, at most one timer is armed, and none once nothing waits.
func TestOneTimerForEveryDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		dec := kvlayout.DefaultConfig()
		dec.Pool.RequestSlots, dec.Pool.PreAllocSlots = 4, 0
		dec.Admission.ClaimTimeout = 30 * time.Second
		cfg := DefaultConfig()
		h, clk := countingHarness(t, dec, cfg, nil)
		h.register(instance{addr: addrA})
		maxLive := 0
		look := func() {
			synctest.Wait()
			maxLive = max(maxLive, clk.Live())
		}
		for room := uint64(1); room <= 40; room++ { // 4 admitted (claim deadline), 36 queued (bootstrap deadline)
			h.open(addrA, room)
			look()
		}
		for room := uint64(100); room < 110; room++ { // claims for rooms not opened yet
			if _, err := h.m.AwaitDestination(room, RankID{Addr: addrA}); err != nil {
				t.Fatal(err)
			}
			look()
		}
		for room := uint64(200); room < 205; room++ { // rooms waiting for an unregistered prefill
			h.open(addrB, room)
			look()
		}
		h.m.lockAll()
		entries := h.m.dlLen()
		h.m.unlockAll()
		if entries < 40+10+1+1 {
			t.Errorf("%d deadline entries, want one per open room, pending claim, shard and waiting address (>= 52)", entries)
		}
		if maxLive != 1 {
			t.Errorf("at most %d timers armed with %d deadlines pending; want exactly 1", maxLive, entries)
		}
		advance(dec.Admission.ClaimTimeout) // the admitted rooms' claim deadline: the next four are admitted
		h.wantFailure(1, FailureClaimTimeout, "Request 1 timed out")
		h.wantPhase(5, PhaseAdmitted)
		look()
		advance(cfg.Timeouts.Bootstrap) // everything else times out
		for _, room := range []uint64{5, 40, 200} {
			if s := h.snapshot(room); s.Phase != PhaseFailed {
				t.Errorf("room %d is %s after timeouts.bootstrap, want failed", room, s.Phase)
			}
		}
		h.m.lockAll()
		entries = h.m.dlLen()
		h.m.unlockAll()
		if entries != 0 || clk.Live() != 0 {
			t.Errorf("after every room failed: %d deadline entries, %d timers armed; want 0 and 0", entries, clk.Live())
		}
		if maxLive != 1 {
			t.Errorf("at most %d timers armed; want 1", maxLive)
		}
		h.assertClean()
	})
}

// passCounter counts admission passes per shard.
type passCounter struct {
	NopObserver
	mu     sync.Mutex
	passes int
}

func (p *passCounter) AdmissionPass(int, int, prealloc.BlockReason) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.passes++
}

func (p *passCounter) take() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.passes
	p.passes = 0
	return n
}

// A call that ends several rooms of a shard (an instance replaced fails its
// four rooms) runs one admission pass when it ends, not one per room inside
// it, and the queued room behind them is admitted by that pass.
func TestEndingRoomsAdmitsOncePerCall(t *testing.T) {
	bubble(t, func(t *testing.T) {
		dec := kvlayout.DefaultConfig()
		dec.Pool.RequestSlots, dec.Pool.PreAllocSlots = 4, 0
		obs := &passCounter{}
		h, _ := countingHarness(t, dec, DefaultConfig(), obs)
		a := instance{addr: addrA, instanceID: "a-1"}
		h.register(a)
		h.register(instance{addr: addrB})
		for room := uint64(1); room <= 4; room++ {
			h.open(addrA, room)
		}
		h.open(addrB, 5)
		h.wantPhase(5, PhaseQueued)
		obs.take()
		a.instanceID = "a-2" // restarted: its four rooms fail
		res, err := h.m.RegisterPrefill(h.registration(a, 0, 0, 0, 0))
		if err != nil || res.RoomsFailed != 4 {
			t.Fatalf("RegisterPrefill(restarted) = %+v, %v; want 4 rooms failed", res, err)
		}
		if n := obs.take(); n != 1 {
			t.Errorf("%d admission passes for one call that ended 4 rooms of the shard; want 1", n)
		}
		h.wantPhase(5, PhaseAdmitted)
		h.m.AbortRoom(5, "")
		h.m.Shutdown(context.Background())
		h.assertClean()
	})
}
