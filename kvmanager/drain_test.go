package kvmanager

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// ackObserver counts RoomEndAcks by outcome.
type ackObserver struct {
	NopObserver
	mu   sync.Mutex
	acks map[string]int
}

func (o *ackObserver) RoomEndAcks(outcome string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.acks == nil {
		o.acks = map[string]int{}
	}
	o.acks[outcome] += n
}

func (o *ackObserver) count(outcome string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.acks[outcome]
}

// syncBuf is a log buffer safe for the manager's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// drainPool fits one default room (1000 prompt tokens, 16 pages of 64) at
// a time: a second one needs the first one's pages.
var drainPool = smallPool(24)

// reportChunk is a chunk the prefill moved itself (ReportTransfer), with
// its layout weight.
func (h *harness) reportChunk(room uint64, rank RankID, idx, off, n int, last bool) error {
	h.t.Helper()
	req := chunk(room, rank, idx, off, n, last)
	req.Bytes = h.chunkWeight(room, req)
	_, _, err := h.m.ReportTransfer(req)
	return err
}

// TestDeferredReleaseExitPaths: on every exit path of a room whose prefill
// rank received the destination and writes by itself (ReportTransfer), the
// claim ends with AckRequired, the room's pages drain (not free: a room
// that needs them stays queued) and come back at once with the rank's ack;
// a second ack is a no-op.
func TestDeferredReleaseExitPaths(t *testing.T) {
	paths := []struct {
		name string
		end  func(h *harness, rank RankID)
		code FailureCode
	}{
		{"abort", func(h *harness, _ RankID) {
			if _, _, err := h.m.AbortRoom(1, ""); err != nil {
				h.t.Fatal(err)
			}
		}, FailureAborted},
		{"failure reported by the prefill", func(h *harness, rank RankID) {
			req := chunk(1, rank, 1, 4, 4, false)
			req.Failed, req.Reason = true, "rdma error"
			if _, _, err := h.m.ReportTransfer(req); err != nil {
				h.t.Fatal(err)
			}
		}, FailureTransferFailed},
		{"waiting timeout", func(h *harness, _ RankID) { advance(h.cfg.Timeouts.Waiting) }, FailureWaitingTimeout},
		{"prefill replaced", func(h *harness, _ RankID) { h.register(instance{addr: addrA, instanceID: "second"}) }, FailurePrefillLost},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				obs := &ackObserver{}
				h := newHarness(t, withDecode(drainPool), withObserver(obs), withConfig(func(c *Config) {
					c.Release.DeferredTimeout = 30 * time.Second
					c.Timeouts.Waiting = 10 * time.Second
				}))
				h.register(instance{addr: addrA, instanceID: "first"})
				h.open(addrA, 1)
				rank := h.requiredRanks(1)[0]
				c, d := h.claim(1, rank)
				if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
					t.Fatal(err)
				}
				p.end(h, rank)
				if code := h.snapshot(1).Failure; code == nil || code.Code != p.code {
					t.Fatalf("room 1 failure = %+v, want code %v", code, p.code)
				}
				ev, _ := nextEvent(t, c)
				if ev.Failure == nil || !ev.AckRequired {
					t.Fatalf("claim's end = %+v, want a failure with AckRequired", ev)
				}
				// The prefill keeps writing: refused (the room ended), and
				// the pages are not free.
				if err := h.reportChunk(1, rank, 2, 8, 4, false); err == nil {
					t.Fatal("ReportTransfer after the end was accepted")
				}
				if s := h.stats(0); s.Draining != 1 || s.Pages.Draining != int64(len(d.Pages)) {
					t.Fatalf("stats draining = %d rooms, %d pages; want 1, %d", s.Draining, s.Pages.Draining, len(d.Pages))
				}
				if w := h.snapshot(1).WaitingFor; !strings.Contains(w, "AckRoomEnd (attempt 1) from prefill ranks [cp 0 tp 0 pp 0]") {
					t.Fatalf("waiting_for = %q", w)
				}
				h.register(instance{addr: addrB})
				h.open(addrB, 2)
				h.wantPhase(2, PhaseQueued)

				if _, err := h.m.AckRoomEnd(1, rank, 2); !errors.Is(err, ErrStaleAttempt) {
					t.Fatalf("AckRoomEnd(attempt 2) = %v, want ErrStaleAttempt", err)
				}
				h.wantPhase(2, PhaseQueued)
				res, err := h.m.AckRoomEnd(1, rank, 1)
				if err != nil || !res.Owed || !res.Released || res.Remaining != 0 {
					t.Fatalf("AckRoomEnd = %+v, %v; want owed and released", res, err)
				}
				h.wantPhase(2, PhaseAdmitted) // at once
				if s := h.stats(0); s.Draining != 0 {
					t.Fatalf("still %d draining rooms after the ack", s.Draining)
				}
				if res, err := h.m.AckRoomEnd(1, rank, 1); err != nil || res.Owed || res.Released {
					t.Fatalf("second AckRoomEnd = %+v, %v; want an accepted no-op", res, err)
				}
				if obs.count("acked") != 1 || obs.count("expired") != 0 {
					t.Fatalf("acks = %v", obs.acks)
				}
				h.m.AbortRoom(2, "")
				h.assertLedgersFull()
			})
		})
	}
}

// TestDeferredReleaseBoundExpires: without an ack the pages come back at
// release.deferred_timeout, with a warning naming the rank and the counter.
func TestDeferredReleaseBoundExpires(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := &ackObserver{}
		var logs syncBuf
		h := newHarness(t, withDecode(drainPool), withObserver(obs), withLogger(slog.New(slog.NewTextHandler(&logs, nil))),
			withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		rank := h.requiredRanks(1)[0]
		h.claim(1, rank)
		if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
			t.Fatal(err)
		}
		h.m.AbortRoom(1, "")
		h.open(addrA, 2)
		advance(30*time.Second - time.Millisecond)
		h.wantPhase(2, PhaseQueued)
		if strings.Contains(logs.String(), "deferred_timeout expired") {
			t.Fatal("warned before the bound")
		}
		advance(time.Millisecond)
		h.wantPhase(2, PhaseAdmitted)
		if !strings.Contains(logs.String(), "release.deferred_timeout expired") || !strings.Contains(logs.String(), "ranks=\"[cp 0 tp 0 pp 0]\"") {
			t.Fatalf("no warning naming the rank: %s", logs.String())
		}
		if obs.count("expired") != 1 || obs.count("acked") != 0 {
			t.Fatalf("acks = %v, want expired 1", obs.acks)
		}
		if res, err := h.m.AckRoomEnd(1, rank, 1); err != nil || res.Owed {
			t.Fatalf("late AckRoomEnd = %+v, %v; want an accepted no-op", res, err)
		}
		h.m.AbortRoom(2, "")
		h.assertLedgersFull()
	})
}

// TestDeferredReleaseWhoOwes: a rank whose chunks the daemon's engine
// moves, a room whose destination nobody received, and a claimed rank of an
// instance that never reported a chunk itself owe nothing: the pages go
// back at once; deferral 0 is today's rule.
func TestDeferredReleaseWhoOwes(t *testing.T) {
	cases := []struct {
		name     string
		deferral time.Duration
		act      func(h *harness, rank RankID)
	}{
		{"never received", 30 * time.Second, func(h *harness, rank RankID) {}},
		{"engine moves its chunks", 30 * time.Second, func(h *harness, rank RankID) {
			h.claim(1, rank)
			if _, _, err := h.m.Transfer(context.Background(), chunk(1, rank, 0, 0, 4, false)); err != nil {
				h.t.Fatal(err)
			}
		}},
		{"claimed, its instance never wrote by itself", 30 * time.Second, func(h *harness, rank RankID) { h.claim(1, rank) }},
		{"deferral off", 0, func(h *harness, rank RankID) {
			h.claim(1, rank)
			if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
				h.t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(drainPool), withConfig(func(c *Config) { c.Release.DeferredTimeout = tc.deferral }))
				h.register(instance{addr: addrA})
				h.open(addrA, 1)
				rank := h.requiredRanks(1)[0]
				tc.act(h, rank)
				h.m.AbortRoom(1, "")
				if s := h.stats(0); s.Draining != 0 {
					t.Fatalf("%d draining rooms, want none", s.Draining)
				}
				h.assertLedgersFull()
				if res, err := h.m.AckRoomEnd(1, rank, 1); err != nil || res.Owed {
					t.Fatalf("AckRoomEnd = %+v, %v; want an accepted no-op", res, err)
				}
			})
		})
	}
}

// TestDeferredReleaseRebootstrapAndShutdown: after a rebootstrap the owing
// generation is attempt 2 (an ack for attempt 1 is stale and changes
// nothing); Shutdown does not wait for acknowledgements.
func TestDeferredReleaseRebootstrapAndShutdown(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(drainPool), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1)
		if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		h.m.ContinueGeneration(context.Background())
		rank := RankID{Addr: addrA}
		c, d := h.claim(1, rank)
		if d.Attempt != 2 {
			t.Fatalf("attempt %d, want 2", d.Attempt)
		}
		if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
			t.Fatal(err)
		}
		h.m.AbortRoom(1, "")
		if ev, _ := nextEvent(t, c); !ev.AckRequired {
			t.Fatalf("claim's end = %+v, want AckRequired", ev)
		}
		if _, err := h.m.AckRoomEnd(1, rank, 1); !errors.Is(err, ErrStaleAttempt) {
			t.Fatalf("AckRoomEnd(attempt 1) = %v, want ErrStaleAttempt", err)
		}
		if s := h.stats(0); s.Draining != 1 {
			t.Fatalf("stale ack changed the drain: %d draining", s.Draining)
		}
		if res, err := h.m.AckRoomEnd(1, rank, 2); err != nil || !res.Released {
			t.Fatalf("AckRoomEnd(attempt 2) = %+v, %v", res, err)
		}
		h.assertLedgersFull()

		// Shutdown with a rank that would owe: it fails the room and
		// releases it at once, asking for no ack (nothing waits for it).
		h.open(addrA, 3)
		c3, _ := h.claim(3, rank)
		if err := h.reportChunk(3, rank, 0, 0, 4, false); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		h.m.Shutdown(ctx)
		if ev, _ := nextEvent(t, c3); ev.Failure == nil || ev.Failure.Code != FailureShutdown || ev.AckRequired {
			t.Fatalf("claim's end at shutdown = %+v", ev)
		}
		if s := h.stats(0); s.Draining != 0 {
			t.Fatalf("%d draining rooms after shutdown", s.Draining)
		}
		h.assertLedgersFull()
	})
}

// TestDeferredReleaseClaimedRankOfASelfWriter: once an instance reported a
// chunk it moved itself, a rank of it that claimed a later room and has
// sent nothing yet may be writing its first chunk (sglang#35049): it owes.
func TestDeferredReleaseClaimedRankOfASelfWriter(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(drainPool), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		rank := h.requiredRanks(1)[0]
		h.claim(1, rank)
		pages := h.snapshot(1).NumPages
		if err := h.reportChunk(1, rank, 0, 0, pages, true); err != nil {
			t.Fatal(err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.open(addrA, 2)
		c, _ := h.claim(2, rank)
		h.m.AbortRoom(2, "")
		if ev, _ := nextEvent(t, c); !ev.AckRequired {
			t.Fatalf("claim's end = %+v, want AckRequired", ev)
		}
		if s := h.stats(0); s.Draining != 1 {
			t.Fatalf("%d draining rooms, want 1", s.Draining)
		}
		if res, err := h.m.AckRoomEnd(2, rank, 1); err != nil || !res.Released {
			t.Fatalf("AckRoomEnd = %+v, %v", res, err)
		}
		h.assertLedgersFull()
	})
}

// TestReleaseConfigBounds: release.deferred_timeout is 0..10m; a value
// outside is refused naming the setting and the fix.
func TestReleaseConfigBounds(t *testing.T) {
	for _, d := range []time.Duration{0, time.Second, MaxDeferredTimeout} {
		c := DefaultConfig()
		c.Release.DeferredTimeout = d
		if err := c.Validate(); err != nil {
			t.Errorf("deferred_timeout %s: %v", d, err)
		}
	}
	for _, d := range []time.Duration{-time.Second, MaxDeferredTimeout + time.Second} {
		c := DefaultConfig()
		c.Release.DeferredTimeout = d
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "release.deferred_timeout") || !strings.Contains(err.Error(), "between 0 and 10m0s") || !strings.Contains(err.Error(), "or 0 to release") {
			t.Errorf("deferred_timeout %s: %v; want the setting, its bounds and the fix", d, err)
		}
	}
}

// TestDeferredReleaseClaimTimeout: a room whose destination one rank of a
// self-writing instance claimed, but not every required rank, reaches
// admission.claim_timeout: the ledger keeps it draining (ExpireKeeping)
// rather than freeing the pages the claimed rank may be writing into, until
// that rank's ack.
func TestDeferredReleaseClaimTimeout(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		h.register(instance{addr: addrA, tp: 2})
		h.open(addrA, 1)
		ranks := h.requiredRanks(1)
		if len(ranks) != 2 {
			t.Fatalf("%d required ranks, want 2", len(ranks))
		}
		pages := h.snapshot(1).NumPages
		for _, rk := range ranks {
			h.claim(1, rk)
		}
		for _, rk := range ranks {
			if err := h.reportChunk(1, rk, 0, 0, pages, true); err != nil {
				t.Fatal(err)
			}
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.open(addrA, 2)
		c, _ := h.claim(2, ranks[0]) // ranks[1] never claims
		used := h.pagesUsed(0)
		advance(h.m.dec.Admission.ClaimTimeout + time.Second)
		h.wantFailure(2, FailureClaimTimeout, "Request 2 timed out")
		if ev, _ := nextEvent(t, c); ev.Failure == nil || !ev.AckRequired {
			t.Fatalf("claim's end = %+v, want the failure with AckRequired", ev)
		}
		if s := h.stats(0); s.Draining != 1 || h.pagesUsed(0) != used {
			t.Fatalf("after the claim timeout: %d draining rooms, %d pages used; want 1 and %d (the pages held)", s.Draining, h.pagesUsed(0), used)
		}
		if res, err := h.m.AckRoomEnd(2, ranks[0], 1); err != nil || !res.Released {
			t.Fatalf("AckRoomEnd = %+v, %v; want the room released", res, err)
		}
		h.assertLedgersFull()
	})
}
