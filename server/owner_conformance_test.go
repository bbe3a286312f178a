package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The conformance rows of the calls of a decode engine that owns its
// pages — Rooms.DeclareDestination, Capacity.ReportCapacity, Rooms.Resync
// with hand-offs in flight, and the EngineSession's declare and capacity
// ops — on an engine-owned daemon and on a daemon-owned one: each bad
// input gets its code and names its field, and the daemon's observable
// state (GetStatus with its ledgers and hand-off ledgers, ListRooms) is
// exactly what it was before. A declaration refused because a page is
// held is counted (declarations_refused, checked in owner_test.go): that
// counter is left out of the comparison.

// ownerSnapshot is GetStatus (without its clock fields and the refusal
// counter) and ListRooms, as text.
func ownerSnapshot(t *testing.T, conn *grpc.ClientConn) func(context.Context) string {
	admin, rooms := pb.NewAdminClient(conn), pb.NewRoomsClient(conn)
	return func(ctx context.Context) string {
		st, err := admin.GetStatus(ctx, &pb.GetStatusRequest{})
		if err != nil {
			t.Fatalf("GetStatus: %v", err)
		}
		st.StartedAt, st.Uptime = nil, nil
		for _, sh := range st.GetShards() {
			if sh.GetHolds() != nil {
				sh.Holds.DeclarationsRefused = 0
			}
		}
		list, err := rooms.ListRooms(ctx, &pb.ListRoomsRequest{Limit: 1000})
		if err != nil {
			t.Fatalf("ListRooms: %v", err)
		}
		return prototext.Format(st) + prototext.Format(list)
	}
}

// sessionCall runs one op on es as a row's call: its result as an error.
func sessionCall(es *engineStream, req func() *pb.EngineRequest) func(context.Context) error {
	return func(context.Context) error {
		_, err := es.result(req())
		return err
	}
}

// declareRows are DeclareDestination's bad inputs (as a unary call and as
// the session's declare op, whose fields are named under "declare.").
// Room 5 waits for its declaration, room 6 holds pages 0..15 and row 0.
func declareRows(t *testing.T, conn *grpc.ClientConn, es *engineStream) []confRow {
	rooms := pb.NewRoomsClient(conn)
	declare := func(ctx context.Context, r *pb.DeclareDestinationRequest) error {
		_, err := rooms.DeclareDestination(ctx, r)
		return err
	}
	good := func() *pb.DeclareDestinationRequest { return declaration(5, 100, 3) }
	type dr = pb.DeclareDestinationRequest
	st := func(ty pb.StateType, idx ...int32) *pb.StateIndices { return &pb.StateIndices{Type: ty, Indices: idx} }
	inv, fp := codes.InvalidArgument, codes.FailedPrecondition
	rows := []confRow{
		unaryRow("Declare room 0", good, func(r *dr) { r.Room = 0 }, declare, inv, "room: 0 is reserved"),
		unaryRow("Declare room 2^63", good, func(r *dr) { r.Room = 1 << 63 }, declare, inv, "room"),
		unaryRow("Declare page negative", good, func(r *dr) { r.PageIndices[1] = -1 }, declare, inv, "page_indices[1]"),
		unaryRow("Declare 2^20 pages", good, func(r *dr) { r.PageIndices = make([]int32, 1<<20) }, declare, inv, "page_indices: has 1048576 pages"),
		unaryRow("Declare 15 pages", good, func(r *dr) { r.PageIndices = r.PageIndices[:15] }, declare, inv, "page_indices: has 15 pages; the 1000 tokens beyond the decode prefix (0 of 1000) at page size 64 take 16"),
		unaryRow("Declare page beyond the pool", good, func(r *dr) { r.PageIndices[15] = 16384 }, declare, inv, "page_indices[15]: page 16384 is outside the pool's 16384 pages"),
		unaryRow("Declare page twice", good, func(r *dr) { r.PageIndices[15] = 100 }, declare, inv, "page_indices[15]: page 100 is named twice"),
		unaryRow("Declare metadata_slot -1", good, func(r *dr) { r.MetadataSlot = -1 }, declare, inv, "metadata_slot: -1"),
		unaryRow("Declare metadata_slot beyond the pool", good, func(r *dr) { r.MetadataSlot = 1 << 30 }, declare, inv, "metadata_slot: 1073741824 is outside the pool's"),
		unaryRow("Declare decode_prefix_len 2^24+1", good, func(r *dr) { r.DecodePrefixLen = 1<<24 + 1 }, declare, inv, "decode_prefix_len"),
		unaryRow("Declare decode_prefix_len unaligned", good, func(r *dr) { r.DecodePrefixLen = 63 }, declare, inv, "decode_prefix_len: 63 must be a multiple of the page size 64"),
		unaryRow("Declare decode_prefix_len = prompt", good, func(r *dr) { r.DecodePrefixLen = 1024 }, declare, inv, "decode_prefix_len: 1024"),
		unaryRow("Declare a page for the prefix", good, func(r *dr) { r.DecodePrefixLen = 64 }, declare, inv, "page_indices: has 16 pages; the 936 tokens beyond the decode prefix (64 of 1000)"),
		unaryRow("Declare 5 states", good, func(r *dr) { r.State = repeat(st(pb.StateType_STATE_TYPE_MAMBA, 1), 5) }, declare, inv, "state: has 5 entries (at most 4"),
		unaryRow("Declare state type unspecified", good, func(r *dr) { r.State = []*pb.StateIndices{st(0, 1)} }, declare, inv, "state[0].type: 0 is not a state type"),
		unaryRow("Declare state type 99", good, func(r *dr) { r.State = []*pb.StateIndices{st(99, 1)} }, declare, inv, "state[0].type: 99"),
		unaryRow("Declare state type twice", good, func(r *dr) {
			r.State = []*pb.StateIndices{st(pb.StateType_STATE_TYPE_SWA, 1), st(pb.StateType_STATE_TYPE_SWA, 2)}
		}, declare, inv, "state[1].type: STATE_TYPE_SWA is named twice"),
		unaryRow("Declare state index negative", good, func(r *dr) { r.State = []*pb.StateIndices{st(pb.StateType_STATE_TYPE_MAMBA, 0, -2)} }, declare, inv, "state[0].indices[1]"),
		unaryRow("Declare Mamba slots on a GQA pool", good, func(r *dr) { r.State = []*pb.StateIndices{st(pb.StateType_STATE_TYPE_MAMBA, 0)} }, declare, inv, "state[0].type: MAMBA is not a state of this pool"),
		unaryRow("Declare unknown room", good, func(r *dr) { r.Room = 77 }, declare, codes.NotFound, "77"),
		unaryRow("Declare a bootstrapping room", good, func(r *dr) { r.Room = 8 }, declare, fp, "still bootstrapping"),
		unaryRow("Declare another destination", good, func(r *dr) { r.Room = 6 }, declare, fp, "already has its destination"),
		unaryRow("Declare a held page", good, func(r *dr) { r.PageIndices[0] = 3 }, declare, fp, "page 3 is still held by room 6"),
		unaryRow("Declare a held row", good, func(r *dr) { r.MetadataSlot = 0 }, declare, fp, "metadata slot 0 is still held by room 6"),
		rawRow(conn, pb.Rooms_DeclareDestination_FullMethodName, false, []byte{0x12, 0xff}, "page_indices: cannot be decoded"),
	}
	op := func(name string, mut func(*dr), code codes.Code, field string) confRow {
		return confRow{name: "session declare: " + name, code: code, field: field, call: sessionCall(es, func() *pb.EngineRequest {
			r := good()
			mut(r)
			return &pb.EngineRequest{Op: &pb.EngineRequest_Declare{Declare: r}}
		})}
	}
	return append(rows,
		op("room 0", func(r *dr) { r.Room = 0 }, inv, "declare.room: 0 is reserved"),
		op("page negative", func(r *dr) { r.PageIndices[2] = -5 }, inv, "declare.page_indices[2]"),
		op("15 pages", func(r *dr) { r.PageIndices = r.PageIndices[:15] }, inv, "declare.page_indices: has 15 pages"),
		op("metadata_slot beyond the pool", func(r *dr) { r.MetadataSlot = 1 << 30 }, inv, "declare.metadata_slot"),
		op("state type", func(r *dr) { r.State = []*pb.StateIndices{st(42)} }, inv, "declare.state[0].type"),
		op("unknown room", func(r *dr) { r.Room = 77 }, codes.NotFound, "77"),
		op("a held page", func(r *dr) { r.PageIndices[4] = 9 }, fp, "page 9 is still held by room 6"),
	)
}

// capacityRows are ReportCapacity's bad inputs (as a unary call and as the
// session's capacity op, named under "capacity.").
func capacityRows(conn *grpc.ClientConn, es *engineStream) []confRow {
	capc := pb.NewCapacityClient(conn)
	report := func(ctx context.Context, r *pb.ReportCapacityRequest) error {
		_, err := capc.ReportCapacity(ctx, r)
		return err
	}
	good := func() *pb.ReportCapacityRequest { return &pb.ReportCapacityRequest{TokensFree: 640, PagesFree: 10} }
	type cr = pb.ReportCapacityRequest
	inv := codes.InvalidArgument
	const over40, over31 = 1<<40 + 1, 1 << 31
	return []confRow{
		unaryRow("ReportCapacity decode_dp_rank 1 of 1", good, func(r *cr) { r.DecodeDpRank = 1 }, report, inv, "decode_dp_rank: 1 is out of range: this daemon hosts 1 decode DP shards (allowed 0..0)"),
		unaryRow("ReportCapacity decode_dp_rank 2^31", good, func(r *cr) { r.DecodeDpRank = over31 }, report, inv, "decode_dp_rank"),
		unaryRow("ReportCapacity tokens_free 2^40+1", good, func(r *cr) { r.TokensFree = over40 }, report, inv, "tokens_free"),
		unaryRow("ReportCapacity pages_free 2^40+1", good, func(r *cr) { r.PagesFree = over40 }, report, inv, "pages_free"),
		unaryRow("ReportCapacity state_slots_free 2^40+1", good, func(r *cr) { r.StateSlotsFree = over40 }, report, inv, "state_slots_free"),
		unaryRow("ReportCapacity req_slots_free 2^31", good, func(r *cr) { r.ReqSlotsFree = over31 }, report, inv, "req_slots_free"),
		unaryRow("ReportCapacity metadata_slots_free 2^31", good, func(r *cr) { r.MetadataSlotsFree = over31 }, report, inv, "metadata_slots_free"),
		unaryRow("ReportCapacity queue_depth 2^31", good, func(r *cr) { r.QueueDepth = over31 }, report, inv, "queue_depth"),
		unaryRow("ReportCapacity running 2^31", good, func(r *cr) { r.Running = over31 }, report, inv, "running"),
		unaryRow("ReportCapacity every problem at once", good, func(r *cr) { r.PagesFree, r.Running = over40, over31 }, report, inv, "pages_free"),
		rawRow(conn, pb.Capacity_ReportCapacity_FullMethodName, false, []byte{0x10}, "tokens_free: cannot be decoded"),
		{name: "session capacity: pages_free 2^40+1", code: inv, field: "capacity.pages_free", call: sessionCall(es, func() *pb.EngineRequest {
			return &pb.EngineRequest{Op: &pb.EngineRequest_Capacity{Capacity: &cr{PagesFree: over40}}}
		})},
		{name: "session capacity: decode_dp_rank 1 of 1", code: inv, field: "capacity.decode_dp_rank", call: sessionCall(es, func() *pb.EngineRequest {
			return &pb.EngineRequest{Op: &pb.EngineRequest_Capacity{Capacity: &cr{DecodeDpRank: 1}}}
		})},
	}
}

// resyncRows are Resync's bad hand-offs in flight on an engine-owned
// daemon whose resync is open (room 5 is open, room 6 holds pages 0..15).
func resyncRows(conn *grpc.ClientConn) []confRow {
	rooms := pb.NewRoomsClient(conn)
	resync := func(ctx context.Context, r *pb.ResyncRequest) error { _, err := rooms.Resync(ctx, r); return err }
	good := func() *pb.ResyncRequest { return &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{inFlight(20, 200, 20)}} }
	type rr = pb.ResyncRequest
	f := func(r *rr) *pb.ResyncRoom { return r.Rooms[0] }
	inv := codes.InvalidArgument
	return []confRow{
		unaryRow("Resync a running room", good, func(r *rr) { f(r).InFlight, f(r).ReqSlot = false, 1 }, resync, inv, "rooms[0].in_flight: is false, but kv_pool.owner is engine"),
		unaryRow("Resync in flight without pages", good, func(r *rr) { f(r).PageIndices = nil }, resync, inv, "rooms[0].page_indices: is empty"),
		unaryRow("Resync in flight page negative", good, func(r *rr) { f(r).PageIndices[2] = -1 }, resync, inv, "rooms[0].page_indices[2]"),
		unaryRow("Resync in flight 15 pages", good, func(r *rr) { f(r).PageIndices = f(r).PageIndices[:15] }, resync, inv, "rooms[0].page_indices: has 15 pages"),
		unaryRow("Resync in flight page beyond the pool", good, func(r *rr) { f(r).PageIndices[0] = 1 << 20 }, resync, inv, "rooms[0].page_indices[0]"),
		unaryRow("Resync in flight metadata_slot -1", good, func(r *rr) { f(r).MetadataSlot = -1 }, resync, inv, "rooms[0].metadata_slot"),
		unaryRow("Resync in flight metadata_slot beyond the pool", good, func(r *rr) { f(r).MetadataSlot = 1 << 30 }, resync, inv, "rooms[0].metadata_slot"),
		unaryRow("Resync in flight decode_prefix_len unaligned", good, func(r *rr) { f(r).DecodePrefixLen = 63 }, resync, inv, "rooms[0].decode_prefix_len"),
		unaryRow("Resync in flight decode_prefix_len 2^24+1", good, func(r *rr) { f(r).DecodePrefixLen = 1<<24 + 1 }, resync, inv, "rooms[0].decode_prefix_len"),
		unaryRow("Resync in flight state type", good, func(r *rr) { f(r).State = []*pb.StateIndices{{Type: 7}} }, resync, inv, "rooms[0].state[0].type"),
		unaryRow("Resync in flight 5 states", good, func(r *rr) {
			f(r).State = repeat(&pb.StateIndices{Type: pb.StateType_STATE_TYPE_SWA}, 5)
		}, resync, inv, "rooms[0].state: has 5 entries"),
		unaryRow("Resync in flight Mamba slots on a GQA pool", good, func(r *rr) {
			f(r).State = []*pb.StateIndices{{Type: pb.StateType_STATE_TYPE_MAMBA, Indices: []int32{1}}}
		}, resync, inv, "rooms[0].state[0].type"),
		unaryRow("Resync in flight bootstrap_addr", good, func(r *rr) { f(r).BootstrapAddr = "nohost" }, resync, inv, "rooms[0].bootstrap_addr"),
		unaryRow("Resync in flight prefill_dp_rank", good, func(r *rr) { v := uint32(5000); f(r).PrefillDpRank = &v }, resync, inv, "rooms[0].prefill_dp_rank"),
		unaryRow("Resync in flight decode_dp_rank", good, func(r *rr) { f(r).DecodeDpRank = 3 }, resync, inv, "rooms[0].decode_dp_rank"),
		unaryRow("Resync in flight prompt_len 0", good, func(r *rr) { f(r).PromptLen = 0 }, resync, inv, "rooms[0].prompt_len"),
		unaryRow("Resync in flight a held page", good, func(r *rr) { f(r).PageIndices[0] = 7 }, resync, codes.FailedPrecondition, "rooms[0].page_indices"),
		unaryRow("Resync in flight a held row", good, func(r *rr) { f(r).MetadataSlot = 0 }, resync, codes.FailedPrecondition, "rooms[0].metadata_slot"),
		unaryRow("Resync in flight an open room", good, func(r *rr) { f(r).Room = 5 }, resync, codes.AlreadyExists, "rooms[0].room"),
	}
}

// TestConformanceEngineOwner: the rows against an engine-owned daemon
// whose resync is open (engine.resync_timeout).
func TestConformanceEngineOwner(t *testing.T) {
	w := newOwnerWire(t, true, func(c *config.Config) { c.Engine.ResyncTimeout = time.Hour })
	w.open(5)
	w.open(6)
	if _, err := w.declare(6, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := w.rooms.OpenRoom(w.ctx, &pb.OpenRoomRequest{Rid: "r-8", BootstrapAddr: "10.9.9.9:8998", Room: 8, PromptLen: 1000, MaxNewTokens: 16}); err != nil {
		t.Fatal(err)
	}
	es := openEngineStream(t, w.ctx, w.conn)
	rows := append(declareRows(t, w.conn, es), capacityRows(w.conn, es)...)
	rows = append(rows, resyncRows(w.conn)...)
	runConformance(t, rows, ownerSnapshot(t, w.conn))
	// The held pages and rows named: three declarations, two resyncs.
	if h := w.holds(); h.GetDeclarationsRefused() != 5 || h.GetHeld() != 1 || h.GetQueued() != 2 {
		t.Errorf("holds after the rows = %v; want the 5 refusals of a held page or row counted, room 6 alone held", h)
	}
	if n, _ := gauge(t, w.d, "decodeplane_declarations_refused_total", map[string]string{"dp_rank": "0"}); n != 5 {
		t.Errorf("decodeplane_declarations_refused_total = %v; want 5, as GetStatus counts", n)
	}
}

// TestConformanceDaemonOwner: a daemon-owned daemon refuses the engine
// owner's calls, FAILED_PRECONDITION saying why, after the same wire
// bounds; a resync names in_flight.
func TestConformanceDaemonOwner(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) { c.Engine.ResyncTimeout = time.Hour }})
	conn := d.Conn(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rooms, capc := pb.NewRoomsClient(conn), pb.NewCapacityClient(conn)
	if _, err := pb.NewBootstrapClient(conn).RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: ownerPrefill, RankEndpoint: "10.7.0.1:17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r-5", BootstrapAddr: ownerPrefill, Room: 5, PromptLen: 1000, MaxNewTokens: 16}); err != nil {
		t.Fatal(err)
	}
	es := openEngineStream(t, ctx, conn)
	declare := func(ctx context.Context, r *pb.DeclareDestinationRequest) error {
		_, err := rooms.DeclareDestination(ctx, r)
		return err
	}
	report := func(ctx context.Context, r *pb.ReportCapacityRequest) error {
		_, err := capc.ReportCapacity(ctx, r)
		return err
	}
	resync := func(ctx context.Context, r *pb.ResyncRequest) error { _, err := rooms.Resync(ctx, r); return err }
	goodDecl := func() *pb.DeclareDestinationRequest { return declaration(5, 0, 0) }
	goodCap := func() *pb.ReportCapacityRequest { return &pb.ReportCapacityRequest{PagesFree: 1} }
	fp, inv := codes.FailedPrecondition, codes.InvalidArgument
	daemonOwns := "kv_pool.owner is daemon"
	rows := []confRow{
		unaryRow("Declare on a daemon-owned pool", goodDecl, func(*pb.DeclareDestinationRequest) {}, declare, fp, daemonOwns),
		unaryRow("Declare page negative", goodDecl, func(r *pb.DeclareDestinationRequest) { r.PageIndices[0] = -1 }, declare, inv, "page_indices[0]"),
		unaryRow("Declare unknown room", goodDecl, func(r *pb.DeclareDestinationRequest) { r.Room = 77 }, declare, codes.NotFound, "77"),
		unaryRow("ReportCapacity on a daemon-owned pool", goodCap, func(*pb.ReportCapacityRequest) {}, report, fp, daemonOwns+": the daemon's ledger is the capacity"),
		unaryRow("ReportCapacity pages_free 2^40+1", goodCap, func(r *pb.ReportCapacityRequest) { r.PagesFree = 1<<40 + 1 }, report, inv, "pages_free"),
		unaryRow("Resync in flight on a daemon-owned pool", func() *pb.ResyncRequest { return &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{inFlight(20, 0, 0)}} },
			func(*pb.ResyncRequest) {}, resync, inv, "rooms[0].in_flight: is set, but kv_pool.owner is daemon"),
		{name: "session declare on a daemon-owned pool", code: fp, field: daemonOwns, call: sessionCall(es, func() *pb.EngineRequest {
			return &pb.EngineRequest{Op: &pb.EngineRequest_Declare{Declare: goodDecl()}}
		})},
		{name: "session capacity on a daemon-owned pool", code: fp, field: daemonOwns, call: sessionCall(es, func() *pb.EngineRequest {
			return &pb.EngineRequest{Op: &pb.EngineRequest_Capacity{Capacity: goodCap()}}
		})},
	}
	runConformance(t, rows, ownerSnapshot(t, conn))
	if st, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{}); err != nil || st.GetShards()[0].GetHolds() != nil || st.GetLayout().GetPageOwner() != "daemon" {
		t.Errorf("GetStatus of a daemon-owned pool = %v, %v; want page_owner daemon, no hand-off ledger", st.GetLayout().GetPageOwner(), err)
	}
}
