package kvmanager

// Regression tests from a code review: each reproduces a defect the review
// found (described in its comment as it was) and checks the fixed behaviour.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// rvStaging turns the harness's decode side into a small GQA pool with a
// 1 MiB staging ring (decode TP 1): a prefill with TP 2 is staged.
func rvStaging(c *kvlayout.Config) {
	c.Pool.Kind = kvlayout.KindGQA
	c.Pool.NumLayers, c.Pool.KVHeads, c.Pool.HeadDim, c.Pool.DType = 4, 8, 16, "bf16"
	c.Pool.PageSize, c.Pool.TotalTokens, c.Pool.TotalPages, c.Pool.RequestSlots = 16, 0, 512, 8
	c.Staging = kvlayout.StagingConfig{Enabled: true, PoolSizeMB: 1}
}

// rvOpenStaged registers a TP-2 prefill, opens a 7-page room and claims it.
func rvOpenStaged(h *harness, room uint64) []RankID {
	h.t.Helper()
	h.register(instance{addr: addrA, tp: 2})
	h.open(addrA, room, func(r *OpenRequest) { r.PromptLen = 100 })
	h.claimAll(room)
	if s := h.snapshot(room); !s.Staging || s.Phase != PhaseClaimed {
		h.t.Fatalf("room %d: staging %v phase %s, want a claimed staged room", room, s.Staging, s.Phase)
	}
	return h.requiredRanks(room)
}

// Regression (finding 1, hang): a staged room whose staged chunks all landed and were
// scattered, but whose metadata slot never got the room marker, stays
// Transferring forever. stagingSettleLocked clears r.waitingAt when it arms
// the staging completion timer; when the last scatter lifts the gate it stops
// that timer, and checkSuccessLocked then waits for the marker with no
// deadline armed at all (the non-staged twin, TestT19MarkerMissingKeepsTransferring,
// fails at timeouts.waiting).
func TestStagedRoomWithoutMarkerFailsAtTheWaitingDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(rvStaging), withConfig(func(c *Config) {
			c.Timeouts.Waiting = time.Minute
			c.Timeouts.HeartbeatInterval = time.Hour
		}))
		const room = 21
		ranks := rvOpenStaged(h, room)
		pages := h.snapshot(room).NumPages
		for _, rk := range ranks {
			if _, err := h.m.AllocateStaging(room, rk, 0, pages); err != nil {
				t.Fatalf("AllocateStaging(%s) = %v", rk, err)
			}
		}
		for _, rk := range ranks {
			// The last chunk, but the aux (room marker) never comes: the
			// chunk is refused (every rank's last chunk carries the marker).
			var inv *InvalidError
			if _, err := h.m.StagingChunkReady(context.Background(), ChunkRequest{Room: room, Rank: rk, Index: 0, NumPages: pages, Last: true}); !errors.As(err, &inv) || inv.Field != "aux" {
				t.Fatalf("StagingChunkReady(%s) = %v, want InvalidError on aux", rk, err)
			}
		}
		if ph := h.snapshot(room).Phase; ph != PhaseClaimed && ph != PhaseTransferring {
			t.Fatalf("phase %s, want claimed or transferring", ph)
		}
		h.m.lockAll()
		r := h.m.allRooms()[room]
		armed := h.m.dl.armed(&r.dl) || !r.NextDeadline().IsZero()
		h.m.unlockAll()
		if !armed {
			t.Errorf("room %d is Transferring with no deadline armed (none on the heap, waitingAt zero)", room)
		}
		advance(10 * time.Minute) // 10 × timeouts.waiting, 2 × timeouts.bootstrap
		if s := h.snapshot(room); !s.Phase.Terminal() {
			t.Fatalf("room %d still %s 10 minutes after every chunk landed (waiting timeout 1m): it never ends and holds %d pages", room, s.Phase, s.NumPages)
		}
	})
}

// rvLostAgent is a transfer agent that accepts every batch and then loses it
// (the completion stream broke and could not be re-established, as
// agentclient.Client reports it: delegate.ErrAgentLost). The agent itself is alive and
// keeps executing the batch until its deadline.
type rvLostAgent struct {
	deadlines chan time.Time
}

func (a *rvLostAgent) RegisterBuffers(context.Context, []kvcopy.BufferSpec) error { return nil }
func (a *rvLostAgent) DeregisterBuffers(context.Context, []string) error          { return nil }
func (a *rvLostAgent) CancelRoom(context.Context, uint64) error                   { return nil }
func (a *rvLostAgent) Check(context.Context) error                                { return nil }
func (a *rvLostAgent) Execute(_ context.Context, b kvcopy.Batch) error {
	a.deadlines <- b.Deadline
	return fmt.Errorf("%w: completion stream broke and the agent could not be reached again", delegate.ErrAgentLost)
}

// Regression (finding 2, pages reused under an in-flight write, delegated path): when a
// batch's outcome is unknown (ErrAgentLost: the batch was accepted, the agent
// may still be copying until the batch deadline), delegate.DelegateEngine reports
// transfer.ErrTransferFailed, the room fails and its pages go straight back to the
// ledger, which hands them to the next room while the lost batch may still
// write into them (until transfer.delegate.batch_timeout).
func TestAgentLostBatchKeepsPagesUntilItsDeadline(t *testing.T) {
	bubble(t, func(t *testing.T) {
		agent := &rvLostAgent{deadlines: make(chan time.Time, 4)}
		var eng *delegate.DelegateEngine
		h := newHarness(t, withDecode(smallPool(24)), withEngine(func(*sim.SimEngine) transfer.Engine {
			eng = delegate.NewDelegateEngine(delegate.DelegateConfig{Target: "agent:1", BatchTimeout: 30 * time.Second, HealthInterval: time.Second}, agent, delegate.DelegateDeps{Logger: slog.New(slog.DiscardHandler)})
			return eng
		}))
		// The engine is ready once its health loop's first check passed.
		runCtx, stop := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { _ = eng.Run(runCtx); close(ran) }()
		defer func() { stop(); <-ran }()
		synctest.Wait()
		if up, reason := eng.Ready(); !up {
			t.Fatalf("delegated engine not ready after its first health check: %s", reason)
		}
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		pages1 := h.snapshot(1).NumPages
		h.m.lockAll()
		room1Pages := slices.Clone(h.m.allRooms()[1].Pages())
		h.m.unlockAll()
		h.open(addrA, 2) // does not fit next to room 1: queued
		h.wantPhase(2, PhaseQueued)

		rk := h.requiredRanks(1)[0]
		req := chunk(1, rk, 0, 0, pages1, true)
		req.SrcBuffer = "prefill/kv"
		for i := range pages1 {
			req.SrcPages = append(req.SrcPages, int32(i))
		}
		if _, _, err := h.m.Transfer(context.Background(), req); !errors.Is(err, transfer.ErrTransferFailed) {
			t.Fatalf("Transfer with a lost batch = %v, want transfer.ErrTransferFailed", err)
		}
		deadline := <-agent.deadlines
		now := time.Now()
		h.wantFailure(1, FailureTransferFailed, "KVTransferError(bootstrap_room=1)")
		if now.Before(deadline) && h.snapshot(2).Phase != PhaseQueued {
			h.m.lockAll()
			room2Pages := slices.Clone(h.m.allRooms()[2].Pages())
			h.m.unlockAll()
			reused := 0
			for _, p := range room2Pages {
				if slices.Contains(room1Pages, p) {
					reused++
				}
			}
			t.Errorf("room 2 was admitted at once with %d of room 1's pages, while room 1's lost batch may write into them until its deadline %s from now",
				reused, deadline.Sub(now))
		}
	})
}

// rvCountingClock is kvlayout.RealClock (the bubble's clock) that counts the timers
// armed and not yet fired or stopped.
type rvCountingClock struct {
	mu   sync.Mutex
	live int
}

type rvTimer struct {
	c     *rvCountingClock
	t     *time.Timer
	ended bool
}

func (c *rvCountingClock) Now() time.Time { return time.Now() }
func (c *rvCountingClock) AfterFunc(d time.Duration, f func()) kvlayout.Stopper {
	tm := &rvTimer{c: c}
	c.mu.Lock()
	c.live++
	c.mu.Unlock()
	tm.t = time.AfterFunc(d, func() {
		tm.end()
		f()
	})
	return tm
}
func (t *rvTimer) end() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if !t.ended {
		t.ended = true
		t.c.live--
	}
}
func (t *rvTimer) Stop() bool {
	ok := t.t.Stop()
	if ok {
		t.end()
	}
	return ok
}
func (c *rvCountingClock) Live() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// Regression (finding 4, timer/claim retained): a claim that arrives before OpenRoom
// arms an expiry timer (AwaitDestination, lifecycle.go) whose kvlayout.Stopper is
// dropped: when the room opens and the claim attaches, the timer is never
// stopped, so it (and the Claim, its channel and buffered Destination) stays
// alive for timeouts.bootstrap after the room is long released.
func TestPendingClaimTimerStopsWhenTheRoomOpens(t *testing.T) {
	bubble(t, func(t *testing.T) {
		clk := &rvCountingClock{}
		dec := kvlayout.DefaultConfig()
		led, err := prealloc.NewLedger(dec, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		m, err := New(cfg, dec, Deps{Ledgers: []*prealloc.Ledger{led}, Engine: sim.NewSimEngine(sim.SimConfig{}, nil), Clock: clk, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		h := &harness{t: t, m: m, dec: dec, cfg: cfg, leds: []*prealloc.Ledger{led}}
		h.register(instance{addr: addrA})
		rk := RankID{Addr: addrA}
		c, err := m.AwaitDestination(7, rk) // prefill first: the claim waits
		if err != nil {
			t.Fatal(err)
		}
		h.open(addrA, 7)
		c.Delivered(h.destination(c))
		h.sendAll(7)
		h.wantPhase(7, PhaseSucceeded)
		h.release(7)
		c.Close()
		synctest.Wait()
		if n := clk.Live(); n != 0 {
			t.Errorf("%d timer(s) still armed after the only room was released and its claim closed; want 0", n)
		}
		advance(cfg.Timeouts.Bootstrap)
	})
}

// Regression (finding 5, data race, run with -race): a retry of a chunk in flight reads
// cs.inflight in awaitChunk after Transfer dropped the manager's lock, while
// the original Transfer's chunkEndLocked sets cs.inflight = nil under it. The
// existing TestRetryOfInFlightChunkWaits hides it behind synctest.Wait; with
// real goroutines -race reports it. (No bubble here on purpose.)
func TestRetryOfInFlightChunkDoesNotRace(t *testing.T) {
	h := newHarness(t)
	t.Cleanup(func() { h.m.Shutdown(context.Background()) })
	g := newGate(t)
	h.sim.SetFault(g.hook)
	h.register(instance{addr: addrA})
	h.open(addrA, 1)
	h.claimAll(1)
	rk := h.requiredRanks(1)[0]
	errs := make(chan error, 2)
	send := func() {
		_, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true))
		errs <- err
	}
	go send()
	<-g.entered
	go send()                         // the retry: reads cs.inflight without the lock
	time.Sleep(20 * time.Millisecond) // no happens-before edge with the retry
	g.release <- nil                  // the original writes cs.inflight = nil under the lock
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("Transfer = %v", err)
		}
	}
	h.wantPhase(1, PhaseSucceeded)
	h.release(1)
}

// Regression (finding 6, semantics): OpenRoom checks draining before the idempotency
// key, so a client retrying an OpenRoom whose answer was lost (the documented
// way to retry it) gets UNAVAILABLE during a drain although the room is open
// and proceeds. The client then believes no room exists; the room still gets
// admitted, claimed and filled, and holds its pages in Succeeded (which has
// no deadline) until the daemon shuts down.
func TestIdempotentOpenRoomRetryDuringDrain(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		req := openReq(addrA, 3)
		req.IdempotencyKey = "k-3"
		if _, _, err := h.m.OpenRoom(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		h.m.Drain()
		snap, existing, err := h.m.OpenRoom(context.Background(), req) // the retry of the same call
		if err != nil || !existing || snap.Room != 3 {
			t.Errorf("retried OpenRoom (same idempotency key) during a drain = existing %v, %v; want the existing room", existing, err)
		}
	})
}

// Regression (finding 3, semantics, T13): a prefill's failure report is validated like a
// landed chunk. The wire validator (ReportTransferRequest.Validate) accepts a
// failure with num_pages = 0 on a non-last chunk, but chunkBeginLocked
// rejects it ("num_pages: must be > 0") before looking at Failed, so the
// prefill's failure never fails the room: it waits out timeouts.waiting.
func TestT13ReportedFailureWithoutPagesFailsTheRoom(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 4)
		h.claimAll(4)
		rk := h.requiredRanks(4)[0]
		_, _, err := h.m.ReportTransfer(ChunkRequest{Room: 4, Rank: rk, Index: 0, Failed: true, Reason: "prefill aborted the request"})
		if err != nil {
			t.Errorf("ReportTransfer(failure, no pages) = %v; want the failure recorded", err)
		}
		if s := h.snapshot(4); s.Phase != PhaseFailed {
			t.Errorf("room 4 is %s after its prefill reported a failure; want failed (SGLang T13)", s.Phase)
		}
	})
}
