package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

func pagesFrom(from, n int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = from + int32(i)
	}
	return p
}

// resyncRoom is a running room of 1000 + 10 tokens: 16 pages of 64.
func resyncRoom(room uint64, slot int32, pages []int32) *pb.ResyncRoom {
	return &pb.ResyncRoom{Room: room, Rid: "rid-engine", PromptLen: 1000, OutputLen: 10, MaxNewTokens: 128, ReqSlot: slot, PageIndices: pages}
}

func wantCode(t *testing.T, what string, err error, code codes.Code, substr ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("%s = %v; want %s", what, err, code)
	}
	for _, s := range substr {
		if !strings.Contains(st.Message(), s) {
			t.Errorf("%s: %q does not name %q", what, st.Message(), s)
		}
	}
}

// TestResyncAtTheWire: a daemon started with engine.resync_timeout stays
// SERVING (health) but admits nothing and says why in GetStatus; Resync's
// refusals carry the right codes and name the field; the adopted rooms are
// running rooms; done starts admission, after which Resync is refused;
// the metrics count it.
func TestResyncAtTheWire(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) { c.Engine.ResyncTimeout = time.Hour }})
	conn := d.Conn(t)
	rooms, admin := pb.NewRoomsClient(conn), pb.NewAdminClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health during the resync wait = %v, %v; want SERVING", h, err)
	}
	st, err := admin.GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil || !strings.HasPrefix(st.GetReadiness(), "waiting for the decode engine's resync (0 rooms declared so far), until ") {
		t.Fatalf("GetStatus readiness = %q, %v; want the resync wait", st.GetReadiness(), err)
	}
	// A room opened meanwhile queues; nothing is pre-allocated.
	if _, err := rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r-new", BootstrapAddr: "10.0.0.1:8998", Room: 100, PromptLen: 1000, MaxNewTokens: 128}); err != nil {
		t.Fatal(err)
	}

	// Wire bounds: InvalidArgument naming every bad field.
	bad := resyncRoom(1, 0, []int32{0, -3})
	bad.Rid, bad.MaxNewTokens = "", 0
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{bad}})
	wantCode(t, "Resync(bad fields)", err, codes.InvalidArgument, "rooms[0].rid", "rooms[0].req_slot", "rooms[0].page_indices[1]", "rooms[0].max_new_tokens")
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: make([]*pb.ResyncRoom, pb.MaxResyncRooms+1)})
	wantCode(t, "Resync(4097 rooms)", err, codes.InvalidArgument, "rooms", "at most 4096")
	// Domain checks: the page count, the shard.
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{resyncRoom(1, 1, pagesFrom(0, 15))}})
	wantCode(t, "Resync(15 pages)", err, codes.InvalidArgument, "rooms[0].page_indices", "want 16")
	wrongShard := resyncRoom(1, 1, pagesFrom(0, 16))
	wrongShard.DecodeDpRank = 3
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{wrongShard}})
	wantCode(t, "Resync(decode_dp_rank 3)", err, codes.InvalidArgument, "rooms[0].decode_dp_rank")

	resp, err := rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{resyncRoom(1, 1, pagesFrom(0, 16)), resyncRoom(2, 2, pagesFrom(16, 16))}})
	if err != nil || resp.GetAdopted() != 2 || resp.GetDeclared() != 2 || resp.GetPages() != 32 || resp.GetAdmitting() {
		t.Fatalf("Resync(2 rooms) = %v, %v; want 2 adopted, 32 pages, still waiting", resp, err)
	}
	// A page another declared room holds: FailedPrecondition naming it; a
	// known room: AlreadyExists. The call's earlier rooms stay adopted.
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{resyncRoom(3, 3, pagesFrom(32, 16)), resyncRoom(4, 4, append(pagesFrom(48, 15), 7))}})
	wantCode(t, "Resync(page 7 twice)", err, codes.FailedPrecondition, "rooms[1].page_indices", "page 7 is held by room 1", "1 rooms of this call adopted")
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{resyncRoom(2, 5, pagesFrom(64, 16))}})
	wantCode(t, "Resync(room 2 again)", err, codes.AlreadyExists, "rooms[0].room")

	st, _ = admin.GetStatus(ctx, &pb.GetStatusRequest{})
	if !strings.Contains(st.GetReadiness(), "(3 rooms declared so far)") {
		t.Errorf("readiness = %q; want 3 rooms declared", st.GetReadiness())
	}
	sh := st.GetShards()[0]
	if sh.GetRunning() != 3 || sh.GetPagesTotal()-sh.GetPagesFree() != 48 || sh.GetAdmitted() != 0 {
		t.Errorf("shard during the wait: %d running, %d pages used, %d admitted; want 3, 48, 0", sh.GetRunning(), sh.GetPagesTotal()-sh.GetPagesFree(), sh.GetAdmitted())
	}
	room, err := rooms.GetRoom(ctx, &pb.GetRoomRequest{Room: 3, IncludePages: true})
	if err != nil || room.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || len(room.GetPageIndices()) != 16 || room.GetPageIndices()[0] != 32 {
		t.Fatalf("GetRoom(3) = %v, %v; want succeeded with pages 32..47", room, err)
	}

	resp, err = rooms.Resync(ctx, &pb.ResyncRequest{Done: true})
	if err != nil || !resp.GetAdmitting() || resp.GetDeclared() != 3 {
		t.Fatalf("Resync(done) = %v, %v; want admitting with 3 declared", resp, err)
	}
	st, _ = admin.GetStatus(ctx, &pb.GetStatusRequest{})
	if st.GetReadiness() != "serving" {
		t.Errorf("readiness after done = %q; want serving", st.GetReadiness())
	}
	_, err = rooms.Resync(ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{resyncRoom(9, 9, pagesFrom(80, 16))}, Done: true})
	wantCode(t, "Resync after done", err, codes.FailedPrecondition, "admission already started")

	// The adopted rooms run: growth, release.
	rr, err := rooms.ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 1, OutputLen: 100}}})
	if err != nil || len(rr.GetGrown()) != 1 || len(rr.GetGrown()[0].GetNewPageIndices()) != 2 {
		t.Fatalf("ReportRunning(room 1) = %v, %v; want 2 new pages", rr, err)
	}
	for _, r := range []uint64{1, 2, 3} {
		if _, err := rooms.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: r}); err != nil {
			t.Fatalf("ReleaseRoom(%d) = %v", r, err)
		}
	}

	got := map[string]float64{}
	mfs, err := d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "decodeplane_resync_rooms_adopted_total", "decodeplane_resync_expired_total":
				got[mf.GetName()] = m.GetCounter().GetValue()
			case "decodeplane_resync_duration_seconds":
				got[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{"decodeplane_resync_rooms_adopted_total": 3, "decodeplane_resync_expired_total": 0, "decodeplane_resync_duration_seconds": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v; want %v", k, got[k], v)
		}
	}
}

// TestResyncBlockedByAgrees: during the resync wait and after it, each
// shard's blocked_by reads the same in GetStatus as in WatchCapacity
// (capacity.proto: "as GetStatus's shards say it"): "resync" while
// admission waits for the engine, the ledger's reason after.
func TestResyncBlockedByAgrees(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) { c.Engine.ResyncTimeout = time.Hour }})
	conn := d.Conn(t)
	admin, rooms := pb.NewAdminClient(conn), pb.NewRoomsClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	agree := func(when, want string) {
		t.Helper()
		st, err := admin.GetStatus(ctx, &pb.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		w, err := pb.NewCapacityClient(conn).WatchCapacity(wctx, &pb.WatchCapacityRequest{})
		if err != nil {
			t.Fatal(err)
		}
		u, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(st.GetShards()) != len(u.GetShards()) {
			t.Fatalf("%s: GetStatus has %d shards, WatchCapacity %d", when, len(st.GetShards()), len(u.GetShards()))
		}
		for i, sh := range st.GetShards() {
			if got, feed := sh.GetBlockedBy(), u.GetShards()[i].GetBlockedBy(); got != want || feed != want {
				t.Errorf("%s: shard %d blocked_by: GetStatus %q, WatchCapacity %q; want %q in both", when, i, got, feed, want)
			}
		}
	}
	agree("during the resync wait", "resync")
	if _, err := rooms.Resync(ctx, &pb.ResyncRequest{Done: true}); err != nil {
		t.Fatal(err)
	}
	agree("after the resync", "none")
}
