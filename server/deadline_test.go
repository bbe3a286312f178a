package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/internal/testing/sessiontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestDeadlineAtTheWire runs a whole daemon (bufconn) in a synctest bubble:
// rooms opened with a 2 s timeout — with the unary OpenRoom and with the
// EngineSession's open op — whose registered prefill never claims them
// fail at 2 s (their watchers get the failure then, not before), with
// FAILURE_CODE_DEADLINE_EXCEEDED and a message naming the phase; GetRoom
// shows the budget, its deadline and the time each phase took.
func TestDeadlineAtTheWire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := daemontest.New(daemontest.Options{Config: func(c *config.Config) { c.Timeouts.HeartbeatInterval = time.Hour }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Stop() })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		conn := d.Conn(t)
		rooms := pb.NewRoomsClient(conn)
		if _, err := pb.NewBootstrapClient(conn).RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: "p1:1", RankEndpoint: "10.0.0.1:9000",
			Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16"}); err != nil {
			t.Fatal(err)
		}
		req := func(room uint64) *pb.OpenRoomRequest {
			return &pb.OpenRoomRequest{Rid: fmt.Sprint("r-", room), BootstrapAddr: "p1:1", Room: room, PromptLen: 100, MaxNewTokens: 4,
				Timeout: durationpb.New(2 * time.Second)}
		}
		start := time.Now()
		if _, err := rooms.OpenRoom(ctx, req(7)); err != nil {
			t.Fatal(err)
		}
		watch, err := rooms.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 7})
		if err != nil {
			t.Fatal(err)
		}
		eng, err := sessiontest.OpenEngine(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		if _, err := eng.Open(ctx, req(8)); err != nil {
			t.Fatal(err)
		}
		// Room 7's watch: its events until it fails.
		var failedAt time.Time
		var failure *pb.Failure
		for {
			ev, err := watch.Recv()
			if err != nil {
				t.Fatalf("watch of room 7 ended before its failure: %v", err)
			}
			if ev.GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED {
				failedAt, failure = time.Now(), ev.GetRoom().GetFailure()
				break
			}
		}
		if took := failedAt.Sub(start); took != 2*time.Second {
			t.Errorf("room 7 failed %s after its open, want 2s", took)
		}
		const phase = "in KVPoll.WaitingForInput, phase admitted: the destination was not claimed by prefill ranks cp 0 tp 0 pp 0 of p1:1"
		if failure.GetCode() != pb.FailureCode_FAILURE_CODE_DEADLINE_EXCEEDED || !strings.Contains(failure.GetMessage(), phase) ||
			!strings.HasSuffix(failure.GetMessage(), "time per phase: waiting_prefill 0s, queued 0s, admitted 2s") {
			t.Errorf("room 7 failure %v: %q, want DEADLINE_EXCEEDED naming the phase (%q) and the time per phase", failure.GetCode(), failure.GetMessage(), phase)
		}
		// Room 8's events on the session: failed at 2 s too.
		for {
			ev, err := eng.Next()
			if err != nil {
				t.Fatalf("session ended before room 8 failed: %v", err)
			}
			if r := ev.GetEvent().GetRoom(); r.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED {
				if r.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_DEADLINE_EXCEEDED || !strings.Contains(r.GetFailure().GetMessage(), "phase admitted") {
					t.Errorf("room 8 (session open) failure %v", r.GetFailure())
				}
				if took := time.Since(start); took != 2*time.Second {
					t.Errorf("room 8 failed %s after its open, want 2s", took)
				}
				break
			}
		}
		got, err := rooms.GetRoom(ctx, &pb.GetRoomRequest{Room: 7})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetTimeout().AsDuration() != 2*time.Second || !got.GetDeadline().AsTime().Equal(got.GetOpenedAt().AsTime().Add(2*time.Second)) {
			t.Errorf("GetRoom timeout %v deadline %v (opened %v)", got.GetTimeout(), got.GetDeadline(), got.GetOpenedAt())
		}
		var times []string
		for _, pt := range got.GetPhaseTimes() {
			times = append(times, fmt.Sprintf("%s %s", pt.GetPhase(), pt.GetSpent().AsDuration()))
		}
		if want := "ROOM_PHASE_WAITING_PREFILL 0s, ROOM_PHASE_QUEUED 0s, ROOM_PHASE_ADMITTED 2s"; strings.Join(times, ", ") != want {
			t.Errorf("GetRoom phase_times %q, want %q", strings.Join(times, ", "), want)
		}
	})
}
