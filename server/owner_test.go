package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// The decode engine as the page owner (kv_pool.owner: engine) over real
// gRPC on loopback TCP, against a whole daemon (daemontest): declarations
// over the unary RPC and the EngineSession, the hand-off ledger's refusals
// and their ErrorInfo, capacity reports as routers read them
// (WatchCapacity, GetStatus, /metrics), pages reusable after a drained
// failure, and the engine's resync of its hand-offs in flight. Rooms are
// 1000-token prompts: 16 pages of 64 tokens (the default pool, 16384
// pages).

const ownerPrefill = "10.7.0.1:8998"

// ownerWire is an engine-owned daemon with one registered TP-1 prefill.
type ownerWire struct {
	t     *testing.T
	ctx   context.Context
	d     *daemontest.Daemon
	conn  *grpc.ClientConn
	boot  pb.BootstrapClient
	rooms pb.RoomsClient
	admin pb.AdminClient
	capc  pb.CapacityClient
}

// newOwnerWire starts the daemon (release.deferred_timeout 10m: a drain
// ends by the acknowledgements) with mod applied, and registers the
// prefill unless mod's daemon waits for a resync that names it unknown.
func newOwnerWire(t *testing.T, register bool, mod func(*config.Config)) *ownerWire {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	d := daemontest.Start(t, daemontest.Options{TCP: true, Config: func(c *config.Config) {
		c.KVPool.Owner = kvlayout.OwnerEngine
		c.Release.DeferredTimeout = 10 * time.Minute
		if mod != nil {
			mod(c)
		}
	}})
	conn := d.Conn(t)
	w := &ownerWire{t: t, ctx: ctx, d: d, conn: conn, boot: pb.NewBootstrapClient(conn), rooms: pb.NewRoomsClient(conn),
		admin: pb.NewAdminClient(conn), capc: pb.NewCapacityClient(conn)}
	if register {
		w.register()
	}
	return w
}

func (w *ownerWire) register() {
	w.t.Helper()
	if _, err := w.boot.RegisterPrefill(w.ctx, &pb.RegisterPrefillRequest{BootstrapAddr: ownerPrefill, RankEndpoint: "10.7.0.1:17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16",
		InstanceId: "owner-prefill"}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *ownerWire) open(room uint64) *pb.Room {
	w.t.Helper()
	resp, err := w.rooms.OpenRoom(w.ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint("r-", room), BootstrapAddr: ownerPrefill, Room: room,
		PromptLen: 1000, MaxNewTokens: 16})
	if err != nil {
		w.t.Fatalf("OpenRoom(%d): %v", room, err)
	}
	return resp.GetRoom()
}

// declaration is room's 16 pages from first on and metadata row slot.
func declaration(room uint64, first, slot int32) *pb.DeclareDestinationRequest {
	return &pb.DeclareDestinationRequest{Room: room, PageIndices: pagesFrom(first, 16), MetadataSlot: slot}
}

func (w *ownerWire) declare(room uint64, first, slot int32) (*pb.DeclareDestinationResponse, error) {
	return w.rooms.DeclareDestination(w.ctx, declaration(room, first, slot))
}

func (w *ownerWire) status() *pb.GetStatusResponse {
	w.t.Helper()
	st, err := w.admin.GetStatus(w.ctx, &pb.GetStatusRequest{})
	if err != nil {
		w.t.Fatal(err)
	}
	return st
}

func (w *ownerWire) holds() *pb.HandoffHolds {
	w.t.Helper()
	h := w.status().GetShards()[0].GetHolds()
	if h == nil {
		w.t.Fatal("GetStatus: shard 0 has no hand-off ledger with the engine as owner")
	}
	return h
}

// claim claims room as the prefill's rank and reports its first chunk of
// 4 pages written (the prefill writes by itself): from then on the rank
// may write into the room's pages until it acknowledges.
func (w *ownerWire) claim(room uint64) *pb.Destination {
	w.t.Helper()
	stream, err := w.rooms.AwaitDestination(w.ctx, &pb.AwaitDestinationRequest{Room: room, Rank: prank(ownerPrefill, 0)})
	if err != nil {
		w.t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetDestination() == nil {
		w.t.Fatalf("AwaitDestination(%d) = %v, %v", room, ev, err)
	}
	dst := ev.GetDestination()
	if _, err := w.rooms.ReportTransfer(w.ctx, &pb.ReportTransferRequest{Room: room, Rank: prank(ownerPrefill, 0), NumPages: 4, Success: true,
		Bytes: 4 * uint64(dst.GetPageSize()) * dst.GetTokenBytes(), Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}); err != nil {
		w.t.Fatal(err)
	}
	return dst
}

// gauge is the value of the daemon's gauge or counter name with labels.
func gauge(t *testing.T, d *daemontest.Daemon, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, p := range m.GetLabel() {
				if v, ok := labels[p.GetName()]; ok && v != p.GetValue() {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// pageHeld is err's PAGE_HELD ErrorInfo metadata (nil without one).
func pageHeld(err error) map[string]string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == server.ReasonPageHeld && ei.GetDomain() == server.ErrorDomain {
			return ei.GetMetadata()
		}
	}
	return nil
}

// TestEngineOwnerDeclareAtTheWire: an engine-owned room opens QUEUED,
// waiting for the declaration; the unary declaration admits it into the
// declared pages (a repeat is already); a declaration naming one of them
// is FAILED_PRECONDITION with ErrorInfo PAGE_HELD (what, index, holder,
// draining) and changes nothing but the refusal counters (GetStatus,
// /metrics); the prefill's destination is the declared one; at success the
// hold ends and the same pages are accepted for another room. ReportRunning
// and RetractRoom are refused, saying why.
func TestEngineOwnerDeclareAtTheWire(t *testing.T) {
	w := newOwnerWire(t, true, nil)
	w.open(1)
	r, err := w.rooms.GetRoom(w.ctx, &pb.GetRoomRequest{Room: 1})
	if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED || !strings.Contains(r.GetWaitingFor(), "DeclareDestination") {
		t.Fatalf("opened room = %s waiting for %q; want QUEUED, waiting for the engine's declaration", r.GetPhase(), r.GetWaitingFor())
	}
	w.open(2)
	if h := w.holds(); h.GetQueued() != 2 || h.GetHeld() != 0 {
		t.Fatalf("holds = %v; want 2 rooms waiting for their declaration", h)
	}
	resp, err := w.declare(1, 100, 7)
	if err != nil || resp.GetAlready() || resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED {
		t.Fatalf("DeclareDestination(1) = %v, %v; want admitted", resp, err)
	}
	if resp, err := w.declare(1, 100, 7); err != nil || !resp.GetAlready() {
		t.Fatalf("the same declaration again = %v, %v; want already", resp, err)
	}
	before := w.status()
	_, err = w.declare(2, 110, 8)
	md := pageHeld(err)
	wantCode(t, "declaring room 1's page 110", err, codes.FailedPrecondition, "page 110 is still held by room 1")
	if md["what"] != "page" || md["index"] != "110" || md["holder"] != "1" || md["draining"] != "false" {
		t.Fatalf("PAGE_HELD metadata = %v; want page 110 held by room 1, not draining", md)
	}
	_, err = w.declare(2, 200, 7)
	if md := pageHeld(err); md["what"] != "metadata slot" || md["index"] != "7" || md["holder"] != "1" {
		t.Fatalf("declaring room 1's metadata row 7 = %v (%v); want PAGE_HELD naming metadata slot 7", err, md)
	}
	after := w.status()
	if h := after.GetShards()[0].GetHolds(); h.GetDeclarationsRefused() != 2 || h.GetQueued() != 1 || h.GetHeld() != 1 || h.GetHeldPages() != 16 {
		t.Fatalf("holds after two refusals = %v; want 2 refused, room 1 holding 16 pages, room 2 waiting", h)
	}
	if after.GetRoomsByPhase()["queued"] != before.GetRoomsByPhase()["queued"] {
		t.Fatalf("rooms by phase changed by a refusal: %v → %v", before.GetRoomsByPhase(), after.GetRoomsByPhase())
	}
	if n, _ := gauge(t, w.d, "decodeplane_declarations_refused_total", map[string]string{"dp_rank": "0"}); n != 2 {
		t.Errorf("decodeplane_declarations_refused_total = %v; want 2", n)
	}
	if n, _ := gauge(t, w.d, "decodeplane_handoff_pages", map[string]string{"state": "held"}); n != 16 {
		t.Errorf("decodeplane_handoff_pages{held} = %v; want 16", n)
	}

	dst := w.claim(1)
	if pages := dst.GetPageIndices(); len(pages) != 16 || pages[0] != 100 || pages[15] != 115 || dst.GetMetadataSlot() != 7 {
		t.Fatalf("the prefill's destination = pages %v row %d; want the declared 100..115, row 7", pages, dst.GetMetadataSlot())
	}
	if _, err := w.rooms.ReportTransfer(w.ctx, &pb.ReportTransferRequest{Room: 1, Rank: prank(ownerPrefill, 0), ChunkIndex: 1, PageOffset: 4,
		NumPages: 12, Last: true, Success: true, Bytes: (1000 - 4*64) * dst.GetTokenBytes(), MetadataRoomMarker: 1,
		Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}); err != nil {
		t.Fatal(err)
	}
	if r, err := w.rooms.GetRoom(w.ctx, &pb.GetRoomRequest{Room: 1}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("room 1 after its last chunk = %v, %v; want succeeded", r.GetPhase(), err)
	}
	if h := w.holds(); h.GetHeld() != 0 || h.GetHeldPages() != 0 {
		t.Fatalf("holds after success = %v; want none: the engine decodes in its pages", h)
	}
	_, err = w.rooms.ReportRunning(w.ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 1, OutputLen: 600}}})
	wantCode(t, "ReportRunning", err, codes.FailedPrecondition, "the decode engine owns the pages (kv_pool.owner: engine)")
	_, err = w.rooms.RetractRoom(w.ctx, &pb.RetractRoomRequest{Room: 1, Mode: pb.RetractMode_RETRACT_MODE_RETRACT})
	wantCode(t, "RetractRoom", err, codes.FailedPrecondition, "its own scheduler grows and retracts running requests")
	if _, err := w.declare(2, 100, 7); err != nil {
		t.Fatalf("declaring room 1's pages once its hand-off ended = %v", err)
	}
	for room := uint64(1); room <= 2; room++ {
		if _, err := w.rooms.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
}

// engineStream is an EngineSession stream, read op by op.
type engineStream struct {
	t   *testing.T
	s   pb.EngineSession_SessionClient
	seq uint64
	// events are the room events read while waiting for replies.
	events []*pb.EngineRoomEvent
}

func openEngineStream(t *testing.T, ctx context.Context, conn *grpc.ClientConn) *engineStream {
	t.Helper()
	s, err := pb.NewEngineSessionClient(conn).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &engineStream{t: t, s: s}
}

// do sends one op and returns its reply (the room events read meanwhile
// are kept).
func (es *engineStream) do(req *pb.EngineRequest) *pb.EngineReply {
	es.t.Helper()
	es.seq++
	req.Seq = es.seq
	if err := es.s.Send(req); err != nil {
		es.t.Fatal(err)
	}
	for {
		ev, err := es.s.Recv()
		if err != nil {
			es.t.Fatalf("op %d: %v", req.Seq, err)
		}
		if r := ev.GetReply(); r != nil && r.GetSeq() == req.Seq {
			return r
		}
		if re := ev.GetRoom(); re != nil {
			es.events = append(es.events, re)
		}
	}
}

// result is the op's single result as an error (nil when OK), with the
// ErrorInfo its result carries.
func (es *engineStream) result(req *pb.EngineRequest) (*pb.EngineResult, error) {
	es.t.Helper()
	r := es.do(req)
	if r.GetCode() != 0 || len(r.GetResults()) != 1 {
		es.t.Fatalf("reply = %v; want one result", r)
	}
	res := r.GetResults()[0]
	if res.GetCode() == 0 {
		return res, nil
	}
	st := status.New(codes.Code(res.GetCode()), res.GetMessage())
	if res.GetReason() != "" {
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: res.GetReason(), Domain: server.ErrorDomain, Metadata: res.GetMetadata()})
	}
	return res, st.Err()
}

// next reads the stream's next room event.
func (es *engineStream) next() *pb.EngineRoomEvent {
	es.t.Helper()
	if len(es.events) > 0 {
		ev := es.events[0]
		es.events = es.events[1:]
		return ev
	}
	for {
		ev, err := es.s.Recv()
		if err != nil {
			es.t.Fatalf("waiting for a room event: %v", err)
		}
		if re := ev.GetRoom(); re != nil {
			return re
		}
	}
}

// TestEngineOwnerDeclareOverTheSession: the EngineSession's declare and
// capacity ops are DeclareDestination and ReportCapacity: the same
// answers, a held page's refusal carrying the same PAGE_HELD ErrorInfo
// in its result, a bad field named under the op ("declare.page_indices");
// the Go client's Engine reads the refusal with PageHeld on either
// transport.
func TestEngineOwnerDeclareOverTheSession(t *testing.T) {
	w := newOwnerWire(t, true, nil)
	es := openEngineStream(t, w.ctx, w.conn)
	open := es.do(&pb.EngineRequest{Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{
		{Rid: "r-1", BootstrapAddr: ownerPrefill, Room: 1, PromptLen: 1000, MaxNewTokens: 16},
		{Rid: "r-2", BootstrapAddr: ownerPrefill, Room: 2, PromptLen: 1000, MaxNewTokens: 16}}}}})
	for _, r := range open.GetResults() {
		if r.GetCode() != 0 || r.GetOpen().GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
			t.Fatalf("open over the session = %v; want QUEUED", r)
		}
	}
	res, err := es.result(&pb.EngineRequest{Op: &pb.EngineRequest_Declare{Declare: declaration(1, 0, 0)}})
	if err != nil || res.GetRoom() != 1 || res.GetDeclare().GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED {
		t.Fatalf("declare op = %v, %v; want room 1 admitted", res, err)
	}
	_, err = es.result(&pb.EngineRequest{Op: &pb.EngineRequest_Declare{Declare: declaration(2, 15, 1)}})
	wantCode(t, "declare op of room 1's page 15", err, codes.FailedPrecondition, "page 15 is still held by room 1")
	if md := pageHeld(err); md["index"] != "15" || md["holder"] != "1" || md["what"] != "page" {
		t.Fatalf("the declare op's result ErrorInfo = %v; want PAGE_HELD page 15 held by room 1", md)
	}
	bad := declaration(2, 16, 1)
	bad.PageIndices[3] = -1
	_, err = es.result(&pb.EngineRequest{Op: &pb.EngineRequest_Declare{Declare: bad}})
	wantCode(t, "declare op with a negative page", err, codes.InvalidArgument, "declare.page_indices[3]")
	_, err = es.result(&pb.EngineRequest{Op: &pb.EngineRequest_Capacity{Capacity: &pb.ReportCapacityRequest{DecodeDpRank: 3}}})
	wantCode(t, "capacity op of shard 3", err, codes.InvalidArgument, "capacity.decode_dp_rank")
	if _, err := es.result(&pb.EngineRequest{Op: &pb.EngineRequest_Capacity{Capacity: &pb.ReportCapacityRequest{PagesFree: 7}}}); err != nil {
		t.Fatalf("capacity op = %v", err)
	}
	if !w.holds().GetCapacityReported() {
		t.Fatal("GetStatus: capacity_reported false after the capacity op")
	}

	for _, tr := range []client.Transport{client.TransportStreams, client.TransportUnary} {
		c, err := client.New(w.d.Addr, client.WithTransport(tr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if tr == client.TransportStreams { // the shared session up, so that the declaration rides it
			go func() {
				_, _ = c.Engine().OpenAndWait(w.ctx, &pb.OpenRoomRequest{Rid: "r-9", BootstrapAddr: ownerPrefill, Room: 9, PromptLen: 1000, MaxNewTokens: 16})
			}()
		}
		_, err = c.Engine().DeclareDestination(w.ctx, declaration(2, 8, 2))
		held, ok := client.PageHeld(err)
		if !errors.Is(err, client.ErrFailedPrecondition) || !ok || held != (client.Held{What: "page", Index: 8, Holder: 1}) {
			t.Errorf("%v: the Go client's declaration of a held page = %v; PageHeld = %+v, %v", tr, err, held, ok)
		}
	}
	if h := w.holds(); h.GetDeclarationsRefused() != 3 {
		t.Errorf("declarations refused = %d; want 3 (the session's and the Go client's two)", h.GetDeclarationsRefused())
	}
}

// TestEngineOwnerCapacityAtTheWire: routers read the engine's capacity:
// before its first report the free figures are 0 and blocked_by is
// engine_unreported (WatchCapacity, GetStatus, /metrics); a ReportCapacity
// shows in the next WatchCapacity update, GetStatus and the shard gauges,
// with the rooms waiting for a declaration in the queue depth.
func TestEngineOwnerCapacityAtTheWire(t *testing.T) {
	w := newOwnerWire(t, true, nil)
	stream, err := w.capc.WatchCapacity(w.ctx, &pb.WatchCapacityRequest{MinInterval: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	u, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if sc := u.GetShards()[0]; sc.GetBlockedBy() != "engine_unreported" || sc.GetTokensFree() != 0 || sc.GetPagesFree() != 0 || sc.GetPagesTotal() != 16384 {
		t.Fatalf("capacity before a report = %v; want 0 free of 16384 pages, blocked by engine_unreported", sc)
	}
	if sh := w.status().GetShards()[0]; sh.GetBlockedBy() != "engine_unreported" || sh.GetHolds().GetCapacityReported() {
		t.Fatalf("GetStatus before a report: blocked by %q, %v", sh.GetBlockedBy(), sh.GetHolds())
	}
	if v, _ := gauge(t, w.d, "decodeplane_admission_blocked", map[string]string{"reason": "engine_unreported"}); v != 1 {
		t.Errorf("decodeplane_admission_blocked{engine_unreported} = %v; want 1", v)
	}
	w.open(1)
	w.open(2)
	if _, err := w.capc.ReportCapacity(w.ctx, &pb.ReportCapacityRequest{TokensFree: 64_000, PagesFree: 1000, ReqSlotsFree: 30,
		MetadataSlotsFree: 40, QueueDepth: 1, Running: 5}); err != nil {
		t.Fatal(err)
	}
	for {
		if u, err = stream.Recv(); err != nil {
			t.Fatal(err)
		}
		if u.GetShards()[0].GetTokensFree() == 64_000 {
			break
		}
	}
	sc := u.GetShards()[0]
	if sc.GetPagesFree() != 1000 || sc.GetReqSlotsFree() != 30 || sc.GetQueueDepth() != 2 || sc.GetRunning() != 5 || sc.GetBlockedBy() != "none" || sc.GetPagesTotal() != 16384 {
		t.Fatalf("capacity after the report = %v; want the engine's figures, the 2 rooms waiting for a declaration as the queue", sc)
	}
	sh := w.status().GetShards()[0]
	if sh.GetPagesFree() != 1000 || sh.GetMetadataSlotsFree() != 40 || sh.GetRunning() != 5 || !sh.GetHolds().GetCapacityReported() || sh.GetBlockedBy() != "none" {
		t.Fatalf("GetStatus after the report = %v", sh)
	}
	for name, want := range map[string]float64{"decodeplane_shard_tokens_free": 64_000, "decodeplane_shard_tokens_total": 16384 * 64} {
		if v, _ := gauge(t, w.d, name, map[string]string{"dp_rank": "0"}); v != want {
			t.Errorf("%s = %v; want %v", name, v, want)
		}
	}
	if v, _ := gauge(t, w.d, "decodeplane_kv_pages", map[string]string{"state": "free"}); v != 1000 {
		t.Errorf("decodeplane_kv_pages{free} = %v; want 1000", v)
	}
	if v, _ := gauge(t, w.d, "decodeplane_admission_blocked", map[string]string{"reason": "none"}); v != 1 {
		t.Errorf("decodeplane_admission_blocked{none} = %v; want 1", v)
	}
	for room := uint64(1); room <= 2; room++ {
		if _, err := w.rooms.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEngineOwnerPagesReusableAtTheWire: a declared room that fails while
// its prefill rank may still write keeps its pages held, draining: a
// declaration naming one is refused PAGE_HELD with draining true; its
// WatchRoom and its EngineSession subscription end only with the event
// saying its pages are reusable, after the rank's AckRoomEnd; then the
// pages are accepted for another room.
func TestEngineOwnerPagesReusableAtTheWire(t *testing.T) {
	w := newOwnerWire(t, true, nil)
	es := openEngineStream(t, w.ctx, w.conn)
	es.do(&pb.EngineRequest{Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{
		{Rid: "r-1", BootstrapAddr: ownerPrefill, Room: 1, PromptLen: 1000, MaxNewTokens: 16}}}}})
	w.open(2)
	if _, err := w.declare(1, 0, 0); err != nil {
		t.Fatal(err)
	}
	watch, err := w.rooms.WatchRoom(w.ctx, &pb.WatchRoomRequest{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	dst := w.claim(1)
	if _, err := w.rooms.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: 1, Reason: "client went away"}); err != nil {
		t.Fatal(err)
	}
	var terminal *pb.RoomEvent
	for terminal == nil {
		ev, err := watch.Recv()
		if err != nil {
			t.Fatalf("WatchRoom(1) before the terminal event: %v", err)
		}
		if ev.GetTerminal() {
			terminal = ev
		}
	}
	if terminal.GetPagesReusable() || terminal.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Fatalf("terminal event = %v; want FAILED, pages not reusable yet", terminal)
	}
	_, err = w.declare(2, 4, 1)
	if md := pageHeld(err); md["holder"] != "1" || md["draining"] != "true" || md["index"] != "4" {
		t.Fatalf("declaring a draining room's page 4 = %v (%v); want PAGE_HELD, held by room 1, draining", err, md)
	}
	if h := w.holds(); h.GetDraining() != 1 || h.GetDrainingPages() != 16 {
		t.Fatalf("holds after the abort = %v; want room 1's 16 pages draining", h)
	}
	if _, err := w.rooms.AckRoomEnd(w.ctx, &pb.AckRoomEndRequest{Room: 1, Rank: prank(ownerPrefill, 0), Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}); err != nil {
		t.Fatal(err)
	}
	last, err := watch.Recv()
	if err != nil || !last.GetPagesReusable() || last.GetTerminal() || last.GetTransition().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Fatalf("WatchRoom(1) after the ack = %v, %v; want the pages-reusable step of the failed room", last, err)
	}
	if ev, err := watch.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("WatchRoom(1) after pages reusable = %v, %v; want its end", ev, err)
	}
	var seen []string
	for {
		ev := es.next()
		seen = append(seen, fmt.Sprintf("%s terminal=%v reusable=%v", ev.GetEvent().GetTransition().GetPhase(), ev.GetEvent().GetTerminal(), ev.GetEvent().GetPagesReusable()))
		if ev.GetEvent().GetPagesReusable() {
			break
		}
	}
	if n := len(seen); n < 2 || seen[n-2] != "ROOM_PHASE_FAILED terminal=true reusable=false" {
		t.Fatalf("the session's events of room 1 = %q; want the failure, then pages reusable", seen)
	}
	if _, err := w.declare(2, 4, 0); err != nil {
		t.Fatalf("declaring room 1's pages once reusable = %v", err)
	}
	if h := w.holds(); h.GetDraining() != 0 || h.GetHeld() != 1 || h.GetDeclarationsRefused() != 1 {
		t.Fatalf("holds at the end = %v", h)
	}
	if _, err := w.rooms.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: 2}); err != nil {
		t.Fatal(err)
	}
}
