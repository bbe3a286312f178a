package kvmanager

// Deadlines of retracted (timeouts.retracted) and held (timeouts.held) rooms,
// and ContinueGeneration's answer for the engine's recompute (T23).

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// A held room with no ContinueGeneration fails when timeouts.held passes
// (not a moment before), with the code and a message naming the setting;
// its ledger record goes.
func TestHeldRoomFailsAtTimeoutsHeld(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Timeouts.Held = 40 * time.Second }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1)
		if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		if w := h.wantPhase(1, PhaseHeld).WaitingFor; !strings.Contains(w, "bounded by timeouts.held until ") || !strings.Contains(w, "/generate") {
			t.Errorf("held room waits for %q; want the recompute and timeouts.held", w)
		}
		advance(40*time.Second - time.Millisecond)
		h.wantPhase(1, PhaseHeld)
		advance(time.Millisecond)
		h.wantFailure(1, FailureRetractTimeout, "Request 1 was held for rebootstrap (REBOOTSTRAP) and no ContinueGeneration came within timeouts.held (40s)")
		if st := h.stats(0); st.Held != 0 {
			t.Errorf("ledger still holds %d held rooms", st.Held)
		}
		if got := h.m.ContinueGeneration(context.Background()); len(got) != 0 {
			t.Errorf("ContinueGeneration after the timeout = %v, want none", got)
		}
		h.assertClean()
	})
}

// A retracted room that never gets its pages back fails at
// timeouts.retracted; the room that took its pages keeps running.
func TestRetractedRoomFailsAtTimeoutsRetracted(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Timeouts.Retracted = 20 * time.Second }))
		room := retractedRoom(h)
		if w := h.wantPhase(room, PhaseRetracted).WaitingFor; !strings.Contains(w, "bounded by timeouts.retracted until ") {
			t.Errorf("retracted room waits for %q; want timeouts.retracted", w)
		}
		advance(20*time.Second - time.Millisecond)
		h.wantPhase(room, PhaseRetracted)
		advance(time.Millisecond)
		h.wantFailure(room, FailureRetractTimeout, "Request 1 was retracted (RETRACT) and not resumed: its shard never had room for it again within timeouts.retracted (20s)")
		if st := h.stats(0); st.Retracted != 0 {
			t.Errorf("ledger still holds %d retracted rooms", st.Retracted)
		}
		h.wantPhase(2, PhaseSucceeded)
		h.release(2)
		h.assertClean()
	})
}

// ContinueGeneration's answer names the prefill's /generate (the bootstrap
// host, the registered prefill_http_port) and the pinned DP rank; the room
// then says it waits for that recompute, the held bound no longer applies
// (timeouts.bootstrap does), and the re-sent KV on that DP rank succeeds.
func TestContinueGenerationResumedNamesRecomputeEndpoint(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Timeouts.Held = 10 * time.Second }))
		h.register(instance{addr: addrA, dp: 4}) // follow_bootstrap_room: room 7 → dp 3
		h.open(addrA, 7)
		h.complete(7)
		if _, err := h.m.RetractRoom(7, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		advance(5 * time.Second)
		got := h.m.ContinueGenerationResumed(context.Background())
		want := Resumed{Room: 7, RID: "rid-7", Attempt: 2, Phase: PhaseAdmitted, PrefillAddr: addrA,
			PrefillHTTPHost: "10.0.0.1", PrefillHTTPPort: 30000, GenerateURL: "http://10.0.0.1:30000/generate", PrefillDP: 3}
		if len(got) != 1 || got[0] != want {
			t.Fatalf("ContinueGenerationResumed = %+v, want [%+v]", got, want)
		}
		s := h.wantPhase(7, PhaseAdmitted)
		if !strings.Contains(s.WaitingFor, "rebootstrap attempt 2: the prefill sends only after the decode engine's recompute request (POST http://10.0.0.1:30000/generate, pinned to prefill DP rank 3") {
			t.Errorf("rebootstrapped room waits for %q", s.WaitingFor)
		}
		advance(10 * time.Second) // past the held bound armed at the retraction
		h.wantPhase(7, PhaseAdmitted)
		for _, rk := range h.requiredRanks(7) {
			if rk.DP != 3 {
				t.Errorf("rebootstrap needs %s, want DP rank 3", rk)
			}
		}
		h.complete(7)
		h.release(7)
		h.assertClean()
	})
}

// A prefill registered without prefill_http_port: the answer has no URL and
// the room's wait says so.
func TestContinueGenerationResumedWithoutHTTPPort(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		for _, rk := range ranksOf(instance{addr: addrA}) {
			reg := h.registration(instance{addr: addrA}, rk.DP, rk.CP, rk.TP, rk.PP)
			reg.HTTPPort = 0
			if _, err := h.m.RegisterPrefill(reg); err != nil {
				t.Fatal(err)
			}
		}
		h.open(addrA, 1)
		h.complete(1)
		if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		got := h.m.ContinueGenerationResumed(context.Background())
		if len(got) != 1 || got[0].GenerateURL != "" || got[0].PrefillHTTPPort != 0 || got[0].PrefillHTTPHost != "10.0.0.1" || got[0].PrefillDP != 0 {
			t.Fatalf("ContinueGenerationResumed = %+v, want no URL, host 10.0.0.1, dp 0", got)
		}
		if w := h.snapshot(1).WaitingFor; !strings.Contains(w, addrA+" registered no prefill_http_port") {
			t.Errorf("waits for %q", w)
		}
		h.complete(1)
		h.release(1)
		h.assertClean()
	})
}

// timeouts.retracted and timeouts.held: negative is refused naming the
// setting; 0 is the default (a room is never parked unbounded).
func TestParkedTimeoutsValidate(t *testing.T) {
	c := DefaultConfig()
	c.Timeouts.Retracted, c.Timeouts.Held = -time.Second, -time.Second
	err := c.Validate()
	for _, key := range []string{"timeouts.retracted = -1s: must not be negative", "timeouts.held = -1s: must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate() = %v, want %q", err, key)
		}
	}
	c.Timeouts.Retracted, c.Timeouts.Held = 0, 0
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() with both 0 = %v, want nil", err)
	}
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Timeouts.Held = 0 }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1)
		if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		advance(DefaultParkedTimeout - time.Millisecond)
		h.wantPhase(1, PhaseHeld)
		advance(time.Millisecond)
		h.wantFailure(1, FailureRetractTimeout, "Request 1 was held for rebootstrap (REBOOTSTRAP) and no ContinueGeneration came within timeouts.held (5m0s)")
		h.assertClean()
	})
}

// A rebootstrapped room whose recompute never comes (the engine did not
// POST it, or the prefill did not act on it) fails at admission.claim_timeout
// with a message saying what it waited for.
func TestRebootstrapWithoutRecomputeSaysWhy(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(func(d *kvlayout.Config) { d.Admission.ClaimTimeout = 30 * time.Second }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1)
		if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
			t.Fatal(err)
		}
		h.m.ContinueGeneration(context.Background())
		h.wantPhase(1, PhaseAdmitted)
		advance(30 * time.Second)
		msg := h.wantFailure(1, FailureClaimTimeout, "Request 1 timed out after 30.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed")
		if !strings.HasSuffix(msg, "within admission.claim_timeout; rebootstrap attempt 2: the prefill sends only after the decode engine's recompute request (POST http://10.0.0.1:30000/generate, pinned to prefill DP rank 0, from ContinueGeneration's answer)") {
			t.Errorf("message %q does not say it waited for the recompute", msg)
		}
		h.assertClean()
	})
}
