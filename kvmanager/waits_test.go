package kvmanager

// Waits: every bounded wait of a room before and around its hand-off (DP-rank rules, the prefill registration budget, timeouts.bootstrap, the claim timeout, the waiting timeout, claims before OpenRoom). The transitions each covers are listed in lifecycle_test.go.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
)

func TestT2DPRankRules(t *testing.T) {
	tests := []struct {
		name      string
		inst      instance
		force     bool
		room      uint64
		hint      int
		bindFirst int // BindRoom before OpenRoom; -1 none
		bindAfter int // BindRoom after OpenRoom (room waits in resolving_dp_rank); -1 none
		wantDP    int
		wantRule  DPRule
	}{
		// Rule 1: the router's hint wins even where room % dp would differ.
		{name: "hint", inst: instance{addr: addrA, dp: 4, lb: "round_robin"}, room: 9, hint: 2, bindFirst: -1, bindAfter: -1, wantDP: 2, wantRule: DPRuleHint},
		{name: "hint over follow_room", inst: instance{addr: addrA, dp: 4}, room: 9, hint: 3, bindFirst: -1, bindAfter: -1, wantDP: 3, wantRule: DPRuleHint},
		// Rule 2: dp_size == 1 answers 0 without any query.
		{name: "single dp", inst: instance{addr: addrA, lb: "round_robin"}, room: 9, hint: -1, bindFirst: -1, bindAfter: -1, wantDP: 0, wantRule: DPRuleSingleDP},
		// Rule 3: room % dp_size: 9 % 4 = 1, 10 % 4 = 2.
		{name: "follow room default lb", inst: instance{addr: addrA, dp: 4}, room: 9, hint: -1, bindFirst: -1, bindAfter: -1, wantDP: 1, wantRule: DPRuleFollowRoom},
		{name: "follow room explicit", inst: instance{addr: addrA, dp: 4, lb: "follow_bootstrap_room"}, room: 10, hint: -1, bindFirst: -1, bindAfter: -1, wantDP: 2, wantRule: DPRuleFollowRoom},
		// Plain DP (system_dp_size) keys the groups the same way: 11 % 2 = 1.
		{name: "follow room plain dp", inst: instance{addr: addrA, dp: 2, systemDP: true}, room: 11, hint: -1, bindFirst: -1, bindAfter: -1, wantDP: 1, wantRule: DPRuleFollowRoom},
		// Rule 4: the binding table (SGLang's /register_dp_rank + /query_dp_ranks).
		{name: "binding after open", inst: instance{addr: addrA, dp: 4, lb: "round_robin"}, room: 9, hint: -1, bindFirst: -1, bindAfter: 3, wantDP: 3, wantRule: DPRuleBinding},
		{name: "binding before open", inst: instance{addr: addrA, dp: 4, lb: "shortest_queue"}, room: 9, hint: -1, bindFirst: 2, bindAfter: -1, wantDP: 2, wantRule: DPRuleBinding},
		// force_query disables rule 3: the room waits for its binding, which may contradict room % dp.
		{name: "force query", inst: instance{addr: addrA, dp: 4}, force: true, room: 9, hint: -1, bindFirst: -1, bindAfter: 0, wantDP: 0, wantRule: DPRuleBinding},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withConfig(func(c *Config) { c.DPRank.ForceQuery = tc.force }))
				h.register(tc.inst)
				if tc.bindFirst >= 0 {
					if _, err := h.m.BindRoom(tc.inst.addr, tc.room, tc.bindFirst); err != nil {
						t.Fatalf("BindRoom before open = %v", err)
					}
				}
				h.open(tc.inst.addr, tc.room, func(r *OpenRequest) { r.PrefillDP = tc.hint })
				wantPhases := []Phase{PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted}
				if tc.bindAfter >= 0 {
					h.wantPhase(tc.room, PhaseResolvingDP)
					if s := h.snapshot(tc.room); s.PrefillDP != -1 || s.Poll != PollBootstrapping {
						t.Errorf("unresolved room: prefill dp %d, poll %s; want -1, Bootstrapping", s.PrefillDP, s.Poll)
					}
					if _, err := h.m.BindRoom(tc.inst.addr, tc.room, tc.bindAfter); err != nil {
						t.Fatalf("BindRoom = %v", err)
					}
					wantPhases = []Phase{PhaseWaitingPrefill, PhaseResolvingDP, PhaseQueued, PhaseAdmitted}
				}
				s := h.wantPhase(tc.room, PhaseAdmitted)
				if s.PrefillDP != tc.wantDP || s.DPRule != tc.wantRule {
					t.Errorf("prefill DP = %d (%s), want %d (%s)", s.PrefillDP, s.DPRule, tc.wantDP, tc.wantRule)
				}
				if diff := cmp.Diff(wantPhases, h.phases(tc.room)); diff != "" {
					t.Errorf("phases (-want +got):\n%s", diff)
				}
				// A rank of another DP group is not a source of the room.
				other := RankID{Addr: tc.inst.addr, DP: (tc.wantDP + 1) % max(1, tc.inst.dp)}
				if other.DP != tc.wantDP {
					var inv *InvalidError
					if _, err := h.m.AwaitDestination(tc.room, other); !errors.As(err, &inv) || inv.Field != "rank.dp_rank" {
						t.Errorf("AwaitDestination from dp %d = %v, want InvalidError on rank.dp_rank", other.DP, err)
					}
				}
				h.complete(tc.room)
				h.release(tc.room)
				h.assertClean()
			})
		})
	}
}

// waitAttempts is the registration check count of an address (-1 when no
// room waits on it).
func (h *harness) waitAttempts(addr string) int {
	h.m.wait.mu.Lock()
	defer h.m.wait.mu.Unlock()
	if w := h.m.wait.addrs[addr]; w != nil {
		return w.attempts
	}
	return -1
}

func TestT3PrefillNeverRegisters(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		start := time.Now()
		h.open(addrA, 5)
		h.open(addrA, 6)
		// SGLang's back-off before attempt n: 1, 1, 2, 4, 4, ... s (capped at
		// 4 s): attempt 15 happens 1+1+2+12×4 = 52 s after the first room.
		delays := []time.Duration{1, 1, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}
		for i, d := range delays {
			advance(d * time.Second)
			if got := h.waitAttempts(addrA); got != i+1 {
				t.Fatalf("after %s: %d attempts, want %d", time.Since(start), got, i+1)
			}
			h.wantPhase(5, PhaseWaitingPrefill)
		}
		if el := time.Since(start); el != 48*time.Second {
			t.Fatalf("14th attempt at %s, want 48s", el)
		}
		advance(4*time.Second - time.Nanosecond)
		h.wantPhase(5, PhaseWaitingPrefill)
		advance(time.Nanosecond)
		if el := time.Since(start); el != 52*time.Second {
			t.Fatalf("elapsed %s, want 52s", el)
		}
		want := "Could not fetch prefill parallel info from 10.0.0.1:8998 after 15 attempts"
		for _, room := range []uint64{5, 6} {
			if msg := h.wantFailure(room, FailurePrefillUnavailable, want); msg != want {
				t.Errorf("room %d failure = %q, want %q", room, msg, want)
			}
		}
		if got := h.sglangSteps(5); got[len(got)-1] != "T3" {
			t.Errorf("last SGLang step = %q, want T3", got[len(got)-1])
		}
		if got := h.waitAttempts(addrA); got != -1 {
			t.Errorf("the address still has a retry budget (%d attempts) after failing its rooms", got)
		}
		// No 16th attempt fires.
		advance(time.Minute)
		h.assertClean()
	})
}

func TestT3PartialRegistration(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 2}
		if res, err := h.m.RegisterPrefill(h.registration(in, 0, 0, 0, 0)); err != nil || res.Registered != 1 || res.Expected != 2 {
			t.Fatalf("RegisterPrefill(rank 0) = %+v, %v; want 1 of 2 registered", res, err)
		}
		h.open(addrA, 1)
		advance(52 * time.Second)
		want := "Could not fetch prefill parallel info from 10.0.0.1:8998 after 15 attempts (Prefill server not fully registered yet (1 workers registered).)"
		if msg := h.wantFailure(1, FailurePrefillUnavailable, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		h.assertClean()
	})
}

func TestT3T4RegistrationCompletesWhileWaiting(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 2}
		h.open(addrA, 1)
		advance(10 * time.Second)
		h.wantPhase(1, PhaseWaitingPrefill)
		h.register(in)
		h.wantPhase(1, PhaseAdmitted)
		if got := h.waitAttempts(addrA); got != -1 {
			t.Errorf("retry budget still armed (%d attempts) after the registration completed", got)
		}
		// The retry timer (it would have fired until 52 s) fails nothing.
		advance(45 * time.Second)
		h.wantPhase(1, PhaseAdmitted)
		h.complete(1)
		h.release(1)
		h.assertClean()
	})
}

func TestT11T14WaitingClockStartsAtClaim(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 7)
		h.wantPhase(7, PhaseAdmitted)
		// Admitted at 0 s, claimed at 59 s (inside admission.claim_timeout).
		advance(59 * time.Second)
		h.claimAll(7)
		h.wantPhase(7, PhaseClaimed)
		// 300 s after OpenRoom would be the bootstrap deadline; it no longer
		// applies. The waiting timeout runs from the claim: 59 s + 300 s.
		advance(300*time.Second - time.Nanosecond)
		h.wantPhase(7, PhaseClaimed)
		advance(time.Nanosecond)
		msg := h.wantFailure(7, FailureWaitingTimeout, "Request 7 timed out after 300.0s in KVPoll.WaitingForInput")
		if !strings.Contains(msg, "prefill ranks still sending: cp 0 tp 0 pp 0") {
			t.Errorf("failure %q does not name the rank still sending", msg)
		}
		if got := h.sglangSteps(7); got[len(got)-1] != "T14" {
			t.Errorf("last SGLang step = %q, want T14", got[len(got)-1])
		}
		h.assertClean()
	})
}

func TestT14WaitingTimeoutWhileTransferring(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Timeouts.Waiting = 30 * time.Second }))
		h.register(instance{addr: addrA})
		h.open(addrA, 8)
		h.claimAll(8)
		rk := h.requiredRanks(8)[0]
		advance(20 * time.Second)
		if _, _, err := h.m.Transfer(context.Background(), chunk(8, rk, 0, 0, 4, false)); err != nil {
			t.Fatalf("Transfer = %v", err)
		}
		h.wantPhase(8, PhaseTransferring)
		// A landed chunk does not restart the clock.
		advance(10 * time.Second)
		h.wantFailure(8, FailureWaitingTimeout, "Request 8 timed out after 30.0s in KVPoll.WaitingForInput")
		// A late chunk is refused.
		if _, _, err := h.m.Transfer(context.Background(), chunk(8, rk, 1, 4, 12, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("Transfer after the timeout = %v, want ErrWrongState", err)
		}
		h.assertClean()
	})
}

// TestBootstrapTimeoutBeforeClaim: decodeplane's timeouts.bootstrap (no SGLang
// transition: SGLang has no decode-side deadline before send_metadata);
// the room is in T8's state (handshake done, waiting for admission).
func TestBootstrapTimeoutBeforeClaim(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(oneSlot))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.complete(1) // runs, holding the only req slot
		h.open(addrA, 2)
		h.wantPhase(2, PhaseQueued)
		advance(300*time.Second - time.Nanosecond)
		h.wantPhase(2, PhaseQueued)
		advance(time.Nanosecond)
		want := "Request 2 timed out after 300.0s in KVPoll.WaitingForInput: the destination was not claimed within timeouts.bootstrap (phase queued)"
		if msg := h.wantFailure(2, FailureBootstrapTimeout, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		h.wantPhase(1, PhaseSucceeded) // a running room has no deadline
		h.release(1)
		h.assertClean()
	})
}

// TestDestinationNeverClaimed: after T11's admission, a required rank never
// claims; timeouts.bootstrap ends the room (decodeplane; no SGLang transition).
func TestDestinationNeverClaimed(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(func(c *kvlayout.Config) { c.Admission.ClaimTimeout = 0 }))
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		h.open(addrA, 1)
		h.claim(1, ranksOf(in)[0]) // rank 1 never claims
		advance(300 * time.Second)
		msg := h.wantFailure(1, FailureBootstrapTimeout, "Request 1 timed out after 300.0s in KVPoll.WaitingForInput: the destination was not claimed within timeouts.bootstrap (phase admitted")
		if !strings.HasSuffix(msg, "unclaimed prefill ranks: cp 0 tp 1 pp 0)") {
			t.Errorf("failure %q does not name the unclaimed rank", msg)
		}
		h.assertClean()
	})
}

// TestClaimTimeout: admission.claim_timeout, the ledger's deadline after T11's
// admission (decodeplane; no SGLang transition).
func TestClaimTimeout(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t) // admission.claim_timeout: 60 s
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		start := time.Now()
		h.open(addrA, 1)
		c, _ := h.claim(1, ranksOf(in)[1])
		advance(60*time.Second - time.Nanosecond)
		h.wantPhase(1, PhaseAdmitted)
		advance(time.Nanosecond)
		want := "Request 1 timed out after 60.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (cp 0 tp 0 pp 0) within admission.claim_timeout"
		if msg := h.wantFailure(1, FailureClaimTimeout, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		tr := h.snapshot(1).Transitions
		if at := tr[len(tr)-1].At.Sub(start); at != 60*time.Second {
			t.Errorf("failed at %s, want 60s", at)
		}
		if ev, ok := nextEvent(t, c); !ok || ev.Failure == nil || ev.Failure.Code != FailureClaimTimeout {
			t.Errorf("claim got %+v (open %v), want the claim timeout", ev, ok)
		}
		// The expired pre-allocation is back: a new room is admitted.
		h.open(addrA, 2)
		h.complete(2)
		h.release(2)
		h.assertClean()
	})
}

// TestDPRankResolutionBound: T2 never happens; decodeplane bounds the wait
// (SGLang retries forever).
func TestDPRankResolutionBound(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA, dp: 4, lb: "round_robin"})
		h.open(addrA, 17)
		h.wantPhase(17, PhaseResolvingDP)
		advance(60*time.Second - time.Nanosecond)
		h.wantPhase(17, PhaseResolvingDP)
		advance(time.Nanosecond)
		want := "Request 17 timed out after 60.0s in KVPoll.Bootstrapping: no rule resolved its prefill DP rank at 10.0.0.1:8998 within timeouts.dp_rank_resolution (no router hint, prefill dp_size 4, follow_bootstrap_room false, no BindRoom received)"
		if msg := h.wantFailure(17, FailureDPRankUnresolved, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		// A late binding is stored but changes nothing.
		if _, err := h.m.BindRoom(addrA, 17, 1); err != nil {
			t.Errorf("late BindRoom = %v", err)
		}
		h.wantPhase(17, PhaseFailed)
		h.assertClean()
	})
}

// TestClaimBeforeOpenRoom: a prefill rank claims before T1 (OpenRoom); the
// claim attaches and gets the destination at T11 (decodeplane).
func TestClaimBeforeOpenRoom(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		rk := RankID{Addr: addrA}
		c, err := h.m.AwaitDestination(30, rk)
		if err != nil {
			t.Fatalf("AwaitDestination(unopened) = %v", err)
		}
		select {
		case ev := <-c.Events():
			t.Fatalf("claim on an unopened room got %+v", ev)
		default:
		}
		advance(30 * time.Second)
		h.open(addrA, 30)
		d := h.destination(c)
		c.Delivered(d)
		h.wantPhase(30, PhaseClaimed)
		h.sendAll(30)
		if ev, ok := nextEvent(t, c); !ok || ev.Done == nil || *ev.Done != PhaseSucceeded {
			t.Errorf("claim got %+v (open %v), want done", ev, ok)
		}
		if _, ok := <-c.Events(); ok {
			t.Errorf("claim stream still open after done")
		}
		h.release(30)
		h.assertClean()
	})
}

// TestClaimOnRoomNeverOpenedExpires: a claim for a room that never sees T1
// ends after timeouts.bootstrap (decodeplane).
func TestClaimOnRoomNeverOpenedExpires(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		c, err := h.m.AwaitDestination(31, RankID{Addr: addrA})
		if err != nil {
			t.Fatalf("AwaitDestination = %v", err)
		}
		advance(300 * time.Second)
		ev, ok := nextEvent(t, c)
		if !ok || ev.Failure == nil || ev.Failure.Code != FailureBootstrapTimeout ||
			ev.Failure.Message != "Request 31 timed out after 300.0s in KVPoll.Bootstrapping: the decode side never opened the room" {
			t.Errorf("pending claim got %+v (open %v), want the bootstrap timeout", ev.Failure, ok)
		}
		h.m.lockAll()
		n := h.m.pendingCount()
		h.m.unlockAll()
		if n != 0 {
			t.Errorf("pendingCount = %d, want 0", n)
		}
		h.assertClean()
	})
}

// TestClaimTimeoutSparesRoomWithChunkInFlight: a chunk written before every
// rank claimed keeps the ledger from expiring the destination under it; the
// room ends by timeouts.bootstrap (T16-like release rules, decodeplane).
func TestClaimTimeoutSparesRoomWithChunkInFlight(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(oneSlot))
		g := newGate(t)
		h.sim.SetFault(g.hook)
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		h.open(addrA, 1)
		// Rank 0 claims and starts writing; rank 1 never claims.
		h.claim(1, ranksOf(in)[0])
		done := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(1, ranksOf(in)[0], 0, 0, 16, true))
			done <- err
		}()
		<-g.entered
		advance(30 * time.Second)
		h.open(addrA, 2) // queued behind room 1 (one req slot)
		// admission.claim_timeout (60 s) must not release pages a chunk is
		// writing into: room 2 would get them.
		advance(30 * time.Second)
		h.wantPhase(1, PhaseAdmitted)
		h.wantPhase(2, PhaseQueued)
		if used := h.pagesUsed(0); used != 16 {
			t.Fatalf("pages used while room 1's chunk is in flight = %d, want 16", used)
		}
		// timeouts.bootstrap still bounds the room; its pages stay held
		// until the chunk returned.
		advance(240 * time.Second)
		h.wantFailure(1, FailureBootstrapTimeout, "Request 1 timed out after 300.0s in KVPoll.WaitingForInput: the destination was not claimed within timeouts.bootstrap (phase admitted; unclaimed prefill ranks: cp 0 tp 1 pp 0)")
		h.wantPhase(2, PhaseQueued)
		if used := h.pagesUsed(0); used != 16 {
			t.Fatalf("pages used while room 1's chunk is in flight = %d, want 16", used)
		}
		g.release <- nil
		if err := <-done; !errors.Is(err, ErrWrongState) {
			t.Errorf("in-flight Transfer = %v, want ErrWrongState", err)
		}
		synctest.Wait()
		h.wantPhase(2, PhaseAdmitted)
		h.m.AbortRoom(2, "")
		h.assertClean()
	})
}
