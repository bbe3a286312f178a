package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestPrefillSessionChunksInArrivalOrder: a session's chunks are registered
// with their room in the order they arrive, before any of them waits for
// its transfer (rooms.proto: the last chunk is checked against the chunks
// "already landed or in flight"). With transfers of 50 ms, a last chunk
// sent right behind chunk 0 (without waiting for chunk 0's result) finds
// chunk 0 in flight and is accepted, in every room; two chunks that
// overlap, sent back to back, refuse the second one sent, never the first.
func TestPrefillSessionChunksInArrivalOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Sim.Latency = 50 * time.Millisecond
		c.Timeouts.HeartbeatInterval = time.Hour
	}})
	conn := d.Conn(t)
	const addr = "p1:1"
	if _, err := pb.NewBootstrapClient(conn).RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: "10.0.0.1:9000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16"}); err != nil {
		t.Fatal(err)
	}
	rooms := pb.NewRoomsClient(conn)
	s := openSession(t, ctx, conn)
	s.hello(prank(addr, 0), 0)

	const n = 40
	type sent struct{ first, second uint64 }
	seqs := map[uint64]sent{}
	dests := map[uint64]*pb.Destination{}
	// Claim every room first, then open it: the destination comes on the
	// session.
	for i := range uint64(n) {
		room := 100 + i
		seq := s.op(claimOp(room))
		if r := s.result(seq); r.GetError() != nil {
			t.Fatalf("claim of room %d = %v", room, r)
		}
		if _, err := rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: addr, Room: room, PromptLen: 100, MaxNewTokens: 4}); err != nil {
			t.Fatal(err)
		}
		dst := s.roomEvent(room).GetDestination()
		if dst == nil || len(dst.GetPageIndices()) != 2 {
			t.Fatalf("room %d: destination %v, want 2 pages", room, dst)
		}
		dests[room] = dst
	}
	// Every room's two chunks, back to back, without waiting for a result.
	// Even rooms: chunk 0 then the last chunk. Odd rooms: two chunks that
	// both cover page 0.
	for i := range uint64(n) {
		room := 100 + i
		dst := dests[room]
		c0 := &pb.TransferRequest{Room: room, ChunkIndex: 0, PageOffset: 0, NumPages: 1, Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}
		var c1 *pb.TransferRequest
		if i%2 == 0 {
			c1 = &pb.TransferRequest{Room: room, ChunkIndex: 1, PageOffset: 1, NumPages: 1, Last: true, Aux: &pb.Aux{RoomMarker: room},
				Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}
		} else {
			c1 = &pb.TransferRequest{Room: room, ChunkIndex: 1, PageOffset: 0, NumPages: 2, Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}
		}
		seqs[room] = sent{first: s.op(chunkOp(c0)), second: s.op(chunkOp(c1))}
	}
	results := map[uint64]*pb.PrefillResult{}
	for len(results) < 2*n {
		ev := s.recv()
		if r := ev.GetResult(); r != nil {
			results[r.GetSeq()] = r
		}
	}
	for i := range uint64(n) {
		room := 100 + i
		first, second := results[seqs[room].first], results[seqs[room].second]
		if first.GetError() != nil {
			t.Errorf("room %d: the first chunk sent = %v, want it accepted", room, first.GetError())
		}
		if i%2 == 0 && second.GetError() != nil {
			t.Errorf("room %d: the last chunk sent right behind chunk 0 = %v, want it accepted (chunk 0 is in flight)", room, second.GetError())
		}
		if i%2 == 1 && second.GetError() == nil {
			t.Errorf("room %d: the second of two overlapping chunks was accepted, want it refused", room)
		}
	}
}
