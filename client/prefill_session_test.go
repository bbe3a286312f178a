package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestSendRoomSession: rooms handed off over one prefill session, at once,
// with the decode side on OpenAndWait (its shared engine session): each succeeds, in
// chunks, with no unary claim, Transfer or heartbeat call.
func TestSendRoomSession(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	sess, err := client.OpenSession(ctx, p)
	if err != nil {
		t.Fatalf("Session: %v", err)
	}
	defer sess.Close()
	if sess.Welcome().GetIncarnation() == 0 || sess.Welcome().GetIncarnation() != p.Incarnation() {
		t.Errorf("welcome %v, prefill incarnation %x", sess.Welcome(), p.Incarnation())
	}
	var wg sync.WaitGroup
	for room := uint64(31); room <= 34; room++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			dest, err := client.SendRoomSession(ctx, p, sess, room, client.SendOptions{ChunkPages: 3})
			if err != nil || dest.GetRoom() != room {
				t.Errorf("SendRoomSession(%d) = %v, %v", room, dest, err)
			}
		}()
		go func() {
			defer wg.Done()
			r, err := c.Engine().OpenAndWait(ctx, openReq(room, 500)) // 8 pages: 3 chunks
			if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || r.GetChunksDone() != 3 {
				t.Errorf("OpenAndWait(%d) = %v, %v; want SUCCEEDED in 3 chunks", room, r, err)
			}
		}()
	}
	wg.Wait()
	if n := in.count(pb.PrefillSession_Session_FullMethodName); n != 1 {
		t.Errorf("%d sessions opened, want 1", n)
	}
	for _, m := range []string{pb.Rooms_AwaitDestination_FullMethodName, pb.Rooms_Transfer_FullMethodName, pb.Rooms_AckRoomEnd_FullMethodName} {
		if n := in.count(m); n != 0 {
			t.Errorf("%d %s calls, want none: the session carries them", n, m)
		}
	}
	for room := uint64(31); room <= 34; room++ {
		if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	assertPoolFull(t, c)
}

// TestReportRoomSessionStopsAndAcks is TestReportRoomStopsAndAcksWhenTheRoomEnds
// over a session: the abort comes on the session with ack_required, the
// write in flight is cancelled, and the ack goes on the session, which
// frees the pages at once.
func TestReportRoomSessionStopsAndAcks(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	sess, err := client.OpenSession(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := c.Engine().OpenRoom(ctx, openReq(21, 640)); err != nil { // 10 pages
		t.Fatal(err)
	}
	writing := make(chan struct{})
	aborted, quit := make(chan struct{}), make(chan struct{})
	// The room's end reaches the hand-off (on the session) before
	// AbortRoom's answer may reach this goroutine: the test waits for both.
	defer func() { close(quit); <-aborted }()
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
	var moved []int
	_, err = client.ReportRoomSession(ctx, p, sess, 21, client.SendOptions{ChunkPages: 4, Move: func(mctx context.Context, ch client.Chunk) (uint64, error) {
		moved = append(moved, ch.Index)
		if ch.Index == 0 {
			return ch.Bytes(), nil
		}
		close(writing)
		<-mctx.Done()
		return 0, mctx.Err()
	}})
	var rf *client.RoomFailedError
	if !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_ABORTED || !rf.AckRequired {
		t.Fatalf("ReportRoomSession = %v; want the abort with AckRequired", err)
	}
	if len(moved) != 2 {
		t.Errorf("chunks moved %v, want [0 1]", moved)
	}
	if n := in.count(pb.Rooms_AckRoomEnd_FullMethodName); n != 0 {
		t.Errorf("%d unary AckRoomEnd calls, want the ack on the session", n)
	}
	assertPoolFull(t, c) // released by the session's ack, not the 30s bound
}

// TestSessionOpsAndEnd: a refused op is the unary call's error (a bad
// field; STALE_INCARNATION read by client.StaleIncarnation); after Close
// every op fails and Err says the session ended.
func TestSessionOpsAndEnd(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	sess, err := client.OpenSession(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sess.Chunk(ctx, &pb.TransferRequest{Room: 0})
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("chunk of room 0 = %v, want ErrInvalidArgument", err)
	}
	_, err = sess.Report(ctx, &pb.ReportTransferRequest{Room: 5, NumPages: 1, Success: true, Incarnation: p.Incarnation() + 1})
	if named, daemon, ok := client.StaleIncarnation(err); !ok || named != p.Incarnation()+1 || daemon != p.Incarnation() {
		t.Errorf("stale report = %v (%x %x %v), want STALE_INCARNATION", err, named, daemon, ok)
	}
	sess.Close()
	if sess.Err() == nil {
		t.Error("Err = nil after Close")
	}
	if _, err := sess.Ack(ctx, &pb.AckRoomEndRequest{Room: 5, Attempt: 1}); err == nil {
		t.Error("an ack after Close succeeded")
	}
	// A session of an unregistered rank is refused NOT_FOUND.
	other := c.Prefill(prefillRank("10.9.9.9:1", 1, 0))
	if _, err := client.OpenSession(ctx, other); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Session of an unregistered rank = %v, want ErrNotFound", err)
	}
}
