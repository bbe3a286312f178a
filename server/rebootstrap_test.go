package server_test

// Rebootstrap end to end at the wire (SGLang T21–T23) and the deadlines of
// retracted and held rooms (timeouts.retracted, timeouts.held).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// rbServer is a whole daemon with a 2-DP-rank prefill registered at addr
// (load_balance_method round_robin: no follow_bootstrap_room, the router's
// hint decides), its HTTP server on httpPort.
func rbServer(t *testing.T, ctx context.Context, addr string, httpPort int, cfg func(*config.Config)) *stgServer {
	t.Helper()
	dec := stgDecodeConfig(1)
	dec.Staging.Enabled = false
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
		if cfg != nil {
			cfg(c)
		}
	}})
	conn := d.Conn(t)
	s := &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn), stg: pb.NewStagingClient(conn)}
	for dp := range 2 {
		if _, err := s.boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: fmt.Sprintf("10.0.0.1:%d", 9000+dp),
			Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 2, AttnDpRank: uint32(dp), PpSize: 1}, PageSize: 16, KvCacheDtype: "bf16",
			LoadBalanceMethod: "round_robin", PrefillHttpPort: uint32(httpPort), InstanceId: "p-1"}); err != nil {
			t.Fatalf("RegisterPrefill dp %d: %v", dp, err)
		}
	}
	return s
}

// rbRun opens room on prefill DP rank dp (the router's hint) and plays the
// prefill rank: it claims the destination on dp and reports its KV written
// (one chunk, the room marker); it returns the destination.
func rbRun(t *testing.T, ctx context.Context, s *stgServer, addr string, room uint64, dp uint32) *pb.Destination {
	t.Helper()
	if _, err := s.room.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprintf("rid-%d", room), BootstrapAddr: addr, Room: room, PrefillDpRank: &dp, PromptLen: 64, MaxNewTokens: 4}); err != nil {
		t.Fatalf("OpenRoom(%d) = %v", room, err)
	}
	return rbSend(t, ctx, s, addr, room, dp)
}

// rbSend claims room's current destination from prefill DP rank dp and
// reports all of its KV landed; the room must then be SUCCEEDED.
func rbSend(t *testing.T, ctx context.Context, s *stgServer, addr string, room uint64, dp uint32) *pb.Destination {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.room.AwaitDestination(cctx, &pb.AwaitDestinationRequest{Room: room, Rank: &pb.PrefillRank{BootstrapAddr: addr, DpRank: dp}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination(room %d, dp %d) = %v, %v; want a destination", room, dp, ev, err)
	}
	dst := ev.GetDestination()
	n := uint32(len(dst.GetPageIndices()))
	tokens := min(uint64(n)*uint64(dst.GetPageSize()), uint64(dst.GetFillLen()))
	if _, err := s.room.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: room, Rank: &pb.PrefillRank{BootstrapAddr: addr, DpRank: dp}, NumPages: n, Success: true,
		Bytes: tokens*dst.GetTokenBytes() + dst.GetStateBytes(), Attempt: dst.GetAttempt(), Last: true, MetadataRoomMarker: room}); err != nil {
		t.Fatalf("ReportTransfer(room %d, attempt %d) = %v", room, dst.GetAttempt(), err)
	}
	if r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("room %d after its KV = %v, %v; want SUCCEEDED", room, r.GetPhase(), err)
	}
	return dst
}

// The RL weight-update flow: a running room is retracted for rebootstrap
// (held), ContinueGeneration answers with the prefill's /generate and the
// pinned DP rank, the engine (the test) POSTs the recompute there, and the
// prefill (the test's HTTP server) re-claims on that DP rank and sends:
// the room succeeds again, attempt 2, on the same DP rank.
func TestRebootstrapEndToEndAtTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var s *stgServer
	type recompute struct {
		RID           string `json:"rid"`
		BootstrapRoom uint64 `json:"bootstrap_room"`
		DPRank        uint32 `json:"data_parallel_rank"`
	}
	got := make(chan recompute, 1)
	var prefillAddr string
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req recompute
		if r.Method != http.MethodPost || r.URL.Path != "/generate" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "want POST /generate with a JSON body", http.StatusBadRequest)
			return
		}
		got <- req
		w.WriteHeader(http.StatusOK)
	}))
	defer prefill.Close()
	host, portS, _ := net.SplitHostPort(strings.TrimPrefix(prefill.URL, "http://"))
	port, _ := strconv.Atoi(portS)
	prefillAddr = net.JoinHostPort(host, "8998") // the bootstrap address: the same host
	s = rbServer(t, ctx, prefillAddr, port, nil)

	const room = 4 // 4 % 2 = 0: follow_bootstrap_room would pick DP 0; the hint pins DP 1
	first := rbRun(t, ctx, s, prefillAddr, room, 1)
	held, err := s.room.RetractRoom(ctx, &pb.RetractRoomRequest{Room: room, Mode: pb.RetractMode_RETRACT_MODE_REBOOTSTRAP})
	if err != nil || held.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_HELD {
		t.Fatalf("RetractRoom(REBOOTSTRAP) = %v, %v; want HELD", held, err)
	}
	if r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room}); err != nil || !strings.Contains(r.GetWaitingFor(), "ContinueGeneration") || !strings.Contains(r.GetWaitingFor(), "bounded by timeouts.held until ") {
		t.Errorf("held room waits for %q (%v)", r.GetWaitingFor(), err)
	}

	cg, err := s.room.ContinueGeneration(ctx, &pb.ContinueGenerationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantURL := "http://" + net.JoinHostPort(host, portS) + "/generate"
	if len(cg.GetRooms()) != 1 || cg.GetRooms()[0] != room || len(cg.GetResumed()) != 1 {
		t.Fatalf("ContinueGeneration = %v, want room %d resumed", cg, room)
	}
	rs := cg.GetResumed()[0]
	if rs.GetRoom() != room || rs.GetRid() != "rid-4" || rs.GetAttempt() != 2 || rs.GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED ||
		rs.GetPrefillBootstrapAddr() != prefillAddr || rs.GetPrefillHttpHost() != host || rs.GetPrefillHttpPort() != uint32(port) ||
		rs.GetGenerateUrl() != wantURL || rs.GetPrefillDpRank() != 1 {
		t.Fatalf("resumed = %v; want room 4, rid-4, attempt 2, ADMITTED, %s, %s, DP rank 1", rs, prefillAddr, wantURL)
	}
	r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room})
	if err != nil || !strings.Contains(r.GetWaitingFor(), "the decode engine's recompute request (POST "+wantURL+", pinned to prefill DP rank 1") {
		t.Fatalf("rebootstrapped room waits for %q (%v)", r.GetWaitingFor(), err)
	}

	// The engine: POST the recompute to the URL and rank it was given.
	body, _ := json.Marshal(recompute{RID: rs.GetRid(), BootstrapRoom: rs.GetRoom(), DPRank: uint32(rs.GetPrefillDpRank())})
	resp, err := http.Post(rs.GetGenerateUrl(), "application/json", strings.NewReader(string(body)))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s = %v, %v", rs.GetGenerateUrl(), resp, err)
	}
	resp.Body.Close()
	req := <-got
	// The prefill: a claim from any other DP rank is refused, then it
	// re-claims on the pinned one and sends.
	other := uint32(1 - req.DPRank)
	st, err := s.room.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: req.BootstrapRoom, Rank: &pb.PrefillRank{BootstrapAddr: prefillAddr, DpRank: other}})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("claim from DP rank %d = %v, want InvalidArgument", other, err)
	}
	second := rbSend(t, ctx, s, prefillAddr, req.BootstrapRoom, req.DPRank)
	if second.GetAttempt() != 2 || first.GetAttempt() != 1 {
		t.Errorf("attempts %d then %d, want 1 then 2", first.GetAttempt(), second.GetAttempt())
	}
	r, err = s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room})
	if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || r.GetAttempt() != 2 || r.GetPrefillDpRank() != 1 {
		t.Fatalf("room after the recompute = %v %v attempt %d dp %d; want SUCCEEDED, attempt 2, DP rank 1", r.GetPhase(), err, r.GetAttempt(), r.GetPrefillDpRank())
	}
	if _, err := s.room.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
		t.Fatal(err)
	}
}

// A held room with no ContinueGeneration fails at timeouts.held and a
// retracted room that never resumes (the other running room's engine sends
// no ReportRunning) at timeouts.retracted, with FAILURE_CODE_RETRACT_TIMEOUT
// and a message naming the setting, on WatchRoom and GetRoom.
func TestParkedDeadlinesAtTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const addr = "10.0.0.1:8998"
	s := rbServer(t, ctx, addr, 30000, func(c *config.Config) {
		c.Timeouts.Held = 150 * time.Millisecond
		c.Timeouts.Retracted = 250 * time.Millisecond
	})
	for _, room := range []uint64{1, 2, 3} {
		rbRun(t, ctx, s, addr, room, 0)
	}
	for room, mode := range map[uint64]pb.RetractMode{1: pb.RetractMode_RETRACT_MODE_REBOOTSTRAP, 2: pb.RetractMode_RETRACT_MODE_RETRACT} {
		if _, err := s.room.RetractRoom(ctx, &pb.RetractRoomRequest{Room: room, Mode: mode}); err != nil {
			t.Fatalf("RetractRoom(%d, %s) = %v", room, mode, err)
		}
	}
	for room, want := range map[uint64]string{
		1: "Request 1 was held for rebootstrap (REBOOTSTRAP) and no ContinueGeneration came within timeouts.held (",
		2: "Request 2 was retracted (RETRACT) and not resumed: its shard never had room for it again within timeouts.retracted (",
	} {
		w, err := s.room.WatchRoom(ctx, &pb.WatchRoomRequest{Room: room})
		if err != nil {
			t.Fatal(err)
		}
		var last *pb.RoomEvent
		for last == nil || !last.GetTerminal() {
			if last, err = w.Recv(); err != nil {
				t.Fatalf("WatchRoom(%d): %v", room, err)
			}
		}
		f := last.GetRoom().GetFailure()
		if last.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || f.GetCode() != pb.FailureCode_FAILURE_CODE_RETRACT_TIMEOUT || !strings.HasPrefix(f.GetMessage(), want) {
			t.Errorf("room %d ended %s with %v; want FAILED, RETRACT_TIMEOUT, %q...", room, last.GetRoom().GetPhase(), f, want)
		}
	}
	if r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: 3}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("room 3 = %v, %v; want still SUCCEEDED", r.GetPhase(), err)
	}
	if cg, err := s.room.ContinueGeneration(ctx, &pb.ContinueGenerationRequest{}); err != nil || len(cg.GetRooms()) != 0 || len(cg.GetResumed()) != 0 {
		t.Errorf("ContinueGeneration after the held room failed = %v, %v; want nothing", cg, err)
	}
}
