package server_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The conformance tables: for every RPC, bad inputs sent over real gRPC
// (bufconn) to the real server with a real manager, the code each must get
// and the field its message must name. One row per input; add rows freely.
// After every refusal the daemon's observable state (Admin.GetStatus with
// its shard ledgers and prefills, ListRooms) must be exactly what it was
// before: validate, then apply.

// badUTF8 replaces utf8Slot in a marshalled request: proto.Marshal refuses
// invalid UTF-8, the wire does not.
const utf8Slot = "@@UTF8SLOT@@"

var badUTF8 = []byte("@@\xff\xfe\xfd\xfc\xc3(\xff\xff@@")

// rawFrame is a request already encoded: the raw codec sends it as is.
type rawFrame struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*rawFrame).b, nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	v.(*rawFrame).b = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// withBadUTF8 marshals m (whose string fields may hold utf8Slot) and puts
// invalid UTF-8 in every slot.
func withBadUTF8(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	if len(badUTF8) != len(utf8Slot) {
		tb.Fatal("badUTF8 and utf8Slot differ in length")
	}
	if !bytes.Contains(b, []byte(utf8Slot)) {
		tb.Fatalf("%T has no %s slot", m, utf8Slot)
	}
	return bytes.ReplaceAll(b, []byte(utf8Slot), badUTF8)
}

// callRaw sends b to method (unary, or server streaming when stream) and
// returns the call's error.
func callRaw(ctx context.Context, conn *grpc.ClientConn, method string, stream bool, b []byte) error {
	if !stream {
		return conn.Invoke(ctx, method, &rawFrame{b}, &rawFrame{}, grpc.ForceCodec(rawCodec{}))
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	if err := s.SendMsg(&rawFrame{b}); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	return s.RecvMsg(&rawFrame{})
}

// confRow is one bad input: call sends it; the answer must carry code and,
// in its message, field.
type confRow struct {
	name  string
	call  func(ctx context.Context) error
	code  codes.Code
	field string
}

// runConformance runs the rows against the server, checking the code, the
// field and that snapshot is unchanged by each refusal.
func runConformance(t *testing.T, rows []confRow, snapshot func(context.Context) string) {
	t.Helper()
	counts := map[codes.Code]int{}
	for _, r := range rows {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		before := snapshot(ctx)
		err := r.call(ctx)
		st := status.Convert(err)
		counts[st.Code()]++
		if st.Code() != r.code || !strings.Contains(st.Message(), r.field) {
			t.Errorf("%s: got %s %q; want %s naming %q", r.name, st.Code(), st.Message(), r.code, r.field)
		}
		if after := snapshot(ctx); after != before {
			t.Errorf("%s: the refused call changed the daemon's state:\nbefore:\n%s\nafter:\n%s", r.name, before, after)
		}
		cancel()
	}
	t.Logf("%d bad inputs: %v", len(rows), counts)
}

// unaryRow builds a row from a good request, a mutation and the RPC.
func unaryRow[T proto.Message](name string, good func() T, mut func(T), rpc func(context.Context, T) error, code codes.Code, field string) confRow {
	return confRow{name: name, code: code, field: field, call: func(ctx context.Context) error {
		req := good()
		mut(req)
		return rpc(ctx, req)
	}}
}

// utf8Row builds an invalid-UTF-8 row: the mutation puts utf8Slot in the
// fields that must be reported.
func utf8Row[T proto.Message](tb testing.TB, conn *grpc.ClientConn, method string, stream bool, good func() T, mut func(T), field string) confRow {
	req := good()
	mut(req)
	b := withBadUTF8(tb, req)
	return confRow{name: method + " with invalid UTF-8 in " + field, code: codes.InvalidArgument, field: field + ": contains invalid UTF-8",
		call: func(ctx context.Context) error { return callRaw(ctx, conn, method, stream, b) }}
}

// rawRow sends bytes that are not a valid protobuf message.
func rawRow(conn *grpc.ClientConn, method string, stream bool, b []byte, field string) confRow {
	return confRow{name: fmt.Sprintf("%s with undecodable bytes %x", method, b), code: codes.InvalidArgument, field: field,
		call: func(ctx context.Context) error { return callRaw(ctx, conn, method, stream, b) }}
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestConformanceDecodeplaneV1(t *testing.T) {
	const addr, room = "10.0.0.1:8998", 5
	s := newStgServer(t, stgDecodeConfig(1), "")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s.register(t, ctx, addr, 1)
	s.open(t, ctx, addr, 1, room, 64)
	t.Cleanup(func() { // a claimed room would hold the graceful shutdown
		if _, err := s.room.AbortRoom(context.Background(), &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Errorf("AbortRoom: %v", err)
		}
	})
	admin := pb.NewAdminClient(s.conn)
	snapshot := func(ctx context.Context) string {
		st, err := admin.GetStatus(ctx, &pb.GetStatusRequest{})
		if err != nil {
			t.Fatalf("GetStatus: %v", err)
		}
		st.StartedAt, st.Uptime = nil, nil
		rooms, err := s.room.ListRooms(ctx, &pb.ListRoomsRequest{Limit: 1000})
		if err != nil {
			t.Fatalf("ListRooms: %v", err)
		}
		return prototext.Format(st) + prototext.Format(rooms)
	}

	rank := func() *pb.PrefillRank { return &pb.PrefillRank{BootstrapAddr: addr} }
	goodReg := func() *pb.RegisterPrefillRequest {
		return &pb.RegisterPrefillRequest{BootstrapAddr: "10.0.0.2:8998", RankEndpoint: "10.0.0.2:9000",
			Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 16, KvCacheDtype: "bf16"}
	}
	goodOpen := func() *pb.OpenRoomRequest {
		return &pb.OpenRoomRequest{Rid: "r-new", BootstrapAddr: addr, Room: 6, PromptLen: 64, MaxNewTokens: 4}
	}
	goodTransfer := func() *pb.TransferRequest {
		return &pb.TransferRequest{Room: room, Rank: rank(), NumPages: 4, Last: true, Aux: &pb.Aux{RoomMarker: room}}
	}
	goodReport := func() *pb.ReportTransferRequest {
		return &pb.ReportTransferRequest{Room: room, Rank: rank(), NumPages: 4, Last: true, Success: true, Bytes: 1, MetadataRoomMarker: room}
	}
	goodChunk := func() *pb.ChunkReadyRequest {
		return &pb.ChunkReadyRequest{Room: room, Rank: rank(), NumPages: 1, Last: true, Aux: &pb.Aux{RoomMarker: room}}
	}
	boot, rooms, stg := s.boot, s.room, s.stg
	register := func(ctx context.Context, r *pb.RegisterPrefillRequest) error {
		_, err := boot.RegisterPrefill(ctx, r)
		return err
	}
	heartbeat := func(ctx context.Context, r *pb.HeartbeatRequest) error { _, err := boot.Heartbeat(ctx, r); return err }
	bind := func(ctx context.Context, r *pb.BindRoomRequest) error { _, err := boot.BindRoom(ctx, r); return err }
	dereg := func(ctx context.Context, r *pb.DeregisterPrefillRequest) error {
		_, err := boot.DeregisterPrefill(ctx, r)
		return err
	}
	goodDereg := func() *pb.DeregisterPrefillRequest { return &pb.DeregisterPrefillRequest{BootstrapAddr: addr} }
	lookup := func(ctx context.Context, r *pb.LookupDPRanksRequest) error {
		_, err := boot.LookupDPRanks(ctx, r)
		return err
	}
	open := func(ctx context.Context, r *pb.OpenRoomRequest) error { _, err := rooms.OpenRoom(ctx, r); return err }
	await := func(ctx context.Context, r *pb.AwaitDestinationRequest) error {
		st, err := rooms.AwaitDestination(ctx, r)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	transfer := func(ctx context.Context, r *pb.TransferRequest) error { _, err := rooms.Transfer(ctx, r); return err }
	report := func(ctx context.Context, r *pb.ReportTransferRequest) error {
		_, err := rooms.ReportTransfer(ctx, r)
		return err
	}
	watch := func(ctx context.Context, r *pb.WatchRoomRequest) error {
		st, err := rooms.WatchRoom(ctx, r)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	getRoom := func(ctx context.Context, r *pb.GetRoomRequest) error { _, err := rooms.GetRoom(ctx, r); return err }
	abort := func(ctx context.Context, r *pb.AbortRoomRequest) error { _, err := rooms.AbortRoom(ctx, r); return err }
	release := func(ctx context.Context, r *pb.ReleaseRoomRequest) error {
		_, err := rooms.ReleaseRoom(ctx, r)
		return err
	}
	list := func(ctx context.Context, r *pb.ListRoomsRequest) error { _, err := rooms.ListRooms(ctx, r); return err }
	running := func(ctx context.Context, r *pb.ReportRunningRequest) error {
		_, err := rooms.ReportRunning(ctx, r)
		return err
	}
	retract := func(ctx context.Context, r *pb.RetractRoomRequest) error {
		_, err := rooms.RetractRoom(ctx, r)
		return err
	}
	setup := func(ctx context.Context, r *pb.SetupStagingRequest) error {
		_, err := stg.SetupStaging(ctx, r)
		return err
	}
	alloc := func(ctx context.Context, r *pb.AllocateStagingRequest) error {
		_, err := stg.AllocateStaging(ctx, r)
		return err
	}
	chunk := func(ctx context.Context, r *pb.ChunkReadyRequest) error { _, err := stg.ChunkReady(ctx, r); return err }
	watermark := func(ctx context.Context, r *pb.WatchWatermarkRequest) error {
		st, err := stg.WatchWatermark(ctx, r)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	capc := pb.NewCapacityClient(s.conn)
	capacity := func(ctx context.Context, r *pb.WatchCapacityRequest) error {
		st, err := capc.WatchCapacity(ctx, r)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	goodCap := func() *pb.WatchCapacityRequest { return &pb.WatchCapacityRequest{} }
	inv := codes.InvalidArgument
	type reg = pb.RegisterPrefillRequest
	type par = pb.ParallelInfo
	rows := []confRow{
		// Bootstrap.RegisterPrefill
		unaryRow("RegisterPrefill without parallel", goodReg, func(r *reg) { r.Parallel = nil }, register, inv, "parallel: is required"),
		unaryRow("attn_tp_size 0", goodReg, func(r *reg) { r.Parallel.AttnTpSize = 0 }, register, inv, "parallel.attn_tp_size"),
		unaryRow("attn_tp_size 1025", goodReg, func(r *reg) { r.Parallel.AttnTpSize = 1025 }, register, inv, "parallel.attn_tp_size: 1025 is out of range (allowed 1..1024)"),
		unaryRow("attn_tp_size 2^31", goodReg, func(r *reg) { r.Parallel.AttnTpSize = 1 << 31 }, register, inv, "parallel.attn_tp_size"),
		unaryRow("attn_tp_size 2^32-1", goodReg, func(r *reg) { r.Parallel.AttnTpSize = 1<<32 - 1 }, register, inv, "parallel.attn_tp_size"),
		unaryRow("pp_size 0", goodReg, func(r *reg) { r.Parallel.PpSize = 0 }, register, inv, "parallel.pp_size"),
		unaryRow("pp_size 2^32-1", goodReg, func(r *reg) { r.Parallel.PpSize = 1<<32 - 1 }, register, inv, "parallel.pp_size"),
		unaryRow("attn_cp_size 2^31", goodReg, func(r *reg) { r.Parallel.AttnCpSize = 1 << 31 }, register, inv, "parallel.attn_cp_size"),
		unaryRow("attn_dp_size 2^31", goodReg, func(r *reg) { r.Parallel.AttnDpSize = 1 << 31 }, register, inv, "parallel.attn_dp_size"),
		unaryRow("system_dp_size 2^31", goodReg, func(r *reg) { r.Parallel.SystemDpSize = 1 << 31 }, register, inv, "parallel.system_dp_size"),
		unaryRow("65,536 × 2 ranks", goodReg, func(r *reg) { r.Parallel = &par{AttnTpSize: 1024, AttnDpSize: 64, PpSize: 2} }, register, inv, "parallel: dp × attn_cp_size × attn_tp_size × pp_size is 131072 ranks (at most 65536"),
		unaryRow("system dp counts as dp", goodReg, func(r *reg) { r.Parallel = &par{AttnTpSize: 1024, SystemDpSize: 128, AttnDpSize: 1, PpSize: 1} }, register, inv, "parallel: dp × attn_cp_size"),
		unaryRow("attn_tp_rank = size", goodReg, func(r *reg) { r.Parallel.AttnTpRank = 1 }, register, inv, "parallel.attn_tp_rank"),
		unaryRow("attn_cp_rank with unset size", goodReg, func(r *reg) { r.Parallel.AttnCpSize, r.Parallel.AttnCpRank = 0, 1 }, register, inv, "parallel.attn_cp_rank"),
		unaryRow("attn_dp_rank", goodReg, func(r *reg) { r.Parallel.AttnDpRank = 7 }, register, inv, "parallel.attn_dp_rank"),
		unaryRow("pp_rank", goodReg, func(r *reg) { r.Parallel.PpRank = 1 << 31 }, register, inv, "parallel.pp_rank"),
		unaryRow("system_dp_rank", goodReg, func(r *reg) { r.Parallel.SystemDpRank = 2 }, register, inv, "parallel.system_dp_rank"),
		unaryRow("page_size 48", goodReg, func(r *reg) { r.PageSize = 48 }, register, inv, "page_size"),
		unaryRow("page_size 2^31", goodReg, func(r *reg) { r.PageSize = 1 << 31 }, register, inv, "page_size"),
		unaryRow("page_size mismatch", goodReg, func(r *reg) { r.PageSize = 32 }, register, codes.FailedPrecondition, "page_size=32"),
		unaryRow("kv_cache_dtype empty", goodReg, func(r *reg) { r.KvCacheDtype = "" }, register, inv, "kv_cache_dtype"),
		unaryRow("kv_cache_dtype long", goodReg, func(r *reg) { r.KvCacheDtype = strings.Repeat("b", 33) }, register, inv, "kv_cache_dtype"),
		unaryRow("kv_cache_dtype control", goodReg, func(r *reg) { r.KvCacheDtype = "bf\n16" }, register, inv, "kv_cache_dtype"),
		unaryRow("load_balance_method unknown", goodReg, func(r *reg) { r.LoadBalanceMethod = "random" }, register, inv, "load_balance_method: \"random\" is not a load-balance method"),
		unaryRow("prefill_http_port 65536", goodReg, func(r *reg) { r.PrefillHttpPort = 65536 }, register, inv, "prefill_http_port"),
		unaryRow("instance_id long", goodReg, func(r *reg) { r.InstanceId = strings.Repeat("i", 257) }, register, inv, "instance_id"),
		unaryRow("rank_endpoint empty", goodReg, func(r *reg) { r.RankEndpoint = "" }, register, inv, "rank_endpoint"),
		unaryRow("rank_endpoint no port", goodReg, func(r *reg) { r.RankEndpoint = "10.0.0.2" }, register, inv, "rank_endpoint"),
		unaryRow("rank_endpoint port 0", goodReg, func(r *reg) { r.RankEndpoint = "10.0.0.2:0" }, register, inv, "rank_endpoint"),
		unaryRow("rank_endpoint port +80", goodReg, func(r *reg) { r.RankEndpoint = "10.0.0.2:+80" }, register, inv, "rank_endpoint"),
		unaryRow("rank_endpoint space", goodReg, func(r *reg) { r.RankEndpoint = "10.0 .0.2:80" }, register, inv, "rank_endpoint"),
		unaryRow("bootstrap_addr nohost", goodReg, func(r *reg) { r.BootstrapAddr = "nohost" }, register, inv, "bootstrap_addr"),
		unaryRow("bootstrap_addr 1 MB", goodReg, func(r *reg) { r.BootstrapAddr = strings.Repeat("h", 1<<20) + ":1" }, register, inv, "bootstrap_addr: is 1048578 bytes long"),
		unaryRow("model kind", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{KvPoolKind: "rnn"} }, register, inv, "model.kv_pool_kind"),
		unaryRow("model layers", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{NumLayers: 1 << 31} }, register, inv, "model.num_layers"),
		unaryRow("model heads", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{TotalKvHeads: 5000} }, register, inv, "model.total_kv_heads"),
		unaryRow("model head_dim", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{HeadDim: 1 << 20} }, register, inv, "model.head_dim"),
		unaryRow("MLA dims on a GQA model", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{KvPoolKind: "gqa", KvLoraRank: 512} }, register, inv, "model.kv_lora_rank"),
		unaryRow("model_name space", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{ModelName: "llama 3"} }, register, inv, "model.model_name"),
		unaryRow("model_name long", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{ModelName: strings.Repeat("m", 257)} }, register, inv, "model.model_name: is 257 bytes long"),
		unaryRow("model_revision long", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{ModelRevision: strings.Repeat("r", 129)} }, register, inv, "model.model_revision: is 129 bytes long"),
		unaryRow("model mismatch", goodReg, func(r *reg) { r.Model = &pb.ModelFacts{KvPoolKind: "gqa", NumLayers: 99} }, register, codes.FailedPrecondition, "num_layers 99"),
		unaryRow("every problem at once", goodReg, func(r *reg) { r.PageSize, r.KvCacheDtype, r.Parallel.PpSize = 3, "", 0 }, register, inv, "page_size"),
		utf8Row(t, s.conn, "/decodeplane.v1.Bootstrap/RegisterPrefill", false, goodReg, func(r *reg) { r.KvCacheDtype = utf8Slot }, "kv_cache_dtype"),
		utf8Row(t, s.conn, "/decodeplane.v1.Bootstrap/RegisterPrefill", false, goodReg, func(r *reg) { r.Model = &pb.ModelFacts{KvPoolKind: utf8Slot} }, "model.kv_pool_kind"),
		rawRow(s.conn, "/decodeplane.v1.Bootstrap/RegisterPrefill", false, []byte{0x0a, 0x7f, 'x'}, "bootstrap_addr: cannot be decoded: its length runs past"),

		// Bootstrap.Heartbeat
		unaryRow("Heartbeat without rank", func() *pb.HeartbeatRequest { return &pb.HeartbeatRequest{Rank: rank()} }, func(r *pb.HeartbeatRequest) { r.Rank = nil }, heartbeat, inv, "rank: is required"),
		unaryRow("Heartbeat tp_rank", func() *pb.HeartbeatRequest { return &pb.HeartbeatRequest{Rank: rank()} }, func(r *pb.HeartbeatRequest) { r.Rank.TpRank = 1024 }, heartbeat, inv, "rank.tp_rank"),
		unaryRow("Heartbeat instance_id", func() *pb.HeartbeatRequest { return &pb.HeartbeatRequest{Rank: rank()} }, func(r *pb.HeartbeatRequest) { r.InstanceId = strings.Repeat("i", 300) }, heartbeat, inv, "instance_id"),
		utf8Row(t, s.conn, "/decodeplane.v1.Bootstrap/Heartbeat", false, func() *pb.HeartbeatRequest { return &pb.HeartbeatRequest{Rank: rank()} }, func(r *pb.HeartbeatRequest) { r.Rank.BootstrapAddr = utf8Slot }, "rank.bootstrap_addr"),

		// Bootstrap.DeregisterPrefill
		unaryRow("DeregisterPrefill without bootstrap_addr", goodDereg, func(r *pb.DeregisterPrefillRequest) { r.BootstrapAddr = "" }, dereg, inv, "bootstrap_addr: is required"),
		unaryRow("DeregisterPrefill bootstrap_addr port", goodDereg, func(r *pb.DeregisterPrefillRequest) { r.BootstrapAddr = "10.0.0.1:0" }, dereg, inv, "bootstrap_addr"),
		unaryRow("DeregisterPrefill instance_id", goodDereg, func(r *pb.DeregisterPrefillRequest) { r.InstanceId = strings.Repeat("i", 257) }, dereg, inv, "instance_id: is 257 bytes long"),
		unaryRow("DeregisterPrefill reason", goodDereg, func(r *pb.DeregisterPrefillRequest) { r.Reason = strings.Repeat("r", pb.MaxReasonLen+1) }, dereg, inv, "reason: is 4097 bytes long"),
		utf8Row(t, s.conn, "/decodeplane.v1.Bootstrap/DeregisterPrefill", false, goodDereg, func(r *pb.DeregisterPrefillRequest) { r.Reason = utf8Slot }, "reason"),

		// Bootstrap.BindRoom
		unaryRow("BindRoom room 0", func() *pb.BindRoomRequest { return &pb.BindRoomRequest{BootstrapAddr: addr, Room: 9} }, func(r *pb.BindRoomRequest) { r.Room = 0 }, bind, inv, "room: 0 is reserved"),
		unaryRow("BindRoom room 2^63", func() *pb.BindRoomRequest { return &pb.BindRoomRequest{BootstrapAddr: addr, Room: 9} }, func(r *pb.BindRoomRequest) { r.Room = 1 << 63 }, bind, inv, "room"),
		unaryRow("BindRoom dp_rank", func() *pb.BindRoomRequest { return &pb.BindRoomRequest{BootstrapAddr: addr, Room: 9} }, func(r *pb.BindRoomRequest) { r.DpRank = 1 << 31 }, bind, inv, "dp_rank"),
		utf8Row(t, s.conn, "/decodeplane.v1.Bootstrap/BindRoom", false, func() *pb.BindRoomRequest { return &pb.BindRoomRequest{Room: 9} }, func(r *pb.BindRoomRequest) { r.BootstrapAddr = utf8Slot }, "bootstrap_addr"),

		// Bootstrap.LookupDPRanks
		unaryRow("LookupDPRanks rooms[3] 0", func() *pb.LookupDPRanksRequest { return &pb.LookupDPRanksRequest{BootstrapAddr: addr} }, func(r *pb.LookupDPRanksRequest) { r.Rooms = []uint64{1, 2, 3, 0} }, lookup, inv, "rooms[3]: 0 is reserved"),
		unaryRow("LookupDPRanks too many rooms", func() *pb.LookupDPRanksRequest { return &pb.LookupDPRanksRequest{BootstrapAddr: addr} }, func(r *pb.LookupDPRanksRequest) { r.Rooms = repeat(uint64(1), pb.MaxLookupRooms+1) }, lookup, inv, "rooms: has 100001 entries"),
		unaryRow("LookupDPRanks 100,000 bad rooms", func() *pb.LookupDPRanksRequest { return &pb.LookupDPRanksRequest{BootstrapAddr: addr} }, func(r *pb.LookupDPRanksRequest) { r.Rooms = repeat(uint64(1<<63), pb.MaxLookupRooms) }, lookup, inv, "rooms: 99992 more entries are invalid"),
		unaryRow("LookupDPRanks hint dp_rank", func() *pb.LookupDPRanksRequest { return &pb.LookupDPRanksRequest{BootstrapAddr: addr} }, func(r *pb.LookupDPRanksRequest) { r.Hints = []*pb.RoomHint{{Room: 1, DpRank: 4096}} }, lookup, inv, "hints[0].dp_rank"),
		unaryRow("LookupDPRanks hint room 0", func() *pb.LookupDPRanksRequest { return &pb.LookupDPRanksRequest{BootstrapAddr: addr} }, func(r *pb.LookupDPRanksRequest) { r.Hints = []*pb.RoomHint{{Room: 1}, {Room: 0}} }, lookup, inv, "hints[1].room"),
		unaryRow("LookupDPRanks unknown prefill", func() *pb.LookupDPRanksRequest { return &pb.LookupDPRanksRequest{BootstrapAddr: addr} }, func(r *pb.LookupDPRanksRequest) { r.BootstrapAddr, r.Rooms = "10.9.9.9:1", []uint64{1} }, lookup, codes.NotFound, "10.9.9.9:1"),

		// Rooms.OpenRoom
		unaryRow("OpenRoom room 0", goodOpen, func(r *pb.OpenRoomRequest) { r.Room = 0 }, open, inv, "room: 0 is reserved"),
		unaryRow("OpenRoom room 2^64-1", goodOpen, func(r *pb.OpenRoomRequest) { r.Room = 1<<64 - 1 }, open, inv, "room"),
		unaryRow("OpenRoom rid empty", goodOpen, func(r *pb.OpenRoomRequest) { r.Rid = "" }, open, inv, "rid"),
		unaryRow("OpenRoom rid long", goodOpen, func(r *pb.OpenRoomRequest) { r.Rid = strings.Repeat("r", 513) }, open, inv, "rid"),
		unaryRow("OpenRoom prompt_len 0", goodOpen, func(r *pb.OpenRoomRequest) { r.PromptLen = 0 }, open, inv, "prompt_len"),
		unaryRow("OpenRoom prompt_len 2^32-1", goodOpen, func(r *pb.OpenRoomRequest) { r.PromptLen = 1<<32 - 1 }, open, inv, "prompt_len"),
		unaryRow("OpenRoom output_len 2^32-1", goodOpen, func(r *pb.OpenRoomRequest) { r.OutputLen = 1<<32 - 1 }, open, inv, "output_len"),
		unaryRow("OpenRoom max_new_tokens 0", goodOpen, func(r *pb.OpenRoomRequest) { r.MaxNewTokens = 0 }, open, inv, "max_new_tokens"),
		unaryRow("OpenRoom max_new_tokens 2^32-1", goodOpen, func(r *pb.OpenRoomRequest) { r.MaxNewTokens = 1<<32 - 1 }, open, inv, "max_new_tokens"),
		unaryRow("OpenRoom too big for the pool", goodOpen, func(r *pb.OpenRoomRequest) { r.PromptLen = 1 << 24 }, open, inv, "exceeds the maximum number of tokens"),
		unaryRow("OpenRoom priority", goodOpen, func(r *pb.OpenRoomRequest) { r.Priority = -1 << 31 }, open, inv, "priority"),
		unaryRow("OpenRoom prefill_dp_rank", goodOpen, func(r *pb.OpenRoomRequest) { v := uint32(1 << 30); r.PrefillDpRank = &v }, open, inv, "prefill_dp_rank"),
		unaryRow("OpenRoom decode_dp_rank", goodOpen, func(r *pb.OpenRoomRequest) { v := uint32(1 << 30); r.DecodeDpRank = &v }, open, inv, "decode_dp_rank"),
		unaryRow("OpenRoom idempotency_key", goodOpen, func(r *pb.OpenRoomRequest) { r.IdempotencyKey = strings.Repeat("k", 257) }, open, inv, "idempotency_key"),
		unaryRow("OpenRoom timeout below 1ms", goodOpen, func(r *pb.OpenRoomRequest) { r.Timeout = durationpb.New(999 * time.Microsecond) }, open, inv, "timeout"),
		unaryRow("OpenRoom timeout above 24h", goodOpen, func(r *pb.OpenRoomRequest) { r.Timeout = durationpb.New(24*time.Hour + time.Millisecond) }, open, inv, "timeout"),
		unaryRow("OpenRoom timeout negative", goodOpen, func(r *pb.OpenRoomRequest) { r.Timeout = durationpb.New(-time.Second) }, open, inv, "timeout"),
		unaryRow("OpenRoom timeout not a duration", goodOpen, func(r *pb.OpenRoomRequest) { r.Timeout = &durationpb.Duration{Seconds: 1, Nanos: -1} }, open, inv, "timeout"),
		unaryRow("OpenRoom bootstrap_addr", goodOpen, func(r *pb.OpenRoomRequest) { r.BootstrapAddr = "[::1]:99999" }, open, inv, "bootstrap_addr"),
		unaryRow("OpenRoom existing room, other key", goodOpen, func(r *pb.OpenRoomRequest) { r.Room = room }, open, codes.AlreadyExists, "5"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/OpenRoom", false, goodOpen, func(r *pb.OpenRoomRequest) { r.Rid = utf8Slot }, "rid"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/OpenRoom", false, goodOpen, func(r *pb.OpenRoomRequest) { r.IdempotencyKey = utf8Slot }, "idempotency_key"),

		// Rooms.AwaitDestination (server streaming)
		unaryRow("AwaitDestination room 0", func() *pb.AwaitDestinationRequest { return &pb.AwaitDestinationRequest{Room: room, Rank: rank()} }, func(r *pb.AwaitDestinationRequest) { r.Room = 0 }, await, inv, "room: 0 is reserved"),
		unaryRow("AwaitDestination without rank", func() *pb.AwaitDestinationRequest { return &pb.AwaitDestinationRequest{Room: room, Rank: rank()} }, func(r *pb.AwaitDestinationRequest) { r.Rank = nil }, await, inv, "rank: is required"),
		unaryRow("AwaitDestination pp_rank", func() *pb.AwaitDestinationRequest { return &pb.AwaitDestinationRequest{Room: room, Rank: rank()} }, func(r *pb.AwaitDestinationRequest) { r.Rank.PpRank = 1 << 31 }, await, inv, "rank.pp_rank"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/AwaitDestination", true, func() *pb.AwaitDestinationRequest { return &pb.AwaitDestinationRequest{Room: 77, Rank: rank()} }, func(r *pb.AwaitDestinationRequest) { r.Rank.BootstrapAddr = utf8Slot }, "rank.bootstrap_addr"),
		rawRow(s.conn, "/decodeplane.v1.Rooms/AwaitDestination", true, []byte{0x12, 0xff}, "rank: cannot be decoded"),

		// Rooms.Transfer
		unaryRow("Transfer room 0", goodTransfer, func(r *pb.TransferRequest) { r.Room = 0 }, transfer, inv, "room: 0 is reserved"),
		unaryRow("Transfer last without aux", goodTransfer, func(r *pb.TransferRequest) { r.Aux = nil }, transfer, inv, "aux: is required on the last chunk"),
		unaryRow("Transfer last with marker 0", goodTransfer, func(r *pb.TransferRequest) { r.Aux.RoomMarker = 0 }, transfer, inv, "aux.room_marker"),
		unaryRow("Transfer aux before the last", goodTransfer, func(r *pb.TransferRequest) { r.Last = false }, transfer, inv, "aux: is set on a chunk that is not the last"),
		unaryRow("Transfer 15 output ids", goodTransfer, func(r *pb.TransferRequest) { r.Aux.OutputIds = make([]int32, 15) }, transfer, inv, "aux.output_ids"),
		unaryRow("Transfer num_pages 0", goodTransfer, func(r *pb.TransferRequest) { r.Last, r.Aux, r.NumPages = false, nil, 0 }, transfer, inv, "num_pages"),
		unaryRow("Transfer num_pages 2^32-1", goodTransfer, func(r *pb.TransferRequest) { r.NumPages = 1<<32 - 1 }, transfer, inv, "num_pages"),
		unaryRow("Transfer page_offset 2^32-1", goodTransfer, func(r *pb.TransferRequest) { r.PageOffset = 1<<32 - 1 }, transfer, inv, "page_offset"),
		unaryRow("Transfer page_offset + num_pages", goodTransfer, func(r *pb.TransferRequest) { r.PageOffset, r.NumPages = 1<<24, 1 }, transfer, inv, "page_offset + num_pages"),
		unaryRow("Transfer chunk_index 2^32-1", goodTransfer, func(r *pb.TransferRequest) { r.ChunkIndex = 1<<32 - 1 }, transfer, inv, "chunk_index"),
		unaryRow("Transfer attempt", goodTransfer, func(r *pb.TransferRequest) { r.Attempt = 1 << 31 }, transfer, inv, "attempt"),
		unaryRow("Transfer source pages count", goodTransfer, func(r *pb.TransferRequest) { r.Source = &pb.TransferSource{PageIndices: []int32{1}} }, transfer, inv, "source.page_indices"),
		unaryRow("Transfer source page negative", goodTransfer, func(r *pb.TransferRequest) { r.Source = &pb.TransferSource{PageIndices: []int32{1, 2, -3, 4}} }, transfer, inv, "source.page_indices[2]"),
		unaryRow("Transfer source huge", goodTransfer, func(r *pb.TransferRequest) { r.Source = &pb.TransferSource{PageIndices: make([]int32, 1<<18)} }, transfer, inv, "source.page_indices"),
		unaryRow("Transfer source buffer", goodTransfer, func(r *pb.TransferRequest) { r.Source = &pb.TransferSource{Buffer: strings.Repeat("b", 257)} }, transfer, inv, "source.buffer"),
		unaryRow("Transfer rank dp_rank", goodTransfer, func(r *pb.TransferRequest) { r.Rank.DpRank = 1 << 31 }, transfer, inv, "rank.dp_rank"),
		unaryRow("Transfer outside the destination", goodTransfer, func(r *pb.TransferRequest) { r.PageOffset = 1000 }, transfer, inv, "page"),
		unaryRow("Transfer unknown room", goodTransfer, func(r *pb.TransferRequest) { r.Room, r.Aux.RoomMarker = 77, 77 }, transfer, codes.NotFound, "77"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/Transfer", false, goodTransfer, func(r *pb.TransferRequest) { r.Source = &pb.TransferSource{Buffer: utf8Slot} }, "source.buffer"),

		// Rooms.ReportTransfer
		unaryRow("ReportTransfer room 0", goodReport, func(r *pb.ReportTransferRequest) { r.Room = 0 }, report, inv, "room: 0 is reserved"),
		unaryRow("ReportTransfer last without marker", goodReport, func(r *pb.ReportTransferRequest) { r.MetadataRoomMarker = 0 }, report, inv, "metadata_room_marker"),
		unaryRow("ReportTransfer marker before the last", goodReport, func(r *pb.ReportTransferRequest) { r.Last = false }, report, inv, "metadata_room_marker"),
		unaryRow("ReportTransfer bytes 2^63", goodReport, func(r *pb.ReportTransferRequest) { r.Bytes = 1 << 63 }, report, inv, "bytes"),
		unaryRow("ReportTransfer bytes 2^50+1", goodReport, func(r *pb.ReportTransferRequest) { r.Bytes = 1<<50 + 1 }, report, inv, "bytes"),
		unaryRow("ReportTransfer reason on success", goodReport, func(r *pb.ReportTransferRequest) { r.FailureReason = "x" }, report, inv, "failure_reason"),
		unaryRow("ReportTransfer reason long", goodReport, func(r *pb.ReportTransferRequest) {
			r.Success, r.MetadataRoomMarker, r.FailureReason = false, 0, strings.Repeat("x", 4097)
		}, report, inv, "failure_reason"),
		unaryRow("ReportTransfer num_pages", goodReport, func(r *pb.ReportTransferRequest) { r.NumPages = 1 << 25 }, report, inv, "num_pages"),
		unaryRow("ReportTransfer chunk_index", goodReport, func(r *pb.ReportTransferRequest) { r.ChunkIndex = 1 << 24 }, report, inv, "chunk_index"),
		unaryRow("ReportTransfer attempt", goodReport, func(r *pb.ReportTransferRequest) { r.Attempt = 1<<20 + 1 }, report, inv, "attempt"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/ReportTransfer", false, goodReport, func(r *pb.ReportTransferRequest) {
			r.Success, r.MetadataRoomMarker, r.FailureReason = false, 0, utf8Slot
		}, "failure_reason"),

		// Rooms.WatchRoom, GetRoom, AbortRoom, ReleaseRoom
		unaryRow("WatchRoom room 0", func() *pb.WatchRoomRequest { return &pb.WatchRoomRequest{Room: room} }, func(r *pb.WatchRoomRequest) { r.Room = 0 }, watch, inv, "room: 0 is reserved"),
		unaryRow("WatchRoom room 2^63", func() *pb.WatchRoomRequest { return &pb.WatchRoomRequest{Room: room} }, func(r *pb.WatchRoomRequest) { r.Room = 1 << 63 }, watch, inv, "room"),
		unaryRow("WatchRoom unknown", func() *pb.WatchRoomRequest { return &pb.WatchRoomRequest{Room: room} }, func(r *pb.WatchRoomRequest) { r.Room = 77 }, watch, codes.NotFound, "77"),
		rawRow(s.conn, "/decodeplane.v1.Rooms/WatchRoom", true, []byte{0x08}, "room: cannot be decoded"),
		unaryRow("GetRoom room 0", func() *pb.GetRoomRequest { return &pb.GetRoomRequest{Room: room} }, func(r *pb.GetRoomRequest) { r.Room = 0 }, getRoom, inv, "room: 0 is reserved"),
		unaryRow("GetRoom unknown", func() *pb.GetRoomRequest { return &pb.GetRoomRequest{Room: room} }, func(r *pb.GetRoomRequest) { r.Room = 77 }, getRoom, codes.NotFound, "77"),
		unaryRow("AbortRoom room 0", func() *pb.AbortRoomRequest { return &pb.AbortRoomRequest{Room: room} }, func(r *pb.AbortRoomRequest) { r.Room = 0 }, abort, inv, "room: 0 is reserved"),
		unaryRow("AbortRoom reason long", func() *pb.AbortRoomRequest { return &pb.AbortRoomRequest{Room: room} }, func(r *pb.AbortRoomRequest) { r.Reason = strings.Repeat("x", 4097) }, abort, inv, "reason"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/AbortRoom", false, func() *pb.AbortRoomRequest { return &pb.AbortRoomRequest{Room: room} }, func(r *pb.AbortRoomRequest) { r.Reason = utf8Slot }, "reason"),
		unaryRow("ReleaseRoom room 0", func() *pb.ReleaseRoomRequest { return &pb.ReleaseRoomRequest{Room: room} }, func(r *pb.ReleaseRoomRequest) { r.Room = 0 }, release, inv, "room: 0 is reserved"),
		unaryRow("ReleaseRoom not succeeded", func() *pb.ReleaseRoomRequest { return &pb.ReleaseRoomRequest{Room: room} }, func(*pb.ReleaseRoomRequest) {}, release, codes.FailedPrecondition, "abort"),

		// Rooms.ListRooms
		unaryRow("ListRooms limit", func() *pb.ListRoomsRequest { return &pb.ListRoomsRequest{} }, func(r *pb.ListRoomsRequest) { r.Limit = 1 << 20 }, list, inv, "limit"),
		unaryRow("ListRooms phase 0", func() *pb.ListRoomsRequest { return &pb.ListRoomsRequest{} }, func(r *pb.ListRoomsRequest) { r.Phases = []pb.RoomPhase{1, 0} }, list, inv, "phases[1]"),
		unaryRow("ListRooms phase 99", func() *pb.ListRoomsRequest { return &pb.ListRoomsRequest{} }, func(r *pb.ListRoomsRequest) { r.Phases = []pb.RoomPhase{99} }, list, inv, "phases[0]"),
		unaryRow("ListRooms 17 phases", func() *pb.ListRoomsRequest { return &pb.ListRoomsRequest{} }, func(r *pb.ListRoomsRequest) { r.Phases = repeat(pb.RoomPhase_ROOM_PHASE_QUEUED, 17) }, list, inv, "phases: has 17 entries"),
		unaryRow("ListRooms bootstrap_addr", func() *pb.ListRoomsRequest { return &pb.ListRoomsRequest{} }, func(r *pb.ListRoomsRequest) { r.BootstrapAddr = "x" }, list, inv, "bootstrap_addr"),
		utf8Row(t, s.conn, "/decodeplane.v1.Rooms/ListRooms", false, func() *pb.ListRoomsRequest { return &pb.ListRoomsRequest{} }, func(r *pb.ListRoomsRequest) { r.BootstrapAddr = utf8Slot }, "bootstrap_addr"),

		// Rooms.ReportRunning
		unaryRow("ReportRunning room 0", func() *pb.ReportRunningRequest { return &pb.ReportRunningRequest{} }, func(r *pb.ReportRunningRequest) { r.Rooms = []*pb.RunningUsage{{Room: room}, {Room: 0}} }, running, inv, "rooms[1].room"),
		unaryRow("ReportRunning output_len", func() *pb.ReportRunningRequest { return &pb.ReportRunningRequest{} }, func(r *pb.ReportRunningRequest) { r.Rooms = []*pb.RunningUsage{{Room: room, OutputLen: 1<<32 - 1}} }, running, inv, "rooms[0].output_len"),
		unaryRow("ReportRunning too many", func() *pb.ReportRunningRequest { return &pb.ReportRunningRequest{} }, func(r *pb.ReportRunningRequest) {
			r.Rooms = make([]*pb.RunningUsage, pb.MaxRunningRooms+1)
			for i := range r.Rooms {
				r.Rooms[i] = &pb.RunningUsage{Room: 1}
			}
		}, running, inv, "rooms: has 100001 entries"),

		// Rooms.RetractRoom
		unaryRow("RetractRoom mode", func() *pb.RetractRoomRequest { return &pb.RetractRoomRequest{Room: room} }, func(r *pb.RetractRoomRequest) { r.Mode = 0 }, retract, inv, "mode"),
		unaryRow("RetractRoom mode 7", func() *pb.RetractRoomRequest { return &pb.RetractRoomRequest{Room: room} }, func(r *pb.RetractRoomRequest) { r.Mode = 7 }, retract, inv, "mode"),
		unaryRow("RetractRoom room 0", func() *pb.RetractRoomRequest { return &pb.RetractRoomRequest{Room: room, Mode: 1} }, func(r *pb.RetractRoomRequest) { r.Room = 0 }, retract, inv, "room: 0 is reserved"),
		unaryRow("RetractRoom not running", func() *pb.RetractRoomRequest { return &pb.RetractRoomRequest{Room: room, Mode: 1} }, func(*pb.RetractRoomRequest) {}, retract, codes.FailedPrecondition, "running"),

		// Staging
		unaryRow("SetupStaging without rank", func() *pb.SetupStagingRequest { return &pb.SetupStagingRequest{Rank: rank()} }, func(r *pb.SetupStagingRequest) { r.Rank = nil }, setup, inv, "rank: is required"),
		unaryRow("SetupStaging cp_rank", func() *pb.SetupStagingRequest { return &pb.SetupStagingRequest{Rank: rank()} }, func(r *pb.SetupStagingRequest) { r.Rank.CpRank = 5000 }, setup, inv, "rank.cp_rank"),
		utf8Row(t, s.conn, "/decodeplane.v1.Staging/SetupStaging", false, func() *pb.SetupStagingRequest { return &pb.SetupStagingRequest{Rank: rank()} }, func(r *pb.SetupStagingRequest) { r.Rank.BootstrapAddr = utf8Slot }, "rank.bootstrap_addr"),
		unaryRow("AllocateStaging room 0", func() *pb.AllocateStagingRequest {
			return &pb.AllocateStagingRequest{Room: room, Rank: rank(), NumPages: 1}
		}, func(r *pb.AllocateStagingRequest) { r.Room = 0 }, alloc, inv, "room: 0 is reserved"),
		unaryRow("AllocateStaging num_pages 0", func() *pb.AllocateStagingRequest {
			return &pb.AllocateStagingRequest{Room: room, Rank: rank(), NumPages: 1}
		}, func(r *pb.AllocateStagingRequest) { r.NumPages = 0 }, alloc, inv, "num_pages"),
		unaryRow("AllocateStaging num_pages 2^32-1", func() *pb.AllocateStagingRequest {
			return &pb.AllocateStagingRequest{Room: room, Rank: rank(), NumPages: 1}
		}, func(r *pb.AllocateStagingRequest) { r.NumPages = 1<<32 - 1 }, alloc, inv, "num_pages"),
		unaryRow("AllocateStaging chunk_index", func() *pb.AllocateStagingRequest {
			return &pb.AllocateStagingRequest{Room: room, Rank: rank(), NumPages: 1}
		}, func(r *pb.AllocateStagingRequest) { r.ChunkIndex = 1<<32 - 1 }, alloc, inv, "chunk_index"),
		unaryRow("AllocateStaging room not staged", func() *pb.AllocateStagingRequest {
			return &pb.AllocateStagingRequest{Room: room, Rank: rank(), NumPages: 1}
		}, func(*pb.AllocateStagingRequest) {}, alloc, codes.FailedPrecondition, "stag"),
		unaryRow("ChunkReady room 0", goodChunk, func(r *pb.ChunkReadyRequest) { r.Room = 0 }, chunk, inv, "room: 0 is reserved"),
		unaryRow("ChunkReady last without aux", goodChunk, func(r *pb.ChunkReadyRequest) { r.Aux = nil }, chunk, inv, "aux: is required on the last chunk"),
		unaryRow("ChunkReady marker 0", goodChunk, func(r *pb.ChunkReadyRequest) { r.Aux.RoomMarker = 0 }, chunk, inv, "aux.room_marker"),
		unaryRow("ChunkReady aux before the last", goodChunk, func(r *pb.ChunkReadyRequest) { r.Last = false }, chunk, inv, "aux"),
		unaryRow("ChunkReady num_pages 0", goodChunk, func(r *pb.ChunkReadyRequest) { r.NumPages = 0 }, chunk, inv, "num_pages"),
		unaryRow("ChunkReady page_offset", goodChunk, func(r *pb.ChunkReadyRequest) { r.PageOffset = 1<<32 - 1 }, chunk, inv, "page_offset"),
		unaryRow("ChunkReady output ids", goodChunk, func(r *pb.ChunkReadyRequest) { r.Aux.OutputIds = make([]int32, 100) }, chunk, inv, "aux.output_ids"),
		unaryRow("WatchWatermark dp rank", func() *pb.WatchWatermarkRequest { return &pb.WatchWatermarkRequest{} }, func(r *pb.WatchWatermarkRequest) { r.DecodeDpRank = 1 << 31 }, watermark, inv, "decode_dp_rank"),
		unaryRow("WatchWatermark tp rank", func() *pb.WatchWatermarkRequest { return &pb.WatchWatermarkRequest{} }, func(r *pb.WatchWatermarkRequest) { r.DecodeTpRanks = []uint32{0, 1 << 31} }, watermark, inv, "decode_tp_ranks[1]"),
		unaryRow("WatchWatermark 1025 ranks", func() *pb.WatchWatermarkRequest { return &pb.WatchWatermarkRequest{} }, func(r *pb.WatchWatermarkRequest) { r.DecodeTpRanks = make([]uint32, 1025) }, watermark, inv, "decode_tp_ranks: has 1025 entries"),
		rawRow(s.conn, "/decodeplane.v1.Staging/WatchWatermark", true, []byte{0x12, 0x05, 0x01}, "decode_tp_ranks: cannot be decoded"),

		// Capacity.WatchCapacity
		unaryRow("WatchCapacity min_interval 5ms", goodCap, func(r *pb.WatchCapacityRequest) { r.MinInterval = durationpb.New(5 * time.Millisecond) }, capacity, inv, "min_interval: 5ms is out of range: allowed 10ms..1m0s"),
		unaryRow("WatchCapacity min_interval 61s", goodCap, func(r *pb.WatchCapacityRequest) { r.MinInterval = durationpb.New(61 * time.Second) }, capacity, inv, "min_interval: 1m1s is out of range: allowed 10ms..1m0s"),
		unaryRow("WatchCapacity min_interval negative", goodCap, func(r *pb.WatchCapacityRequest) { r.MinInterval = durationpb.New(-time.Second) }, capacity, inv, "min_interval: -1s is out of range"),
		unaryRow("WatchCapacity min_interval invalid", goodCap, func(r *pb.WatchCapacityRequest) { r.MinInterval = &durationpb.Duration{Seconds: 1, Nanos: -1} }, capacity, inv, "min_interval: is not a valid duration"),
		unaryRow("WatchCapacity keepalive 500ms", goodCap, func(r *pb.WatchCapacityRequest) { r.KeepaliveInterval = durationpb.New(500 * time.Millisecond) }, capacity, inv, "keepalive_interval: 500ms is out of range: allowed 1s..10m0s"),
		unaryRow("WatchCapacity keepalive 11m", goodCap, func(r *pb.WatchCapacityRequest) { r.KeepaliveInterval = durationpb.New(11 * time.Minute) }, capacity, inv, "keepalive_interval: 11m0s is out of range: allowed 1s..10m0s"),
		unaryRow("WatchCapacity keepalive below min_interval", goodCap, func(r *pb.WatchCapacityRequest) {
			r.MinInterval, r.KeepaliveInterval = durationpb.New(30*time.Second), durationpb.New(20*time.Second)
		}, capacity, inv, "keepalive_interval: 20s is below min_interval 30s"),
		unaryRow("WatchCapacity keepalive below the default min_interval's bound", goodCap, func(r *pb.WatchCapacityRequest) { r.KeepaliveInterval = durationpb.New(time.Millisecond) }, capacity, inv, "keepalive_interval"),
		rawRow(s.conn, "/decodeplane.v1.Capacity/WatchCapacity", true, []byte{0x0a, 0x05, 0x08}, "min_interval: cannot be decoded"),

		// Admin: no fields, but the bytes must still decode.
		rawRow(s.conn, "/decodeplane.v1.Admin/GetStatus", false, []byte{0x0a, 0x10}, "request: cannot be decoded: unknown field 1"),
		rawRow(s.conn, "/decodeplane.v1.Admin/Drain", false, []byte{0xff}, "request: cannot be decoded"),
		rawRow(s.conn, "/decodeplane.v1.Rooms/ContinueGeneration", false, []byte{0x80}, "request: cannot be decoded"),
	}
	runConformance(t, rows, snapshot)
}

// TestDecodeRecordCannotBeForged: a valid message carrying the codec's
// record field number (with someone else's bytes) is an ordinary unknown
// field: the call is served. And after undecodable calls the server still
// serves decodable ones.
func TestDecodeRecordCannotBeForged(t *testing.T) {
	s := newStgServer(t, stgDecodeConfig(1), "")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	b := protowire.AppendTag(nil, protowire.MaxValidNumber, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("0123456789abcdefroom: forged refusal"))
	if err := callRaw(ctx, s.conn, "/decodeplane.v1.Admin/GetStatus", false, b); err != nil {
		t.Fatalf("GetStatus with a forged record: %v; want it served", err)
	}
	req, err := proto.Marshal(&pb.GetRoomRequest{Room: 77})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := callRaw(ctx, s.conn, "/decodeplane.v1.Admin/GetStatus", false, []byte{0xff}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("undecodable GetStatus = %v; want InvalidArgument", err)
		}
		if err := callRaw(ctx, s.conn, "/decodeplane.v1.Rooms/GetRoom", false, req); status.Code(err) != codes.NotFound {
			t.Fatalf("GetRoom(77) after an undecodable call = %v; want NotFound", err)
		}
	}
}
