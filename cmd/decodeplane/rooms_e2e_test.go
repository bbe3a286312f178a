package main

// End-to-end tests of issue 4 (rooms over gRPC) through the real daemon
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
// Each test names the SGLang transitions (T1–T23 of the decode spec §2.5) it
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
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// roomsTimeout bounds every test's waits; the tests finish far sooner.
const roomsTimeout = 60 * time.Second

// roomsDaemon is one running daemon and a decode-side client for it.
type roomsDaemon struct {
	addr  string
	token string
	c     *client.Client
	// beatEvery, when set, is how often startRanks' heartbeat loops beat
	// (default: half the daemon's interval).
	beatEvery time.Duration
}

// roomsStartDaemon writes cfgYAML to a file, starts the binary with it on a
// free port (metrics off) and waits for health SERVING. token is what the
// clients send (the daemon's token comes from cfgYAML or env). A port taken
// between freeAddr and the daemon's listen is retried with another one.
func roomsStartDaemon(t *testing.T, cfgYAML, token string, env ...string) *roomsDaemon {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "decodeplane.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		p := startDaemon(t, []string{"serve", "--config", cfgPath, "--listen", addr, "--set", "server.metrics_listen="}, e2eEnviron(env...))
		err := roomsWaitServing(t, p, addr)
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("daemon %s output:\n%s", addr, p.stderr.String())
				}
			})
			d := &roomsDaemon{addr: addr, token: token}
			d.c = d.newClient(t, token)
			return d
		}
		out := p.stderr.String()
		if attempt < 3 && strings.Contains(out, "address already in use") {
			continue
		}
		t.Fatalf("the daemon did not serve: %v\nconfig:\n%s\noutput:\n%s", err, cfgYAML, out)
	}
}

// roomsWaitServing watches the daemon's health until SERVING, or returns
// why not (the process exited, or the deadline passed).
func roomsWaitServing(t *testing.T, p *daemonProc, addr string) error {
	t.Helper()
	// Retry the connection every 20ms, not after gRPC's default 1s
	// back-off: the daemon listens a few milliseconds after it starts.
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = 20*time.Millisecond, 200*time.Millisecond
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	serving := make(chan error, 1)
	go func() {
		stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			serving <- err
			return
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				serving <- err
				return
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				serving <- nil
				return
			}
		}
	}()
	select {
	case err := <-serving:
		return err
	case <-p.exited:
		cancel()
		<-serving
		return fmt.Errorf("the daemon exited before serving: %v", p.err)
	}
}

// newClient is a client of the daemon with the given token ("" sends none).
func (d *roomsDaemon) newClient(t *testing.T, token string) *client.Client {
	t.Helper()
	var opts []client.Option
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	c, err := client.New(d.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roomsCtx is the test's deadline for its waits.
func roomsCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), roomsTimeout)
	t.Cleanup(cancel)
	return ctx
}

// roomsReg describes prefill rank (dpRank, tpRank) of an instance at addr with
// attention TP tp and DP dp, the decode side's page size and dtype.
func roomsReg(addr string, tp, tpRank, dp, dpRank uint32, lbMethod string) *pb.RegisterPrefillRequest {
	return &pb.RegisterPrefillRequest{
		BootstrapAddr:     addr,
		RankEndpoint:      fmt.Sprintf("10.1.%d.%d:%d", dpRank, tpRank, 17000+100*dpRank+tpRank),
		Parallel:          &pb.ParallelInfo{AttnTpSize: tp, AttnTpRank: tpRank, AttnDpSize: dp, AttnDpRank: dpRank, PpSize: 1},
		PageSize:          64,
		KvCacheDtype:      "bf16",
		LoadBalanceMethod: lbMethod,
		InstanceId:        "prefill@" + addr,
	}
}

// roomsInstance describes every rank of a prefill instance (DP-major).
func roomsInstance(addr string, tp, dp uint32, lbMethod string, model *pb.ModelFacts) []*pb.RegisterPrefillRequest {
	var out []*pb.RegisterPrefillRequest
	for d := range dp {
		for r := range tp {
			reg := roomsReg(addr, tp, r, dp, d, lbMethod)
			reg.Model = model
			out = append(out, reg)
		}
	}
	return out
}

// roomsRank is a registered prefill rank with its heartbeat loop running.
type roomsRank struct {
	*client.Prefill
	c   *client.Client
	reg *pb.RegisterPrefillResponse
	// stop ends the heartbeat loop and waits for it (idempotent).
	stop func()
}

// startRanks registers each rank (own connection, as separate prefill
// processes have) and runs its heartbeat loop until stop or the test's end.
func (d *roomsDaemon) startRanks(t *testing.T, regs ...*pb.RegisterPrefillRequest) []*roomsRank {
	t.Helper()
	ctx := roomsCtx(t)
	var out []*roomsRank
	for _, reg := range regs {
		c := d.newClient(t, d.token)
		p := c.Prefill(reg, client.HeartbeatEvery(d.beatEvery))
		resp, err := p.Register(ctx)
		if err != nil {
			t.Fatalf("RegisterPrefill %s tp %d dp %d: %v", reg.GetBootstrapAddr(), reg.GetParallel().GetAttnTpRank(), reg.GetParallel().GetAttnDpRank(), err)
		}
		hbCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.RunHeartbeat(hbCtx) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("heartbeat loop of %v ended with %v, want context.Canceled", p.Rank(), err)
				}
			})
		}
		t.Cleanup(stop)
		out = append(out, &roomsRank{Prefill: p, c: c, reg: resp, stop: stop})
	}
	return out
}

// roomsOpen is a room request with the usual lengths.
func roomsOpen(addr string, room uint64, promptLen uint32) *pb.OpenRoomRequest {
	return &pb.OpenRoomRequest{Rid: fmt.Sprintf("rid-%d", room), BootstrapAddr: addr, Room: room, PromptLen: promptLen, MaxNewTokens: 64}
}

// handOff opens req, has every rank deliver the room with SendRoom (chunks
// of chunkPages) and waits for SUCCEEDED. It returns the room (with its
// timeline) and each rank's destination.
func (d *roomsDaemon) handOff(t *testing.T, ctx context.Context, req *pb.OpenRoomRequest, ranks []*roomsRank, chunkPages int) (*pb.Room, []*pb.Destination) {
	t.Helper()
	if _, err := d.c.OpenRoom(ctx, req); err != nil {
		t.Fatalf("OpenRoom %d: %v", req.GetRoom(), err)
	}
	dests := make([]*pb.Destination, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() {
			dests[i], errs[i] = r.SendRoom(ctx, req.GetRoom(), client.SendOptions{ChunkPages: chunkPages, OutputIDs: []int32{42}})
		})
	}
	_, werr := d.c.WaitRoom(ctx, req.GetRoom(), pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("SendRoom %d from %v: %v", req.GetRoom(), ranks[i].Rank(), err)
		}
	}
	if err := errors.Join(append(errs, werr)...); err != nil {
		t.Fatalf("room %d did not succeed: %v", req.GetRoom(), err)
	}
	return d.getRoom(t, ctx, req.GetRoom()), dests
}

func (d *roomsDaemon) getRoom(t *testing.T, ctx context.Context, room uint64) *pb.Room {
	t.Helper()
	r, err := d.c.GetRoom(ctx, &pb.GetRoomRequest{Room: room})
	if err != nil {
		t.Fatalf("GetRoom %d: %v", room, err)
	}
	return r
}

// release hands a succeeded room back and checks every page came back.
func (d *roomsDaemon) release(t *testing.T, ctx context.Context, r *pb.Room) {
	t.Helper()
	resp, err := d.c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: r.GetRoom()})
	if err != nil {
		t.Fatalf("ReleaseRoom %d: %v", r.GetRoom(), err)
	}
	if resp.GetPagesReleased() != r.GetNumPages() || resp.GetAlreadyReleased() {
		t.Errorf("ReleaseRoom %d = %v, want %d pages released", r.GetRoom(), resp, r.GetNumPages())
	}
	if got := d.getRoom(t, ctx, r.GetRoom()); got.GetPhase() != pb.RoomPhase_ROOM_PHASE_RELEASED {
		t.Errorf("room %d after ReleaseRoom: phase %s, want RELEASED", r.GetRoom(), got.GetPhase())
	}
}

// assertDrained checks that no room is live and that every decode DP shard's
// ledger is full again: pages, request slots, metadata slots, state slots.
// ListRooms and GetStatus take the room manager's lock, so they observe
// every release made by a transition the test already saw.
func (d *roomsDaemon) assertDrained(t *testing.T) {
	t.Helper()
	ctx := roomsCtx(t)
	live, err := d.c.ListRooms(ctx, &pb.ListRoomsRequest{LiveOnly: true})
	if err != nil {
		t.Fatalf("ListRooms: %v", err)
	}
	for _, r := range live.GetRooms() {
		t.Errorf("room %d is still live: phase %s", r.GetRoom(), r.GetPhase())
	}
	st, err := d.c.Status(ctx)
	if err != nil {
		t.Fatalf("GetStatus: %v", err)
	}
	if len(st.GetShards()) == 0 {
		t.Fatal("GetStatus lists no decode shard")
	}
	for _, sh := range st.GetShards() {
		busy := sh.GetWaiting() + sh.GetQueued() + sh.GetAdmitted() + sh.GetClaimed() + sh.GetRunning() + sh.GetRetracted() + sh.GetHeld()
		if sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() ||
			sh.GetMetadataSlotsFree() != sh.GetMetadataSlotsTotal() || sh.GetStateSlotsFree() != sh.GetStateSlotsTotal() || busy != 0 {
			t.Errorf("decode shard %d is not full: pages %d/%d, req slots %d/%d, metadata slots %d/%d, state slots %d/%d, %d rooms in the ledger",
				sh.GetDpRank(), sh.GetPagesFree(), sh.GetPagesTotal(), sh.GetReqSlotsFree(), sh.GetReqSlotsTotal(),
				sh.GetMetadataSlotsFree(), sh.GetMetadataSlotsTotal(), sh.GetStateSlotsFree(), sh.GetStateSlotsTotal(), busy)
		}
	}
}

// shard returns decode shard dp's status.
func (d *roomsDaemon) shard(t *testing.T, ctx context.Context, dp uint32) *pb.ShardStatus {
	t.Helper()
	st, err := d.c.Status(ctx)
	if err != nil {
		t.Fatalf("GetStatus: %v", err)
	}
	for _, sh := range st.GetShards() {
		if sh.GetDpRank() == dp {
			return sh
		}
	}
	t.Fatalf("GetStatus has no decode shard %d", dp)
	return nil
}

// layout is the daemon's decode KV layout.
func (d *roomsDaemon) layout(t *testing.T, ctx context.Context) *pb.KVLayout {
	t.Helper()
	st, err := d.c.Status(ctx)
	if err != nil {
		t.Fatalf("GetStatus: %v", err)
	}
	return st.GetLayout()
}

// roomsAssertSGLang checks that the room's timeline went through each SGLang
// transition (a step tagged "T2/T4/T8" covers T2, T4 and T8).
func roomsAssertSGLang(t *testing.T, r *pb.Room, want ...string) {
	t.Helper()
	var seen []string
	for _, tr := range r.GetTransitions() {
		if tr.GetSglang() != "" {
			seen = append(seen, strings.Split(tr.GetSglang(), "/")...)
		}
	}
	for _, w := range want {
		if !slices.Contains(seen, w) {
			t.Errorf("room %d's timeline covers SGLang transitions %v, want %s among them", r.GetRoom(), seen, w)
		}
	}
}

// roomsWantFailed checks that err is room's failure with code, and returns it.
func roomsWantFailed(t *testing.T, err error, room uint64, code pb.FailureCode) *client.RoomFailedError {
	t.Helper()
	var rf *client.RoomFailedError
	if !errors.As(err, &rf) || !errors.Is(err, client.ErrRoomFailed) {
		t.Fatalf("room %d: got %v (%T), want a *client.RoomFailedError", room, err, err)
	}
	if rf.Room != room || rf.Code != code {
		t.Fatalf("room %d: got failure %v, want room %d with %s", room, rf, room, code)
	}
	return rf
}

// waitFailed waits for room's end and checks it failed with code; it returns
// the room with its timeline.
func (d *roomsDaemon) waitFailed(t *testing.T, ctx context.Context, room uint64, code pb.FailureCode) *pb.Room {
	t.Helper()
	_, err := d.c.WaitRoom(ctx, room)
	rf := roomsWantFailed(t, err, room, code)
	r := d.getRoom(t, ctx, room)
	if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || r.GetPoll() != pb.KVPoll_KV_POLL_FAILED || r.GetFailure().GetMessage() != rf.Message {
		t.Errorf("room %d: GetRoom = phase %s poll %s failure %v; the watch said %q", room, r.GetPhase(), r.GetPoll(), r.GetFailure(), rf.Message)
	}
	return r
}

// roomsWantCode checks an RPC error's code, family and message.
func roomsWantCode(t *testing.T, what string, err error, code codes.Code, family error, inMessage ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %s", what, code)
		return
	}
	if status.Code(err) != code || !errors.Is(err, family) {
		t.Errorf("%s: got %v (code %s), want %s", what, err, status.Code(err), code)
		return
	}
	msg := status.Convert(err).Message()
	for _, s := range inMessage {
		if !strings.Contains(msg, s) {
			t.Errorf("%s: message %q does not contain %q", what, msg, s)
		}
	}
}

// roomsAwaitDestination claims room for rank and returns the stream and the
// destination it delivered.
func roomsAwaitDestination(t *testing.T, ctx context.Context, r *roomsRank, room uint64) (*client.DestinationStream, *pb.Destination) {
	t.Helper()
	s, err := r.c.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: r.Rank()})
	if err != nil {
		t.Fatalf("AwaitDestination %d: %v", room, err)
	}
	t.Cleanup(s.Close)
	ev, err := s.Next()
	if err != nil || ev.Destination == nil {
		t.Fatalf("AwaitDestination %d: got %+v, %v; want the destination", room, ev, err)
	}
	return s, ev.Destination
}

// roomsTransfer sends one chunk of dest (pages [off, off+n)) for rank.
func roomsTransfer(ctx context.Context, r *roomsRank, dest *pb.Destination, index, off, n uint32, last bool) (*pb.TransferResponse, error) {
	req := &pb.TransferRequest{Room: dest.GetRoom(), Rank: r.Rank(), ChunkIndex: index, PageOffset: off, NumPages: n, Last: last}
	if last {
		req.Aux = &pb.Aux{RoomMarker: dest.GetRoom()}
	}
	return r.c.Transfer(ctx, req)
}

func roomsPages(promptLen uint32) int { return int((promptLen + 63) / 64) }

// roomsGQAModel are the KV layout facts of the default decode pool (Llama-3-8B
// like: 32 layers, 8 KV heads of 128).
var roomsGQAModel = &pb.ModelFacts{KvPoolKind: "gqa", NumLayers: 32, TotalKvHeads: 8, HeadDim: 128}

// TestRoomsE2EGQAPrefillTP2DecodeTP1: two prefill ranks each own half of the
// KV heads and both write every page of the one decode rank. The room's state
// is the MIN over both ranks: one rank done is not success.
// SGLang transitions: T1, T2/T4/T8, T11, T12/T17.
func TestRoomsE2EGQAPrefillTP2DecodeTP1(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "kv_pool:\n  kind: gqa\n", "")
	ctx := roomsCtx(t)
	const addr = "10.0.0.1:8998"
	ranks := d.startRanks(t, roomsInstance(addr, 2, 1, "", roomsGQAModel)...)
	for i, r := range ranks {
		m := r.reg.GetMapping()
		if m.GetDummy() || m.GetRequiredDstInfoNum() != 1 || !slices.Equal(m.GetServesDecodeTpRanks(), []uint32{0}) {
			t.Errorf("rank %d mapping: %v, want a real source of decode rank 0 with required_dst_info_num 1", i, m)
		}
		if dr := m.GetDecodeRanks(); len(dr) != 1 || !slices.Equal(dr[0].GetTargetTpRanks(), []uint32{0, 1}) || dr[0].GetRequiredPrefillResponseNum() != 2 {
			t.Errorf("rank %d: decode rank mapping %v, want targets [0 1] and 2 required responses", i, dr)
		}
		if got := r.reg.GetRegisteredRanks(); got != uint32(i+1) || r.reg.GetExpectedRanks() != 2 {
			t.Errorf("rank %d: registered %d of %d, want %d of 2", i, got, r.reg.GetExpectedRanks(), i+1)
		}
	}
	layout := d.layout(t, ctx)

	t.Run("MIN over ranks", func(t *testing.T) {
		// Both ranks claim; rank 0 sends everything: the room is
		// TRANSFERRING, not SUCCEEDED, until rank 1 has sent its part too.
		const room, prompt = 3001, 1000
		if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, prompt)); err != nil {
			t.Fatal(err)
		}
		s0, dest0 := roomsAwaitDestination(t, ctx, ranks[0], room)
		s1, dest1 := roomsAwaitDestination(t, ctx, ranks[1], room)
		if _, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_CLAIMED); err != nil {
			t.Fatal(err)
		}
		n := uint32(len(dest0.GetPageIndices()))
		if int(n) != roomsPages(prompt) || dest0.GetFillLen() != prompt || dest0.GetMetadataSlot() < 0 {
			t.Fatalf("destination: %d pages, fill %d, metadata slot %d; want %d pages, fill %d", n, dest0.GetFillLen(), dest0.GetMetadataSlot(), roomsPages(prompt), prompt)
		}
		if !slices.Equal(dest0.GetPageIndices(), dest1.GetPageIndices()) || dest0.GetMetadataSlot() != dest1.GetMetadataSlot() {
			t.Errorf("the two ranks got different pages: %v vs %v", dest0, dest1)
		}
		for i := range uint32(4) {
			resp, err := roomsTransfer(ctx, ranks[0], dest0, i, i*n/4, n/4, i == 3)
			if err != nil {
				t.Fatalf("rank 0 chunk %d: %v", i, err)
			}
			if resp.GetPoll() != pb.KVPoll_KV_POLL_TRANSFERRING {
				t.Errorf("rank 0 chunk %d: poll %s, want TRANSFERRING", i, resp.GetPoll())
			}
		}
		if r := d.getRoom(t, ctx, room); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_TRANSFERRING || r.GetPoll() != pb.KVPoll_KV_POLL_TRANSFERRING || r.GetChunksDone() != 4 {
			t.Fatalf("after rank 0's last chunk: %s/%s with %d chunks, want TRANSFERRING with 4 (rank 1 has sent nothing)", r.GetPhase(), r.GetPoll(), r.GetChunksDone())
		}
		for i := range uint32(2) {
			if _, err := roomsTransfer(ctx, ranks[1], dest1, i, i*n/2, n/2, i == 1); err != nil {
				t.Fatalf("rank 1 chunk %d: %v", i, err)
			}
		}
		for i, s := range []*client.DestinationStream{s0, s1} {
			if ev, err := s.Next(); err != nil || ev.Done == nil || ev.Done.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				t.Fatalf("rank %d's stream after both finished: %+v, %v; want Done(SUCCEEDED)", i, ev, err)
			}
		}
		r := d.getRoom(t, ctx, room)
		if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || r.GetPoll() != pb.KVPoll_KV_POLL_SUCCESS || r.GetChunksDone() != 6 {
			t.Fatalf("room: %s/%s with %d chunks, want SUCCEEDED/SUCCESS with 6", r.GetPhase(), r.GetPoll(), r.GetChunksDone())
		}
		if want := uint64(prompt) * layout.GetTokenBytes(); r.GetBytesTransferred() != want {
			t.Errorf("bytes transferred %d, want %d (fill × token bytes of the decode rank)", r.GetBytesTransferred(), want)
		}
		roomsAssertSGLang(t, r, "T1", "T2", "T4", "T8", "T11", "T12", "T17")
		d.release(t, ctx, r)
		d.assertDrained(t)
	})

	t.Run("both ranks send", func(t *testing.T) {
		const room, prompt = 3002, 777
		r, dests := d.handOff(t, ctx, roomsOpen(addr, room, prompt), ranks, 4)
		for i, dest := range dests {
			want := []*pb.DecodeTarget{{DecodeTpRank: 0, SrcHeadStart: 0, DstHeadStart: uint32(4 * i), NumHeads: 4}}
			if !roomsTargetsEqual(dest.GetTargets(), want) {
				t.Errorf("rank %d targets %v, want %v (half the heads each)", i, dest.GetTargets(), want)
			}
			if dest.GetDummy() || dest.GetRequiredDstInfoNum() != 1 || len(dest.GetPageIndices()) != roomsPages(prompt) {
				t.Errorf("rank %d destination %v", i, dest)
			}
		}
		if want := uint32(2 * ((roomsPages(prompt) + 3) / 4)); r.GetChunksDone() != want {
			t.Errorf("chunks done %d, want %d", r.GetChunksDone(), want)
		}
		if want := uint64(prompt) * layout.GetTokenBytes(); r.GetBytesTransferred() != want {
			t.Errorf("bytes transferred %d, want %d", r.GetBytesTransferred(), want)
		}
		roomsAssertSGLang(t, r, "T1", "T4", "T11", "T12", "T17")
		d.release(t, ctx, r)
		d.assertDrained(t)
	})
}

func roomsTargetsEqual(got, want []*pb.DecodeTarget) bool {
	return slices.EqualFunc(got, want, func(a, b *pb.DecodeTarget) bool { return proto.Equal(a, b) })
}

// TestRoomsE2EGQAPrefillTP1DecodeTP4: one prefill rank serves four decode
// ranks, two of its eight KV heads to each.
// SGLang transitions: T1, T2/T4/T8, T11, T12/T17.
func TestRoomsE2EGQAPrefillTP1DecodeTP4(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "kv_pool:\n  kind: gqa\n  kv_heads: 8\nparallel:\n  attn_tp: 4\n", "")
	ctx := roomsCtx(t)
	const addr = "10.0.0.2:8998"
	ranks := d.startRanks(t, roomsInstance(addr, 1, 1, "", roomsGQAModel)...)
	m := ranks[0].reg.GetMapping()
	if m.GetDummy() || m.GetRequiredDstInfoNum() != 4 || !slices.Equal(m.GetServesDecodeTpRanks(), []uint32{0, 1, 2, 3}) || len(m.GetDecodeRanks()) != 4 {
		t.Fatalf("mapping %v, want one real source for decode ranks 0..3 with required_dst_info_num 4", m)
	}
	for _, dr := range m.GetDecodeRanks() {
		if !slices.Equal(dr.GetTargetTpRanks(), []uint32{0}) || dr.GetRequiredDstInfoNum() != 4 || dr.GetRequiredPrefillResponseNum() != 1 {
			t.Errorf("decode rank %d mapping %v", dr.GetDecodeTpRank(), dr)
		}
	}
	layout := d.layout(t, ctx)
	if layout.GetAttnTpSize() != 4 || layout.GetHeadsPerRank() != 2 {
		t.Fatalf("decode layout %v, want attn TP 4 with 2 heads per rank", layout)
	}

	const room, prompt = 3101, 500
	r, dests := d.handOff(t, ctx, roomsOpen(addr, room, prompt), ranks, 2)
	var want []*pb.DecodeTarget
	for e := range uint32(4) {
		want = append(want, &pb.DecodeTarget{DecodeTpRank: e, SrcHeadStart: 2 * e, DstHeadStart: 0, NumHeads: 2})
	}
	if !roomsTargetsEqual(dests[0].GetTargets(), want) {
		t.Errorf("targets %v, want %v (heads 2e..2e+1 to decode rank e)", dests[0].GetTargets(), want)
	}
	if dests[0].GetRequiredDstInfoNum() != 4 || dests[0].GetDummy() {
		t.Errorf("destination %v, want required_dst_info_num 4", dests[0])
	}
	if want := uint64(prompt) * layout.GetTokenBytes() * 4; r.GetBytesTransferred() != want {
		t.Errorf("bytes transferred %d, want %d (fill × token bytes × 4 decode ranks)", r.GetBytesTransferred(), want)
	}
	roomsAssertSGLang(t, r, "T1", "T2", "T4", "T8", "T11", "T12", "T17")
	d.release(t, ctx, r)
	d.assertDrained(t)
}

// TestRoomsE2EMLAPrefillTP4DecodeTP1: MLA has no heads to split, so one
// prefill rank sends the latent KV and the three others get dummy
// destinations (no pages, no metadata slot) and only wait for the end.
// SGLang transitions: T1, T2/T4/T8, T11, T12/T17.
func TestRoomsE2EMLAPrefillTP4DecodeTP1(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "kv_pool:\n  kind: mla\n  kv_lora_rank: 512\n  qk_rope_head_dim: 64\n", "")
	ctx := roomsCtx(t)
	const addr = "10.0.0.3:8998"
	model := &pb.ModelFacts{KvPoolKind: "mla", NumLayers: 32, KvLoraRank: 512, QkRopeHeadDim: 64}
	ranks := d.startRanks(t, roomsInstance(addr, 4, 1, "", model)...)
	for i, r := range ranks {
		if got, want := r.reg.GetMapping().GetDummy(), i > 0; got != want {
			t.Errorf("rank %d: mapping dummy %v, want %v", i, got, want)
		}
	}
	dr := ranks[0].reg.GetMapping().GetDecodeRanks()
	if len(dr) != 1 || !slices.Equal(dr[0].GetTargetTpRanks(), []uint32{0, 1, 2, 3}) || !slices.Equal(dr[0].GetDummyTpRanks(), []uint32{1, 2, 3}) || dr[0].GetRequiredPrefillResponseNum() != 1 {
		t.Fatalf("decode rank mapping %v, want targets 0..3 with dummies 1..3 and one required response", dr)
	}
	layout := d.layout(t, ctx)
	if !layout.GetIsMla() || layout.GetHeadDim() != 576 {
		t.Fatalf("decode layout %v, want MLA with 576 (512 + 64) dims", layout)
	}

	const room, prompt = 3201, 1000
	r, dests := d.handOff(t, ctx, roomsOpen(addr, room, prompt), ranks, 4)
	if dests[0].GetDummy() || len(dests[0].GetPageIndices()) != roomsPages(prompt) || dests[0].GetMetadataSlot() < 0 ||
		!roomsTargetsEqual(dests[0].GetTargets(), []*pb.DecodeTarget{{DecodeTpRank: 0}}) {
		t.Errorf("rank 0 destination %v, want the real one: %d pages, a metadata slot, target decode rank 0", dests[0], roomsPages(prompt))
	}
	for i, dest := range dests[1:] {
		if !dest.GetDummy() || len(dest.GetPageIndices()) != 0 || dest.GetMetadataSlot() != -1 ||
			!roomsTargetsEqual(dest.GetTargets(), []*pb.DecodeTarget{{DecodeTpRank: 0, Dummy: true}}) {
			t.Errorf("rank %d destination %v, want a dummy (no pages, metadata slot -1, dummy target 0)", i+1, dest)
		}
	}
	if want := uint32((roomsPages(prompt) + 3) / 4); r.GetChunksDone() != want {
		t.Errorf("chunks done %d, want %d (rank 0's only)", r.GetChunksDone(), want)
	}
	if want := uint64(prompt) * layout.GetTokenBytes(); r.GetBytesTransferred() != want {
		t.Errorf("bytes transferred %d, want %d", r.GetBytesTransferred(), want)
	}
	// A dummy rank has nothing to send: a chunk from it is refused.
	_, err := roomsTransfer(ctx, ranks[2], &pb.Destination{Room: room}, 0, 0, 1, true)
	roomsWantCode(t, "Transfer from a dummy rank", err, codes.InvalidArgument, client.ErrInvalidArgument, "rank", "dummy")
	roomsAssertSGLang(t, r, "T1", "T4", "T11", "T12", "T17")
	d.release(t, ctx, r)
	d.assertDrained(t)
}

// TestRoomsE2EPrefillDPRules resolves a room's prefill DP rank with each of
// SGLang's rules (hint, dp_size == 1, room % dp_size under
// follow_bootstrap_room, the BindRoom table), on a decode side with two DP
// shards; only the prefill ranks of the resolved DP group may claim a room.
// SGLang transitions: T1, T2 (each rule), T4, T8, T11, T12/T17.
func TestRoomsE2EPrefillDPRules(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "parallel:\n  dp: 2\n", "")
	ctx := roomsCtx(t)
	const (
		single = "10.0.1.1:8998" // DP 1
		follow = "10.0.1.2:8998" // DP 4, follow_bootstrap_room
		rr     = "10.0.1.3:8998" // DP 4, round_robin: needs a hint or a binding
	)
	singleRanks := d.startRanks(t, roomsInstance(single, 1, 1, "", nil)...)
	followRanks := d.startRanks(t, roomsInstance(follow, 1, 4, "follow_bootstrap_room", nil)...)
	rrRanks := d.startRanks(t, roomsInstance(rr, 1, 4, "round_robin", nil)...)

	// check runs the room through the ranks of dp group dp and checks the
	// rule on the room and in LookupDPRanks (with the same hints).
	check := func(t *testing.T, addr string, ranks []*roomsRank, req *pb.OpenRoomRequest, dp uint32, rule pb.DPRankRule) {
		t.Helper()
		var hints []*pb.RoomHint
		if req.PrefillDpRank != nil {
			hints = []*pb.RoomHint{{Room: req.GetRoom(), DpRank: req.GetPrefillDpRank()}}
		}
		r, dests := d.handOff(t, ctx, req, ranks[dp:dp+1], 0)
		if r.GetDpRankRule() != rule || r.PrefillDpRank == nil || r.GetPrefillDpRank() != dp {
			t.Errorf("room %d: prefill dp rank %v by %s, want %d by %s", r.GetRoom(), r.PrefillDpRank, r.GetDpRankRule(), dp, rule)
		}
		if want := uint32(req.GetRoom() % 2); r.GetDecodeDpRank() != want || dests[0].GetDecodeDpRank() != want {
			t.Errorf("room %d on decode shard %d (destination %d), want %d", r.GetRoom(), r.GetDecodeDpRank(), dests[0].GetDecodeDpRank(), want)
		}
		res, err := d.c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: addr, Rooms: []uint64{req.GetRoom()}, Hints: hints})
		if err != nil {
			t.Fatalf("LookupDPRanks: %v", err)
		}
		want := &pb.LookupDPRanksResponse{Resolved: []*pb.DPRankResult{{Room: req.GetRoom(), DpRank: dp, Rule: rule}}}
		if !proto.Equal(res, want) {
			t.Errorf("LookupDPRanks(%d) = %v, want %v", req.GetRoom(), res, want)
		}
		roomsAssertSGLang(t, r, "T1", "T2", "T4", "T8", "T11", "T12", "T17")
		d.release(t, ctx, r)
		d.assertDrained(t)
	}

	t.Run("hint", func(t *testing.T) {
		req := roomsOpen(rr, 4001, 300)
		req.PrefillDpRank = proto.Uint32(2)
		// Without the hint a round_robin room is unknown: never guessed.
		res, err := d.c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: rr, Rooms: []uint64{4001}})
		if err != nil || len(res.GetResolved()) != 0 || !slices.Equal(res.GetUnresolved(), []uint64{4001}) {
			t.Fatalf("LookupDPRanks without hint = %v, %v; want room 4001 unresolved", res, err)
		}
		check(t, rr, rrRanks, req, 2, pb.DPRankRule_DP_RANK_RULE_HINT)
	})
	t.Run("dp_size 1", func(t *testing.T) {
		check(t, single, singleRanks, roomsOpen(single, 4002, 300), 0, pb.DPRankRule_DP_RANK_RULE_SINGLE_DP)
	})
	t.Run("room mod dp_size", func(t *testing.T) {
		const room = 4003 // 4003 % 4 == 3
		// A rank of another DP group cannot claim the room.
		if _, err := d.c.OpenRoom(ctx, roomsOpen(follow, room, 300)); err != nil {
			t.Fatal(err)
		}
		_, err := followRanks[1].SendRoom(ctx, room, client.SendOptions{})
		roomsWantCode(t, "SendRoom from DP group 1", err, codes.InvalidArgument, client.ErrInvalidArgument, "rank.dp_rank", "follow_room")
		if _, err := d.c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
		d.assertDrained(t)
		check(t, follow, followRanks, roomsOpen(follow, 4007, 300), 3, pb.DPRankRule_DP_RANK_RULE_FOLLOW_ROOM)
	})
	t.Run("binding after open", func(t *testing.T) {
		const room = 4004
		resp, err := d.c.OpenRoom(ctx, roomsOpen(rr, room, 300))
		if err != nil {
			t.Fatal(err)
		}
		if ph := resp.GetRoom().GetPhase(); ph != pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK {
			t.Fatalf("round_robin room without hint: phase %s, want RESOLVING_DP_RANK", ph)
		}
		res, err := d.c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: rr, Rooms: []uint64{room}})
		if err != nil || !slices.Equal(res.GetUnresolved(), []uint64{room}) {
			t.Fatalf("LookupDPRanks before BindRoom = %v, %v; want unresolved", res, err)
		}
		if replaced, err := rrRanks[1].BindRoom(ctx, room); err != nil || replaced {
			t.Fatalf("BindRoom = %v, %v", replaced, err)
		}
		if _, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
			t.Fatal(err)
		}
		r, dests := d.handOffOpened(t, ctx, room, rrRanks[1:2])
		if r.GetDpRankRule() != pb.DPRankRule_DP_RANK_RULE_BINDING || r.GetPrefillDpRank() != 1 || dests[0].GetDecodeDpRank() != 0 {
			t.Errorf("room %d: prefill dp rank %d by %s on decode shard %d, want 1 by BINDING on 0", room, r.GetPrefillDpRank(), r.GetDpRankRule(), dests[0].GetDecodeDpRank())
		}
		res, err = d.c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: rr, Rooms: []uint64{room}})
		want := &pb.LookupDPRanksResponse{Resolved: []*pb.DPRankResult{{Room: room, DpRank: 1, Rule: pb.DPRankRule_DP_RANK_RULE_BINDING}}}
		if err != nil || !proto.Equal(res, want) {
			t.Errorf("LookupDPRanks = %v, %v; want %v", res, err, want)
		}
		d.release(t, ctx, r)
		d.assertDrained(t)
	})
	t.Run("binding before open", func(t *testing.T) {
		const room = 4005
		if _, err := rrRanks[3].BindRoom(ctx, room); err != nil {
			t.Fatal(err)
		}
		check(t, rr, rrRanks, roomsOpen(rr, room, 300), 3, pb.DPRankRule_DP_RANK_RULE_BINDING)
	})
}

// handOffOpened is handOff for a room already open.
func (d *roomsDaemon) handOffOpened(t *testing.T, ctx context.Context, room uint64, ranks []*roomsRank) (*pb.Room, []*pb.Destination) {
	t.Helper()
	dests := make([]*pb.Destination, len(ranks))
	for i, r := range ranks {
		dest, err := r.SendRoom(ctx, room, client.SendOptions{})
		if err != nil {
			t.Fatalf("SendRoom %d: %v", room, err)
		}
		dests[i] = dest
	}
	r, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
	if err != nil {
		t.Fatal(err)
	}
	return d.getRoom(t, ctx, r.GetRoom()), dests
}

// TestRoomsE2EThousandConcurrentRooms opens 1,000 rooms at once (all admitted
// together: the ledger holds them all), then four prefill ranks (prefill
// attention TP 4 -> decode TP 1, so every room needs all four) deliver them
// while the decode side waits for each and releases it. Each prefill rank
// runs 64 hand-offs at a time and the decode side waits on 64 rooms at a
// time, which keeps the test process under the race detector's goroutine
// limit; the rooms themselves are all open concurrently.
// SGLang transitions: T1, T2/T4/T8, T11, T12/T17, on every room.
func TestRoomsE2EThousandConcurrentRooms(t *testing.T) {
	t.Parallel()
	const (
		rooms      = 1000
		workers    = 64
		prompt     = 256 // 4 pages
		chunkPages = 2   // 2 chunks per rank and room
		first      = uint64(100000)
		addr       = "10.0.2.1:8998"
	)
	d := roomsStartDaemon(t, `kv_pool:
  total_tokens: 4194304
  request_slots: 1024
admission:
  claim_timeout: 5m
`, "")
	ctx := roomsCtx(t)
	ranks := d.startRanks(t, roomsInstance(addr, 4, 1, "", roomsGQAModel)...)
	layout := d.layout(t, ctx)

	// run calls f for each room with n goroutines and returns the first error.
	run := func(n int, f func(room uint64) error) error {
		next := make(chan uint64)
		var firstErr atomic.Pointer[error]
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				for room := range next {
					if err := f(room); err != nil {
						firstErr.CompareAndSwap(nil, &err)
					}
				}
			})
		}
		for i := range uint64(rooms) {
			next <- first + i
		}
		close(next)
		wg.Wait()
		if p := firstErr.Load(); p != nil {
			return *p
		}
		return nil
	}

	start := time.Now()
	if err := run(16, func(room uint64) error {
		_, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, prompt))
		return err
	}); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	opened := time.Since(start)
	sh := d.shard(t, ctx, 0)
	if sh.GetAdmitted() != rooms || sh.GetPagesTotal()-sh.GetPagesFree() != rooms*uint64(roomsPages(prompt)) {
		t.Fatalf("after opening: %d rooms admitted holding %d pages, want all %d holding %d", sh.GetAdmitted(), sh.GetPagesTotal()-sh.GetPagesFree(), rooms, rooms*roomsPages(prompt))
	}

	handOff := time.Now()
	var bytes atomic.Uint64
	var wg sync.WaitGroup
	errs := make([]error, len(ranks)+1)
	for i, r := range ranks {
		wg.Go(func() {
			errs[i] = run(workers, func(room uint64) error {
				if _, err := r.SendRoom(ctx, room, client.SendOptions{ChunkPages: chunkPages}); err != nil {
					return fmt.Errorf("rank %d room %d: %w", i, room, err)
				}
				return nil
			})
		})
	}
	wg.Go(func() {
		errs[len(ranks)] = run(workers, func(room uint64) error {
			r, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
			if err != nil {
				return fmt.Errorf("room %d: %w", room, err)
			}
			bytes.Add(r.GetBytesTransferred())
			resp, err := d.c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room})
			if err != nil {
				return fmt.Errorf("release %d: %w", room, err)
			}
			if resp.GetPagesReleased() != uint32(roomsPages(prompt)) {
				return fmt.Errorf("release %d: %d pages, want %d", room, resp.GetPagesReleased(), roomsPages(prompt))
			}
			return nil
		})
	})
	wg.Wait()
	total, delivered := time.Since(start), time.Since(handOff)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if want := uint64(rooms) * prompt * layout.GetTokenBytes(); bytes.Load() != want {
		t.Errorf("bytes transferred %d, want %d", bytes.Load(), want)
	}
	t.Logf("%d concurrent rooms, prefill TP 4 -> decode TP 1 (4 prefill ranks, %d chunks each per room): %s open to release = %.0f rooms/s (opening %s; hand-off + release %s = %.0f rooms/s)",
		rooms, roomsPages(prompt)/chunkPages, total.Round(time.Millisecond), rooms/total.Seconds(), opened.Round(time.Millisecond), delivered.Round(time.Millisecond), rooms/delivered.Seconds())

	list, err := d.c.ListRooms(ctx, &pb.ListRoomsRequest{Phases: []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_RELEASED}, Limit: 2 * rooms})
	if err != nil || list.GetTotal() != rooms {
		t.Errorf("ListRooms(RELEASED) total %d, %v; want %d", list.GetTotal(), err, rooms)
	}
	roomsAssertSGLang(t, d.getRoom(t, ctx, first+rooms-1), "T1", "T2", "T4", "T8", "T11", "T12", "T17")
	d.assertDrained(t)
}

// TestRoomsE2EPrefillNeverRegisters: a room whose prefill never (fully)
// registers fails after the configured number of checks with SGLang's
// message. SGLang transitions: T1, T3.
func TestRoomsE2EPrefillNeverRegisters(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, `timeouts:
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
		if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300)); err != nil {
			t.Fatal(err)
		}
		r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_PREFILL_UNAVAILABLE)
		if want := "Could not fetch prefill parallel info from 10.0.3.2:8998 after 3 attempts (Prefill server not fully registered yet (1 workers registered).)"; r.GetFailure().GetMessage() != want {
			t.Errorf("failure %q, want %q", r.GetFailure().GetMessage(), want)
		}
		roomsAssertSGLang(t, r, "T1", "T3")
		d.assertDrained(t)
	})
}

// TestRoomsE2EPrefillDiesMidTransfer: the prefill's heartbeat loop stops
// while one room is mid-transfer and another is admitted; after interval ×
// max_failures (floored at 2 s × 1) the daemon declares the instance lost and
// fails both with SGLang's message; a room that already succeeded is not
// affected. SGLang transitions: T1, T4, T11, T15.
func TestRoomsE2EPrefillDiesMidTransfer(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, `timeouts:
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
	want := "Lost connection with prefill instance (bootstrap_addr: 10.0.4.1:8998), 2 requests affected"
	for _, room := range []uint64{mid, admitted} {
		r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_PREFILL_LOST)
		if r.GetFailure().GetMessage() != want {
			t.Errorf("room %d failure %q, want %q", room, r.GetFailure().GetMessage(), want)
		}
		roomsAssertSGLang(t, r, "T1", "T4", "T11", "T15")
	}
	t.Logf("declared lost %s after the last heartbeat loop stopped (interval 2s × 1 failure, checked every 2s)", time.Since(stopped).Round(10*time.Millisecond))
	_, err := s.Next()
	if rf := roomsWantFailed(t, err, mid, pb.FailureCode_FAILURE_CODE_PREFILL_LOST); rf.Message != want {
		t.Errorf("the claim stream's failure %q, want %q", rf.Message, want)
	}
	_, err = roomsTransfer(ctx, p, dest, 1, 1, 1, false)
	roomsWantCode(t, "Transfer after the loss", err, codes.FailedPrecondition, client.ErrFailedPrecondition, "Lost connection")
	_, err = p.c.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: p.Rank(), InstanceId: "prefill@" + addr})
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
}

// TestRoomsE2EChunkFails: a chunk moved by the daemon's engine fails
// (transfer.sim.failure_probability 1), and a chunk the prefill moved itself
// is reported failed (ReportRoom with a failing Move). The room fails with
// the reason; the prefill sees ErrRoomFailed (and ErrAborted from Transfer).
// SGLang transitions: T1, T4, T11, T13/T18.
func TestRoomsE2EChunkFails(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "transfer:\n  sim:\n    failure_probability: 1\n    seed: 1\n", "")
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
			return uint64(ch.NumPages) * 64, nil
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
}

// TestRoomsE2EAbortInEveryState aborts a room in each phase it can be in:
// waiting for the prefill, resolving its DP rank, queued (no request slot:
// request_slots 1), admitted, claimed, transferring, succeeded and held for
// rebootstrap. Each abort fails the room with "Aborted by AbortReq." (or the
// given reason), tells the prefill ranks, and returns every resource; a
// second abort is a no-op. SGLang transitions: T1, T4, T11, T16, T21.
func TestRoomsE2EAbortInEveryState(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "kv_pool:\n  request_slots: 1\n  pre_alloc_slots: 0\n", "")
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
}

// TestRoomsE2EDestinationNeverClaimed: an admitted destination that not every
// required prefill rank claims within admission.claim_timeout is released
// and the room fails; a rank that did claim sees the failure. decodeplane
// adds this deadline (SGLang has none before the destination is sent: it
// would hold the pages until the 300 s bootstrap/waiting timeouts).
// SGLang transitions: T1, T4, T11 (then decodeplane's claim timeout).
func TestRoomsE2EDestinationNeverClaimed(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "admission:\n  claim_timeout: 300ms\n", "")
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
}

// TestRoomsE2ERequestErrors: AlreadyExists, NotFound, InvalidArgument naming
// the field (nothing stored), FailedPrecondition for a page-size or KV-dtype
// mismatch (SGLang's messages, nothing registered) and for a BindRoom that
// contradicts follow_bootstrap_room (SGLang's message; the room fails).
func TestRoomsE2ERequestErrors(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "kv_pool:\n  kind: gqa\n", "")
	ctx := roomsCtx(t)
	const addr = "10.0.8.1:8998"
	ranks := d.startRanks(t, roomsInstance(addr, 1, 1, "", roomsGQAModel)...)
	const unknown = 123456789

	t.Run("duplicate room", func(t *testing.T) {
		const room = 10001
		req := roomsOpen(addr, room, 300)
		req.IdempotencyKey = "open-10001"
		if _, err := d.c.OpenRoom(ctx, req); err != nil {
			t.Fatal(err)
		}
		dup := roomsOpen(addr, room, 300)
		dup.Rid = "another-request"
		_, err := d.c.OpenRoom(ctx, dup)
		roomsWantCode(t, "OpenRoom of an open room", err, codes.AlreadyExists, client.ErrAlreadyExists, "10001")
		// The same idempotency key is the same request: not a duplicate.
		again, err := d.c.OpenRoom(ctx, req)
		if err != nil || !again.GetExisting() {
			t.Errorf("OpenRoom with the same idempotency key = %v, %v; want existing", again, err)
		}
		r, _ := d.handOffOpened(t, ctx, room, ranks)
		if r.GetRid() != req.GetRid() {
			t.Errorf("room rid %q, want the first request's %q", r.GetRid(), req.GetRid())
		}
		d.release(t, ctx, r)
		d.assertDrained(t)
	})
	t.Run("unknown room", func(t *testing.T) {
		_, err := d.c.GetRoom(ctx, &pb.GetRoomRequest{Room: unknown})
		roomsWantCode(t, "GetRoom", err, codes.NotFound, client.ErrNotFound, "123456789")
		_, err = d.c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: unknown})
		roomsWantCode(t, "AbortRoom", err, codes.NotFound, client.ErrNotFound)
		_, err = d.c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: unknown})
		roomsWantCode(t, "ReleaseRoom", err, codes.NotFound, client.ErrNotFound)
		_, err = d.c.WaitRoom(ctx, unknown)
		roomsWantCode(t, "WatchRoom", err, codes.NotFound, client.ErrNotFound)
		_, err = roomsTransfer(ctx, ranks[0], &pb.Destination{Room: unknown}, 0, 0, 1, true)
		roomsWantCode(t, "Transfer", err, codes.NotFound, client.ErrNotFound)
		_, err = ranks[0].c.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: unknown, Rank: ranks[0].Rank(), NumPages: 1, Last: true, Success: true, MetadataRoomMarker: unknown})
		roomsWantCode(t, "ReportTransfer", err, codes.NotFound, client.ErrNotFound)
		// Unknown prefills.
		_, err = d.c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: "10.0.8.99:1", Rooms: []uint64{1}})
		roomsWantCode(t, "LookupDPRanks of an unknown prefill", err, codes.NotFound, client.ErrNotFound)
		_, err = d.c.BindRoom(ctx, &pb.BindRoomRequest{BootstrapAddr: "10.0.8.99:1", Room: 1})
		roomsWantCode(t, "BindRoom of an unknown prefill", err, codes.NotFound, client.ErrNotFound)
		_, err = d.c.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: &pb.PrefillRank{BootstrapAddr: "10.0.8.99:1"}})
		roomsWantCode(t, "Heartbeat of an unknown rank", err, codes.NotFound, client.ErrNotFound, "register again")
		d.assertDrained(t)
	})
	t.Run("bad field values", func(t *testing.T) {
		for _, tc := range []struct {
			field  string
			mutate func(*pb.OpenRoomRequest)
		}{
			{"room", func(r *pb.OpenRoomRequest) { r.Room = 0 }}, // reserved: the metadata marker's "not written"
			{"room", func(r *pb.OpenRoomRequest) { r.Room = 1 << 63 }},
			{"prompt_len", func(r *pb.OpenRoomRequest) { r.PromptLen = 0 }},
			{"max_new_tokens", func(r *pb.OpenRoomRequest) { r.MaxNewTokens = 0 }},
			{"bootstrap_addr", func(r *pb.OpenRoomRequest) { r.BootstrapAddr = "" }},
			{"bootstrap_addr", func(r *pb.OpenRoomRequest) { r.BootstrapAddr = "prefill-0" }},
			{"bootstrap_addr", func(r *pb.OpenRoomRequest) { r.BootstrapAddr = "10.0.8.1:0" }},
			{"rid", func(r *pb.OpenRoomRequest) { r.Rid = "" }},
			{"decode_dp_rank", func(r *pb.OpenRoomRequest) { r.DecodeDpRank = proto.Uint32(1) }},
			{"prefill_dp_rank", func(r *pb.OpenRoomRequest) { r.PrefillDpRank = proto.Uint32(1) }},
			{"exceeds the maximum number of tokens", func(r *pb.OpenRoomRequest) { r.PromptLen = 2 << 20 }},
		} {
			req := roomsOpen(addr, 10002, 300)
			tc.mutate(req)
			_, err := d.c.OpenRoom(ctx, req)
			roomsWantCode(t, fmt.Sprintf("OpenRoom with bad %s", tc.field), err, codes.InvalidArgument, client.ErrInvalidArgument, tc.field)
			if req.GetRoom() > 0 && req.GetRoom() < 1<<63 {
				_, err = d.c.GetRoom(ctx, &pb.GetRoomRequest{Room: req.GetRoom()})
				roomsWantCode(t, fmt.Sprintf("GetRoom after the bad %s", tc.field), err, codes.NotFound, client.ErrNotFound)
			}
		}
		for _, tc := range []struct {
			field  string
			mutate func(*pb.RegisterPrefillRequest)
		}{
			{"page_size", func(r *pb.RegisterPrefillRequest) { r.PageSize = 48 }},
			{"kv_cache_dtype", func(r *pb.RegisterPrefillRequest) { r.KvCacheDtype = "" }},
			{"parallel.attn_tp_rank", func(r *pb.RegisterPrefillRequest) { r.Parallel.AttnTpRank = 2 }},
			{"rank_endpoint", func(r *pb.RegisterPrefillRequest) { r.RankEndpoint = "" }},
			{"bootstrap_addr", func(r *pb.RegisterPrefillRequest) { r.BootstrapAddr = "nohost" }},
		} {
			reg := roomsReg("10.0.8.2:8998", 2, 0, 1, 0, "")
			tc.mutate(reg)
			_, err := d.c.RegisterPrefill(ctx, reg)
			roomsWantCode(t, fmt.Sprintf("RegisterPrefill with bad %s", tc.field), err, codes.InvalidArgument, client.ErrInvalidArgument, tc.field)
		}
		_, err := d.c.ListRooms(ctx, &pb.ListRoomsRequest{Limit: 1 << 20})
		roomsWantCode(t, "ListRooms with a huge limit", err, codes.InvalidArgument, client.ErrInvalidArgument, "limit")
		_, err = d.c.Transfer(ctx, &pb.TransferRequest{Room: 1})
		roomsWantCode(t, "Transfer without a rank", err, codes.InvalidArgument, client.ErrInvalidArgument, "rank")
		roomsAssertPrefills(t, d, ctx, addr)
		d.assertDrained(t)
	})
	t.Run("page size mismatch", func(t *testing.T) {
		reg := roomsReg("10.0.8.3:8998", 1, 0, 1, 0, "")
		reg.PageSize = 32
		_, err := d.c.RegisterPrefill(ctx, reg)
		want := "Page size mismatch: prefill server has page_size=32, but decode server has page_size=64. Both servers must use the same --page-size value."
		roomsWantCode(t, "RegisterPrefill with page_size 32", err, codes.FailedPrecondition, client.ErrFailedPrecondition, want)
		reg = roomsReg("10.0.8.3:8998", 1, 0, 1, 0, "")
		reg.KvCacheDtype = "fp8_e4m3"
		_, err = d.c.RegisterPrefill(ctx, reg)
		want = "KV cache dtype mismatch: prefill server has kv_cache_dtype=fp8_e4m3, but decode server has kv_cache_dtype=bf16. Both servers must use the same --kv-cache-dtype value."
		roomsWantCode(t, "RegisterPrefill with fp8", err, codes.FailedPrecondition, client.ErrFailedPrecondition, want)
		// The refused prefill's heartbeat loop stops at once: it cannot fix it.
		hb := d.c.Prefill(reg).RunHeartbeat(ctx)
		roomsWantCode(t, "RunHeartbeat of a refused prefill", hb, codes.FailedPrecondition, client.ErrFailedPrecondition, "dtype mismatch")
		roomsAssertPrefills(t, d, ctx, addr)
		d.assertDrained(t)
	})
	t.Run("follow_bootstrap_room conflict", func(t *testing.T) {
		const follow, room = "10.0.8.4:8998", 10011 // 10011 % 2 == 1
		fr := d.startRanks(t, roomsInstance(follow, 1, 2, "follow_bootstrap_room", nil)...)
		if _, err := d.c.OpenRoom(ctx, roomsOpen(follow, room, 300)); err != nil {
			t.Fatal(err)
		}
		_, err := fr[0].BindRoom(ctx, room)
		want := "follow_bootstrap_room conflict: dispatched to dp_rank 0 but bootstrap_room 10011 implies dp_rank 1. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing."
		roomsWantCode(t, "BindRoom against follow_bootstrap_room", err, codes.FailedPrecondition, client.ErrFailedPrecondition, want)
		r := d.waitFailed(t, ctx, room, pb.FailureCode_FAILURE_CODE_DP_RANK_CONFLICT)
		if r.GetFailure().GetMessage() != want {
			t.Errorf("failure %q, want %q", r.GetFailure().GetMessage(), want)
		}
		d.assertDrained(t)
	})
}

// roomsAssertPrefills checks that exactly the instances addrs are registered.
func roomsAssertPrefills(t *testing.T, d *roomsDaemon, ctx context.Context, addrs ...string) {
	t.Helper()
	st, err := d.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range st.GetPrefills() {
		got = append(got, p.GetBootstrapAddr())
	}
	slices.Sort(got)
	slices.Sort(addrs)
	if !slices.Equal(got, addrs) {
		t.Errorf("registered prefill instances %q, want %q (a refused call stores nothing)", got, addrs)
	}
}

// TestRoomsE2EAuthToken: with a bootstrap token (set through SGLang's
// SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN), mutating calls without it or
// with a wrong one are Unauthenticated and store nothing; reads need no
// token; the right token runs a room end to end.
func TestRoomsE2EAuthToken(t *testing.T) {
	t.Parallel()
	const token = "s3cret-bootstrap-token"
	d := roomsStartDaemon(t, "log:\n  level: warn\n", token, "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN="+token)
	ctx := roomsCtx(t)
	const addr = "10.0.9.1:8998"
	missing, wrong := d.newClient(t, ""), d.newClient(t, "not-the-token")
	bad := map[string]*client.Client{"missing token": missing, "wrong token": wrong}

	for name, c := range bad {
		_, err := c.OpenRoom(ctx, roomsOpen(addr, 11001, 300))
		roomsWantCode(t, name+": OpenRoom", err, codes.Unauthenticated, client.ErrUnauthenticated, "Bearer")
		_, err = c.GetRoom(ctx, &pb.GetRoomRequest{Room: 11001})
		roomsWantCode(t, name+": GetRoom after the refused OpenRoom", err, codes.NotFound, client.ErrNotFound)
		_, err = c.RegisterPrefill(ctx, roomsReg(addr, 1, 0, 1, 0, ""))
		roomsWantCode(t, name+": RegisterPrefill", err, codes.Unauthenticated, client.ErrUnauthenticated)
	}
	roomsAssertPrefills(t, d, ctx)

	ranks := d.startRanks(t, roomsInstance(addr, 1, 1, "", nil)...)
	const room = 11002
	if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 300)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
		t.Fatal(err)
	}
	rank := ranks[0].Rank()
	for name, c := range bad {
		_, err := c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room})
		roomsWantCode(t, name+": AbortRoom", err, codes.Unauthenticated, client.ErrUnauthenticated)
		_, err = c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room})
		roomsWantCode(t, name+": ReleaseRoom", err, codes.Unauthenticated, client.ErrUnauthenticated)
		_, err = c.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: rank})
		roomsWantCode(t, name+": Heartbeat", err, codes.Unauthenticated, client.ErrUnauthenticated)
		_, err = c.BindRoom(ctx, &pb.BindRoomRequest{BootstrapAddr: addr, Room: room})
		roomsWantCode(t, name+": BindRoom", err, codes.Unauthenticated, client.ErrUnauthenticated)
		_, err = c.Transfer(ctx, &pb.TransferRequest{Room: room, Rank: rank, NumPages: 1})
		roomsWantCode(t, name+": Transfer", err, codes.Unauthenticated, client.ErrUnauthenticated)
		_, err = c.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: room, Rank: rank, NumPages: 1, Success: true})
		roomsWantCode(t, name+": ReportTransfer", err, codes.Unauthenticated, client.ErrUnauthenticated)
		s, err := c.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: rank})
		if err == nil {
			_, err = s.Next()
			s.Close()
		}
		roomsWantCode(t, name+": AwaitDestination", err, codes.Unauthenticated, client.ErrUnauthenticated)
		// Reads need no token.
		if r, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: room}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED {
			t.Errorf("%s: GetRoom = %v, %v; want the room, still ADMITTED", name, r.GetPhase(), err)
		}
		if _, err := c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: addr, Rooms: []uint64{room}}); err != nil {
			t.Errorf("%s: LookupDPRanks: %v", name, err)
		}
		if _, err := c.ListRooms(ctx, &pb.ListRoomsRequest{}); err != nil {
			t.Errorf("%s: ListRooms: %v", name, err)
		}
	}
	r, _ := d.handOffOpened(t, ctx, room, ranks)
	if r.GetChunksDone() != 1 {
		t.Errorf("room delivered in %d chunks, want 1 (no refused chunk counted)", r.GetChunksDone())
	}
	d.release(t, ctx, r)
	d.assertDrained(t)
}

// TestRoomsE2EReflection: a reflection client resolves the file descriptors
// of decodeplane.v1.Bootstrap and decodeplane.v1.Rooms and sees every RPC of
// the contract, with the right streaming shape.
func TestRoomsE2EReflection(t *testing.T) {
	t.Parallel()
	d := roomsStartDaemon(t, "", "")
	ctx := roomsCtx(t)
	conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := rs.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := rs.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection error for %v: %v", req, e)
		}
		return resp
	}
	var names []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	want := map[string][]string{
		"decodeplane.v1.Bootstrap": {"RegisterPrefill", "Heartbeat", "BindRoom", "LookupDPRanks"},
		"decodeplane.v1.Rooms":     {"OpenRoom", "AwaitDestination", "Transfer", "ReportTransfer", "WatchRoom", "GetRoom", "AbortRoom", "ReleaseRoom", "ListRooms"},
	}
	// The server sends each file once per stream: collect them all.
	files := map[string]*descriptorpb.FileDescriptorProto{}
	for svc := range want {
		if !slices.Contains(names, svc) {
			t.Errorf("reflection lists %q, want %s", names, svc)
		}
		resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: svc}})
		for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, fd); err != nil {
				t.Fatal(err)
			}
			files[fd.GetName()] = fd
		}
	}
	if err := rs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, fd := range files {
		set.File = append(set.File, fd)
	}
	reg, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("resolving the reflected descriptors: %v", err)
	}
	for svc, methods := range want {
		desc, err := reg.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Errorf("%s: %v", svc, err)
			continue
		}
		sd, ok := desc.(protoreflect.ServiceDescriptor)
		if !ok {
			t.Errorf("%s is a %T, not a service", svc, desc)
			continue
		}
		var got []string
		for i := range sd.Methods().Len() {
			got = append(got, string(sd.Methods().Get(i).Name()))
		}
		for _, m := range methods {
			if !slices.Contains(got, m) {
				t.Errorf("%s has methods %q, want %s", svc, got, m)
			}
		}
		if svc == "decodeplane.v1.Bootstrap" && len(got) != len(methods) {
			t.Errorf("%s has methods %q, want exactly %q", svc, got, methods)
		}
		for i := range sd.Methods().Len() {
			m := sd.Methods().Get(i)
			streaming := m.Name() == "AwaitDestination" || m.Name() == "WatchRoom"
			if m.IsStreamingServer() != streaming || m.IsStreamingClient() {
				t.Errorf("%s.%s: server streaming %v, client streaming %v; want server streaming %v only", svc, m.Name(), m.IsStreamingServer(), m.IsStreamingClient(), streaming)
			}
		}
	}
	desc, err := reg.FindDescriptorByName("decodeplane.v1.Rooms.AwaitDestination")
	if md, ok := desc.(protoreflect.MethodDescriptor); err != nil || !ok || md.Output().FullName() != "decodeplane.v1.DestinationEvent" {
		t.Errorf("Rooms.AwaitDestination: %v, %v; want it to stream decodeplane.v1.DestinationEvent", desc, err)
	}
}
