package server_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Admission at the wire: the real server over bufconn with a real manager
// and ledger (simulated, instant transfers). The prefill is one TP-1 rank
// at admAddr; every room's single rank moves all its pages in one chunk.

const admAddr = "10.2.0.1:8998"

// admDecodeConfig is a GQA pool of pages pages of 16 tokens, 8 request
// slots, R reserved decode tokens and admission.max_bypass bypass.
func admDecodeConfig(pages int64, r, bypass int) kvlayout.Config {
	dec := stgDecodeConfig(1)
	dec.Staging = kvlayout.StagingConfig{}
	dec.Pool.TotalPages = pages
	dec.Admission.ReservedDecodeTokens = r
	dec.Admission.MaxBypass = bypass
	return dec
}

func admServer(t *testing.T, dec kvlayout.Config) (*stgServer, context.Context) {
	t.Helper()
	s := newStgServer(t, dec, "")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	s.register(t, ctx, admAddr, 1)
	return s, ctx
}

func (s *stgServer) openRoom(t *testing.T, ctx context.Context, room uint64, prompt, maxNew uint32) *pb.Room {
	t.Helper()
	resp, err := s.room.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint("rid-", room), BootstrapAddr: admAddr, Room: room, PromptLen: prompt, MaxNewTokens: maxNew})
	if err != nil {
		t.Fatalf("OpenRoom(%d) = %v", room, err)
	}
	return resp.GetRoom()
}

// getRoom returns the room with its pages.
func (s *stgServer) getRoom(t *testing.T, ctx context.Context, room uint64) *pb.Room {
	t.Helper()
	r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room, IncludePages: true})
	if err != nil {
		t.Fatalf("GetRoom(%d) = %v", room, err)
	}
	return r
}

func (s *stgServer) wantPhase(t *testing.T, ctx context.Context, room uint64, want pb.RoomPhase) *pb.Room {
	t.Helper()
	r := s.getRoom(t, ctx, room)
	if r.GetPhase() != want {
		t.Fatalf("room %d is %s, want %s", room, r.GetPhase(), want)
	}
	return r
}

// succeed claims an admitted room as its prefill rank and moves all its
// pages in one last chunk carrying the room marker: the room succeeds.
func (s *stgServer) succeed(t *testing.T, ctx context.Context, room uint64) {
	t.Helper()
	rank := &pb.PrefillRank{BootstrapAddr: admAddr}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.room.AwaitDestination(cctx, &pb.AwaitDestinationRequest{Room: room, Rank: rank})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination(%d) = %v, %v; want a destination", room, ev, err)
	}
	n := uint32(len(ev.GetDestination().GetPageIndices()))
	if _, err := s.room.Transfer(ctx, &pb.TransferRequest{Room: room, Rank: rank, NumPages: n, Last: true, Aux: &pb.Aux{RoomMarker: room}}); err != nil {
		t.Fatalf("Transfer(%d) = %v", room, err)
	}
	s.wantPhase(t, ctx, room, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
}

func (s *stgServer) release(t *testing.T, ctx context.Context, room uint64) {
	t.Helper()
	if _, err := s.room.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
		t.Fatalf("ReleaseRoom(%d) = %v", room, err)
	}
}

// TestOpenRoomNeverAdmittable: a request whose budget exceeds the pool even
// when the pool is empty is refused at OpenRoom with SGLang's message,
// whatever rebootstrap says, and nothing changes: the room does not exist
// and the next room is admitted at once. Pool: 1024 pages × 16 = 16384
// tokens, R = 512, CLIP = 4096.
func TestOpenRoomNeverAdmittable(t *testing.T) {
	s, ctx := admServer(t, admDecodeConfig(1024, 512, kvlayout.DefaultMaxBypass))
	tests := []struct {
		name string
		req  *pb.OpenRoomRequest
		msg  string
	}{
		{"output_len 2000000: fill 300 + 1999999 → 2000304 + 512",
			&pb.OpenRoomRequest{PromptLen: 300, OutputLen: 2_000_000, MaxNewTokens: 16},
			"Request big exceeds the maximum number of tokens: 2000816 > 16384"},
		{"output_len 2^32-1: above the wire bound, refused naming the field",
			&pb.OpenRoomRequest{PromptLen: 300, OutputLen: math.MaxUint32, MaxNewTokens: 16},
			"output_len: 4294967295 is out of range (allowed up to 16777216 tokens): Request \"big\" exceeds the maximum number of tokens any decode pool holds"},
		{"output_len 2^24: fill 300 + 16777215, page-rounded 16777520 + 512",
			&pb.OpenRoomRequest{PromptLen: 300, OutputLen: 1 << 24, MaxNewTokens: 16},
			"Request big exceeds the maximum number of tokens: 16778032 > 16384"},
		{"the same with rebootstrap: prefill length 300 + 2000000",
			&pb.OpenRoomRequest{PromptLen: 300, OutputLen: 2_000_000, MaxNewTokens: 16, Rebootstrap: true},
			"Request big exceeds the maximum number of tokens: 2000300 > 16384"},
		{"prompt + reserve: 16000 + 512 > 16384",
			&pb.OpenRoomRequest{PromptLen: 16000, MaxNewTokens: 1},
			"Request big exceeds the maximum number of tokens: 16512 > 16384"},
		{"max_new estimate: 12300 + min(2^24, 4096) > 16384",
			&pb.OpenRoomRequest{PromptLen: 12300, MaxNewTokens: 1 << 24},
			"Request big exceeds the maximum number of tokens: 16396 > 16384"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			room := uint64(100 + i)
			tc.req.Rid, tc.req.BootstrapAddr, tc.req.Room = "big", admAddr, room
			_, err := s.room.OpenRoom(ctx, tc.req)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tc.msg {
				t.Fatalf("OpenRoom = %v, want InvalidArgument %q", err, tc.msg)
			}
			if _, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room}); status.Code(err) != codes.NotFound {
				t.Errorf("GetRoom(refused room) = %v, want NotFound", err)
			}
		})
	}
	// Nothing was queued: the next room is admitted at once.
	if r := s.openRoom(t, ctx, 1, 16000-512, 1); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED {
		t.Fatalf("room after the refusals is %s, want admitted", r.GetPhase())
	}
	s.succeed(t, ctx, 1)
	s.release(t, ctx, 1)
}

// TestBigRoomDoesNotStallShard: 1024 pages × 16 tokens, R = 512,
// admission.max_bypass = 2. Room 1 (1000 tokens, 63 pages) runs, so room 10
// (15000 tokens: 15008 + 512 = 15520 needed, the budget is 15376 − 512 =
// 14864) does not fit; it would on the empty pool, so it is accepted and
// waits. Rooms 11 and 12 are admitted past it; after those two bypasses the
// shard is strict behind room 10, so room 13 waits too. When room 1 ends,
// room 10 is admitted first, then room 13.
func TestBigRoomDoesNotStallShard(t *testing.T) {
	s, ctx := admServer(t, admDecodeConfig(1024, 512, 2))
	s.openRoom(t, ctx, 1, 1000, 1)
	s.succeed(t, ctx, 1)
	if r := s.openRoom(t, ctx, 10, 15000, 1); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
		t.Fatalf("big room is %s, want queued", r.GetPhase())
	}
	for _, room := range []uint64{11, 12} {
		if r := s.openRoom(t, ctx, room, 16, 1); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED {
			t.Fatalf("room %d is %s, want admitted while the big room waits", room, r.GetPhase())
		}
		s.wantPhase(t, ctx, 10, pb.RoomPhase_ROOM_PHASE_QUEUED)
	}
	if r := s.openRoom(t, ctx, 13, 16, 1); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
		t.Fatalf("room 13 is %s, want queued behind the big room (bypassed twice)", r.GetPhase())
	}
	for _, room := range []uint64{11, 12} {
		s.succeed(t, ctx, room)
		s.release(t, ctx, room)
	}
	// Rooms 11 and 12 leaving does not make room for room 10 (room 1
	// still holds 63 pages), and room 13 still may not pass it.
	s.wantPhase(t, ctx, 10, pb.RoomPhase_ROOM_PHASE_QUEUED)
	s.wantPhase(t, ctx, 13, pb.RoomPhase_ROOM_PHASE_QUEUED)
	st, err := pb.NewAdminClient(s.conn).GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sh := st.GetShards()[0]; sh.GetBlockedBy() != "tokens" || sh.GetQueued() != 2 {
		t.Errorf("shard: blocked by %q, %d queued; want tokens, 2", sh.GetBlockedBy(), sh.GetQueued())
	}
	s.release(t, ctx, 1)
	big := s.wantPhase(t, ctx, 10, pb.RoomPhase_ROOM_PHASE_ADMITTED)
	if n := len(big.GetPageIndices()); n != 938 {
		t.Errorf("big room got %d pages, want 938 (15000 tokens)", n)
	}
	s.wantPhase(t, ctx, 13, pb.RoomPhase_ROOM_PHASE_ADMITTED)
	for _, room := range []uint64{10, 13} {
		s.succeed(t, ctx, room)
		s.release(t, ctx, room)
	}
}

// TestRetractFreesPagesForGrowth: 64 pages × 16 tokens, R = 0. Room 3 (16
// tokens, 1 page), room 1 (480 tokens, 30 pages, max_new 16) and room 2
// (480 tokens, 30 pages, max_new 200) run: 3 pages free. Room 2 cannot grow
// to output 200 (seq 680 = 43 pages, 13 more): no_capacity. RetractRoom(1,
// RETRACT) returns its 30 pages at once and answers RETRACTED with no page;
// the next ReportRunning grows room 2 by 13 pages, at least 10 of which
// were room 1's. Room 1 stays RETRACTED (480 > 20 free pages × 16 = 320)
// until room 2 is released, then resumes with 30 pages none of which is
// room 3's.
func TestRetractFreesPagesForGrowth(t *testing.T) {
	s, ctx := admServer(t, admDecodeConfig(64, 0, kvlayout.DefaultMaxBypass))
	s.openRoom(t, ctx, 3, 16, 1)
	s.succeed(t, ctx, 3)
	s.openRoom(t, ctx, 1, 480, 16)
	s.succeed(t, ctx, 1)
	s.openRoom(t, ctx, 2, 480, 200)
	s.succeed(t, ctx, 2)
	old := s.getRoom(t, ctx, 1).GetPageIndices()
	keep := s.getRoom(t, ctx, 3).GetPageIndices()

	grow := &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 2, OutputLen: 200}}}
	resp, err := s.room.ReportRunning(ctx, grow)
	if err != nil || !slices.Equal(resp.GetNoCapacity(), []uint64{2}) || len(resp.GetGrown()) != 0 {
		t.Fatalf("ReportRunning before the retraction = %v, %v; want room 2 in no_capacity", resp, err)
	}
	ret, err := s.room.RetractRoom(ctx, &pb.RetractRoomRequest{Room: 1, Mode: pb.RetractMode_RETRACT_MODE_RETRACT})
	if err != nil {
		t.Fatalf("RetractRoom = %v", err)
	}
	if r := ret.GetRoom(); r.GetPhase() != pb.RoomPhase_ROOM_PHASE_RETRACTED || r.GetNumPages() != 0 {
		t.Fatalf("RetractRoom answered %s with %d pages, want retracted with 0", r.GetPhase(), r.GetNumPages())
	}
	s.wantPhase(t, ctx, 1, pb.RoomPhase_ROOM_PHASE_RETRACTED)

	resp, err = s.room.ReportRunning(ctx, grow)
	if err != nil || len(resp.GetNoCapacity()) != 0 || len(resp.GetGrown()) != 1 || len(resp.GetGrown()[0].GetNewPageIndices()) != 13 {
		t.Fatalf("ReportRunning after the retraction = %v, %v; want room 2 grown by 13 pages", resp, err)
	}
	reused := 0
	for _, p := range resp.GetGrown()[0].GetNewPageIndices() {
		if slices.Contains(old, p) {
			reused++
		}
	}
	if reused < 10 {
		t.Errorf("room 2 grew into %d of room 1's pages, want at least 10 (only 3 others were free)", reused)
	}
	if r := s.wantPhase(t, ctx, 1, pb.RoomPhase_ROOM_PHASE_RETRACTED); r.GetNumPages() != 0 {
		t.Errorf("retracted room holds %d pages", r.GetNumPages())
	}
	// A retracted room is not running: ReportRunning does not grow it.
	if _, err := s.room.ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 1, OutputLen: 5}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ReportRunning(retracted room) = %v, want InvalidArgument (not running)", err)
	}

	s.release(t, ctx, 2)
	back := s.wantPhase(t, ctx, 1, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
	pages := back.GetPageIndices()
	if len(pages) != 30 {
		t.Fatalf("resumed room holds %d pages, want 30", len(pages))
	}
	for _, p := range pages {
		if slices.Contains(keep, p) {
			t.Errorf("resumed room got page %d, which room 3 holds", p)
		}
	}
	if !strings.Contains(lastNote(t, s, ctx, 1), "resumed after retraction") {
		t.Errorf("last transition of room 1 = %q, want the resumption", lastNote(t, s, ctx, 1))
	}
	// The resumed room runs again: it grows.
	resp, err = s.room.ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 1, OutputLen: 16}}})
	if err != nil || len(resp.GetGrown()) != 1 {
		t.Errorf("ReportRunning(resumed) = %v, %v; want it to grow", resp, err)
	}
	s.release(t, ctx, 1)
	s.release(t, ctx, 3)
}

// lastNote is the note of the room's last transition.
func lastNote(t *testing.T, s *stgServer, ctx context.Context, room uint64) string {
	t.Helper()
	tl := s.getRoom(t, ctx, room).GetTransitions()
	if len(tl) == 0 {
		return ""
	}
	return tl[len(tl)-1].GetNote()
}
