package kvmanager

import (
	"context"
	"errors"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// A rank that never registered with a fully registered instance cannot claim
// a room: its destination would go to a process the daemon does not know.
func TestAwaitDestinationFromUnregisteredRank(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, err := h.m.AwaitDestination(1, RankID{Addr: addrA, TP: 3}); !errors.Is(err, ErrPrefillNotFound) {
			t.Fatalf("AwaitDestination from an unregistered rank = %v, want ErrPrefillNotFound", err)
		}
		h.complete(1)
		h.release(1)
		h.assertClean()
	})
}

// T21/T22: a held room re-bootstraps on its bound DP rank; if the prefill was
// replaced by one with fewer DP ranks, that rank no longer exists and the
// room fails with a message saying so (instead of waiting for a timeout).
func TestT21T22RebootstrapAfterDPShrinkFails(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA, dp: 4, instanceID: "a"}) // follow_bootstrap_room: room 3 → dp 3
		h.open(addrA, 3)
		h.complete(3)
		if _, err := h.m.RetractRoom(3, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		h.register(instance{addr: addrA, dp: 2, instanceID: "b"}) // replaced; the held room survives
		h.wantPhase(3, PhaseHeld)
		if got := h.m.ContinueGeneration(context.Background()); len(got) != 1 || got[0] != 3 {
			t.Fatalf("ContinueGeneration() = %v, want [3]", got)
		}
		h.wantFailure(3, FailureDPRankUnresolved, "rebootstrap of room 3: its prefill DP rank 3 no longer exists at "+addrA+" (dp_size is now 2)")
		h.assertClean()
	})
}

// T22: a held room that no longer fits the pool at ContinueGeneration (its
// output grew while it ran, and a rebootstrap re-prefills prompt + output
// with max_new_tokens still to come) is dropped by the ledger's entry check
// and fails at once rather than staying held forever; the others re-enter.
func TestT22DroppedHeldRoomFails(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// 16,384 tokens: room 1 (prompt 1000, max_new 4096) fits when opened
		// (1000 + 4096), but after growing to 11,300 output tokens its
		// rebootstrap needs 1000 + 11,299 + 4096 = 16,395.
		h := newHarness(t, withDecode(func(d *kvlayout.Config) { d.Pool.TotalTokens = 16384 }))
		h.register(instance{addr: addrA})
		for _, room := range []uint64{1, 2} {
			h.open(addrA, room, func(r *OpenRequest) { r.MaxNewTokens = 4096 })
			h.complete(room)
		}
		if _, noCap, notRunning, _ := h.m.ReportRunning([]Usage{{Room: 1, OutputLen: 11300}}); len(noCap) != 0 || len(notRunning) != 0 {
			t.Fatalf("ReportRunning: no capacity %v, not running %v", noCap, notRunning)
		}
		for _, room := range []uint64{1, 2} {
			if _, err := h.m.RetractRoom(room, RetractRebootstrap); err != nil {
				t.Fatal(err)
			}
		}
		if got := h.m.ContinueGeneration(context.Background()); len(got) != 1 || got[0] != 2 {
			t.Fatalf("ContinueGeneration() = %v, want [2] (room 1 dropped by the ledger)", got)
		}
		h.wantFailure(1, FailureUnspecified, "rebootstrap of room 1 refused at ContinueGeneration: prompt 1000 + output 11299 tokens exceed the decode pool")
		h.complete(2)
		h.release(2)
		h.assertClean()
	})
}

// T11: a chunk from a rank whose claim stream was given the destination
// counts as its claim even if the stream has not reported the delivery yet
// (Send and the prefill's first Transfer race); a rank with no claim stream
// is still refused.
func TestT11ChunkBeforeDeliveryIsRecordedCountsAsClaim(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA, tp: 2})
		h.open(addrA, 1)
		r0, r1 := RankID{Addr: addrA, TP: 0}, RankID{Addr: addrA, TP: 1}
		c0, err := h.m.AwaitDestination(1, r0)
		if err != nil {
			t.Fatal(err)
		}
		d := h.destination(c0) // received, Delivered not called yet
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, r1, 0, 0, len(d.Pages), true)); !errors.Is(err, ErrWrongState) {
			t.Fatalf("Transfer from a rank with no claim stream = %v, want ErrWrongState", err)
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, r0, 0, 0, len(d.Pages), true)); err != nil {
			t.Fatalf("Transfer before the delivery was recorded = %v, want it accepted as the claim", err)
		}
		c0.Delivered(d) // late: a no-op
		_, _ = h.claim(1, r1)
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, r1, 0, 0, len(d.Pages), true)); err != nil {
			t.Fatal(err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

// T22: a chunk carries its destination's attempt; a chunk of an earlier
// attempt of a rebootstrapped room is refused rather than counted.
func TestT22ChunkOfAnEarlierAttemptIsRefused(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1)
		if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		h.m.ContinueGeneration(context.Background())
		rank := RankID{Addr: addrA}
		_, d := h.claim(1, rank)
		if d.Attempt != 2 {
			t.Fatalf("destination attempt = %d, want 2", d.Attempt)
		}
		stale := chunk(1, rank, 0, 0, len(d.Pages), true)
		stale.Attempt = 1
		if _, _, err := h.m.Transfer(context.Background(), stale); !errors.Is(err, ErrWrongState) {
			t.Fatalf("Transfer of attempt 1 after the rebootstrap = %v, want ErrWrongState", err)
		}
		current := chunk(1, rank, 0, 0, len(d.Pages), true)
		current.Attempt = 2
		if _, _, err := h.m.Transfer(context.Background(), current); err != nil {
			t.Fatal(err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}
