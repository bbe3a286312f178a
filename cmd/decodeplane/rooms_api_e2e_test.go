package main

// End-to-end tests of rooms over gRPC through the real daemon
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
// Each test names the SGLang transitions (T1–T23, docs/sglang-transitions.md) it
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
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/sessiontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestRoomsE2ERequestErrors: AlreadyExists, NotFound, InvalidArgument naming
// the field (nothing stored), FailedPrecondition for a page-size or KV-dtype
// mismatch (SGLang's messages, nothing registered) and for a BindRoom that
// contradicts follow_bootstrap_room (SGLang's message; the room fails).
func TestRoomsE2ERequestErrors(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "kv_pool:\n  kind: gqa\n", "")
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
			_, err = ranks[0].report(ctx, &pb.ReportTransferRequest{Room: unknown, Rank: ranks[0].Rank(), NumPages: 1, Last: true, Success: true, MetadataRoomMarker: unknown})
			roomsWantCode(t, "ReportTransfer", err, codes.NotFound, client.ErrNotFound)
			// Unknown prefills.
			_, err = d.c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: "10.0.8.99:1", Rooms: []uint64{1}})
			roomsWantCode(t, "LookupDPRanks of an unknown prefill", err, codes.NotFound, client.ErrNotFound)
			unknownRank := d.c.Prefill(&pb.RegisterPrefillRequest{BootstrapAddr: "10.0.8.99:1"}) // DP, TP ... rank 0
			_, err = unknownRank.BindRoom(ctx, 1)
			roomsWantCode(t, "BindRoom of an unknown prefill", err, codes.NotFound, client.ErrNotFound)
			_, err = unknownRank.Heartbeat(ctx)
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
				// Never admissible even by an empty pool, whatever rebootstrap says.
				{"exceeds the maximum number of tokens", func(r *pb.OpenRoomRequest) { r.OutputLen = 2_000_000 }},
				{"exceeds the maximum number of tokens", func(r *pb.OpenRoomRequest) { r.OutputLen = 1<<32 - 1 }},
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
				_, err := d.c.Prefill(reg).Register(ctx)
				roomsWantCode(t, fmt.Sprintf("RegisterPrefill with bad %s", tc.field), err, codes.InvalidArgument, client.ErrInvalidArgument, tc.field)
			}
			_, err := d.c.ListRooms(ctx, &pb.ListRoomsRequest{Limit: 1 << 20})
			roomsWantCode(t, "ListRooms with a huge limit", err, codes.InvalidArgument, client.ErrInvalidArgument, "limit")
			// A rank without an address (a registration without one).
			_, err = d.c.Prefill(&pb.RegisterPrefillRequest{}).Transfer(ctx, &pb.TransferRequest{Room: 1})
			roomsWantCode(t, "Transfer without a rank's address", err, codes.InvalidArgument, client.ErrInvalidArgument, "rank")
			roomsAssertPrefills(t, d, ctx, addr)
			d.assertDrained(t)
		})
		t.Run("page size mismatch", func(t *testing.T) {
			reg := roomsReg("10.0.8.3:8998", 1, 0, 1, 0, "")
			reg.PageSize = 32
			_, err := d.c.Prefill(reg).Register(ctx)
			want := "Page size mismatch: prefill server has page_size=32, but decode server has page_size=64. Both servers must use the same --page-size value."
			roomsWantCode(t, "RegisterPrefill with page_size 32", err, codes.FailedPrecondition, client.ErrFailedPrecondition, want)
			reg = roomsReg("10.0.8.3:8998", 1, 0, 1, 0, "")
			reg.KvCacheDtype = "fp8_e4m3"
			_, err = d.c.Prefill(reg).Register(ctx)
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
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		const token = "s3cret-bootstrap-token"
		d := roomsStartOver(t, tr, "log:\n  level: warn\n", token, "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN="+token)
		ctx := roomsCtx(t)
		const addr = "10.0.9.1:8998"
		missing, wrong := d.newClient(t, ""), d.newClient(t, "not-the-token")
		bad := map[string]*roomsClient{"missing token": missing, "wrong token": wrong}

		for name, c := range bad {
			_, err := c.OpenRoom(ctx, roomsOpen(addr, 11001, 300))
			roomsWantCode(t, name+": OpenRoom", err, codes.Unauthenticated, client.ErrUnauthenticated, "Bearer")
			_, err = c.GetRoom(ctx, &pb.GetRoomRequest{Room: 11001})
			roomsWantCode(t, name+": GetRoom after the refused OpenRoom", err, codes.NotFound, client.ErrNotFound)
			_, err = c.Prefill(roomsReg(addr, 1, 0, 1, 0, "")).Register(ctx)
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
		reg := roomsReg(addr, 1, 0, 1, 0, "") // ranks[0]'s
		for name, c := range bad {
			_, err := c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room})
			roomsWantCode(t, name+": AbortRoom", err, codes.Unauthenticated, client.ErrUnauthenticated)
			_, err = c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room})
			roomsWantCode(t, name+": ReleaseRoom", err, codes.Unauthenticated, client.ErrUnauthenticated)
			p := c.Prefill(reg) // the rank, through the client without the token
			_, err = p.Heartbeat(ctx)
			roomsWantCode(t, name+": Heartbeat", err, codes.Unauthenticated, client.ErrUnauthenticated)
			_, err = p.BindRoom(ctx, room)
			roomsWantCode(t, name+": BindRoom", err, codes.Unauthenticated, client.ErrUnauthenticated)
			_, err = p.Transfer(ctx, &pb.TransferRequest{Room: room, NumPages: 1})
			roomsWantCode(t, name+": Transfer", err, codes.Unauthenticated, client.ErrUnauthenticated)
			_, err = p.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: room, NumPages: 1, Success: true})
			roomsWantCode(t, name+": ReportTransfer", err, codes.Unauthenticated, client.ErrUnauthenticated)
			s, err := p.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room})
			if err == nil {
				_, err = s.Next()
				s.Close()
			}
			roomsWantCode(t, name+": AwaitDestination", err, codes.Unauthenticated, client.ErrUnauthenticated)
			if tr == overStream {
				// The prefill session is refused as a whole (the ops above
				// are the unary ones of the same client).
				hello := &pb.PrefillHello{Rank: p.Rank(), InstanceId: reg.GetInstanceId()}
				_, err := sessiontest.OpenPrefill(ctx, c.Conn(), hello, c.callOpts()...)
				roomsWantCode(t, name+": PrefillSession", err, codes.Unauthenticated, client.ErrUnauthenticated, "Bearer")
			}
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
	})
}

// TestRoomsE2EReflection: a reflection client resolves the file descriptors
// of decodeplane.v1.Bootstrap, decodeplane.v1.Rooms,
// decodeplane.v1.Capacity, decodeplane.v1.EngineSession and
// decodeplane.v1.PrefillSession and sees every RPC of the contract, with
// the right streaming shape (the two sessions' Session the bidi streams).
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
		"decodeplane.v1.Bootstrap": {"RegisterPrefill", "Heartbeat", "DeregisterPrefill", "BindRoom", "LookupDPRanks"},
		"decodeplane.v1.Rooms":     {"OpenRoom", "AwaitDestination", "Transfer", "ReportTransfer", "WatchRoom", "GetRoom", "AbortRoom", "ReleaseRoom", "ListRooms", "DeclareDestination", "RegisterEngineLayout"},
		"decodeplane.v1.Capacity":  {"WatchCapacity", "ReportCapacity"},
		// EngineSession.Session is the one bidirectional stream.
		"decodeplane.v1.EngineSession":  {"Session"},
		"decodeplane.v1.PrefillSession": {"Session"},
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
		if (svc == "decodeplane.v1.Bootstrap" || svc == "decodeplane.v1.Capacity" || svc == "decodeplane.v1.EngineSession" || svc == "decodeplane.v1.PrefillSession") && len(got) != len(methods) {
			t.Errorf("%s has methods %q, want exactly %q", svc, got, methods)
		}
		for i := range sd.Methods().Len() {
			m := sd.Methods().Get(i)
			bidi := m.Name() == "Session"
			streaming := m.Name() == "AwaitDestination" || m.Name() == "WatchRoom" || m.Name() == "WatchCapacity" || bidi
			if m.IsStreamingServer() != streaming || m.IsStreamingClient() != bidi {
				t.Errorf("%s.%s: server streaming %v, client streaming %v; want server streaming %v, client streaming %v", svc, m.Name(), m.IsStreamingServer(), m.IsStreamingClient(), streaming, bidi)
			}
		}
	}
	desc, err := reg.FindDescriptorByName("decodeplane.v1.Rooms.AwaitDestination")
	if md, ok := desc.(protoreflect.MethodDescriptor); err != nil || !ok || md.Output().FullName() != "decodeplane.v1.DestinationEvent" {
		t.Errorf("Rooms.AwaitDestination: %v, %v; want it to stream decodeplane.v1.DestinationEvent", desc, err)
	}
}
