package main

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
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/sessiontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The rooms suite's harness: the daemon binary started with a configuration
// per test, its clients (roomsClient) and prefill ranks (roomsRank), and the
// checks the tests share.

// roomsTimeout bounds every test's waits; the tests finish far sooner.
const roomsTimeout = 60 * time.Second

// roomsDaemon is one running daemon and a decode-side client for it.
type roomsDaemon struct {
	addr  string
	token string
	c     *roomsClient
	// tr is how rooms are carried (transport_e2e_test.go); the zero value is
	// unary.
	tr roomsTransport
	// metricsAddr is the daemon's /metrics listener ("" when off).
	metricsAddr string
	// engineOps and prefillOps count the room ops the test sent on the
	// transport, engineHandOffs its OpenAndWait calls and handOffs its
	// SendRoom and ReportRoom calls, for assertCarried.
	engineOps, prefillOps, engineHandOffs, handOffs atomic.Int64
	// beatEvery, when set, is how often startRanks' heartbeat loops beat
	// (default: half the daemon's interval).
	beatEvery time.Duration
}

// roomsStartDaemon writes cfgYAML to a file, starts the binary with it on a
// free port (metrics off) and waits for health SERVING. token is what the
// clients send (the daemon's token comes from cfgYAML or env). A port taken
// between freeAddr and the daemon's listen is retried with another one.
// Its rooms are carried by the unary API.
func roomsStartDaemon(t *testing.T, cfgYAML, token string, env ...string) *roomsDaemon {
	t.Helper()
	return roomsStartDaemonOver(t, overUnary, false, cfgYAML, token, env...)
}

// roomsStartOver is roomsStartDaemon for a test run over both transports:
// the daemon's /metrics listener is on, its rooms are carried by tr, and
// the test's end checks that they were (assertCarried).
func roomsStartOver(t *testing.T, tr roomsTransport, cfgYAML, token string, env ...string) *roomsDaemon {
	t.Helper()
	d := roomsStartDaemonOver(t, tr, true, cfgYAML, token, env...)
	t.Cleanup(func() { d.assertCarried(t) })
	return d
}

func roomsStartDaemonOver(t *testing.T, tr roomsTransport, withMetrics bool, cfgYAML, token string, env ...string) *roomsDaemon {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "decodeplane.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		addr, maddr := freeAddr(t), ""
		if withMetrics {
			maddr = freeAddr(t)
		}
		p := startDaemon(t, []string{"serve", "--config", cfgPath, "--listen", addr, "--set", "server.metrics_listen=" + maddr}, e2eEnviron(env...))
		err := roomsWaitServing(t, p, addr)
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("daemon %s output:\n%s", addr, p.Out.String())
				}
			})
			d := &roomsDaemon{addr: addr, token: token, tr: tr, metricsAddr: maddr}
			d.c = d.newClient(t, token)
			return d
		}
		out := p.Out.String()
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
	case <-p.Exited():
		cancel()
		<-serving
		return fmt.Errorf("the daemon exited before serving: %v", p.Err())
	}
}

// newClient is a client of the daemon with the given token ("" sends none),
// built for the daemon's transport; on stream its engine session is open.
func (d *roomsDaemon) newClient(t *testing.T, token string) *roomsClient {
	t.Helper()
	opts := []client.Option{client.WithTransport(d.tr.clientTransport())}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	c, err := client.New(d.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &roomsClient{Client: c, d: d, token: token}
	if d.tr == overStream {
		rc.eng = startEngineWatch(t, rc)
	}
	return rc
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
// Its claim, chunk, report, SendRoom and ReportRoom take the daemon's
// transport (transport_e2e_test.go).
type roomsRank struct {
	*client.Prefill
	c        *roomsClient
	d        *roomsDaemon
	tr       roomsTransport
	reg      *pb.RegisterPrefillResponse
	instance string // the registration's instance_id
	// stop ends the heartbeat loop and the rank's session, and waits for
	// them (idempotent): the rank is dead on either transport.
	stop func()

	sessCtx context.Context
	sessMu  sync.Mutex
	sess    *sessiontest.Prefill
	sessErr error
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
		rank := &roomsRank{Prefill: p, c: c, d: d, tr: d.tr, reg: resp, instance: reg.GetInstanceId(), sessCtx: hbCtx}
		var once sync.Once
		rank.stop = func() {
			once.Do(func() {
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("heartbeat loop of %v ended with %v, want context.Canceled", p.Rank(), err)
				}
				rank.sessMu.Lock()
				s := rank.sess
				rank.sessErr = errors.New("the rank was stopped")
				rank.sessMu.Unlock()
				if s != nil {
					s.Close()
				}
			})
		}
		t.Cleanup(rank.stop)
		out = append(out, rank)
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
	// The family is the Go client's classification of its *client.Error;
	// an op sent on a session by sessiontest answers the daemon's status.
	var ce *client.Error
	if status.Code(err) != code || (errors.As(err, &ce) && !errors.Is(err, family)) {
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
func roomsAwaitDestination(t *testing.T, ctx context.Context, r *roomsRank, room uint64) (roomsClaim, *pb.Destination) {
	t.Helper()
	s, err := r.claim(ctx, room)
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
	return r.chunk(ctx, req)
}

func roomsPages(promptLen uint32) int { return int((promptLen + 63) / 64) }
