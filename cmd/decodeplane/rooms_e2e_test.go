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
// Transports: every TestRoomsE2E test but reflection runs twice,
// as subtests unary and stream, each on its own daemon: the same
// assertions, the rooms carried by the unary API or by the EngineSession
// and PrefillSession streams, and the daemon's /metrics proving which
// (transport_e2e_test.go).
//
// Timing: nothing sleeps. Tests wait on events (WatchRoom through WaitRoom
// or the engine session's events, AwaitDestination streams or session
// claims, the heartbeat loop's return) under context deadlines. The
// daemon's own time-based behaviour (heartbeat loss, claim
// timeout, the registration retry budget) runs on its real clock with short
// configured values; the fake-clock versions live in kvmanager's synctest
// suite.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// roomsGQAModel are the KV layout facts of the default decode pool (Llama-3-8B
// like: 32 layers, 8 KV heads of 128).
var roomsGQAModel = &pb.ModelFacts{KvPoolKind: "gqa", NumLayers: 32, TotalKvHeads: 8, HeadDim: 128}

// TestRoomsE2EGQAPrefillTP2DecodeTP1: two prefill ranks each own half of the
// KV heads and both write every page of the one decode rank. The room's state
// is the MIN over both ranks: one rank done is not success.
// SGLang transitions: T1, T2/T4/T8, T11, T12/T17.
func TestRoomsE2EGQAPrefillTP2DecodeTP1(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "kv_pool:\n  kind: gqa\n", "")
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
			for i, s := range []roomsClaim{s0, s1} {
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
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "kv_pool:\n  kind: gqa\n  kv_heads: 8\nparallel:\n  attn_tp: 4\n", "")
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
	})
}

// TestRoomsE2EMLAPrefillTP4DecodeTP1: MLA has no heads to split, so one
// prefill rank sends the latent KV and the three others get dummy
// destinations (no pages, no metadata slot) and only wait for the end.
// SGLang transitions: T1, T2/T4/T8, T11, T12/T17.
func TestRoomsE2EMLAPrefillTP4DecodeTP1(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "kv_pool:\n  kind: mla\n  kv_lora_rank: 512\n  qk_rope_head_dim: 64\n", "")
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
	})
}

// TestRoomsE2EPrefillDPRules resolves a room's prefill DP rank with each of
// SGLang's rules (hint, dp_size == 1, room % dp_size under
// follow_bootstrap_room, the BindRoom table), on a decode side with two DP
// shards; only the prefill ranks of the resolved DP group may claim a room.
// SGLang transitions: T1, T2 (each rule), T4, T8, T11, T12/T17.
func TestRoomsE2EPrefillDPRules(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "parallel:\n  dp: 2\n", "")
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
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		const (
			rooms      = 1000
			workers    = 64
			prompt     = 256 // 4 pages
			chunkPages = 2   // 2 chunks per rank and room
			first      = uint64(100000)
			addr       = "10.0.2.1:8998"
		)
		d := roomsStartOver(t, tr, `kv_pool:
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
	})
}
