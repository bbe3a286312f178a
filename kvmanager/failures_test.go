package kvmanager

// Failures: a room that fails, is aborted or loses its prefill, and what every exit path gives back. The transitions each covers are listed in lifecycle_test.go.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/transfer"
)

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
		pending := h.m.allRooms()[1].ReleasePending()
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
