package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestE2EKill9EngineResync: rooms in several phases (running, one grown,
// one retracted, one mid-hand-off with the prefill writing, one waiting
// for an unregistered prefill), then the daemon binary is killed (SIGKILL)
// and started again on the same port with engine.resync_timeout. The new
// daemon is SERVING but admits nothing and says so; the prefill learns the
// new incarnation and registers again; its old destination is refused
// (STALE_INCARNATION) and its hand-off stops before the next write; a room
// opened meanwhile queues. The "engine" (this test, through the Go client)
// re-declares its three running rooms with the pages the old daemon gave
// them; then the queued room and new rooms get destinations in other
// pages (no page owned twice), the adopted rooms grow and are released,
// and the pool is whole again.
func TestE2EKill9EngineResync(t *testing.T) {
	addr := freeAddr(t)
	base := []string{"serve", "--listen", addr, "--set", "server.metrics_listen="}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hc, first, c := startForRestart(t, addr, base)
	st, err := c.Admin().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldInc := st.GetIncarnation()

	const bootstrap = "10.1.0.1:8998"
	changes := make(chan [2]uint64, 4)
	p := c.Prefill(&pb.RegisterPrefillRequest{BootstrapAddr: bootstrap, RankEndpoint: "10.1.0.1:17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: "prefill-resync"},
		client.HeartbeatEvery(50*time.Millisecond),
		client.OnIncarnationChange(func(o, n uint64) { changes <- [2]uint64{o, n} }))
	if _, err := p.Register(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, stopBeat := context.WithCancel(ctx)
	beat := make(chan error, 1)
	go func() { beat <- p.RunHeartbeat(hctx) }()
	defer func() {
		stopBeat()
		<-beat
	}()
	open := func(room uint64, addr string) {
		t.Helper()
		if _, err := c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r-" + string(rune('a'+room)), BootstrapAddr: addr, Room: room, PromptLen: 1000, MaxNewTokens: 256}); err != nil {
			t.Fatalf("OpenRoom(%d) = %v", room, err)
		}
	}
	handOff := func(room uint64) {
		t.Helper()
		open(room, bootstrap)
		if _, err := p.ReportRoom(ctx, room, client.SendOptions{ChunkPages: 4}); err != nil {
			t.Fatalf("ReportRoom(%d) = %v", room, err)
		}
	}
	pagesOf := func(room uint64) []int32 {
		t.Helper()
		r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: room, IncludePages: true})
		if err != nil {
			t.Fatalf("GetRoom(%d) = %v", room, err)
		}
		return r.GetPageIndices()
	}

	// The old daemon's rooms: 1, 2, 3 running (1 grown to 1,200 tokens), 4
	// mid-hand-off, 5 waiting for an unregistered prefill, 6 retracted.
	for _, room := range []uint64{1, 2, 3, 6} {
		handOff(room)
	}
	if rr, err := c.Engine().ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 1, OutputLen: 200}}}); err != nil || len(rr.GetGrown()) != 1 {
		t.Fatalf("ReportRunning(1) = %v, %v; want room 1 grown", rr, err)
	}
	engine := map[uint64]*pb.ResyncRoom{ // what the engine still runs, as it knows it
		1: {Room: 1, Rid: "r-b", PromptLen: 1000, OutputLen: 200, MaxNewTokens: 256, ReqSlot: 1, PageIndices: pagesOf(1)},
		2: {Room: 2, Rid: "r-c", PromptLen: 1000, OutputLen: 1, MaxNewTokens: 256, ReqSlot: 2, PageIndices: pagesOf(2)},
		3: {Room: 3, Rid: "r-d", PromptLen: 1000, OutputLen: 1, MaxNewTokens: 256, ReqSlot: 3, PageIndices: pagesOf(3)},
	}
	dp0 := uint32(0)
	oldPages := 0
	for _, r := range engine {
		r.BootstrapAddr, r.PrefillDpRank = bootstrap, &dp0
		oldPages += len(r.PageIndices)
	}
	open(4, bootstrap)
	blocked, release := make(chan struct{}), make(chan struct{})
	var oldDest *pb.Destination
	done4 := make(chan error, 1)
	go func() {
		_, err := p.ReportRoom(ctx, 4, client.SendOptions{ChunkPages: 4, Move: func(_ context.Context, ch client.Chunk) (uint64, error) {
			if ch.Index == 1 {
				oldDest = ch.Destination
				close(blocked)
				<-release
			}
			return ch.Bytes(), nil
		}})
		done4 <- err
	}()
	select {
	case <-blocked:
	case err := <-done4:
		t.Fatalf("ReportRoom(4) ended before chunk 1: %v", err)
	}
	open(5, "10.9.9.9:8998")
	// Retracted last: while a retracted room waits, nothing new is admitted.
	if _, err := c.Engine().RetractRoom(ctx, &pb.RetractRoomRequest{Room: 6, Mode: pb.RetractMode_RETRACT_MODE_RETRACT}); err != nil {
		t.Fatal(err)
	}
	st, _ = c.Admin().Status(ctx)
	t.Logf("before the kill: rooms %v, shard 0 %d of %d pages used", st.GetRoomsByPhase(), st.GetShards()[0].GetPagesTotal()-st.GetShards()[0].GetPagesFree(), st.GetShards()[0].GetPagesTotal())

	// kill -9, restart on the same port with a resync wait.
	killed := time.Now()
	first.Kill(t, 10*time.Second)
	second := startDaemon(t, append(base, "--set", "engine.resync_timeout=60s"), e2eEnviron())
	e2e.WaitHealth(t, hc, second, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	serving := time.Since(killed)
	var change [2]uint64
	select {
	case change = <-changes:
	case <-ctx.Done():
		t.Fatal("the prefill never saw the new incarnation")
	}
	st, err = c.Admin().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	newInc := st.GetIncarnation()
	if newInc == oldInc || change != [2]uint64{oldInc, newInc} {
		t.Fatalf("incarnations: old %x, new %x, the prefill saw %x; want a new one", oldInc, newInc, change)
	}
	if !strings.HasPrefix(st.GetReadiness(), "waiting for the decode engine's resync (0 rooms declared so far), until ") {
		t.Errorf("readiness after the restart = %q; want the resync wait", st.GetReadiness())
	}

	// The prefill's old destination is refused and changes nothing; its
	// hand-off stops before the next write.
	_, err = p.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: 4, ChunkIndex: 1, PageOffset: 4, NumPages: 4,
		Success: true, Bytes: 1, Attempt: oldDest.GetAttempt(), Incarnation: oldDest.GetIncarnation()})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "earlier decodeplane incarnation") {
		t.Errorf("ReportTransfer on the old destination = %v; want FailedPrecondition STALE_INCARNATION", err)
	}
	close(release)
	if err := <-done4; !errors.Is(err, client.ErrIncarnationChanged) {
		t.Errorf("ReportRoom(4) across the restart = %v; want ErrIncarnationChanged", err)
	}

	// A room opened during the wait queues (or still waits for the
	// prefill's re-registration, which the heartbeat sends after it learned
	// the incarnation); nothing is pre-allocated.
	open(10, bootstrap)
	if r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 10}); err != nil ||
		r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED && r.GetPhase() != pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL {
		t.Fatalf("room 10 during the wait = %v, %v; want QUEUED (or WAITING_PREFILL), not admitted", r.GetPhase(), err)
	}
	st, _ = c.Admin().Status(ctx)
	if sh := st.GetShards()[0]; sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetAdmitted() != 0 {
		t.Fatalf("before the resync %d of %d pages are free, %d admitted; want all free, none", sh.GetPagesFree(), sh.GetPagesTotal(), sh.GetAdmitted())
	}

	// The engine's resync.
	declared := []*pb.ResyncRoom{engine[1], engine[2], engine[3]}
	resyncStart := time.Now()
	resp, err := c.Engine().Resync(ctx, declared)
	if err != nil || !resp.GetAdmitting() || resp.GetDeclared() != 3 || resp.GetPages() != uint64(oldPages) {
		t.Fatalf("Resync = %v, %v; want 3 rooms, %d pages, admitting", resp, err, oldPages)
	}
	resyncTook := time.Since(resyncStart)
	if _, err := c.Engine().Resync(ctx, nil); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a second Resync = %v; want FailedPrecondition", err)
	}

	// New rooms get destinations, in other pages.
	if _, err := p.ReportRoom(ctx, 10, client.SendOptions{ChunkPages: 4}); err != nil {
		t.Fatalf("ReportRoom(10) after the resync = %v", err)
	}
	fresh := []uint64{10}
	for room := uint64(11); room <= 14; room++ {
		handOff(room)
		fresh = append(fresh, room)
	}
	owner := map[int32]uint64{}
	total := 0
	for _, room := range append([]uint64{1, 2, 3}, fresh...) {
		pages := pagesOf(room)
		if room <= 3 && !slices.Equal(pages, engine[room].PageIndices) {
			t.Errorf("adopted room %d holds %v; the engine declared %v", room, pages, engine[room].PageIndices)
		}
		for _, pg := range pages {
			if o, ok := owner[pg]; ok {
				t.Errorf("page %d is owned by rooms %d and %d", pg, o, room)
			}
			owner[pg] = room
		}
		total += len(pages)
	}
	// A fresh ledger hands pages out in the same order as the killed one
	// did: without the resync room 10 would have got room 1's pages.
	p1, p10 := engine[1].PageIndices, pagesOf(10)
	t.Logf("adopted room 1 holds %[3]d pages (first %[1]d, last %[2]d); room 10, admitted after the resync, %[6]d (first %[4]d, last %[5]d)", p1[0], p1[len(p1)-1], len(p1), p10[0], p10[len(p10)-1], len(p10))
	st, _ = c.Admin().Status(ctx)
	sh := st.GetShards()[0]
	if used := int(sh.GetPagesTotal() - sh.GetPagesFree()); used != total || sh.GetRunning() != 8 {
		t.Errorf("status: %d pages used, %d running; the rooms hold %d pages, 8 run", used, sh.GetRunning(), total)
	}
	if st.GetReadiness() != "serving" {
		t.Errorf("readiness after the resync = %q; want serving", st.GetReadiness())
	}

	// The adopted rooms are running rooms: they grow and are released; the
	// pool is whole again.
	rr, err := c.Engine().ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 1, OutputLen: 300}, {Room: 2, OutputLen: 100}}})
	if err != nil || len(rr.GetGrown()) != 2 {
		t.Fatalf("ReportRunning(adopted rooms) = %v, %v; want both grown", rr, err)
	}
	for _, g := range rr.GetGrown() {
		for _, pg := range g.GetNewPageIndices() {
			if o, ok := owner[pg]; ok {
				t.Errorf("room %d grew into page %d of room %d", g.GetRoom(), pg, o)
			}
		}
	}
	for _, room := range append([]uint64{1, 2, 3}, fresh...) {
		if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
			t.Fatalf("ReleaseRoom(%d) = %v", room, err)
		}
	}
	st, _ = c.Admin().Status(ctx)
	sh = st.GetShards()[0]
	if sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() || sh.GetRunning() != 0 {
		t.Errorf("after the releases: %d of %d pages, %d of %d req slots free, %d running; want the pool whole",
			sh.GetPagesFree(), sh.GetPagesTotal(), sh.GetReqSlotsFree(), sh.GetReqSlotsTotal(), sh.GetRunning())
	}
	for _, room := range []uint64{4, 5, 6} {
		if _, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: room}); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("GetRoom(%d) at the new daemon = %v; want ErrNotFound (never declared)", room, err)
		}
	}
	t.Logf("kill -9 → SERVING %v; resync of 3 rooms (%d pages) took %v; then %d new rooms (%d pages in all, none shared); incarnation %x → %x",
		serving.Round(time.Millisecond), oldPages, resyncTook.Round(time.Microsecond), len(fresh), total, oldInc, newInc)
}
