package server_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// ackCount reads decodeplane_room_end_acks_total{outcome}.
func ackCount(t *testing.T, d *daemontest.Daemon, outcome string) float64 {
	t.Helper()
	mfs, err := d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "decodeplane_room_end_acks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no decodeplane_room_end_acks_total{outcome=%q}", outcome)
	return 0
}

// drainingGauge reads decodeplane_pages_draining{dp_rank="0"}.
func drainingGauge(t *testing.T, d *daemontest.Daemon) float64 {
	t.Helper()
	mfs, err := d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "decodeplane_pages_draining" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no decodeplane_pages_draining")
	return 0
}

// TestDeferredReleaseAtTheWire: a prefill that received a destination and
// writes by itself (ReportTransfer) keeps writing after the abort. Its
// claim stream ends with ack_required, its late report is refused, and a
// room that needs those pages is not admitted until AckRoomEnd; with the ack
// it is admitted at once. A stale attempt or incarnation is refused and
// changes nothing; a second ack, or one from a room that owes none, is an
// accepted no-op.
func TestDeferredReleaseAtTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dec := stgDecodeConfig(1) // 512 pages of 16 tokens: one 6000-token room at a time
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
	}})
	if got := config.DefaultConfig().Release.DeferredTimeout; got != 30*time.Second { // the daemon's, unchanged here
		t.Fatalf("release.deferred_timeout default = %s, want 30s", got)
	}
	conn := d.Conn(t)
	s := &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}
	admin := pb.NewAdminClient(conn)
	own := d.Incarnation()
	const addr = "p1:1"
	s.register(t, ctx, addr, 1)
	open := func(room uint64) {
		if _, err := s.room.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: addr, Room: room, PromptLen: 6000, MaxNewTokens: 4}); err != nil {
			t.Fatal(err)
		}
	}
	phase := func(room uint64) pb.RoomPhase {
		r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetPhase()
	}
	open(7)
	stream, err := s.room.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 7, Rank: prank(addr, 0), Incarnation: own})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination = %v, %v", ev, err)
	}
	dst := ev.GetDestination()
	report := func(i, off, num uint32) *pb.ReportTransferRequest {
		tokens := uint64(num) * uint64(dst.GetPageSize())
		return &pb.ReportTransferRequest{Room: 7, Rank: prank(addr, 0), ChunkIndex: i, PageOffset: off, NumPages: num, Success: true,
			Bytes: tokens * dst.GetTokenBytes(), Attempt: dst.GetAttempt(), Incarnation: own}
	}
	if _, err := s.room.ReportTransfer(ctx, report(0, 0, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
		t.Fatal(err)
	}
	ev, err = stream.Recv()
	if err != nil || ev.GetFailure() == nil || !ev.GetAckRequired() {
		t.Fatalf("claim stream after the abort = %v, %v; want a failure with ack_required", ev, err)
	}
	// The prefill keeps writing: its report is refused (the room ended) and
	// the pages stay draining.
	if _, err := s.room.ReportTransfer(ctx, report(1, 8, 8)); err == nil {
		t.Fatal("ReportTransfer after the abort was accepted")
	}
	open(8)
	if p := phase(8); p != pb.RoomPhase_ROOM_PHASE_QUEUED {
		t.Fatalf("room 8 is %v while room 7's pages drain, want QUEUED", p)
	}
	r7, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: 7})
	if err != nil || !strings.Contains(r7.GetWaitingFor(), "AckRoomEnd (attempt 1) from prefill ranks [cp 0 tp 0 pp 0]") || !strings.Contains(r7.GetWaitingFor(), "until ") {
		t.Fatalf("room 7 waiting_for = %q, %v", r7.GetWaitingFor(), err)
	}
	st, err := admin.GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil || st.GetShards()[0].GetDrainingRooms() != 1 || st.GetShards()[0].GetDrainingPages() != uint64(len(dst.GetPageIndices())) {
		t.Fatalf("GetStatus shard = %v, %v; want 1 draining room with %d pages", st.GetShards(), err, len(dst.GetPageIndices()))
	}
	if g := drainingGauge(t, d); g != float64(len(dst.GetPageIndices())) {
		t.Fatalf("decodeplane_pages_draining = %v, want %d", g, len(dst.GetPageIndices()))
	}

	ack := func(room uint64, attempt uint32, inc uint64) (*pb.AckRoomEndResponse, error) {
		return s.room.AckRoomEnd(ctx, &pb.AckRoomEndRequest{Room: room, Rank: prank(addr, 0), Attempt: attempt, Incarnation: inc})
	}
	// Refused, changing nothing: a stale attempt, a stale incarnation, a
	// bad request.
	_, err = ack(7, 2, own)
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || len(st.Details()) == 0 || st.Details()[0].(*errdetails.ErrorInfo).GetReason() != server.ReasonStaleAttempt {
		t.Fatalf("AckRoomEnd(attempt 2) = %v; want FailedPrecondition %s", err, server.ReasonStaleAttempt)
	}
	wantStale(t, "AckRoomEnd", func() error { _, err := ack(7, 1, own^1); return err }(), own^1, own)
	if _, err := ack(7, 0, own); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "attempt") {
		t.Fatalf("AckRoomEnd(attempt 0) = %v; want InvalidArgument naming attempt", err)
	}
	if p := phase(8); p != pb.RoomPhase_ROOM_PHASE_QUEUED {
		t.Fatalf("room 8 is %v after refused acks, want QUEUED", p)
	}
	// A live room owes nothing: accepted, a no-op.
	if res, err := ack(8, 1, own); err != nil || res.GetOwed() {
		t.Fatalf("AckRoomEnd(live room 8) = %v, %v; want a no-op", res, err)
	}
	res, err := ack(7, 1, own)
	if err != nil || !res.GetOwed() || !res.GetReleased() || res.GetRemaining() != 0 {
		t.Fatalf("AckRoomEnd = %v, %v; want owed and released", res, err)
	}
	if p := phase(8); p != pb.RoomPhase_ROOM_PHASE_ADMITTED {
		t.Fatalf("room 8 is %v right after the ack, want ADMITTED", p)
	}
	if res, err := ack(7, 1, own); err != nil || res.GetOwed() || res.GetReleased() {
		t.Fatalf("second AckRoomEnd = %v, %v; want an accepted no-op", res, err)
	}
	if ackCount(t, d, "acked") != 1 || ackCount(t, d, "expired") != 0 {
		t.Fatalf("acks: acked %v expired %v; want 1, 0", ackCount(t, d, "acked"), ackCount(t, d, "expired"))
	}
	if g := drainingGauge(t, d); g != 0 {
		t.Fatalf("decodeplane_pages_draining = %v after the ack", g)
	}
}

// drainWire is a daemon with the 512-page pool and one registered TP-1
// prefill at addr, for the exit-path tests.
type drainWire struct {
	t    *testing.T
	ctx  context.Context
	d    *daemontest.Daemon
	s    *stgServer
	own  uint64
	addr string
}

func newDrainWire(t *testing.T, ctx context.Context) *drainWire {
	dec := stgDecodeConfig(1)
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
	}})
	conn := d.Conn(t)
	w := &drainWire{t: t, ctx: ctx, d: d, own: d.Incarnation(), addr: "p1:1",
		s: &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}}
	w.register("first")
	return w
}

func (w *drainWire) register(instance string) {
	w.t.Helper()
	if _, err := w.s.boot.RegisterPrefill(w.ctx, &pb.RegisterPrefillRequest{BootstrapAddr: w.addr, RankEndpoint: "10.0.0.1:9000", InstanceId: instance,
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 16, KvCacheDtype: "bf16"}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *drainWire) open(room uint64) {
	w.t.Helper()
	if _, err := w.s.room.OpenRoom(w.ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: w.addr, Room: room, PromptLen: 6000, MaxNewTokens: 4}); err != nil {
		w.t.Fatal(err)
	}
}

// claimAndWrite claims room, reports its first 8 pages (the prefill writes
// by itself) and returns the claim stream and the destination.
func (w *drainWire) claimAndWrite(room uint64) (func() (*pb.DestinationEvent, error), *pb.Destination) {
	w.t.Helper()
	stream, err := w.s.room.AwaitDestination(w.ctx, &pb.AwaitDestinationRequest{Room: room, Rank: prank(w.addr, 0), Incarnation: w.own})
	if err != nil {
		w.t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetDestination() == nil {
		w.t.Fatalf("AwaitDestination = %v, %v", ev, err)
	}
	dst := ev.GetDestination()
	if _, err := w.s.room.ReportTransfer(w.ctx, w.report(room, dst, 0, 0, 8, true)); err != nil {
		w.t.Fatal(err)
	}
	return stream.Recv, dst
}

func (w *drainWire) report(room uint64, dst *pb.Destination, i, off, num uint32, ok bool) *pb.ReportTransferRequest {
	r := &pb.ReportTransferRequest{Room: room, Rank: prank(w.addr, 0), ChunkIndex: i, PageOffset: off, NumPages: num, Success: ok,
		Bytes: uint64(num) * uint64(dst.GetPageSize()) * dst.GetTokenBytes(), Attempt: dst.GetAttempt(), Incarnation: w.own}
	if !ok {
		r.Bytes, r.FailureReason = 0, "rdma write failed"
	}
	return r
}

func (w *drainWire) phase(room uint64) pb.RoomPhase {
	w.t.Helper()
	r, err := w.s.room.GetRoom(w.ctx, &pb.GetRoomRequest{Room: room})
	if err != nil {
		w.t.Fatal(err)
	}
	return r.GetPhase()
}

func (w *drainWire) draining() uint32 {
	w.t.Helper()
	st, err := pb.NewAdminClient(w.s.conn).GetStatus(w.ctx, &pb.GetStatusRequest{})
	if err != nil {
		w.t.Fatal(err)
	}
	return st.GetShards()[0].GetDrainingRooms()
}

// TestDeferredReleaseExitPathsAtTheWire: each exit path of a room whose rank
// writes by itself — abort, the prefill's reported failure, a new prefill
// instance behind the address, and the end of a rebootstrapped attempt —
// ends the claim with ack_required and keeps the pages from a room that
// needs them until the ack, which admits it at once. The rebootstrapped
// room owes for attempt 2: an ack for attempt 1 is refused. (The timeouts
// and the bound run under synctest in kvmanager's drain_test.go.)
func TestDeferredReleaseExitPathsAtTheWire(t *testing.T) {
	paths := []struct {
		name    string
		attempt uint32
		setup   func(w *drainWire)
		end     func(w *drainWire, dst *pb.Destination)
		code    pb.FailureCode
	}{
		{name: "abort", attempt: 1, end: func(w *drainWire, _ *pb.Destination) {
			if _, err := w.s.room.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
				w.t.Fatal(err)
			}
		}, code: pb.FailureCode_FAILURE_CODE_ABORTED},
		{name: "failure", attempt: 1, end: func(w *drainWire, dst *pb.Destination) {
			if _, err := w.s.room.ReportTransfer(w.ctx, w.report(7, dst, 1, 8, 8, false)); err != nil {
				w.t.Fatal(err)
			}
		}, code: pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED},
		{name: "prefill replaced", attempt: 1, end: func(w *drainWire, _ *pb.Destination) { w.register("second") }, code: pb.FailureCode_FAILURE_CODE_PREFILL_LOST},
		{name: "rebootstrap", attempt: 2, setup: func(w *drainWire) {
			// Attempt 1 succeeds, is held for rebootstrap and continues.
			stream, err := w.s.room.AwaitDestination(w.ctx, &pb.AwaitDestinationRequest{Room: 7, Rank: prank(w.addr, 0), Incarnation: w.own})
			if err != nil {
				w.t.Fatal(err)
			}
			ev, err := stream.Recv()
			if err != nil {
				w.t.Fatal(err)
			}
			dst := ev.GetDestination()
			n := uint32(len(dst.GetPageIndices()))
			last := w.report(7, dst, 0, 0, n, true)
			last.Last, last.MetadataRoomMarker = true, 7
			last.Bytes = uint64(dst.GetFillLen())*dst.GetTokenBytes() + dst.GetStateBytes()
			if _, err := w.s.room.ReportTransfer(w.ctx, last); err != nil {
				w.t.Fatal(err)
			}
			if p := w.phase(7); p != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				w.t.Fatalf("attempt 1 is %v, want SUCCEEDED", p)
			}
			if _, err := w.s.room.RetractRoom(w.ctx, &pb.RetractRoomRequest{Room: 7, Mode: pb.RetractMode_RETRACT_MODE_REBOOTSTRAP}); err != nil {
				w.t.Fatal(err)
			}
			if _, err := w.s.room.ContinueGeneration(w.ctx, &pb.ContinueGenerationRequest{}); err != nil {
				w.t.Fatal(err)
			}
		}, end: func(w *drainWire, _ *pb.Destination) {
			if _, err := w.s.room.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
				w.t.Fatal(err)
			}
		}, code: pb.FailureCode_FAILURE_CODE_ABORTED},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			w := newDrainWire(t, ctx)
			w.open(7)
			if p.setup != nil {
				p.setup(w)
			}
			next, dst := w.claimAndWrite(7)
			if dst.GetAttempt() != p.attempt {
				t.Fatalf("destination attempt %d, want %d", dst.GetAttempt(), p.attempt)
			}
			p.end(w, dst)
			ev, err := next()
			if err != nil || ev.GetFailure().GetCode() != p.code || !ev.GetAckRequired() {
				t.Fatalf("claim's end = %v, %v; want %v with ack_required", ev, err, p.code)
			}
			if p.name == "prefill replaced" {
				w.register("second") // the new instance, complete, for room 8
			}
			w.open(8)
			if ph := w.phase(8); ph != pb.RoomPhase_ROOM_PHASE_QUEUED || w.draining() != 1 {
				t.Fatalf("room 8 %v, %d draining rooms; want QUEUED behind room 7's draining pages", ph, w.draining())
			}
			if p.attempt > 1 {
				_, err := w.s.room.AckRoomEnd(ctx, &pb.AckRoomEndRequest{Room: 7, Rank: prank(w.addr, 0), Attempt: p.attempt - 1, Incarnation: w.own})
				if status.Code(err) != codes.FailedPrecondition || w.draining() != 1 {
					t.Fatalf("AckRoomEnd(attempt %d) = %v; want FailedPrecondition, nothing released", p.attempt-1, err)
				}
			}
			res, err := w.s.room.AckRoomEnd(ctx, &pb.AckRoomEndRequest{Room: 7, Rank: prank(w.addr, 0), Attempt: p.attempt, Incarnation: w.own})
			if err != nil || !res.GetReleased() {
				t.Fatalf("AckRoomEnd = %v, %v; want released", res, err)
			}
			if ph := w.phase(8); ph != pb.RoomPhase_ROOM_PHASE_ADMITTED || w.draining() != 0 {
				t.Fatalf("room 8 %v, %d draining after the ack; want ADMITTED at once", ph, w.draining())
			}
		})
	}
}

// TestDeferredReleaseShutdownAtTheWire: the daemon's shutdown fails a room
// whose rank writes by itself without asking for an ack, and does not wait
// for one (the ledgers go with the process): Stop, a shutdown whose
// deadline has already passed, returns with no error.
func TestDeferredReleaseShutdownAtTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	w.open(7)
	next, _ := w.claimAndWrite(7)
	stopped := make(chan error, 1)
	go func() { stopped <- w.d.Stop() }()
	ev, err := next()
	if err != nil || ev.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN || ev.GetAckRequired() {
		t.Fatalf("claim's end at shutdown = %v, %v; want SHUTDOWN without ack_required", ev, err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop = %v", err)
	}
}

// TestWatchRoomEndsAtPagesReusable: a unary WatchRoom of a room that failed
// while its prefill rank could still write sends the terminal FAILED event
// without pages_reusable and stays open; the rank's AckRoomEnd sends the
// room's last event (pages_reusable, the phase unchanged), then the stream
// ends OK.
func TestWatchRoomEndsAtPagesReusable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dec := stgDecodeConfig(1)
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
	}})
	conn := d.Conn(t)
	s := &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}
	own := d.Incarnation()
	const addr = "p1:1"
	s.register(t, ctx, addr, 1)
	if _, err := s.room.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r9", BootstrapAddr: addr, Room: 9, PromptLen: 600, MaxNewTokens: 4}); err != nil {
		t.Fatal(err)
	}
	claim, err := s.room.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 9, Rank: prank(addr, 0), Incarnation: own})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := claim.Recv()
	if err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination = %v, %v", ev, err)
	}
	dst := ev.GetDestination()
	if _, err := s.room.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: 9, Rank: prank(addr, 0), ChunkIndex: 0, NumPages: 1, Success: true,
		Bytes: uint64(dst.GetPageSize()) * dst.GetTokenBytes(), Attempt: dst.GetAttempt(), Incarnation: own}); err != nil {
		t.Fatal(err)
	}
	watch, err := s.room.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 9})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil { // the current state
		t.Fatal(err)
	}
	if _, err := s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 9}); err != nil {
		t.Fatal(err)
	}
	term, err := watch.Recv()
	if err != nil || !term.GetTerminal() || term.GetPagesReusable() || term.GetTransition().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Fatalf("event after the abort = %v, %v; want the terminal FAILED event, pages not reusable", term, err)
	}
	if ev, err := claim.Recv(); err != nil || !ev.GetAckRequired() {
		t.Fatalf("claim after the abort = %v, %v; want ack_required", ev, err)
	}
	if _, err := s.room.AckRoomEnd(ctx, &pb.AckRoomEndRequest{Room: 9, Rank: prank(addr, 0), Attempt: dst.GetAttempt(), Incarnation: own}); err != nil {
		t.Fatal(err)
	}
	last, err := watch.Recv()
	if err != nil || !last.GetPagesReusable() || last.GetTerminal() || last.GetTransition().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Fatalf("event after the ack = %v, %v; want pages_reusable with the phase unchanged", last, err)
	}
	if ev, err := watch.Recv(); err != io.EOF {
		t.Fatalf("after the last event: %v, %v; want the stream's end", ev, err)
	}
}
