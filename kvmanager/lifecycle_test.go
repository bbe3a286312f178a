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
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
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

func TestT12HeterogeneousTP(t *testing.T) {
	tests := []struct {
		name      string
		dec       func(*kvlayout.Config)
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
			dec:       func(c *kvlayout.Config) { c.Parallel.AttnTP = 4 },
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
			dec:       mlaDecode(kvlayout.KindMLA),
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
