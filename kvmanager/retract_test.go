package kvmanager

// Retraction and rebootstrap: T20 (retract, resume), T21/T22 (hold, ContinueGeneration). The transitions each covers are listed in lifecycle_test.go.

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// retractedRoom leaves room 1 retracted on a 64-page pool: rooms 1 and 2
// (16 pages each) run, room 2 grows to 46 pages, then room 1 is retracted
// and cannot resume: 18 free pages (1152 tokens) − R × 1 active (512) = 640
// < 1000 + 512 (fill_len + R). It returns 1.
func retractedRoom(h *harness) uint64 {
	h.t.Helper()
	h.register(instance{addr: addrA})
	for _, room := range []uint64{1, 2} {
		h.open(addrA, room, func(r *OpenRequest) { r.MaxNewTokens = 16 })
		h.complete(room)
	}
	// 1000 + 1900 tokens = 46 pages: 30 more.
	grown, noCap, notRunning, _ := h.m.ReportRunning([]Usage{{Room: 2, OutputLen: 1900}})
	if len(grown) != 1 || len(grown[0].NewPages) != 30 || noCap != nil || notRunning != nil {
		h.t.Fatalf("ReportRunning = %v, %v, %v; want 30 new pages", grown, noCap, notRunning)
	}
	if _, err := h.m.RetractRoom(1, RetractCPU); err != nil {
		h.t.Fatalf("RetractRoom(1) = %v", err)
	}
	return 1
}

// TestT20RetractWaitsForReportRunning: on a roomy pool a retracted room
// still does not resume inside RetractRoom nor at a pass another event
// triggers while room 2 runs (room 3's admission waits behind it); the
// next ReportRunning is the decode step after which it resumes, before
// room 3 is admitted.
func TestT20RetractWaitsForReportRunning(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		for _, room := range []uint64{1, 2} {
			h.open(addrA, room)
			h.complete(room)
		}
		s, err := h.m.RetractRoom(1, RetractCPU)
		if err != nil || s.Phase != PhaseRetracted || s.NumPages != 0 {
			t.Fatalf("RetractRoom = %s with %d pages, %v; want retracted with 0", s.Phase, s.NumPages, err)
		}
		if st := h.stats(0); st.Retracted != 1 || st.Pages.Used != 16 {
			t.Errorf("ledger: %d retracted, %d pages used; want 1, 16 (room 2 only)", st.Retracted, st.Pages.Used)
		}
		synctest.Wait()
		h.wantPhase(1, PhaseRetracted)
		h.open(addrA, 3)
		h.wantPhase(3, PhaseQueued)
		h.wantPhase(1, PhaseRetracted)
		if grown, noCap, notRunning, _ := h.m.ReportRunning([]Usage{{Room: 2, OutputLen: 1}}); grown != nil || noCap != nil || notRunning != nil {
			t.Fatalf("ReportRunning = %v, %v, %v", grown, noCap, notRunning)
		}
		if s := h.wantPhase(1, PhaseSucceeded); s.NumPages != 16 {
			t.Errorf("resumed room holds %d pages, want 16", s.NumPages)
		}
		h.wantPhase(3, PhaseAdmitted)
		h.release(1)
		h.release(2)
		h.complete(3)
		h.release(3)
		h.assertClean()
	})
}

func TestT20RetractAndResume(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(smallPool(64)))
		room := retractedRoom(h)
		s := h.wantPhase(room, PhaseRetracted)
		if s.Poll != PollSuccess || s.NumPages != 0 {
			t.Errorf("retracted room: poll %s, %d pages; want Success, 0", s.Poll, s.NumPages)
		}
		if st := h.stats(0); st.Retracted != 1 || st.Pages.Used != 46 {
			t.Errorf("ledger: %d retracted, %d pages used; want 1, 46", st.Retracted, st.Pages.Used)
		}
		// While a retracted room waits, nothing new is admitted.
		h.open(addrA, 3, func(r *OpenRequest) { r.PromptLen = 64 })
		h.wantPhase(3, PhaseQueued)
		if grown, _, notRunning, _ := h.m.ReportRunning([]Usage{{Room: room, OutputLen: 10}}); grown != nil || !slices.Equal(notRunning, []uint64{room}) {
			t.Errorf("ReportRunning(retracted) = %v, notRunning %v; want not running", grown, notRunning)
		}
		// Room 2 finishing frees enough for room 1 to resume, then room 3.
		h.release(2)
		s = h.wantPhase(room, PhaseSucceeded)
		if s.NumPages != 16 {
			t.Errorf("resumed room holds %d pages, want 16", s.NumPages)
		}
		if got := h.sglangSteps(room); !slices.Equal(got[len(got)-2:], []string{"T20", "T20"}) {
			t.Errorf("last SGLang steps = %q, want T20 T20", got[len(got)-2:])
		}
		h.wantPhase(3, PhaseAdmitted)
		// The resumed room runs again: it grows, and can be retracted again.
		if grown, noCap, notRunning, _ := h.m.ReportRunning([]Usage{{Room: room, OutputLen: 100}}); len(grown) != 1 || noCap != nil || notRunning != nil {
			t.Errorf("ReportRunning(resumed) = %v, %v, %v; want it to grow by a page", grown, noCap, notRunning)
		}
		if s, err := h.m.RetractRoom(room, RetractCPU); err != nil || s.Phase != PhaseRetracted || s.NumPages != 0 {
			t.Errorf("RetractRoom(resumed) = %s with %d pages, %v; want retracted, 0 pages", s.Phase, s.NumPages, err)
		}
		// No other room runs: it stays retracted with its pages free until
		// the pass RetractResumeAfter later resumes it.
		synctest.Wait()
		if s := h.wantPhase(room, PhaseRetracted); s.NumPages != 0 {
			t.Errorf("retracted room holds %d pages before the pass", s.NumPages)
		}
		advance(RetractResumeAfter)
		h.wantPhase(room, PhaseSucceeded)
		if st := h.stats(0); st.Resumed != 0 || st.Running != 1 {
			t.Errorf("ledger: %d resumed, %d running; want 0, 1", st.Resumed, st.Running)
		}
		h.release(room)
		h.complete(3)
		h.release(3)
		h.assertClean()
	})
}

func TestT21T22HoldAndContinueGenerationSameDPRank(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun())
		in := instance{addr: addrA, dp: 4, tp: 2, lb: "round_robin"}
		h.register(in)
		h.open(addrA, 21)
		if _, err := h.m.BindRoom(addrA, 21, 3); err != nil {
			t.Fatalf("BindRoom = %v", err)
		}
		h.complete(21)
		s, err := h.m.RetractRoom(21, RetractRebootstrap)
		if err != nil {
			t.Fatalf("RetractRoom(rebootstrap) = %v", err)
		}
		if s.Phase != PhaseHeld || s.Poll != PollSuccess {
			t.Errorf("held room: %s %s, want held Success", s.Phase, s.Poll)
		}
		if st := h.stats(0); st.Held != 1 || st.Pages.Used != 0 || st.ReqSlots.Used != 0 {
			t.Errorf("ledger: %d held, %d pages, %d req slots used; want 1, 0, 0", st.Held, st.Pages.Used, st.ReqSlots.Used)
		}
		// The weight update takes a while: the BindRoom entry expires
		// (binding_ttl 120 s), but the room stays on its DP rank.
		for range 50 {
			advance(4 * time.Second)
			h.heartbeatAll(in)
		}
		if res, _, err := h.m.LookupDPRanks(addrA, []uint64{21}, nil); err != nil || len(res) != 0 {
			t.Fatalf("LookupDPRanks after the TTL = %v, %v; want unresolved", res, err)
		}
		if ids := h.m.ContinueGeneration(context.Background()); !slices.Equal(ids, []uint64{21}) {
			t.Fatalf("ContinueGeneration() = %v, want [21]", ids)
		}
		s = h.wantPhase(21, PhaseAdmitted)
		if s.Attempt != 2 || s.PrefillDP != 3 || s.DPRule != DPRuleBinding {
			t.Errorf("rebootstrapped room: attempt %d, prefill dp %d (%s); want 2, 3 (binding)", s.Attempt, s.PrefillDP, s.DPRule)
		}
		// 1000 prompt tokens + 0 output (the boundary token was popped): 16 pages.
		if s.NumPages != 16 {
			t.Errorf("rebootstrapped room holds %d pages, want 16", s.NumPages)
		}
		steps := h.sglangSteps(21)
		if i := slices.Index(steps, "T21"); i < 0 || !slices.Contains(steps[i:], "T22") {
			t.Errorf("SGLang steps %q lack T21 then T22", steps)
		}
		var inv *InvalidError
		if _, err := h.m.AwaitDestination(21, RankID{Addr: addrA, DP: 0}); !errors.As(err, &inv) {
			t.Errorf("AwaitDestination from dp 0 = %v, want InvalidError", err)
		}
		for _, rk := range h.requiredRanks(21) {
			if rk.DP != 3 {
				t.Errorf("rebootstrap needs %s, want DP rank 3", rk)
			}
			if _, d := h.claim(21, rk); d.Attempt != 2 {
				t.Errorf("destination attempt = %d, want 2", d.Attempt)
			}
		}
		h.sendAll(21)
		h.wantPhase(21, PhaseSucceeded)
		h.release(21)
		h.assertClean()
	})
}

func TestT22ContinueGenerationWaitsForPrefill(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun())
		in := instance{addr: addrA, dp: 2}
		h.register(in)
		h.open(addrA, 5) // follow_room: 5 % 2 = 1
		h.complete(5)
		if _, err := h.m.RetractRoom(5, RetractRebootstrap); err != nil {
			t.Fatalf("RetractRoom = %v", err)
		}
		// The prefill restarts during the pause: heartbeats stop, it is lost.
		advance(10 * time.Second)
		h.wantPhase(5, PhaseHeld) // held rooms are not handing off KV
		h.m.ContinueGeneration(context.Background())
		h.wantPhase(5, PhaseWaitingPrefill)
		h.register(in)
		s := h.wantPhase(5, PhaseAdmitted)
		if s.PrefillDP != 1 || s.Attempt != 2 {
			t.Errorf("prefill dp %d attempt %d, want 1, 2", s.PrefillDP, s.Attempt)
		}
		h.complete(5)
		h.release(5)
		h.assertClean()
	})
}
