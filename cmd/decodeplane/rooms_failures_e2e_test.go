package main

// End-to-end tests of rooms over gRPC through the real daemon
// binary: every test starts `decodeplane serve` with its own configuration
// (a YAML file in t.TempDir()) and drives it with the Go client library, as a
// prefill server and a decode engine would.
//
// Map to the "Tests" section:
//
//   - GQA prefill TP 2 -> decode TP 1 ........ TestRoomsE2EGQAPrefillTP2DecodeTP1
//   - GQA prefill TP 1 -> decode TP 4 ........ TestRoomsE2EGQAPrefillTP1DecodeTP4
//   - MLA prefill TP 4 -> decode TP 1 ........ TestRoomsE2EMLAPrefillTP4DecodeTP1
//   - DP 4 with each resolution rule ......... TestRoomsE2EPrefillDPRules
//   - 1,000 concurrent rooms, 4 prefill ranks  TestRoomsE2EThousandConcurrentRooms
//   - prefill never registers ................ TestRoomsE2EPrefillNeverRegisters
//   - prefill dies mid-transfer .............. TestRoomsE2EPrefillDiesMidTransfer
//   - a chunk fails .......................... TestRoomsE2EChunkFails
//   - abort in each state .................... TestRoomsE2EAbortInEveryState
//   - destination never claimed .............. TestRoomsE2EDestinationNeverClaimed
//   - AlreadyExists, NotFound, InvalidArgument,
//     FailedPrecondition (page size, dtype,
//     follow_bootstrap_room conflict) ........ TestRoomsE2ERequestErrors
//   - Unauthenticated ........................ TestRoomsE2EAuthToken
//   - "Done when": reflection ................ TestRoomsE2EReflection
//
// Each test names the SGLang transitions (T1–T23, docs/sglang-transitions.md) it
// covers and asserts them on the room's timeline (Transition.sglang).
//
// Timing: nothing sleeps. Tests wait on events (WatchRoom through WaitRoom,
// AwaitDestination streams, the heartbeat loop's return) under context
// deadlines. The daemon's own time-based behaviour (heartbeat loss, claim
// timeout, the registration retry budget) runs on its real clock with short
// configured values; the fake-clock versions live in kvmanager's synctest
// suite.

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestRoomsE2EPrefillNeverRegisters: a room whose prefill never (fully)
// registers fails after the configured number of checks with SGLang's
// message. SGLang transitions: T1, T3.
func TestRoomsE2EPrefillNeverRegisters(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, `timeouts:
  prefill_info_attempts: 3
  prefill_info_backoff: 20ms
  prefill_info_backoff_max: 40ms
`, "")
		ctx := roomsCtx(t)

		t.Run("unknown instance", func(t *testing.T) {
			const addr, room = "10.0.3.1:8998", 5001
			resp, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300))
			if err != nil {
				t.Fatal(err)
			}
			if r := resp.GetRoom(); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL || r.GetPoll() != pb.KVPoll_KV_POLL_BOOTSTRAPPING {
				t.Errorf("opened room: phase %s poll %s, want WAITING_PREFILL / BOOTSTRAPPING", r.GetPhase(), r.GetPoll())
			}
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_PREFILL_UNAVAILABLE)
			if want := "Could not fetch prefill parallel info from 10.0.3.1:8998 after 3 attempts"; r.GetFailure().GetMessage() != want {
				t.Errorf("failure %q, want %q", r.GetFailure().GetMessage(), want)
			}
			roomsAssertSGLang(t, r, "T1", "T3")
			d.assertDrained(t)
		})
		t.Run("half registered", func(t *testing.T) {
			const addr, room = "10.0.3.2:8998", 5002
			d.startRanks(t, roomsReg(addr, 2, 0, 1, 0, ""))
			// The decode engine's one call: OpenAndWait returns the failure.
			_, err := d.c.OpenAndWait(ctx, roomsOpen(addr, room, 300))
			roomsWantFailed(t, err, room, pb.FailureCode_FAILURE_CODE_PREFILL_UNAVAILABLE)
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_PREFILL_UNAVAILABLE)
			if want := "Could not fetch prefill parallel info from 10.0.3.2:8998 after 3 attempts (Prefill server not fully registered yet (1 workers registered).)"; r.GetFailure().GetMessage() != want {
				t.Errorf("failure %q, want %q", r.GetFailure().GetMessage(), want)
			}
			roomsAssertSGLang(t, r, "T1", "T3")
			d.assertDrained(t)
		})
	})
}

// TestRoomsE2EPrefillDiesMidTransfer: the prefill's heartbeat loop stops
// while one room is mid-transfer and another is admitted; after interval ×
// max_failures (floored at 2 s × 1) the daemon declares the instance lost and
// fails both with SGLang's message; a room that already succeeded is not
// affected. SGLang transitions: T1, T4, T11, T15.
func TestRoomsE2EPrefillDiesMidTransfer(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, `timeouts:
  heartbeat_interval: 500ms
  heartbeat_max_failures: 0
`, "")
		ctx := roomsCtx(t)
		const addr = "10.0.4.1:8998"
		// Beat well inside the 2 s budget, so that only the stop below kills it.
		d.beatEvery = 200 * time.Millisecond
		ranks := d.startRanks(t, roomsInstance(addr, 1, 1, "", nil)...)
		p := ranks[0]
		if iv, mf := p.reg.GetHeartbeatInterval().AsDuration(), p.reg.GetHeartbeatMaxFailures(); iv != 2*time.Second || mf != 1 {
			t.Fatalf("registration: heartbeat every %s, %d failures; want SGLang's floors 2s and 1", iv, mf)
		}

		done, _ := d.handOff(t, ctx, roomsOpen(addr, 6001, 200), ranks, 0)

		const mid, admitted = 6002, 6003
		if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, mid, 256)); err != nil {
			t.Fatal(err)
		}
		s, dest := roomsAwaitDestination(t, ctx, p, mid)
		if _, err := roomsTransfer(ctx, p, dest, 0, 0, 1, false); err != nil {
			t.Fatalf("chunk 0: %v", err)
		}
		if _, err := d.c.WaitRoom(ctx, mid, pb.RoomPhase_ROOM_PHASE_TRANSFERRING); err != nil {
			t.Fatal(err)
		}
		if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, admitted, 256)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.c.WaitRoom(ctx, admitted, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
			t.Fatal(err)
		}

		p.stop() // the prefill dies: no more heartbeats
		stopped := time.Now()
		// SGLang's message, then the silent rank and how long it was silent
		// (wall time here: at least 2 s, plus up to a check interval and load).
		want := regexp.MustCompile(`^Lost connection with prefill instance \(bootstrap_addr: 10\.0\.4\.1:8998\), 2 requests affected; silent ranks \(no heartbeat within 1 × 2s\): dp 0 cp 0 tp 0 pp 0 for ([2-9]|\d\d+)(\.\d)?s$`)
		for _, room := range []uint64{mid, admitted} {
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_PREFILL_LOST)
			if !want.MatchString(r.GetFailure().GetMessage()) {
				t.Errorf("room %d failure %q, want %s", room, r.GetFailure().GetMessage(), want)
			}
			roomsAssertSGLang(t, r, "T1", "T4", "T11", "T15")
		}
		t.Logf("declared lost %s after the last heartbeat loop stopped (interval 2s × 1 failure, checked every 2s)", time.Since(stopped).Round(10*time.Millisecond))
		_, err := s.Next()
		if tr == overUnary {
			// The AwaitDestination stream outlives the heartbeats: it hears
			// the loss.
			if rf := roomsWantFailed(t, err, mid, pb.FailureCode_FAILURE_CODE_PREFILL_LOST); !want.MatchString(rf.Message) {
				t.Errorf("the claim stream's failure %q, want %s", rf.Message, want)
			}
			_, err = roomsTransfer(ctx, p, dest, 1, 1, 1, false)
		} else {
			// The claim lived on the dead rank's session (the session is the
			// heartbeat): it ended with it, before the loss.
			if err == nil || errors.Is(err, client.ErrRoomFailed) {
				t.Errorf("the claim on the closed session: %v, want the session's end", err)
			}
			// A new session of the dead rank is refused as its Heartbeat is
			// (below); its chunk, sent without a session (the unary
			// Transfer), is refused as on unary.
			_, serr := p.openSession(ctx)
			roomsWantCode(t, "PrefillSession of the dead instance", serr, codes.NotFound, client.ErrNotFound, "register again")
			_, err = p.Transfer(ctx, &pb.TransferRequest{Room: mid, ChunkIndex: 1, PageOffset: 1, NumPages: 1})
		}
		roomsWantCode(t, "Transfer after the loss", err, codes.FailedPrecondition, client.ErrFailedPrecondition, "Lost connection")
		_, err = p.Heartbeat(ctx)
		roomsWantCode(t, "Heartbeat of the dead instance", err, codes.NotFound, client.ErrNotFound, "register again")
		st, err := d.c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ps := range st.GetPrefills() {
			t.Errorf("the dead instance is still known: %v", ps)
		}
		// The room that had succeeded keeps its KV (SGLang fails non-Success rooms only).
		if r := d.getRoom(t, ctx, done.GetRoom()); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			t.Errorf("succeeded room %d after the loss: phase %s", done.GetRoom(), r.GetPhase())
		}
		d.release(t, ctx, done)
		d.assertDrained(t)
	})
}

// TestRoomsE2EChunkFails: a chunk moved by the daemon's engine fails
// (transfer.sim.failure_probability 1), and a chunk the prefill moved itself
// is reported failed (ReportRoom with a failing Move). The room fails with
// the reason; the prefill sees ErrRoomFailed (and ErrAborted from Transfer).
// SGLang transitions: T1, T4, T11, T13/T18.
func TestRoomsE2EChunkFails(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "transfer:\n  sim:\n    failure_probability: 1\n    seed: 1\n", "")
		ctx := roomsCtx(t)

		t.Run("engine", func(t *testing.T) {
			const addr, room = "10.0.5.1:8998", 7001
			ranks := d.startRanks(t, roomsInstance(addr, 1, 1, "", nil)...)
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300)); err != nil {
				t.Fatal(err)
			}
			_, err := ranks[0].SendRoom(ctx, room, client.SendOptions{ChunkPages: 2})
			rf := roomsWantFailed(t, err, room, pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED)
			if !errors.Is(err, client.ErrAborted) || status.Code(err) != codes.Aborted {
				t.Errorf("SendRoom error %v: want it to match ErrAborted (the Transfer that revealed it)", err)
			}
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED)
			for _, s := range []string{"KVTransferError(bootstrap_room=7001)", "chunk 0", "injected failure (transfer.sim.failure_probability = 1)"} {
				if !strings.Contains(r.GetFailure().GetMessage(), s) {
					t.Errorf("failure %q does not contain %q", r.GetFailure().GetMessage(), s)
				}
			}
			if rf.Message != r.GetFailure().GetMessage() {
				t.Errorf("prefill saw %q, the room says %q", rf.Message, r.GetFailure().GetMessage())
			}
			roomsAssertSGLang(t, r, "T1", "T4", "T11", "T13", "T18")
			d.assertDrained(t)
		})
		t.Run("reported by the prefill", func(t *testing.T) {
			const addr, room = "10.0.5.2:8998", 7002
			ranks := d.startRanks(t, roomsInstance(addr, 2, 1, "", nil)...)
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300)); err != nil {
				t.Fatal(err)
			}
			moveErr := errors.New("mooncake: batch transfer to decode failed: connection reset")
			var err1 error
			var wg sync.WaitGroup
			wg.Go(func() { _, err1 = ranks[1].ReportRoom(ctx, room, client.SendOptions{}) })
			_, err0 := ranks[0].ReportRoom(ctx, room, client.SendOptions{ChunkPages: 2, Move: func(_ context.Context, ch client.Chunk) (uint64, error) {
				if ch.Index == 1 {
					return 0, moveErr
				}
				return ch.Bytes(), nil
			}})
			wg.Wait()
			rf := roomsWantFailed(t, err0, room, pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED)
			if !errors.Is(err0, moveErr) {
				t.Errorf("rank 0's error %v does not wrap its Move error", err0)
			}
			roomsWantFailed(t, err1, room, pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED)
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED)
			want := "KVTransferError(bootstrap_room=7002): " + moveErr.Error()
			if msg := r.GetFailure().GetMessage(); !strings.HasPrefix(msg, want) || !strings.Contains(msg, "chunk 1") || rf.Message != msg {
				t.Errorf("failure %q (prefill saw %q), want it to start with %q and name chunk 1", msg, rf.Message, want)
			}
			roomsAssertSGLang(t, r, "T1", "T4", "T11", "T13", "T18")
			d.assertDrained(t)
		})
	})
}

// TestRoomsE2EAbortInEveryState aborts a room in each phase it can be in:
// waiting for the prefill, resolving its DP rank, queued (no request slot:
// request_slots 1), admitted, claimed, transferring, succeeded and held for
// rebootstrap. Each abort fails the room with "Aborted by AbortReq." (or the
// given reason), tells the prefill ranks, and returns every resource; a
// second abort is a no-op. A room aborted while its prefill writes by
// itself (ReportTransfer) keeps its pages draining until the rank's
// AckRoomEnd. SGLang transitions: T1, T4, T11, T16, T21.
func TestRoomsE2EAbortInEveryState(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "kv_pool:\n  request_slots: 1\n  pre_alloc_slots: 0\n", "")
		ctx := roomsCtx(t)
		const (
			addr    = "10.0.6.1:8998" // TP 1, DP 1
			rrAddr  = "10.0.6.2:8998" // DP 2, round_robin
			absent  = "10.0.6.3:8998" // never registers
			aborted = "Aborted by AbortReq."
		)
		p := d.startRanks(t, roomsInstance(addr, 1, 1, "", nil)...)[0]
		d.startRanks(t, roomsInstance(rrAddr, 1, 2, "round_robin", nil)...)

		// abort aborts room, which must be in phase, and checks the outcome.
		abort := func(t *testing.T, room uint64, phase pb.RoomPhase, reason string) *pb.Room {
			t.Helper()
			if r := d.getRoom(t, ctx, room); r.GetPhase() != phase {
				t.Fatalf("room %d is %s before the abort, want %s", room, r.GetPhase(), phase)
			}
			resp, err := d.c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: reason})
			if err != nil {
				t.Fatalf("AbortRoom %d: %v", room, err)
			}
			want := aborted
			if reason != "" {
				want = reason
			}
			if resp.GetAlreadyTerminal() || resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || resp.GetRoom().GetFailure().GetMessage() != want {
				t.Errorf("AbortRoom %d = %v, want FAILED with %q", room, resp, want)
			}
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_ABORTED)
			roomsAssertSGLang(t, r, "T1", "T16")
			again, err := d.c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room})
			if err != nil || !again.GetAlreadyTerminal() {
				t.Errorf("second AbortRoom %d = %v, %v; want already_terminal", room, again, err)
			}
			return r
		}

		t.Run("waiting for prefill", func(t *testing.T) {
			if _, err := d.c.OpenRoom(ctx, roomsOpen(absent, 8001, 300)); err != nil {
				t.Fatal(err)
			}
			abort(t, 8001, pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, "")
			d.assertDrained(t)
		})
		t.Run("resolving DP rank", func(t *testing.T) {
			if _, err := d.c.OpenRoom(ctx, roomsOpen(rrAddr, 8002, 300)); err != nil {
				t.Fatal(err)
			}
			abort(t, 8002, pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK, "client disconnected")
			d.assertDrained(t)
		})
		t.Run("admitted", func(t *testing.T) {
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, 8003, 300)); err != nil {
				t.Fatal(err)
			}
			if _, err := d.c.WaitRoom(ctx, 8003, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
				t.Fatal(err)
			}
			if sh := d.shard(t, ctx, 0); sh.GetAdmitted() != 1 || sh.GetPagesFree() == sh.GetPagesTotal() {
				t.Fatalf("shard while admitted: %v", sh)
			}
			r := abort(t, 8003, pb.RoomPhase_ROOM_PHASE_ADMITTED, "")
			roomsAssertSGLang(t, r, "T4", "T11")
			d.assertDrained(t)
		})
		t.Run("queued and claimed", func(t *testing.T) {
			const claimed, queued = 8004, 8005
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, claimed, 300)); err != nil {
				t.Fatal(err)
			}
			s, _ := roomsAwaitDestination(t, ctx, p, claimed)
			if _, err := d.c.WaitRoom(ctx, claimed, pb.RoomPhase_ROOM_PHASE_CLAIMED); err != nil {
				t.Fatal(err)
			}
			// The only request slot is taken: the next room queues.
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, queued, 300)); err != nil {
				t.Fatal(err)
			}
			if sh := d.shard(t, ctx, 0); sh.GetQueued() != 1 || sh.GetClaimed() != 1 {
				t.Fatalf("shard: %d queued, %d claimed; want 1 and 1", sh.GetQueued(), sh.GetClaimed())
			}
			abort(t, queued, pb.RoomPhase_ROOM_PHASE_QUEUED, "")
			abort(t, claimed, pb.RoomPhase_ROOM_PHASE_CLAIMED, "")
			_, err := s.Next()
			if rf := roomsWantFailed(t, err, claimed, pb.FailureCode_FAILURE_CODE_ABORTED); rf.Message != aborted {
				t.Errorf("the prefill's stream says %q, want %q", rf.Message, aborted)
			}
			d.assertDrained(t)
		})
		t.Run("transferring", func(t *testing.T) {
			const room = 8006
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 256)); err != nil {
				t.Fatal(err)
			}
			s, dest := roomsAwaitDestination(t, ctx, p, room)
			if resp, err := roomsTransfer(ctx, p, dest, 0, 0, 2, false); err != nil || resp.GetPoll() != pb.KVPoll_KV_POLL_TRANSFERRING {
				t.Fatalf("chunk 0 = %v, %v", resp, err)
			}
			abort(t, room, pb.RoomPhase_ROOM_PHASE_TRANSFERRING, "")
			_, err := s.Next()
			roomsWantFailed(t, err, room, pb.FailureCode_FAILURE_CODE_ABORTED)
			_, err = roomsTransfer(ctx, p, dest, 1, 2, 2, true)
			roomsWantCode(t, "Transfer after the abort", err, codes.FailedPrecondition, client.ErrFailedPrecondition, aborted)
			d.assertDrained(t)
		})
		t.Run("succeeded", func(t *testing.T) {
			r, _ := d.handOff(t, ctx, roomsOpen(addr, 8007, 300), []*roomsRank{p}, 0)
			if sh := d.shard(t, ctx, 0); sh.GetRunning() != 1 {
				t.Fatalf("shard: %d running, want 1", sh.GetRunning())
			}
			abort(t, r.GetRoom(), pb.RoomPhase_ROOM_PHASE_SUCCEEDED, "")
			_, err := d.c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: r.GetRoom()})
			roomsWantCode(t, "ReleaseRoom of the aborted room", err, codes.FailedPrecondition, client.ErrFailedPrecondition, "failed")
			d.assertDrained(t)
		})
		t.Run("held for rebootstrap", func(t *testing.T) {
			r, _ := d.handOff(t, ctx, roomsOpen(addr, 8008, 300), []*roomsRank{p}, 0)
			resp, err := d.c.RetractRoom(ctx, &pb.RetractRoomRequest{Room: r.GetRoom(), Mode: pb.RetractMode_RETRACT_MODE_REBOOTSTRAP})
			if err != nil || resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_HELD {
				t.Fatalf("RetractRoom(REBOOTSTRAP) = %v, %v; want HELD", resp, err)
			}
			held := abort(t, r.GetRoom(), pb.RoomPhase_ROOM_PHASE_HELD, "")
			roomsAssertSGLang(t, held, "T21")
			d.assertDrained(t)
		})
		// Last: once this instance reported a chunk, the daemon knows it
		// writes by itself (the subtests above rely on its engine's rule).
		t.Run("transferring, the prefill writing by itself", func(t *testing.T) {
			// The rank moves the KV itself and reports its chunks: aborted
			// mid-transfer, it may still be writing, so the room's pages
			// drain (held, in no budget) until it acknowledges the room's
			// end, and only then come back.
			const room = 8009
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 256)); err != nil {
				t.Fatal(err)
			}
			s, dest := roomsAwaitDestination(t, ctx, p, room)
			ch := client.Chunk{Destination: dest, Index: 0, PageOffset: 0, NumPages: 2}
			if _, err := p.report(ctx, &pb.ReportTransferRequest{Room: room, Rank: p.Rank(), NumPages: 2, Success: true, Bytes: ch.Bytes()}); err != nil {
				t.Fatalf("report of chunk 0: %v", err)
			}
			abort(t, room, pb.RoomPhase_ROOM_PHASE_TRANSFERRING, "")
			_, err := s.Next()
			if rf := roomsWantFailed(t, err, room, pb.FailureCode_FAILURE_CODE_ABORTED); !rf.AckRequired {
				t.Errorf("the claim's failure %v does not ask for an acknowledgement", rf)
			}
			if sh := d.shard(t, ctx, 0); sh.GetDrainingRooms() != 1 || sh.GetDrainingPages() != uint64(len(dest.GetPageIndices())) || sh.GetPagesFree() == sh.GetPagesTotal() {
				t.Errorf("shard before the acknowledgement: %d rooms, %d pages draining, %d/%d pages free; want the room's %d pages draining",
					sh.GetDrainingRooms(), sh.GetDrainingPages(), sh.GetPagesFree(), sh.GetPagesTotal(), len(dest.GetPageIndices()))
			}
			resp, err := p.ack(ctx, dest)
			if err != nil || !resp.GetOwed() || resp.GetRemaining() != 0 || !resp.GetReleased() {
				t.Errorf("AckRoomEnd = %v, %v; want owed, the last one, released", resp, err)
			}
			again, err := p.ack(ctx, dest)
			if err != nil || again.GetOwed() || again.GetReleased() {
				t.Errorf("second AckRoomEnd = %v, %v; want a no-op", again, err)
			}
			d.assertDrained(t)
		})
	})
}

// TestRoomsE2EDestinationNeverClaimed: an admitted destination that not every
// required prefill rank claims within admission.claim_timeout is released
// and the room fails; a rank that did claim sees the failure. decodeplane
// adds this deadline (SGLang has none before the destination is sent: it
// would hold the pages until the 300 s bootstrap/waiting timeouts).
// SGLang transitions: T1, T4, T11 (then decodeplane's claim timeout).
func TestRoomsE2EDestinationNeverClaimed(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "admission:\n  claim_timeout: 300ms\n", "")
		ctx := roomsCtx(t)
		const addr = "10.0.7.1:8998"
		ranks := d.startRanks(t, roomsInstance(addr, 2, 1, "", nil)...)

		t.Run("no rank claims", func(t *testing.T) {
			const room = 9001
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300)); err != nil {
				t.Fatal(err)
			}
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_CLAIM_TIMEOUT)
			for _, s := range []string{"Request 9001 timed out after", "KVPoll.WaitingForInput", "admission.claim_timeout"} {
				if !strings.Contains(r.GetFailure().GetMessage(), s) {
					t.Errorf("failure %q does not contain %q", r.GetFailure().GetMessage(), s)
				}
			}
			roomsAssertSGLang(t, r, "T1", "T4", "T11")
			d.assertDrained(t)
		})
		t.Run("one of two ranks claims", func(t *testing.T) {
			const room = 9002
			if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300)); err != nil {
				t.Fatal(err)
			}
			s, _ := roomsAwaitDestination(t, ctx, ranks[0], room)
			_, err := s.Next()
			rf := roomsWantFailed(t, err, room, pb.FailureCode_FAILURE_CODE_CLAIM_TIMEOUT)
			r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_CLAIM_TIMEOUT)
			if rf.Message != r.GetFailure().GetMessage() || !strings.Contains(rf.Message, "admission.claim_timeout") {
				t.Errorf("claimer saw %q, the room says %q", rf.Message, r.GetFailure().GetMessage())
			}
			// The rank that never claimed learns it when it finally asks.
			_, err = ranks[1].SendRoom(ctx, room, client.SendOptions{})
			roomsWantFailed(t, err, room, pb.FailureCode_FAILURE_CODE_CLAIM_TIMEOUT)
			d.assertDrained(t)
		})
	})
}
