package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// End-to-end tests of the decode engine as the page owner (kv_pool.owner:
// engine) through the real binaries: the daemon (and, on the delegated
// path, the reference transfer agent) as processes, the decode engine and
// the prefill ranks played by this test over gRPC (owner_helpers_test.go).
// The engine allocates from its own free lists and frees a room's pages
// only when it finished decoding it or when the room's last event says
// they are reusable; each test ends with the engine's lists whole, nothing
// held by the daemon, and a declaration of every page accepted.

func ownerCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ownerRegister registers a TP-1 prefill instance at bootstrap.
func ownerRegister(t *testing.T, ctx context.Context, boot pb.BootstrapClient, bootstrap, instance string) {
	t.Helper()
	if _, err := boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: bootstrap, RankEndpoint: "10.3.0.1:17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: ownerPageSize, KvCacheDtype: "bf16",
		InstanceId: instance}); err != nil {
		t.Fatalf("RegisterPrefill(%s, %s): %v", bootstrap, instance, err)
	}
}

// reason is err's ErrorInfo reason ("" without one).
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetReason()
		}
	}
	return ""
}

// ownerSucceed sends a claimed room's KV (two chunks, written by the rank)
// and waits until the room succeeded.
func ownerSucceed(t *testing.T, ctx context.Context, e *ownerEngine, p *ownerRank, dst *pb.Destination) {
	t.Helper()
	for i, off := uint32(0), uint32(0); off < uint32(len(dst.GetPageIndices())); i, off = i+1, off+8 {
		if err := p.report(ctx, dst, i, off, 8, true); err != nil {
			t.Fatalf("ReportTransfer(room %d chunk %d): %v", dst.GetRoom(), i, err)
		}
	}
	e.watch(ctx, dst.GetRoom(), func(ev *pb.RoomEvent) bool { return ev.GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED })
}

// TestE2EEngineOwnerFailures: on the delegated path with decodeplane's
// default buffers in the reference agent, one hand-off succeeds over the
// agent; the agent fails every batch of another (--fault-fail-rooms): the
// room fails and its pages come back to the engine only with its
// pages-reusable event; a third fails by its prefill rank's report of a
// failed write: its pages stay held, draining — a declaration of them is
// refused naming the room — until the rank acknowledges (AckRoomEnd), and
// are then accepted for the next room, which the engine declares in them.
func TestE2EEngineOwnerFailures(t *testing.T) {
	ctx := ownerCtx(t)
	agentAt := freeAddr(t)
	agent := e2e.Start(t, "decodeplane-agent", e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-agent"), nil,
		"--listen", agentAt, "--fault-fail-rooms", "11")
	aconn := ownerDial(t, agentAt)
	e2e.WaitHealth(t, aconn, agent, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	addr := freeAddr(t)
	d := startDaemon(t, append([]string{"serve", "--listen", addr, "--set", "server.metrics_listen=", "--transfer-path", "delegate", "--agent", agentAt,
		"--set", "kv_pool.kind=gqa", "--set", "kv_pool.num_layers=2", "--set", "kv_pool.kv_heads=2", "--set", "kv_pool.head_dim=16",
		"--set", "kv_pool.dtype=bf16", "--set", "release.deferred_timeout=5m"}, ownerPool()...), e2eEnviron())
	conn := ownerDial(t, addr)
	e2e.WaitHealth(t, conn, d, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	const bootstrap = "10.3.0.1:8998"
	ownerRegister(t, ctx, pb.NewBootstrapClient(conn), bootstrap, "prefill-a")
	// The prefill's KV in the agent: 64 pages of 2 layers × K/V × 16 tokens
	// × 2 heads × 16 dims × bf16.
	const pageBytes, srcBuffer = 2 * 2 * ownerPageSize * 2 * 16 * 2, "prefill/a/kv"
	if _, err := transferv1.NewTransferAgentClient(aconn).RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{{
		Name: srcBuffer, Kind: transferv1.BufferKind_BUFFER_KIND_PREFILL_KV, Length: ownerPages * pageBytes, ItemSize: pageBytes}}}); err != nil {
		t.Fatal(err)
	}
	e := newOwnerEngine(t, conn)
	e.report(ctx)
	p := &ownerRank{t: t, rooms: pb.NewRoomsClient(conn), rank: &pb.PrefillRank{BootstrapAddr: bootstrap}}
	// transfer asks the daemon to move the room's KV from the prefill's
	// buffer (its page i at 63-i), in two chunks.
	transfer := func(room uint64, dst *pb.Destination) error {
		for i, off := uint32(0), uint32(0); off < uint32(len(dst.GetPageIndices())); i, off = i+1, off+8 {
			req := &pb.TransferRequest{Room: room, Rank: p.rank, ChunkIndex: i, PageOffset: off, NumPages: 8, Last: off+8 == ownerRoomPages,
				Source: &pb.TransferSource{Buffer: srcBuffer}, Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}
			for k := off; k < off+8; k++ {
				req.Source.PageIndices = append(req.Source.PageIndices, int32(ownerPages-1-k))
			}
			if req.Last {
				req.Aux = &pb.Aux{RoomMarker: room, OutputIds: []int32{7}}
			}
			if _, err := p.rooms.Transfer(ctx, req); err != nil {
				return err
			}
		}
		return nil
	}

	e.open(ctx, 10, bootstrap)
	e.declare(ctx, 10)
	dst, _ := p.claim(ctx, 10)
	if err := transfer(10, dst); err != nil {
		t.Fatalf("Transfer(10) over the agent: %v", err)
	}
	e.watch(ctx, 10, func(ev *pb.RoomEvent) bool { return ev.GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED })
	e.finish(ctx, 10)

	// The agent fails room 11's batch.
	e.open(ctx, 11, bootstrap)
	a11 := e.declare(ctx, 11)
	dst, _ = p.claim(ctx, 11)
	if err := transfer(11, dst); err == nil {
		t.Fatal("Transfer(11): the agent's injected failure was not reported")
	}
	term := e.watch(ctx, 11, func(ev *pb.RoomEvent) bool { return ev.GetTerminal() })
	if term.GetRoom().GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(term.GetRoom().GetFailure().GetMessage(), "injected fault") {
		t.Fatalf("room 11 ended %v; want TRANSFER_FAILED with the agent's error", term.GetRoom().GetFailure())
	}
	e.open(ctx, 13, bootstrap)
	if !term.GetPagesReusable() {
		e.wantHeld(ctx, 13, 11, a11, true)
	}
	e.awaitReusable(ctx, 11)
	t.Logf("room 11 failed by the agent; its pages reusable with its terminal event: %v", term.GetPagesReusable())

	// The prefill reports a failed write of room 12.
	e.open(ctx, 12, bootstrap)
	a12 := e.declare(ctx, 12)
	dst, end := p.claim(ctx, 12)
	if err := p.report(ctx, dst, 0, 0, 8, true); err != nil {
		t.Fatal(err)
	}
	if err := p.report(ctx, dst, 1, 8, 8, false); err != nil {
		t.Fatal(err)
	}
	if ev, err := end(); err != nil || ev.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !ev.GetAckRequired() {
		t.Fatalf("room 12's claim ended %v, %v; want TRANSFER_FAILED with ack_required", ev, err)
	}
	if term := e.watch(ctx, 12, func(ev *pb.RoomEvent) bool { return ev.GetTerminal() }); term.GetPagesReusable() {
		t.Fatal("room 12's pages reusable at its failure, while its rank may still write")
	}
	e.wantHeld(ctx, 13, 12, a12, true)
	if h := e.holds(ctx); h.GetDraining() != 1 || h.GetDrainingPages() != ownerRoomPages || h.GetDeclarationsRefused() == 0 {
		t.Fatalf("hand-off ledger while room 12 drains = %v", h)
	}
	if res, err := p.ack(ctx, 12, dst.GetAttempt(), dst.GetIncarnation()); err != nil || !res.GetReleased() {
		t.Fatalf("AckRoomEnd(12) = %v, %v; want released", res, err)
	}
	e.awaitReusable(ctx, 12)
	if a13 := e.declare(ctx, 13); !slices.Equal(a13.pages, a12.pages) {
		t.Fatalf("room 13 declared in %v; the engine's free list gave back room 12's %v first", a13.pages, a12.pages)
	}
	dst, _ = p.claim(ctx, 13)
	if err := transfer(13, dst); err != nil {
		t.Fatalf("Transfer(13) into room 12's pages: %v", err)
	}
	e.watch(ctx, 13, func(ev *pb.RoomEvent) bool { return ev.GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED })
	e.finish(ctx, 13)
	e.checkClean(ctx, bootstrap)
}

// TestE2EEngineOwnerPrefillRestart: the prefill restarts (the same
// address, a new instance id) while a room's rank is writing: the room
// fails (the prefill is lost), its pages stay held, draining, until the
// restarted rank acknowledges the room's end; then the next room is
// declared in them and handed off by the new instance.
func TestE2EEngineOwnerPrefillRestart(t *testing.T) {
	ctx := ownerCtx(t)
	addr := freeAddr(t)
	d := startDaemon(t, append([]string{"serve", "--listen", addr, "--set", "server.metrics_listen=", "--set", "release.deferred_timeout=5m"}, ownerPool()...), e2eEnviron())
	conn := ownerDial(t, addr)
	e2e.WaitHealth(t, conn, d, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	const bootstrap = "10.3.0.2:8998"
	boot := pb.NewBootstrapClient(conn)
	ownerRegister(t, ctx, boot, bootstrap, "prefill-1")
	e := newOwnerEngine(t, conn)
	p := &ownerRank{t: t, rooms: pb.NewRoomsClient(conn), rank: &pb.PrefillRank{BootstrapAddr: bootstrap}}

	e.open(ctx, 20, bootstrap)
	a20 := e.declare(ctx, 20)
	dst, end := p.claim(ctx, 20)
	if err := p.report(ctx, dst, 0, 0, 4, true); err != nil {
		t.Fatal(err)
	}
	ownerRegister(t, ctx, boot, bootstrap, "prefill-2") // the restart
	if ev, err := end(); err != nil || ev.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST || !ev.GetAckRequired() {
		t.Fatalf("room 20's claim ended %v, %v; want PREFILL_LOST with ack_required", ev, err)
	}
	if term := e.watch(ctx, 20, func(ev *pb.RoomEvent) bool { return ev.GetTerminal() }); term.GetPagesReusable() {
		t.Fatal("room 20's pages reusable at its failure, while the old prefill may still write")
	}
	e.open(ctx, 21, bootstrap)
	e.wantHeld(ctx, 21, 20, a20, true)
	if res, err := p.ack(ctx, 20, dst.GetAttempt(), dst.GetIncarnation()); err != nil || !res.GetReleased() {
		t.Fatalf("AckRoomEnd(20) by the restarted rank = %v, %v; want released", res, err)
	}
	e.awaitReusable(ctx, 20)
	if a21 := e.declare(ctx, 21); !slices.Equal(a21.pages, a20.pages) {
		t.Fatalf("room 21 declared in %v, want room 20's %v", a21.pages, a20.pages)
	}
	dst, _ = p.claim(ctx, 21)
	ownerSucceed(t, ctx, e, p, dst)
	e.finish(ctx, 21)
	e.checkClean(ctx, bootstrap)
}

// TestE2EEngineOwnerKill9Resync: the daemon binary is killed (SIGKILL)
// with two hand-offs in flight (one rank writing, one claimed) and a room
// the engine decodes, then started again with engine.resync_timeout. The
// engine re-declares its hand-offs in flight (ResyncRoom.in_flight): the
// new daemon holds their pages draining, refuses a declaration naming
// them, refuses the old claims' stale incarnation, and says they are
// reusable after the rank's acknowledgement (room 31) or after
// release.deferred_timeout (room 32, never acknowledged), not before;
// they are then accepted for a new room.
func TestE2EEngineOwnerKill9Resync(t *testing.T) {
	ctx := ownerCtx(t)
	addr := freeAddr(t)
	base := append([]string{"serve", "--listen", addr, "--set", "server.metrics_listen="}, ownerPool()...)
	first := startDaemon(t, append(base, "--set", "release.deferred_timeout=5m"), e2eEnviron())
	conn := ownerDial(t, addr)
	e2e.WaitHealth(t, conn, first, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	const bootstrap = "10.3.0.3:8998"
	boot := pb.NewBootstrapClient(conn)
	ownerRegister(t, ctx, boot, bootstrap, "prefill-k")
	e := newOwnerEngine(t, conn)
	p := &ownerRank{t: t, rooms: pb.NewRoomsClient(conn), rank: &pb.PrefillRank{BootstrapAddr: bootstrap}}

	e.open(ctx, 30, bootstrap)
	e.declare(ctx, 30)
	dst30, _ := p.claim(ctx, 30)
	ownerSucceed(t, ctx, e, p, dst30) // the engine decodes room 30 across the restart
	e.open(ctx, 31, bootstrap)
	a31 := e.declare(ctx, 31)
	dst31, _ := p.claim(ctx, 31)
	if err := p.report(ctx, dst31, 0, 0, 4, true); err != nil {
		t.Fatal(err)
	}
	e.open(ctx, 32, bootstrap)
	a32 := e.declare(ctx, 32)
	p.claim(ctx, 32) // claimed, nothing written yet

	first.Kill(t, 10*time.Second)
	const deferred = 3 * time.Second
	second := startDaemon(t, append(base, "--set", "engine.resync_timeout=60s", "--set", fmt.Sprintf("release.deferred_timeout=%s", deferred)), e2eEnviron())
	e2e.WaitHealth(t, conn, second, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	ownerRegister(t, ctx, boot, bootstrap, "prefill-k") // the prefill registers with the new incarnation
	dp := uint32(0)
	inFlight := func(room uint64, a ownerAlloc) *pb.ResyncRoom {
		return &pb.ResyncRoom{Room: room, Rid: fmt.Sprint("req-", room), PromptLen: ownerPromptLen, MaxNewTokens: 16, BootstrapAddr: bootstrap,
			PrefillDpRank: &dp, InFlight: true, PageIndices: a.pages, MetadataSlot: a.row}
	}
	resyncAt := time.Now()
	resp, err := p.rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{inFlight(31, a31), inFlight(32, a32)}, Done: true})
	if err != nil || resp.GetAdopted() != 2 || !resp.GetAdmitting() {
		t.Fatalf("Resync(in flight 31, 32) = %v, %v; want both adopted, admitting", resp, err)
	}
	if h := e.holds(ctx); h.GetDraining() != 2 || h.GetDrainingPages() != 2*ownerRoomPages {
		t.Fatalf("hand-off ledger after the resync = %v; want rooms 31 and 32 draining", h)
	}
	// The old claims are of the killed daemon's incarnation.
	if err := p.report(ctx, dst31, 1, 4, 4, true); status.Code(err) != codes.FailedPrecondition || reason(err) != "STALE_INCARNATION" {
		t.Fatalf("ReportTransfer on room 31's old destination = %v; want STALE_INCARNATION", err)
	}
	if _, err := p.ack(ctx, 31, dst31.GetAttempt(), dst31.GetIncarnation()); status.Code(err) != codes.FailedPrecondition || reason(err) != "STALE_INCARNATION" {
		t.Fatalf("AckRoomEnd(31) naming the old incarnation = %v; want STALE_INCARNATION", err)
	}
	e.open(ctx, 33, bootstrap)
	e.wantHeld(ctx, 33, 31, a31, true)
	e.wantHeld(ctx, 33, 32, a32, true)
	if res, err := p.ack(ctx, 31, dst31.GetAttempt(), 0); err != nil || !res.GetOwed() || !res.GetReleased() {
		t.Fatalf("AckRoomEnd(31, incarnation 0) = %v, %v; want owed and released", res, err)
	}
	e.awaitReusable(ctx, 31)
	if ev := e.awaitReusable(ctx, 32); ev.GetRoom().GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN {
		t.Fatalf("room 32's last event = %v; want the inherited hand-off's failure", ev)
	}
	if took := time.Since(resyncAt); took < deferred {
		t.Fatalf("room 32's pages reusable %v after the resync, before release.deferred_timeout (%v), with no acknowledgement", took, deferred)
	}
	if a33 := e.declare(ctx, 33); !slices.Equal(a33.pages, a32.pages) {
		t.Fatalf("room 33 declared in %v, want room 32's %v", a33.pages, a32.pages)
	}
	dst33, _ := p.claim(ctx, 33)
	ownerSucceed(t, ctx, e, p, dst33)
	e.finish(ctx, 33)
	// Room 30 was never in flight: the new daemon does not know it; the
	// engine finished decoding it and frees its pages itself.
	if _, err := p.rooms.GetRoom(ctx, &pb.GetRoomRequest{Room: 30}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetRoom(30) at the new daemon = %v; want NotFound", err)
	}
	e.give(ctx, 30)
	e.checkClean(ctx, bootstrap)
}
