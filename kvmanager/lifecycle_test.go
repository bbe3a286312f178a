package kvmanager

// Transitions covered (SGLang decode state machine, spec §2.5), by test:
//
//	T1  TestT1T2T4T8T11T12T17HappyPath, TestT2DPRankRules, TestT3PrefillNeverRegisters
//	T2  TestT2DPRankRules (hint, dp_size == 1, room % dp under follow_bootstrap_room,
//	    BindRoom binding before and after OpenRoom, force_query, plain DP),
//	    TestT2HintOutOfRangeOnceRegistered, TestLookupDPRanks, TestBindRoom*
//	T3  TestT3PrefillNeverRegisters (15 attempts, back-off 1,1,2,4,4,... s, fails at 52 s),
//	    TestT3PartialRegistration, TestT3T4RegistrationCompletesWhileWaiting
//	T4  TestT1T2T4T8T11T12T17HappyPath, TestT3T4RegistrationCompletesWhileWaiting
//	T5  TestT5ReregistrationWithNewEndpointFailsDPGroup ("... is healthy before, but now it is down")
//	T8  TestT1T2T4T8T11T12T17HappyPath (handshake done: WaitingForInput before admission)
//	T10 TestT16AbortInEveryPhase/queued (abort before admission frees nothing, holds nothing)
//	T11 TestT1T2T4T8T11T12T17HappyPath, TestT11T14WaitingClockStartsAtClaim
//	T12 TestT12HeterogeneousTP (prefill TP 2 -> decode TP 1, TP 1 -> decode TP 4,
//	    MLA prefill TP 4 -> decode TP 1 with 3 dummies), TestT12ChunksBeforeEveryRankClaimed
//	T13 TestT13T18ChunkFailureFromEngine, TestT13T18ReportedFailure
//	T14 TestT11T14WaitingClockStartsAtClaim, TestT14WaitingTimeoutWhileTransferring
//	T15 TestT15HeartbeatLoss, TestT15HeartbeatsKeepInstanceAlive
//	T16 TestT16AbortInEveryPhase (waiting_prefill, resolving_dp_rank, queued, admitted,
//	    claimed, transferring, succeeded, retracted, held; terminal is a no-op),
//	    TestT16AbortWithChunkInFlight
//	T17 TestT1T2T4T8T11T12T17HappyPath, TestT17MetadataSlotFreedAtSuccess
//	T18 TestT13T18ChunkFailureFromEngine, TestT13T18ReportedFailure (KV released, slot freed)
//	T19 TestT19MetadataMarkerMismatch, TestT19MarkerMissingKeepsTransferring
//	T20 TestT20RetractAndResume, TestT20RetractWaitsForReportRunning, TestSlowWatcherDropped, TestObserverGaugesMatchRooms
//	T21 TestT21T22HoldAndContinueGenerationSameDPRank
//	T22 TestT21T22HoldAndContinueGenerationSameDPRank, TestT22ContinueGenerationWaitsForPrefill
//
// Not covered: T6, T7 (decodeplane makes no /route lookups or ZMQ KV-args
// registration: prefill ranks register and claim themselves), T9 (the
// handshake failures that exist here are T3/T5/T15 and are covered there),
// T23 (the recompute POST to the prefill is not kvmanager's).
//
// Deliberately changed from SGLang (each has a test):
//   - T3 is bounded in virtual time by the same 15-attempt budget with the
//     newer back-off (1, 1, 2, 4, 4, ... s), so it fails at 52 s rather than
//     after 15 scheduler cycles (TestT3PrefillNeverRegisters).
//   - DP-rank resolution is bounded by timeouts.dp_rank_resolution (60 s);
//     SGLang retries forever (TestDPRankResolutionBound).
//   - A decode-side bootstrap deadline (timeouts.bootstrap, 300 s from
//     OpenRoom until every required rank claimed) exists; SGLang has none
//     before send_metadata (TestBootstrapTimeoutBeforeClaim,
//     TestDestinationNeverClaimed).
//   - An admitted destination must be claimed within admission.claim_timeout
//     (ledger deadline); SGLang has no such deadline (TestClaimTimeout). Once
//     a claimed rank writes a chunk through Transfer the ledger deadline is
//     cancelled, so the pages are never handed out under a write in flight;
//     timeouts.bootstrap still bounds the room
//     (TestClaimTimeoutSparesRoomWithChunkInFlight).
//   - T11's waiting clock starts when every required rank claimed the
//     destination (the analogue of send_metadata), not at admission
//     (TestT11T14WaitingClockStartsAtClaim).
//   - T16 reaches held rebootstrap rooms too (SGLang's /abort_request does
//     not), and aborting a terminal room is a no-op (TestT16AbortInEveryPhase).
//   - T15 fails every non-Success room of the instance, including rooms still
//     waiting for its registration or DP rank (TestT15HeartbeatLoss).
//   - A new instance id behind a known address replaces the instance and
//     fails its rooms (TestNewInstanceIDReplacesInstance; SGLang PR #34289 is
//     only a proposal).
//   - T5's message is used when a rank re-registers with a new endpoint: the
//     rooms of that prefill DP group fail (labelled T15, FailurePrefillLost).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

func TestT1T2T4T8T11T12T17HappyPath(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		// The instance is known: OpenRoom returns the room already admitted.
		if s := h.open(addrA, 42); s.Phase != PhaseAdmitted || s.Poll != PollWaitingForInput {
			t.Errorf("OpenRoom snapshot: phase %s poll %s, want admitted WaitingForInput", s.Phase, s.Poll)
		}
		s := h.wantPhase(42, PhaseAdmitted)
		if s.PrefillDP != 0 || s.DPRule != DPRuleSingleDP || s.NumPages != 16 || s.MetadataSlot < 0 {
			t.Errorf("admitted room: prefill dp %d (%s), %d pages, metadata slot %d; want dp 0 (single_dp), 16 pages, a slot", s.PrefillDP, s.DPRule, s.NumPages, s.MetadataSlot)
		}
		dests := h.claimAll(42)
		h.wantPhase(42, PhaseClaimed)
		for rk, d := range dests {
			if d.Room != 42 || len(d.Pages) != 16 || d.PageSize != 64 || d.FillLen != 1000 || d.Dummy || d.Attempt != 1 || d.RequiredDstInfoNum != 1 {
				t.Errorf("destination for %s = %+v", rk, d)
			}
		}
		rk := h.requiredRanks(42)[0]
		if _, dup, err := h.m.Transfer(context.Background(), chunk(42, rk, 0, 0, 8, false)); err != nil || dup {
			t.Fatalf("Transfer(chunk 0) = dup %v, %v", dup, err)
		}
		h.wantPhase(42, PhaseTransferring)
		res, _, err := h.m.Transfer(context.Background(), chunk(42, rk, 1, 8, 8, true))
		if err != nil {
			t.Fatalf("Transfer(chunk 1) = %v", err)
		}
		if res.MarkerWritten != 42 {
			t.Errorf("last chunk MarkerWritten = %d, want 42", res.MarkerWritten)
		}
		s = h.wantPhase(42, PhaseSucceeded)
		// 1000 tokens × 2 (K,V) × 8 heads × 128 × 2 bytes × 32 layers.
		if want := uint64(1000 * 2 * 8 * 128 * 2 * 32); s.BytesTransferred != want || s.ChunksDone != 2 {
			t.Errorf("bytes %d, chunks %d; want %d, 2", s.BytesTransferred, s.ChunksDone, want)
		}
		if s.Poll != PollSuccess {
			t.Errorf("poll = %s, want Success", s.Poll)
		}
		if pages, already, err := h.m.ReleaseRoom(42); pages != 16 || already || err != nil {
			t.Errorf("ReleaseRoom = %d, %v, %v; want 16, false, nil", pages, already, err)
		}
		if _, already, err := h.m.ReleaseRoom(42); !already || err != nil {
			t.Errorf("second ReleaseRoom = already %v, %v; want true, nil", already, err)
		}
		wantPhases := []Phase{PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted, PhaseClaimed, PhaseTransferring, PhaseSucceeded, PhaseReleased}
		if diff := cmp.Diff(wantPhases, h.phases(42)); diff != "" {
			t.Errorf("phases (-want +got):\n%s", diff)
		}
		wantSteps := []string{"T1", "T2/T4/T8", "T11", "T11", "", "T12/T17", ""}
		if diff := cmp.Diff(wantSteps, h.sglangSteps(42)); diff != "" {
			t.Errorf("SGLang transitions (-want +got):\n%s", diff)
		}
		h.assertClean()
	})
}

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

func TestT12HeterogeneousTP(t *testing.T) {
	tests := []struct {
		name      string
		dec       func(*prealloc.Config)
		inst      instance
		wantRanks []RankID
		// wantTargets are the targets of every rank's destination (dummies
		// included), by prefill TP rank.
		wantTargets map[int][]transfer.Target
		wantDummy   map[int]bool
		wantDstInfo int
		// wantBytes is what every required rank's single 1000-token chunk moves.
		wantBytes uint64
	}{
		{
			// Prefill TP 2 → decode TP 1 (8 KV heads): decode needs both
			// prefill ranks; each sends its 4 heads into heads [4r, 4r+4).
			name:      "prefill TP 2 to decode TP 1",
			inst:      instance{addr: addrA, tp: 2},
			wantRanks: []RankID{{Addr: addrA, TP: 0}, {Addr: addrA, TP: 1}},
			wantTargets: map[int][]transfer.Target{
				0: {{DecodeTP: 0, SrcHeadStart: 0, DstHeadStart: 0, NumHeads: 4}},
				1: {{DecodeTP: 0, SrcHeadStart: 0, DstHeadStart: 4, NumHeads: 4}},
			},
			wantDummy:   map[int]bool{0: false, 1: false},
			wantDstInfo: 1,
			// 2 ranks × 1000 tokens × 2 × 4 heads × 128 × 2 B × 32 layers.
			wantBytes: 2 * 1000 * 2 * 4 * 128 * 2 * 32,
		},
		{
			// Prefill TP 1 → decode TP 4: one prefill rank serves all four
			// decode ranks (required_dst_info_num = 4), 2 heads each.
			name:      "prefill TP 1 to decode TP 4",
			dec:       func(c *prealloc.Config) { c.Parallel.AttnTP = 4 },
			inst:      instance{addr: addrA, tp: 1},
			wantRanks: []RankID{{Addr: addrA, TP: 0}},
			wantTargets: map[int][]transfer.Target{0: {
				{DecodeTP: 0, SrcHeadStart: 0, NumHeads: 2},
				{DecodeTP: 1, SrcHeadStart: 2, NumHeads: 2},
				{DecodeTP: 2, SrcHeadStart: 4, NumHeads: 2},
				{DecodeTP: 3, SrcHeadStart: 6, NumHeads: 2},
			}},
			wantDummy:   map[int]bool{0: false},
			wantDstInfo: 4,
			// 4 targets × 1000 tokens × 2 × 2 heads × 128 × 2 B × 32 layers.
			wantBytes: 4 * 1000 * 2 * 2 * 128 * 2 * 32,
		},
		{
			// MLA prefill TP 4 → decode TP 1: rank 0 is the real source,
			// ranks 1–3 are dummies (empty destination) that count as done.
			name:      "MLA prefill TP 4 to decode TP 1",
			dec:       mlaDecode(prealloc.KindMLA),
			inst:      instance{addr: addrA, tp: 4},
			wantRanks: []RankID{{Addr: addrA, TP: 0}},
			wantTargets: map[int][]transfer.Target{
				0: {{DecodeTP: 0}},
				1: {{DecodeTP: 0, Dummy: true}},
				2: {{DecodeTP: 0, Dummy: true}},
				3: {{DecodeTP: 0, Dummy: true}},
			},
			wantDummy:   map[int]bool{0: false, 1: true, 2: true, 3: true},
			wantDstInfo: 1,
			// 1000 tokens × (512 + 64) × 2 B × 32 layers.
			wantBytes: 1000 * 576 * 2 * 32,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				h.register(tc.inst)
				h.open(addrA, 3)
				h.wantPhase(3, PhaseAdmitted)
				if diff := cmp.Diff(tc.wantRanks, h.requiredRanks(3)); diff != "" {
					t.Fatalf("required ranks (-want +got):\n%s", diff)
				}
				// Every rank of the instance claims; only the required ones gate.
				all := ranksOf(tc.inst)
				// The room is claimed once the last required rank claimed.
				lastRequired := slices.Index(all, tc.wantRanks[len(tc.wantRanks)-1])
				for i, rk := range all {
					_, d := h.claim(3, rk)
					if diff := cmp.Diff(tc.wantTargets[rk.TP], d.Targets); diff != "" {
						t.Errorf("targets of %s (-want +got):\n%s", rk, diff)
					}
					if d.Dummy != tc.wantDummy[rk.TP] {
						t.Errorf("destination of %s: dummy %v, want %v", rk, d.Dummy, tc.wantDummy[rk.TP])
					}
					if d.Dummy && (d.Pages != nil || d.MetadataSlot != -1) {
						t.Errorf("dummy destination of %s carries pages %v, slot %d", rk, d.Pages, d.MetadataSlot)
					}
					if !d.Dummy && (len(d.Pages) != 16 || d.RequiredDstInfoNum != tc.wantDstInfo) {
						t.Errorf("destination of %s: %d pages, required_dst_info_num %d; want 16, %d", rk, len(d.Pages), d.RequiredDstInfoNum, tc.wantDstInfo)
					}
					want := PhaseAdmitted
					if i >= lastRequired {
						want = PhaseClaimed
					}
					h.wantPhase(3, want)
				}
				for i, rk := range tc.wantRanks {
					if _, _, err := h.m.Transfer(context.Background(), chunk(3, rk, 0, 0, 16, true)); err != nil {
						t.Fatalf("Transfer from %s = %v", rk, err)
					}
					if i < len(tc.wantRanks)-1 {
						h.wantPhase(3, PhaseTransferring)
					}
				}
				s := h.wantPhase(3, PhaseSucceeded)
				if s.BytesTransferred != tc.wantBytes {
					t.Errorf("bytes = %d, want %d", s.BytesTransferred, tc.wantBytes)
				}
				for _, rk := range all {
					if !tc.wantDummy[rk.TP] {
						continue
					}
					var inv *InvalidError
					if _, _, err := h.m.Transfer(context.Background(), chunk(3, rk, 0, 0, 16, true)); !errors.As(err, &inv) {
						t.Errorf("Transfer from dummy %s = %v, want InvalidError", rk, err)
					}
				}
				h.release(3)
				h.assertClean()
			})
		})
	}
}

func TestT12ChunksBeforeEveryRankClaimed(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		h.open(addrA, 4)
		r0, r1 := ranksOf(in)[0], ranksOf(in)[1]
		h.claim(4, r0)
		// Rank 1 has not claimed: its chunks are refused.
		if _, _, err := h.m.Transfer(context.Background(), chunk(4, r1, 0, 0, 16, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("Transfer from an unclaimed rank = %v, want ErrWrongState", err)
		}
		// Rank 0 may send at once; the room stays admitted until rank 1 claims.
		if _, _, err := h.m.Transfer(context.Background(), chunk(4, r0, 0, 0, 16, true)); err != nil {
			t.Fatalf("Transfer from rank 0 = %v", err)
		}
		h.wantPhase(4, PhaseAdmitted)
		h.claim(4, r1)
		h.wantPhase(4, PhaseTransferring)
		if _, _, err := h.m.Transfer(context.Background(), chunk(4, r1, 0, 0, 16, true)); err != nil {
			t.Fatalf("Transfer from rank 1 = %v", err)
		}
		h.wantPhase(4, PhaseSucceeded)
		h.release(4)
		h.assertClean()
	})
}

func TestT13T18ChunkFailureFromEngine(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		h.open(addrA, 9)
		c0, _ := h.claim(9, ranksOf(in)[0])
		h.claim(9, ranksOf(in)[1])
		h.sim.SetFault(func(op transfer.ChunkOp) error {
			if op.Rank.TP == 1 {
				return errors.New("rdma write to 10.0.0.1 failed: QP in error state")
			}
			return nil
		})
		if _, _, err := h.m.Transfer(context.Background(), chunk(9, ranksOf(in)[0], 0, 0, 16, true)); err != nil {
			t.Fatalf("Transfer from rank 0 = %v", err)
		}
		_, _, err := h.m.Transfer(context.Background(), chunk(9, ranksOf(in)[1], 0, 0, 16, true))
		if !errors.Is(err, transfer.ErrTransferFailed) {
			t.Fatalf("Transfer from rank 1 = %v, want transfer.ErrTransferFailed", err)
		}
		msg := h.wantFailure(9, FailureTransferFailed, "KVTransferError(bootstrap_room=9): chunk 0 from")
		if !strings.Contains(msg, "rdma write to 10.0.0.1 failed: QP in error state") {
			t.Errorf("failure %q does not carry the engine's reason", msg)
		}
		if got := h.sglangSteps(9); got[len(got)-1] != "T13/T18" {
			t.Errorf("last SGLang step = %q, want T13/T18", got[len(got)-1])
		}
		// The claim stream of the other rank ends with the failure.
		ev, ok := nextEvent(t, c0)
		if !ok || ev.Failure == nil || ev.Failure.Code != FailureTransferFailed {
			t.Errorf("rank 0's claim got %+v (open %v), want the failure", ev, ok)
		}
		h.assertClean()
	})
}

func TestT13T18ReportedFailure(t *testing.T) {
	tests := []struct {
		name, reason, want string
	}{
		{name: "with reason", reason: "Failed to send kv chunk of 9 to 10.0.0.3:17000", want: "KVTransferError(bootstrap_room=9): Failed to send kv chunk of 9 to 10.0.0.3:17000 (reported by"},
		{name: "default reason", want: "KVTransferError(bootstrap_room=9): Failed to get kvcache from prefill instance, it might be dead (reported by"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t)
				h.register(instance{addr: addrA})
				h.open(addrA, 9)
				h.claimAll(9)
				rk := h.requiredRanks(9)[0]
				first := ChunkRequest{Room: 9, Rank: rk, Index: 0, PageOffset: 0, NumPages: 8}
				first.Bytes = h.chunkWeight(9, first)
				if poll, dup, err := h.m.ReportTransfer(first); poll != PollTransferring || dup || err != nil {
					t.Fatalf("ReportTransfer(chunk 0) = %s, %v, %v", poll, dup, err)
				}
				poll, _, err := h.m.ReportTransfer(ChunkRequest{Room: 9, Rank: rk, Index: 1, PageOffset: 8, NumPages: 8, Last: true, Failed: true, Reason: tc.reason})
				if poll != PollFailed || err != nil {
					t.Fatalf("ReportTransfer(failed) = %s, %v; want Failed, nil", poll, err)
				}
				h.wantFailure(9, FailureTransferFailed, tc.want)
				if s := h.snapshot(9); !s.Failure.FromAnotherRank {
					t.Errorf("a reported failure should be marked from another rank")
				}
				h.assertClean()
			})
		})
	}
}

func TestT15HeartbeatLoss(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun())
		a := instance{addr: addrA, dp: 2, lb: "round_robin"}
		b := instance{addr: addrB}
		h.register(a)
		h.register(b)
		start := time.Now()
		// Room 1 succeeded (unaffected), 2 is claimed, 3 admitted, 4 resolving
		// its DP rank; room 10 belongs to another instance.
		h.open(addrA, 1, func(r *OpenRequest) { r.PrefillDP = 0 })
		h.complete(1)
		h.open(addrA, 2, func(r *OpenRequest) { r.PrefillDP = 1 })
		h.claimAll(2)
		h.open(addrA, 3, func(r *OpenRequest) { r.PrefillDP = 0 })
		h.open(addrA, 4)
		h.open(addrB, 10)
		h.wantPhase(4, PhaseResolvingDP)
		// Only b heartbeats. Checks run every 5 s; a is dead once silent for
		// max_failures (2) × interval (5 s) = 10 s.
		advance(4 * time.Second)
		h.heartbeatAll(b)
		advance(4 * time.Second)
		h.heartbeatAll(b)
		for _, room := range []uint64{2, 3, 4} {
			if s := h.snapshot(room); s.Phase == PhaseFailed {
				t.Fatalf("room %d failed after 8s: %s", room, s.Failure.Message)
			}
		}
		advance(2 * time.Second)
		// SGLang's message, then which ranks went silent and for how long.
		want := "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 3 requests affected; silent ranks (no heartbeat within 2 × 5s): dp 0 cp 0 tp 0 pp 0 for 10s, dp 1 cp 0 tp 0 pp 0 for 10s"
		for _, room := range []uint64{2, 3, 4} {
			if msg := h.wantFailure(room, FailurePrefillLost, want); msg != want {
				t.Errorf("room %d failure = %q, want %q", room, msg, want)
			}
			tr := h.snapshot(room).Transitions
			if last := tr[len(tr)-1]; last.SGLang != "T15" || last.At.Sub(start) != 10*time.Second {
				t.Errorf("room %d failed at %s (%s), want 10s (T15)", room, last.At.Sub(start), last.SGLang)
			}
		}
		h.wantPhase(1, PhaseSucceeded)
		h.wantPhase(10, PhaseAdmitted)
		if _, _, err := h.m.Heartbeat(ranksOf(a)[0], ""); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat from the dead instance = %v, want ErrPrefillNotFound", err)
		}
		if _, _, err := h.m.LookupDPRanks(addrA, []uint64{1}, nil); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("LookupDPRanks at the dead instance = %v, want ErrPrefillNotFound", err)
		}
		h.release(1)
		h.complete(10)
		h.release(10)
		h.assertClean()
	})
}

func TestT15HeartbeatsKeepInstanceAlive(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun(), withConfig(func(c *Config) {
			c.Timeouts.HeartbeatInterval = time.Second // floored at SGLang's 2 s
			c.Timeouts.HeartbeatMaxFailures = 0        // floored at 1
		}))
		in := instance{addr: addrA}
		h.register(in)
		h.open(addrA, 1)
		h.claimAll(1)
		for range 30 {
			advance(1900 * time.Millisecond)
			h.heartbeatAll(in)
		}
		h.wantPhase(1, PhaseClaimed)
		st := h.m.Status()
		if len(st.Prefills) != 1 || st.Prefills[0].ActiveRooms != 1 || st.Prefills[0].Registered != 1 {
			t.Errorf("Status().Prefills = %+v", st.Prefills)
		}
		// Floors: 1 failure × 2 s. The last heartbeat was at 57 s; the check
		// at 60 s finds the instance silent for 3 s >= 2 s.
		advance(3 * time.Second)
		h.wantFailure(1, FailurePrefillLost, "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 1 requests affected")
		h.assertClean()
	})
}

// abortSetup brings a room to a phase and returns it.
type abortSetup struct {
	name  string
	phase Phase
	opts  []option
	setup func(h *harness) uint64
}

func TestT16AbortInEveryPhase(t *testing.T) {
	tests := []abortSetup{
		{name: "waiting_prefill", phase: PhaseWaitingPrefill, setup: func(h *harness) uint64 {
			h.open(addrB, 1) // never registers
			return 1
		}},
		{name: "resolving_dp_rank", phase: PhaseResolvingDP, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA, dp: 2, lb: "round_robin"})
			h.open(addrA, 1)
			return 1
		}},
		{name: "queued", phase: PhaseQueued, opts: []option{withDecode(oneSlot)}, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA})
			h.open(addrA, 1)
			h.open(addrA, 2) // the only req slot is room 1's
			return 2
		}},
		{name: "admitted", phase: PhaseAdmitted, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA})
			h.open(addrA, 1)
			return 1
		}},
		{name: "claimed", phase: PhaseClaimed, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA})
			h.open(addrA, 1)
			h.claimAll(1)
			return 1
		}},
		{name: "transferring", phase: PhaseTransferring, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA})
			h.open(addrA, 1)
			h.claimAll(1)
			if _, _, err := h.m.Transfer(context.Background(), chunk(1, h.requiredRanks(1)[0], 0, 0, 4, false)); err != nil {
				h.t.Fatalf("Transfer = %v", err)
			}
			return 1
		}},
		{name: "succeeded", phase: PhaseSucceeded, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA})
			h.open(addrA, 1)
			h.complete(1)
			return 1
		}},
		{name: "retracted", phase: PhaseRetracted, opts: []option{withDecode(smallPool(64))}, setup: func(h *harness) uint64 {
			return retractedRoom(h)
		}},
		{name: "held", phase: PhaseHeld, setup: func(h *harness) uint64 {
			h.register(instance{addr: addrA})
			h.open(addrA, 1)
			h.complete(1)
			if _, err := h.m.RetractRoom(1, RetractRebootstrap); err != nil {
				h.t.Fatalf("RetractRoom(rebootstrap) = %v", err)
			}
			return 1
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, tc.opts...)
				room := tc.setup(h)
				h.wantPhase(room, tc.phase)
				var claims []*Claim
				if tc.phase == PhaseClaimed {
					for _, rk := range h.requiredRanks(room) {
						c, err := h.m.AwaitDestination(room, rk)
						if err != nil {
							t.Fatalf("AwaitDestination = %v", err)
						}
						h.destination(c)
						claims = append(claims, c)
					}
				}
				s, already, err := h.m.AbortRoom(room, "")
				if err != nil || already {
					t.Fatalf("AbortRoom = already %v, %v; want false, nil", already, err)
				}
				if s.Phase != PhaseFailed || s.Failure == nil || s.Failure.Code != FailureAborted || s.Failure.Message != "Aborted by AbortReq." {
					t.Errorf("AbortRoom snapshot = %s %+v, want failed: aborted \"Aborted by AbortReq.\"", s.Phase, s.Failure)
				}
				if got := h.sglangSteps(room); got[len(got)-1] != "T16" {
					t.Errorf("last SGLang step = %q, want T16", got[len(got)-1])
				}
				for _, c := range claims {
					if ev, ok := nextEvent(t, c); !ok || ev.Failure == nil || ev.Failure.Code != FailureAborted {
						t.Errorf("claim got %+v (open %v), want the abort", ev, ok)
					}
				}
				// Aborting a terminal room is a no-op.
				before := h.snapshot(room)
				s, already, err = h.m.AbortRoom(room, "again")
				if err != nil || !already || s.Failure.Message != "Aborted by AbortReq." {
					t.Errorf("second AbortRoom = already %v, %v, %q; want true, nil, unchanged", already, err, s.Failure.Message)
				}
				if after := h.snapshot(room); len(after.Transitions) != len(before.Transitions) {
					t.Errorf("second AbortRoom added transitions: %d -> %d", len(before.Transitions), len(after.Transitions))
				}
				// Release every other room so that the ledgers can be checked.
				live, _ := h.m.ListRooms(ListFilter{LiveOnly: true})
				for _, o := range live {
					if _, _, err := h.m.AbortRoom(o.Room, ""); err != nil {
						t.Fatalf("AbortRoom(%d) = %v", o.Room, err)
					}
				}
				h.assertClean()
			})
		})
	}
	t.Run("custom reason and unknown room", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			h := newHarness(t)
			h.open(addrA, 1)
			if s, _, err := h.m.AbortRoom(1, "client disconnected"); err != nil || s.Failure.Message != "client disconnected" {
				t.Errorf("AbortRoom(reason) = %+v, %v", s.Failure, err)
			}
			if _, _, err := h.m.AbortRoom(99, ""); !errors.Is(err, ErrRoomNotFound) {
				t.Errorf("AbortRoom(unknown) = %v, want ErrRoomNotFound", err)
			}
			h.assertClean()
		})
	})
}

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
	grown, noCap, notRunning := h.m.ReportRunning([]Usage{{Room: 2, OutputLen: 1900}})
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
		if grown, noCap, notRunning := h.m.ReportRunning([]Usage{{Room: 2, OutputLen: 1}}); grown != nil || noCap != nil || notRunning != nil {
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

func TestT16AbortWithChunkInFlight(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		g := newGate(t)
		h.sim.SetFault(g.hook)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		done := make(chan error, 1)
		go func() {
			_, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true))
			done <- err
		}()
		<-g.entered
		synctest.Wait()
		if _, _, err := h.m.AbortRoom(1, ""); err != nil {
			t.Fatalf("AbortRoom = %v", err)
		}
		h.wantFailure(1, FailureAborted, "Aborted by AbortReq.")
		// The chunk is still being written: its pages stay taken.
		if used := h.pagesUsed(0); used != 16 {
			t.Fatalf("pages used while the chunk is in flight = %d, want 16", used)
		}
		if n := h.m.InFlight(); n != 0 {
			t.Errorf("InFlight() = %d, want 0 (the room is terminal)", n)
		}
		// The room is retained until released; it cannot be forgotten yet.
		h.m.lockAll()
		pending := h.m.allRooms()[1].releasePending
		h.m.unlockAll()
		if !pending {
			t.Errorf("room released its resources with a chunk in flight")
		}
		g.release <- nil
		if err := <-done; !errors.Is(err, ErrWrongState) {
			t.Errorf("in-flight Transfer = %v, want ErrWrongState (the room failed)", err)
		}
		synctest.Wait()
		h.assertClean()
	})
}

func TestT17MetadataSlotFreedAtSuccess(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if st := h.stats(0); st.MetaSlots.Used != 1 || st.Pages.Used != 16 || st.ReqSlots.Used != 1 {
			t.Fatalf("admitted: %d metadata slots, %d pages, %d req slots used; want 1, 16, 1", st.MetaSlots.Used, st.Pages.Used, st.ReqSlots.Used)
		}
		h.complete(1)
		// pop_transferred frees the metadata slot; the pages and req slot
		// belong to the running request.
		if st := h.stats(0); st.MetaSlots.Used != 0 || st.Pages.Used != 16 || st.ReqSlots.Used != 1 || st.Running != 1 {
			t.Fatalf("succeeded: %d metadata slots, %d pages, %d req slots used, %d running; want 0, 16, 1, 1", st.MetaSlots.Used, st.Pages.Used, st.ReqSlots.Used, st.Running)
		}
		h.release(1)
		h.assertClean()
	})
}

func TestT19MetadataMarkerMismatch(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 12)
		h.claimAll(12)
		req := chunk(12, h.requiredRanks(12)[0], 0, 0, 16, true)
		req.Marker = 13 // another room's marker lands in the slot
		if _, _, err := h.m.Transfer(context.Background(), req); err != nil {
			t.Fatalf("Transfer = %v", err)
		}
		msg := h.wantFailure(12, FailureMetadataCorruption, "Metadata corruption detected - bootstrap_room mismatch")
		if !strings.Contains(msg, "holds room 13, expected 12") {
			t.Errorf("failure %q does not name both rooms", msg)
		}
		if got := h.sglangSteps(12); got[len(got)-1] != "T19" {
			t.Errorf("last SGLang step = %q, want T19", got[len(got)-1])
		}
		h.assertClean()
	})
}

func TestT19MarkerMissingKeepsTransferring(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.Timeouts.Waiting = time.Minute }))
		h.register(instance{addr: addrA})
		h.open(addrA, 12)
		h.claimAll(12)
		rk := h.requiredRanks(12)[0]
		if _, _, err := h.m.Transfer(context.Background(), chunk(12, rk, 0, 0, 8, false)); err != nil {
			t.Fatalf("Transfer(chunk 0) = %v", err)
		}
		// Every rank's last chunk carries the marker: one without it is
		// refused (nothing lands), so the room cannot hang on a lost aux.
		req := chunk(12, rk, 1, 8, 8, true)
		req.Marker = 0
		var inv *InvalidError
		if _, _, err := h.m.Transfer(context.Background(), req); !errors.As(err, &inv) || inv.Field != "aux" {
			t.Fatalf("Transfer(last chunk without the marker) = %v, want InvalidError on aux", err)
		}
		// SGLang's metadata gate: Success waits for the marker; the prefill
		// never sends the last chunk again, and the waiting timeout ends it.
		h.wantPhase(12, PhaseTransferring)
		if w := h.getRoom(12).WaitingFor; !strings.Contains(w, "8 of 16 pages landed, last chunk not landed") {
			t.Errorf("waiting for %q, want the rank's missing pages and last chunk", w)
		}
		advance(time.Minute)
		msg := h.wantFailure(12, FailureWaitingTimeout, "Request 12 timed out after 60.0s in KVPoll.WaitingForInput")
		if !strings.Contains(msg, "prefill ranks still sending: cp 0 tp 0 pp 0") {
			t.Errorf("failure %q does not name the rank still sending", msg)
		}
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
		if grown, _, notRunning := h.m.ReportRunning([]Usage{{Room: room, OutputLen: 10}}); grown != nil || !slices.Equal(notRunning, []uint64{room}) {
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
		if grown, noCap, notRunning := h.m.ReportRunning([]Usage{{Room: room, OutputLen: 100}}); len(grown) != 1 || noCap != nil || notRunning != nil {
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
		h := newHarness(t, withDecode(func(c *prealloc.Config) { c.Admission.ClaimTimeout = 0 }))
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

// TestDuplicateChunk: (room, rank, chunk) idempotency during T12
// (decodeplane).
func TestDuplicateChunk(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		first, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 8, false))
		if err != nil || dup {
			t.Fatalf("Transfer = dup %v, %v", dup, err)
		}
		again, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 8, false))
		if err != nil || !dup || again != first {
			t.Errorf("Transfer(retry) = %+v, dup %v, %v; want %+v, true, nil", again, dup, err, first)
		}
		if poll, dup, err := h.m.ReportTransfer(chunk(1, rk, 0, 0, 8, false)); !dup || err != nil || poll != PollTransferring {
			t.Errorf("ReportTransfer(duplicate) = %s, %v, %v; want Transferring, true, nil", poll, dup, err)
		}
		if s := h.snapshot(1); s.ChunksDone != 1 {
			t.Errorf("chunks done = %d, want 1 (a duplicate counts once)", s.ChunksDone)
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 1, 8, 8, true)); err != nil {
			t.Fatalf("Transfer(last) = %v", err)
		}
		h.wantPhase(1, PhaseSucceeded)
		// Retries after success still answer.
		if _, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 1, 8, 8, true)); !dup || err != nil {
			t.Errorf("Transfer(retry after success) = dup %v, %v", dup, err)
		}
		h.release(1)
		h.assertClean()
	})
}

// TestRetryOfInFlightChunkWaits: a retry of a chunk in flight waits for it and
// does not move it twice (T12, decodeplane).
func TestRetryOfInFlightChunkWaits(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		g := newGate(t)
		h.sim.SetFault(g.hook)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		type result struct {
			res transfer.ChunkResult
			dup bool
			err error
		}
		results := make(chan result, 2)
		send := func() {
			res, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true))
			results <- result{res, dup, err}
		}
		go send()
		<-g.entered
		go send()
		synctest.Wait()
		select {
		case r := <-results:
			t.Fatalf("a Transfer returned while the chunk was in flight: %+v", r)
		default:
		}
		if len(g.entered) != 0 {
			t.Fatalf("the retry moved the chunk a second time")
		}
		// The prefill cannot report a chunk the engine is moving.
		if _, _, err := h.m.ReportTransfer(chunk(1, rk, 0, 0, 16, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("ReportTransfer of a chunk in flight = %v, want ErrWrongState", err)
		}
		g.release <- nil
		a, b := <-results, <-results
		if a.err != nil || b.err != nil || a.dup == b.dup || a.res.Bytes != b.res.Bytes {
			t.Errorf("results %+v and %+v: want one original and one duplicate with the same result", a, b)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

// TestRetryAfterCallerGaveUp: a caller's cancelled Transfer lands nothing and
// does not fail the room (no T13); the retry moves the chunk (decodeplane).
func TestRetryAfterCallerGaveUp(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withSim(sim.SimConfig{BandwidthGBytesPerS: 1, Seed: 1}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		// 1000 tokens × 131072 B = 131 MB at 1 GB/s: 131 ms.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, _, err := h.m.Transfer(ctx, chunk(1, rk, 0, 0, 16, true)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Transfer with a short deadline = %v, want DeadlineExceeded", err)
		}
		h.wantPhase(1, PhaseClaimed) // nothing landed; the room lives on
		if _, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true)); err != nil || dup {
			t.Fatalf("Transfer(retry) = dup %v, %v; want a fresh move", dup, err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

// TestChunkValidation: chunks refused during T11/T12, and a room that waits
// for a missing chunk before T12.
func TestChunkValidation(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		rk := RankID{Addr: addrA}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("Transfer before the claim = %v, want ErrWrongState", err)
		}
		h.claimAll(1)
		tests := []struct {
			name  string
			req   ChunkRequest
			field string
			is    error
		}{
			{name: "unknown room", req: chunk(2, rk, 0, 0, 1, false), is: ErrRoomNotFound},
			{name: "other instance", req: chunk(1, RankID{Addr: addrB}, 0, 0, 1, false), field: "rank.bootstrap_addr"},
			{name: "other dp", req: chunk(1, RankID{Addr: addrA, DP: 1}, 0, 0, 1, false), field: "rank.dp_rank"},
			{name: "rank not addressed", req: chunk(1, RankID{Addr: addrA, TP: 1}, 0, 0, 1, false), field: "rank"},
			{name: "pages out of range", req: chunk(1, rk, 0, 10, 7, false), field: "page_offset"},
			{name: "empty non-last chunk", req: chunk(1, rk, 0, 0, 0, false), field: "num_pages"},
			{name: "source pages mismatch", req: ChunkRequest{Room: 1, Rank: rk, NumPages: 2, SrcPages: []int32{1}}, field: "source.page_indices"},
		}
		for _, tc := range tests {
			_, _, err := h.m.Transfer(context.Background(), tc.req)
			var inv *InvalidError
			switch {
			case tc.is != nil && !errors.Is(err, tc.is):
				t.Errorf("%s: Transfer = %v, want %v", tc.name, err, tc.is)
			case tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field):
				t.Errorf("%s: Transfer = %v, want InvalidError on %s", tc.name, err, tc.field)
			}
		}
		// The coverage contract: indices in any order, no page twice, a last
		// chunk only when it completes the rank's pages, nothing after it.
		var inv *InvalidError
		wantInvalid := func(what string, req ChunkRequest, field string) {
			t.Helper()
			before := h.snapshot(1)
			if _, _, err := h.m.Transfer(context.Background(), req); !errors.As(err, &inv) || inv.Field != field {
				t.Errorf("%s = %v, want InvalidError on %s", what, err, field)
			}
			if after := h.snapshot(1); after.ChunksDone != before.ChunksDone || after.BytesTransferred != before.BytesTransferred || after.Phase != before.Phase {
				t.Errorf("%s changed the room: %+v -> %+v", what, before, after)
			}
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 5, 4, 4, false)); err != nil {
			t.Fatalf("Transfer(chunk 5, pages [4, 8)) = %v", err)
		}
		wantInvalid("a chunk overlapping pages already sent", chunk(1, rk, 6, 7, 2, false), "page_offset")
		wantInvalid("a retry of chunk 5 with other pages", chunk(1, rk, 5, 8, 4, false), "chunk_index")
		wantInvalid("a last chunk leaving pages unsent", chunk(1, rk, 7, 8, 8, true), "last")
		noMarker := chunk(1, rk, 7, 0, 4, false)
		noMarker.Last = true
		h.m.Transfer(context.Background(), chunk(1, rk, 2, 8, 8, false))
		wantInvalid("a last chunk without the room marker", noMarker, "aux")
		if _, _, dup, err := transferDup(h, chunk(1, rk, 5, 4, 4, false)); err != nil || !dup {
			t.Errorf("a retry of chunk 5 = dup %v, %v; want a duplicate", dup, err)
		}
		// Pages [0, 4) never came: the room waits for them and says so.
		h.wantPhase(1, PhaseTransferring)
		if got := h.getRoom(1); !strings.Contains(got.WaitingFor, "12 of 16 pages landed") || got.Coverage[0].PagesLanded != 12 || got.Coverage[0].PagesRequired != 16 {
			t.Errorf("GetRoom: waiting for %q, coverage %+v; want 12 of 16 pages", got.WaitingFor, got.Coverage)
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 4, true)); err != nil {
			t.Fatalf("Transfer(last chunk 0, pages [0, 4)) = %v", err)
		}
		h.wantPhase(1, PhaseSucceeded)
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 9, 0, 0, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("a chunk after success = %v, want ErrWrongState", err)
		}
		h.release(1)
		h.assertClean()
	})
}

// TestSuccessNeedsEveryPageOfEveryRank: prefill TP 2 -> decode TP 1 (both
// ranks required): ranks whose last chunks carry no pages, half of them, or
// one rank sending everything and the other nothing never succeed, through
// Transfer and ReportTransfer alike.
func TestSuccessNeedsEveryPageOfEveryRank(t *testing.T) {
	for _, report := range []bool{false, true} {
		t.Run(fmt.Sprintf("report=%v", report), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t)
				h.register(instance{addr: addrA, tp: 2})
				h.open(addrA, 3)
				h.claimAll(3)
				ranks := h.requiredRanks(3)
				if len(ranks) != 2 {
					t.Fatalf("required ranks = %v, want 2", ranks)
				}
				pages := h.snapshot(3).NumPages
				send := func(rk RankID, idx, off, n int, last bool) error {
					req := chunk(3, rk, idx, off, n, last)
					if report {
						req.Bytes = h.chunkWeight(3, req)
						_, _, err := h.m.ReportTransfer(req)
						return err
					}
					_, _, err := h.m.Transfer(context.Background(), req)
					return err
				}
				var inv *InvalidError
				if err := send(ranks[0], 0, 0, 0, true); !errors.As(err, &inv) || inv.Field != "last" {
					t.Errorf("an empty last chunk = %v, want InvalidError on last", err)
				}
				if err := send(ranks[0], 0, 0, pages/2, true); !errors.As(err, &inv) || inv.Field != "last" {
					t.Errorf("a last chunk with half the pages = %v, want InvalidError on last", err)
				}
				if err := send(ranks[0], 0, 0, pages, true); err != nil {
					t.Fatalf("rank 0 sends everything: %v", err)
				}
				h.wantPhase(3, PhaseTransferring) // rank 1 sent nothing
				if err := send(ranks[1], 0, 0, pages/2, false); err != nil {
					t.Fatalf("rank 1, first half: %v", err)
				}
				h.wantPhase(3, PhaseTransferring)
				if err := send(ranks[1], 1, pages/2, pages-pages/2, true); err != nil {
					t.Fatalf("rank 1, second half: %v", err)
				}
				s := h.wantPhase(3, PhaseSucceeded)
				if report {
					want := h.chunkWeight(3, chunk(3, ranks[0], 0, 0, pages, true)) + h.chunkWeight(3, chunk(3, ranks[1], 0, 0, pages, true))
					if int64(s.BytesTransferred) != want {
						t.Errorf("bytes = %d, want %d", s.BytesTransferred, want)
					}
				}
				h.release(3)
				h.assertClean()
			})
		})
	}
}

// TestReportedBytesMustMatchTheLayout: a prefill's bytes are checked
// against what its pages weigh; a mismatch (or 2^63) changes nothing.
func TestReportedBytesMustMatchTheLayout(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 4)
		h.claimAll(4)
		rk := h.requiredRanks(4)[0]
		pages := h.snapshot(4).NumPages
		req := chunk(4, rk, 0, 0, pages, true)
		want := h.chunkWeight(4, req)
		for _, b := range []int64{0, want - 1, want + 1, -1 << 63} {
			req.Bytes = b
			var inv *InvalidError
			if _, _, err := h.m.ReportTransfer(req); !errors.As(err, &inv) || inv.Field != "bytes" {
				t.Errorf("bytes %d = %v, want InvalidError on bytes", b, err)
			}
		}
		if s := h.snapshot(4); s.ChunksDone != 0 || s.BytesTransferred != 0 || s.Phase != PhaseClaimed {
			t.Errorf("refused reports changed the room: %+v", s)
		}
		req.Bytes = want
		if _, dup, err := h.m.ReportTransfer(req); err != nil || dup {
			t.Fatalf("ReportTransfer(exact bytes) = %v, %v", dup, err)
		}
		h.wantPhase(4, PhaseSucceeded)
		h.release(4)
		h.assertClean()
	})
}

// TestOpenRoomErrors: T1 refused (capacity check of §2.3, duplicates, ranges).
func TestOpenRoomErrors(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withShards(2))
		h.register(instance{addr: addrA, dp: 2})
		h.open(addrA, 1, func(r *OpenRequest) { r.IdempotencyKey = "k1" })
		if s, again, err := h.m.OpenRoom(context.Background(), OpenRequest{Room: 1, Addr: addrA, IdempotencyKey: "k1", PrefillDP: -1, DecodeDP: -1, PromptLen: 1000}); err != nil || !again || s.Room != 1 {
			t.Errorf("OpenRoom(same key) = %d, %v, %v; want the room again", s.Room, again, err)
		}
		if _, _, err := h.m.OpenRoom(context.Background(), openReq(addrA, 1)); !errors.Is(err, ErrRoomExists) {
			t.Errorf("OpenRoom(other key) = %v, want ErrRoomExists", err)
		}
		var inv *InvalidError
		if _, _, err := h.m.OpenRoom(context.Background(), func() OpenRequest { r := openReq(addrA, 2); r.DecodeDP = 2; return r }()); !errors.As(err, &inv) || inv.Field != "decode_dp_rank" {
			t.Errorf("OpenRoom(decode dp 2 of 2) = %v, want InvalidError on decode_dp_rank", err)
		}
		if _, _, err := h.m.OpenRoom(context.Background(), func() OpenRequest { r := openReq(addrA, 2); r.PrefillDP = 2; return r }()); !errors.As(err, &inv) || inv.Field != "prefill_dp_rank" {
			t.Errorf("OpenRoom(prefill dp 2 of 2) = %v, want InvalidError on prefill_dp_rank", err)
		}
		// SGLang's entry check: nothing is allocated.
		_, _, err := h.m.OpenRoom(context.Background(), func() OpenRequest { r := openReq(addrA, 3); r.PromptLen = 2 << 20; return r }())
		var ce *prealloc.CapacityError
		if !errors.As(err, &ce) || !errors.Is(err, prealloc.ErrExceedsCapacity) || !strings.Contains(err.Error(), "Request rid-3 exceeds the maximum number of tokens: 2097152 > 1048576") {
			t.Errorf("OpenRoom(too long) = %v, want SGLang's capacity error", err)
		}
		if _, err := h.m.GetRoom(3, false); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("GetRoom(refused room) = %v, want ErrRoomNotFound", err)
		}
		// Room ids spread over the decode shards: 1 % 2 = 1; DecodeDP pins one.
		if s := h.snapshot(1); s.DecodeDP != 1 {
			t.Errorf("room 1 on decode shard %d, want 1", s.DecodeDP)
		}
		h.open(addrA, 4, func(r *OpenRequest) { r.DecodeDP = 1 })
		if s := h.snapshot(4); s.DecodeDP != 1 || h.stats(1).Admitted != 2 {
			t.Errorf("room 4 on decode shard %d (shard 1 admitted %d), want shard 1 with 2 admitted", s.DecodeDP, h.stats(1).Admitted)
		}
		for _, room := range []uint64{1, 4} {
			h.complete(room)
			h.release(room)
		}
		h.assertClean()
	})
}

// TestReleaseRoomErrors: release applies only after T12/T17.
func TestReleaseRoomErrors(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.m.ReleaseRoom(1); !errors.Is(err, ErrWrongState) {
			t.Errorf("ReleaseRoom(admitted) = %v, want ErrWrongState", err)
		}
		if _, _, err := h.m.ReleaseRoom(2); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("ReleaseRoom(unknown) = %v, want ErrRoomNotFound", err)
		}
		h.m.AbortRoom(1, "")
		if _, _, err := h.m.ReleaseRoom(1); !errors.Is(err, ErrWrongState) {
			t.Errorf("ReleaseRoom(failed) = %v, want ErrWrongState", err)
		}
		if _, err := h.m.RetractRoom(1, RetractCPU); !errors.Is(err, ErrWrongState) {
			t.Errorf("RetractRoom(failed) = %v, want ErrWrongState", err)
		}
		h.assertClean()
	})
}

// TestOnRoomEndRunsOnceOnEveryExit: the end hook of T16/T18 exits runs once,
// after any chunk in flight returned.
func TestOnRoomEndRunsOnceOnEveryExit(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		g := newGate(t)
		h.sim.SetFault(g.hook)
		calls := map[uint64]int{}
		for _, room := range []uint64{1, 2} {
			h.open(addrA, room)
			if err := h.m.OnRoomEnd(room, func() { calls[room]++ }); err != nil {
				t.Fatalf("OnRoomEnd(%d) = %v", room, err)
			}
		}
		h.claimAll(1)
		done := make(chan struct{})
		go func() {
			h.m.Transfer(context.Background(), chunk(1, h.requiredRanks(1)[0], 0, 0, 16, true))
			close(done)
		}()
		<-g.entered
		h.m.AbortRoom(1, "")
		h.m.AbortRoom(2, "")
		h.m.lockAll()
		c1, c2 := calls[1], calls[2]
		h.m.unlockAll()
		if c1 != 0 || c2 != 1 {
			t.Errorf("after abort: calls %d, %d; want 0 (chunk in flight), 1", c1, c2)
		}
		g.release <- nil
		<-done
		// Registered after the end: runs at once.
		if err := h.m.OnRoomEnd(2, func() { calls[2]++ }); err != nil {
			t.Fatalf("OnRoomEnd(ended room) = %v", err)
		}
		h.m.lockAll()
		c1, c2 = calls[1], calls[2]
		h.m.unlockAll()
		if c1 != 1 || c2 != 2 {
			t.Errorf("calls %d, %d; want 1, 2", c1, c2)
		}
		if err := h.m.OnRoomEnd(99, func() {}); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("OnRoomEnd(unknown) = %v, want ErrRoomNotFound", err)
		}
		h.assertClean()
	})
}

// TestHoldSuccessGate: a success gate delays T12 (staged scatters) or fails
// the room (T18).
func TestHoldSuccessGate(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		for _, room := range []uint64{1, 2} {
			h.open(addrA, room)
			if err := h.m.HoldSuccess(room, "scatter-0"); err != nil {
				t.Fatalf("HoldSuccess(%d) = %v", room, err)
			}
			h.claimAll(room)
			h.sendAll(room)
			h.wantPhase(room, PhaseTransferring) // every chunk landed; the gate holds
		}
		h.m.ReleaseHold(1, "scatter-0", nil)
		h.wantPhase(1, PhaseSucceeded)
		if err := h.m.HoldSuccess(1, "late"); !errors.Is(err, ErrWrongState) {
			t.Errorf("HoldSuccess(succeeded) = %v, want ErrWrongState", err)
		}
		h.m.ReleaseHold(2, "scatter-0", &Failure{Code: FailureStagingFailed, Message: "staging scatter of room 2 failed"})
		h.wantFailure(2, FailureStagingFailed, "staging scatter of room 2 failed")
		h.release(1)
		h.assertClean()
	})
}

// TestRoomRetention: terminal rooms (after T16) are kept for retention, then
// forgotten (decodeplane).
func TestRoomRetention(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun(), withConfig(func(c *Config) {
			c.Rooms.Retention = 2 * time.Minute
			c.Rooms.MaxRetained = 2
		}))
		for i := uint64(1); i <= 3; i++ {
			h.open(addrA, i)
			h.m.AbortRoom(i, "")
		}
		// MaxRetained 2: the oldest went first.
		if _, err := h.m.GetRoom(1, false); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("GetRoom(1) = %v, want ErrRoomNotFound (beyond max_retained)", err)
		}
		h.wantPhase(2, PhaseFailed)
		// A forgotten room id can be opened again.
		h.open(addrA, 1)
		h.m.AbortRoom(1, "")
		advance(3 * time.Minute)
		for i := uint64(1); i <= 3; i++ {
			if _, err := h.m.GetRoom(i, false); !errors.Is(err, ErrRoomNotFound) {
				t.Errorf("GetRoom(%d) after retention = %v, want ErrRoomNotFound", i, err)
			}
		}
		h.assertClean()
	})
}

func TestListRoomsAndPoll(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 2)
		advance(time.Second)
		h.open(addrA, 1)
		h.open(addrB, 3)
		h.m.AbortRoom(2, "")
		all, total := h.m.ListRooms(ListFilter{})
		if total != 3 || len(all) != 3 || all[0].Room != 2 {
			t.Errorf("ListRooms() = %d rooms (total %d), first %d; want 3, oldest (2) first", len(all), total, all[0].Room)
		}
		live, total := h.m.ListRooms(ListFilter{LiveOnly: true, Limit: 1})
		if total != 2 || len(live) != 1 || live[0].Room != 1 {
			t.Errorf("ListRooms(live, limit 1) = %v (total %d)", live, total)
		}
		byAddr, _ := h.m.ListRooms(ListFilter{Addr: addrB, Phases: []Phase{PhaseWaitingPrefill}})
		if len(byAddr) != 1 || byAddr[0].Room != 3 {
			t.Errorf("ListRooms(addr B, waiting) = %v", byAddr)
		}
		for room, want := range map[uint64]KVPoll{1: PollWaitingForInput, 2: PollFailed, 3: PollBootstrapping, 99: PollFailed} {
			if got := h.m.Poll(room); got != want {
				t.Errorf("Poll(%d) = %s, want %s", room, got, want)
			}
		}
		s, err := h.m.GetRoom(1, true)
		if err != nil || len(s.Pages) != 16 || len(s.Transitions) != 3 {
			t.Errorf("GetRoom(with pages) = %d pages, %d transitions, %v", len(s.Pages), len(s.Transitions), err)
		}
		h.m.AbortRoom(1, "")
		h.m.AbortRoom(3, "")
		h.assertClean()
	})
}

func TestPhaseAndCodeNames(t *testing.T) {
	for p := PhaseWaitingPrefill; p <= PhaseHeld; p++ {
		got, ok := ParsePhase(p.String())
		if !ok || got != p {
			t.Errorf("ParsePhase(%q) = %v, %v; want %v", p.String(), got, ok, p)
		}
	}
	if _, ok := ParsePhase("unspecified"); ok {
		t.Errorf("ParsePhase(unspecified) accepted")
	}
	for _, s := range []fmt.Stringer{Phase(99), FailureCode(99), DPRule(99), KVPoll(9)} {
		if !strings.Contains(s.String(), "(") {
			t.Errorf("out-of-range %T renders as %q", s, s.String())
		}
	}
	if got := FailureShutdown.String(); got != "shutdown" {
		t.Errorf("FailureShutdown = %q", got)
	}
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
