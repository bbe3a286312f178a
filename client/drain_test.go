package client_test

import (
	"context"
	"errors"
	"testing"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestReportRoomStopsAndAcksWhenTheRoomEnds: a ReportRoom whose room is
// aborted while its Move writes sees the end on the claim stream
// (ack_required): the Move in flight has its context cancelled, no further
// chunk is moved or reported, and the hand-off acknowledges the end
// (AckRoomEnd with the destination's generation), so the daemon's pages are
// free at once rather than after release.deferred_timeout (30s by default).
func TestReportRoomStopsAndAcksWhenTheRoomEnds(t *testing.T) {
	eachTransport(t, testReportRoomStopsAndAcksWhenTheRoomEnds)
}

func testReportRoomStopsAndAcksWhenTheRoomEnds(t *testing.T, tr client.Transport) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, client.WithTransport(tr))
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.Engine().OpenRoom(ctx, openReq(21, 640)); err != nil { // 10 pages
		t.Fatal(err)
	}
	writing := make(chan struct{})
	aborted, quit := make(chan struct{}), make(chan struct{})
	var moved []int
	// The room's end reaches the hand-off (on the claim stream) before
	// AbortRoom's answer may reach this goroutine: the test waits for both.
	defer func() { close(quit); <-aborted }()
	_, err := func() (*pb.Destination, error) {
		go func() {
			defer close(aborted)
			select {
			case <-writing:
			case <-quit: // the hand-off ended before its second write
				return
			}
			if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 21}); err != nil {
				t.Errorf("AbortRoom: %v", err)
			}
		}()
		return p.ReportRoom(ctx, 21, client.SendOptions{ChunkPages: 4, Move: func(mctx context.Context, ch client.Chunk) (uint64, error) {
			moved = append(moved, ch.Index)
			if ch.Index == 0 {
				return ch.Bytes(), nil
			}
			close(writing) // the second chunk's write is in flight when the room is aborted
			<-mctx.Done()  // and stops only when told to
			return 0, mctx.Err()
		}})
	}()
	var rf *client.RoomFailedError
	if !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_ABORTED || !rf.AckRequired {
		t.Fatalf("ReportRoom = %v; want the abort with AckRequired", err)
	}
	if len(moved) != 2 {
		t.Errorf("chunks moved %v, want [0 1]: nothing after the end", moved)
	}
	if n := in.count(opMethod(tr, pb.Rooms_ReportTransfer_FullMethodName)); n != 1 {
		t.Errorf("%d ReportTransfer calls, want 1 (the cancelled write is not reported)", n)
	}
	acks := in.requests(opMethod(tr, pb.Rooms_AckRoomEnd_FullMethodName))
	if len(acks) != 1 {
		t.Fatalf("%d AckRoomEnd calls, want 1", len(acks))
	}
	if a := acks[0].(*pb.AckRoomEndRequest); a.GetRoom() != 21 || a.GetAttempt() != 1 || a.GetIncarnation() == 0 || a.GetRank().GetTpRank() != 0 {
		t.Errorf("AckRoomEnd = %v; want room 21, attempt 1, the destination's incarnation", a)
	}
	for _, m := range []string{pb.Rooms_ReportTransfer_FullMethodName, pb.Rooms_AckRoomEnd_FullMethodName} {
		if n := in.count(opMethod(client.TransportStreams+client.TransportUnary-tr, m)); n != 0 {
			t.Errorf("%d %s on the other transport than %s, want none", n, m, tr)
		}
	}
	assertPoolFull(t, c) // released by the ack, not the 30s bound
}
