package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestSendRoomsShareOneSession: many concurrent SendRooms and ReportRooms
// of one rank (the default transport) go on one prefill session: one
// stream opened, every claim and chunk on it, no unary claim, Transfer,
// ReportTransfer or ack.
func TestSendRoomsShareOneSession(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	const rooms = 16
	// Every hand-off claims before its room opens, so that all are in
	// flight at once (a session closes when no hand-off uses it: one that
	// ended before the next began would leave the next a new session).
	var wg sync.WaitGroup
	for room := uint64(1); room <= rooms; room++ {
		wg.Go(func() {
			o := client.SendOptions{ChunkPages: 3}
			var err error
			var dest *pb.Destination
			if room%2 == 0 {
				dest, err = p.ReportRoom(ctx, room, o)
			} else {
				dest, err = p.SendRoom(ctx, room, o)
			}
			if err != nil || dest.GetRoom() != room {
				t.Errorf("hand-off of room %d = %v, %v", room, dest, err)
			}
		})
	}
	in.waitCalls(t, sessionOp("claim"), rooms)
	for room := uint64(1); room <= rooms; room++ {
		if _, err := c.Engine().OpenRoom(ctx, openReq(room, 500)); err != nil { // 8 pages: 3 chunks of 3
			t.Fatal(err)
		}
	}
	wg.Wait()
	if n := in.count(pb.PrefillSession_Session_FullMethodName); n != 1 {
		t.Errorf("%d sessions opened, want 1", n)
	}
	if n := in.count(sessionOp("claim")); n != rooms {
		t.Errorf("%d claims on the session, want %d", n, rooms)
	}
	if n, m := in.count(sessionOp("chunk")), in.count(sessionOp("report")); n != 3*rooms/2 || m != 3*rooms/2 {
		t.Errorf("%d chunks and %d reports on the session, want %d of each", n, m, 3*rooms/2)
	}
	for _, m := range []string{pb.Rooms_AwaitDestination_FullMethodName, pb.Rooms_Transfer_FullMethodName,
		pb.Rooms_ReportTransfer_FullMethodName, pb.Rooms_AckRoomEnd_FullMethodName, pb.Bootstrap_Heartbeat_FullMethodName} {
		if n := in.count(m); n != 0 {
			t.Errorf("%d %s calls, want none", n, m)
		}
	}
	for room := uint64(1); room <= rooms; room++ {
		r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: room})
		if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || r.GetChunksDone() != 3 {
			t.Errorf("room %d = %v, %v; want SUCCEEDED in 3 chunks", room, r, err)
		}
		if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	assertPoolFull(t, c)
}

// TestSessionCutMidHandOff: the rank's session is cut under a hand-off in
// flight (before an op reaches the daemon, or after, its answer lost). The
// hand-off goes on on a new session: it claims again (the destination is
// not returned twice), sends the op again, which the daemon does not count
// twice ((room, rank, chunk_index) is its key), and the room succeeds with
// its bytes counted once; ReportRoom's Move runs once per chunk. A cut that
// repeats past the retry policy fails the hand-off with ErrUnavailable.
func TestSessionCutMidHandOff(t *testing.T) {
	const pages, chunkPages = 10, 4 // 640 tokens: 3 chunks
	const bytes = 640 * 2 * 8 * 128 * 2 * 32
	for _, tc := range []struct {
		name   string
		op     string // the op whose receipt cuts the session
		after  bool   // the op reached the daemon, its answer is lost
		report bool   // ReportRoom, else SendRoom
	}{
		{"chunk lost", "chunk", false, false},
		{"chunk answer lost", "chunk", true, false},
		{"report answer lost", "report", true, true},
		{"claim answer lost", "claim", true, false},
		{"ack lost", "ack", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInjector()
			d := newDaemon(t, in.config())
			c := d.client(t, fastRetry)
			ctx := ctxT(t)
			p := registered(t, c)
			if _, err := c.Engine().OpenRoom(ctx, openReq(7, 640)); err != nil {
				t.Fatal(err)
			}
			var moved []int
			o := client.SendOptions{ChunkPages: chunkPages}
			if tc.op == "ack" {
				// The room is aborted while chunk 1 moves: the hand-off
				// acks, and the ack is cut.
				aborted := make(chan error, 1)
				o.Move = func(mctx context.Context, ch client.Chunk) (uint64, error) {
					moved = append(moved, ch.Index)
					if ch.Index == 0 {
						return ch.Bytes(), nil
					}
					go func() {
						_, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 7})
						aborted <- err
					}()
					<-mctx.Done()
					return 0, mctx.Err()
				}
				defer func() {
					if err := <-aborted; err != nil {
						t.Errorf("AbortRoom: %v", err)
					}
				}()
			} else if tc.report {
				o.Move = func(_ context.Context, ch client.Chunk) (uint64, error) {
					moved = append(moved, ch.Index)
					return ch.Bytes(), nil
				}
			}
			in.fail(sessionOp(tc.op), fault{n: 1, code: codes.Unavailable, after: tc.after})
			var err error
			if tc.report {
				_, err = p.ReportRoom(ctx, 7, o)
			} else {
				_, err = p.SendRoom(ctx, 7, o)
			}
			if n := in.count(pb.PrefillSession_Session_FullMethodName); n != 2 {
				t.Errorf("%d sessions opened, want 2 (the cut one and its successor)", n)
			}
			if n, want := in.count(sessionOp("claim")), map[bool]int{false: 2, true: 1}[tc.op == "ack"]; n != want {
				// (The ack follows the claim's end: nothing to claim again.)
				t.Errorf("%d claims, want %d (the room claimed again on the new session while it was claimed)", n, want)
			}
			if tc.op == "ack" {
				var rf *client.RoomFailedError
				if !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_ABORTED || !rf.AckRequired {
					t.Fatalf("ReportRoom = %v; want the abort with AckRequired", err)
				}
				if n := in.count(sessionOp("ack")); n != 2 {
					t.Errorf("%d acks on sessions, want 2 (the cut one, then again)", n)
				}
				assertPoolFull(t, c) // freed by the second ack
				return
			}
			if err != nil {
				t.Fatalf("hand-off across the cut: %v", err)
			}
			r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 7})
			if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || r.GetChunksDone() != 3 || r.GetBytesTransferred() != bytes {
				t.Errorf("room = %v, %v; want SUCCEEDED with 3 chunks and %d bytes, counted once", r, err, bytes)
			}
			var sent []uint32
			for _, m := range in.requests(opMethod(client.TransportStreams, map[bool]string{false: pb.Rooms_Transfer_FullMethodName, true: pb.Rooms_ReportTransfer_FullMethodName}[tc.report])) {
				sent = append(sent, m.(interface{ GetChunkIndex() uint32 }).GetChunkIndex())
			}
			// Chunk 0 is sent again after the cut, unless it was the claim
			// that was cut, or (after) the op's answer was sent before the
			// cut.
			again := len(sent) == 4 && sent[0] == 0 && sent[1] == 0 && sent[2] == 1 && sent[3] == 2
			once := len(sent) == 3 && sent[0] == 0 && sent[1] == 1 && sent[2] == 2
			if !again && !(once && (tc.after || tc.op == "claim")) {
				t.Errorf("chunks sent %v; want 0 twice (sent again on the new session), then 1, 2", sent)
			}
			if tc.report && (len(moved) != 3 || moved[0] != 0 || moved[1] != 1 || moved[2] != 2) {
				t.Errorf("Move ran for chunks %v, want 0, 1, 2 once each (a report is re-sent, the move is not re-run)", moved)
			}
			if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 7}); err != nil {
				t.Fatal(err)
			}
			assertPoolFull(t, c)
		})
	}
	t.Run("repeated cuts", func(t *testing.T) {
		in := newInjector()
		d := newDaemon(t, in.config())
		c := d.client(t, fastRetry) // 4 attempts
		ctx := ctxT(t)
		p := registered(t, c)
		if _, err := c.Engine().OpenRoom(ctx, openReq(8, 640)); err != nil {
			t.Fatal(err)
		}
		in.fail(sessionOp("chunk"), fault{n: 1000, code: codes.Unavailable})
		_, err := p.SendRoom(ctx, 8, client.SendOptions{ChunkPages: chunkPages})
		if !errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil {
			t.Fatalf("SendRoom under repeated cuts = %v; want ErrUnavailable, before the test's deadline", err)
		}
		if n := in.count(sessionOp("chunk")); n != 4 {
			t.Errorf("chunk 0 sent %d times, want 4 (the retry policy's attempts)", n)
		}
		if n := in.count(pb.PrefillSession_Session_FullMethodName); n > 8 {
			t.Errorf("%d sessions opened, want at most 2 per attempt", n)
		}
	})
}

// TestPrefillFallsBackToUnary: a daemon that does not serve PrefillSession
// (an older one: ErrUnimplemented) gets the unary API, hand-offs and beats.
func TestPrefillFallsBackToUnary(t *testing.T) {
	in := newInjector()
	in.fail(pb.PrefillSession_Session_FullMethodName, fault{n: 1000, code: codes.Unimplemented})
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	var errs errLog
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond), client.OnHeartbeatError(errs.add))
	hctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.RunHeartbeat(hctx) }()
	in.waitCalls(t, pb.Bootstrap_Heartbeat_FullMethodName, 3)
	if _, err := c.Engine().OpenRoom(ctx, openReq(3, 300)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendRoom(ctx, 3, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
	}
	if e, _ := errs.get(); len(e) != 1 || !errors.Is(e[0], client.ErrUnimplemented) {
		t.Errorf("heartbeat errors %v; want ErrUnimplemented once (an older daemon stays one)", e)
	}
	if n := in.count(pb.PrefillSession_Session_FullMethodName); n < 3 {
		t.Errorf("%d session opens tried, want one per beat (>= 3)", n)
	}
	if n, m := in.count(pb.Rooms_AwaitDestination_FullMethodName), in.count(pb.Rooms_Transfer_FullMethodName); n != 1 || m != 1 {
		t.Errorf("%d AwaitDestination and %d Transfer calls, want the unary hand-off (1 and 1)", n, m)
	}
}

// sessionEnds is a client stream interceptor that signals when a prefill
// session stream opens and when it ends on the client's side.
type sessionEnds struct {
	opened chan struct{} // one per opened session
	ended  chan struct{} // one per ended session
}

func (s *sessionEnds) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != pb.PrefillSession_Session_FullMethodName {
		return cs, err
	}
	s.opened <- struct{}{}
	return &endSignal{ClientStream: cs, ended: s.ended}, nil
}

type endSignal struct {
	grpc.ClientStream
	once  sync.Once
	ended chan struct{}
}

func (e *endSignal) RecvMsg(m any) error {
	err := e.ClientStream.RecvMsg(m)
	if err != nil {
		e.once.Do(func() { e.ended <- struct{}{} })
	}
	return err
}

// TestSessionLifetime: the rank's shared session is open while
// RunHeartbeat runs or a hand-off is in flight, and ends when neither is
// (after a hand-off without RunHeartbeat, when RunHeartbeat returns), and
// when the Client ends it for good, for one rank (CloseRankSession, what
// Client.Close does to each) or at Client.Close (on a connection the client
// does not own, which stays open); the Prefill's streams methods fail with
// ErrCanceled after that.
func TestSessionLifetime(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	ends := &sessionEnds{opened: make(chan struct{}, 16), ended: make(chan struct{}, 16)}
	conn, err := grpc.NewClient("passthrough:///bufnet", d.dialer(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStreamInterceptor(ends.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := ctxT(t)
	c, err := client.NewFromConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	room := uint64(0)
	handOff := func(p *client.Prefill) error {
		room++
		if _, err := c.Engine().OpenRoom(ctx, openReq(room, 100)); err != nil {
			t.Fatal(err)
		}
		_, err := p.SendRoom(ctx, room, client.SendOptions{})
		return err
	}
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("no session %s", what)
		}
	}
	// heartbeat runs RunHeartbeat; stop cancels it and returns its
	// error, returned waits for it to return by itself.
	var hbCancel []context.CancelFunc
	t.Cleanup(func() {
		for _, c := range hbCancel {
			c()
		}
	})
	heartbeat := func(p *client.Prefill) (stop, returned func() error) {
		hctx, cancel := context.WithCancel(ctx)
		hbCancel = append(hbCancel, cancel)
		done := make(chan error, 1)
		go func() { done <- p.RunHeartbeat(hctx) }()
		return func() error { cancel(); return <-done }, func() error { return <-done }
	}
	p := registered(t, c)

	// A hand-off alone: its session ends with it.
	if err := handOff(p); err != nil {
		t.Fatal(err)
	}
	wait(ends.opened, "opened by the hand-off")
	wait(ends.ended, "end after the last hand-off, without RunHeartbeat")

	// RunHeartbeat holds the session across hand-offs; it ends when
	// RunHeartbeat returns.
	stop, _ := heartbeat(p)
	wait(ends.opened, "opened by RunHeartbeat")
	for range 3 {
		if err := handOff(p); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ends.opened:
		t.Error("a hand-off opened a second session while RunHeartbeat held one")
	case <-ends.ended:
		t.Error("the session ended under RunHeartbeat")
	default:
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
	}
	wait(ends.ended, "end after RunHeartbeat returned")

	// Closing the rank's session ends it for good.
	_, returned := heartbeat(p)
	wait(ends.opened, "opened by RunHeartbeat again")
	client.CloseRankSession(p)
	wait(ends.ended, "end at CloseRankSession")
	if err := returned(); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("RunHeartbeat across CloseRankSession = %v, want ErrCanceled", err)
	}
	if err := handOff(p); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("SendRoom after CloseRankSession = %v, want ErrCanceled", err)
	}
	if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
		t.Fatal(err)
	}

	// Client.Close ends every Prefill's.
	p2 := c.Prefill(prefillRank(addr, 1, 0))
	_, returned = heartbeat(p2)
	wait(ends.opened, "opened by the second Prefill's RunHeartbeat")
	c.Close()
	wait(ends.ended, "end at Client.Close")
	if err := returned(); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("RunHeartbeat across Client.Close = %v, want ErrCanceled", err)
	}
}

// TestRunHeartbeatStreams: under TransportStreams RunHeartbeat keeps the
// rank alive through many heartbeat intervals with its session alone (no
// unary Heartbeat), and after the daemon restarted it learns the new
// incarnation from the refused re-open, registers once with the new
// daemon, and beats there on a new session.
func TestRunHeartbeatStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		a := startFleetDaemon(t)
		tg := newTarget(a)
		c := tg.client(t)
		defer c.Close()
		var errs errLog
		var mu sync.Mutex
		var changes [][2]uint64
		p := c.Prefill(prefillRank(addr, 1, 0), client.OnHeartbeatError(errs.add), client.OnIncarnationChange(func(old, new uint64) {
			mu.Lock()
			changes = append(changes, [2]uint64{old, new})
			mu.Unlock()
		}))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.RunHeartbeat(runCtx) }()
		time.Sleep(10 * fleetInterval)
		synctest.Wait()
		if n, m := len(a.received(pb.Bootstrap_RegisterPrefill_FullMethodName)), len(a.received(pb.Bootstrap_Heartbeat_FullMethodName)); n != 1 || m != 0 {
			t.Fatalf("%d registrations and %d unary heartbeats in 10 intervals; want 1 and none (the session beats)", n, m)
		}
		if e, _ := errs.get(); len(e) != 0 {
			t.Errorf("heartbeat errors %v, want none", e)
		}
		// Alive: the daemon still knows the rank after 10 intervals.
		if _, err := p.Heartbeat(ctx); err != nil {
			t.Fatalf("the rank is not alive after 10 intervals on its session: %v", err)
		}

		a2 := startFleetDaemon(t)
		defer a2.stop(t)
		tg.d.Store(a2)
		a.stop(t)
		time.Sleep(cadence)
		synctest.Wait()
		mu.Lock()
		got := changes
		mu.Unlock()
		if len(got) != 1 || got[0] != [2]uint64{a.Incarnation(), a2.Incarnation()} {
			t.Fatalf("learned %x, want one change %x -> %x", got, a.Incarnation(), a2.Incarnation())
		}
		var ic *client.IncarnationChangedError
		if e, _ := errs.get(); len(e) == 0 || !errors.As(e[len(e)-1], &ic) || ic.Old != a.Incarnation() || ic.New != a2.Incarnation() {
			t.Errorf("heartbeat errors %v; want the incarnation change last", e)
		}
		time.Sleep(10 * fleetInterval)
		synctest.Wait()
		if n, m := len(a2.received(pb.Bootstrap_RegisterPrefill_FullMethodName)), len(a2.received(pb.Bootstrap_Heartbeat_FullMethodName)); n != 1 || m != 0 {
			t.Errorf("the new daemon got %d registrations and %d unary heartbeats; want 1 and none", n, m)
		}
		if p.Incarnation() != a2.Incarnation() {
			t.Errorf("Prefill holds %x, want the new daemon's %x", p.Incarnation(), a2.Incarnation())
		}
		if _, err := p.Heartbeat(ctx); err != nil {
			t.Errorf("the rank is not alive at the new daemon: %v", err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
		}
	})
}

// TestRunHeartbeatStreamsReregistersAfterNotFound: another instance takes
// the rank over; the daemon ends the rank's session NOT_FOUND at its next
// beat, and RunHeartbeat registers again and opens a new session, still
// without a unary Heartbeat.
func TestRunHeartbeatStreamsReregistersAfterNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		a := startFleetDaemon(t)
		defer a.stop(t)
		c := newTarget(a).client(t)
		defer c.Close()
		var errs errLog
		p := c.Prefill(prefillRank(addr, 1, 0), client.OnHeartbeatError(errs.add))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.RunHeartbeat(runCtx) }()
		time.Sleep(cadence)
		synctest.Wait()
		other := prefillRank(addr, 1, 0)
		other.InstanceId = "replacement"
		if resp, err := c.Prefill(other).Register(ctx); err != nil || !resp.GetReplaced() {
			t.Fatalf("RegisterPrefill(replacement) = %v, %v; want a replacement", resp, err)
		}
		time.Sleep(2 * cadence)
		synctest.Wait()
		if e, _ := errs.get(); len(e) == 0 || !errors.Is(e[0], client.ErrNotFound) {
			t.Errorf("heartbeat errors %v; want ErrNotFound first", e)
		}
		regs := a.received(pb.Bootstrap_RegisterPrefill_FullMethodName)
		if len(regs) != 3 {
			t.Fatalf("%d registrations, want 3: ours, the replacement's, ours again", len(regs))
		}
		time.Sleep(5 * fleetInterval)
		synctest.Wait()
		if n, m := len(a.received(pb.Bootstrap_RegisterPrefill_FullMethodName)), len(a.received(pb.Bootstrap_Heartbeat_FullMethodName)); n != 3 || m != 0 {
			t.Errorf("%d registrations and %d unary heartbeats; want 3 and none", n, m)
		}
		if _, err := p.Heartbeat(ctx); err != nil {
			t.Errorf("Heartbeat as the re-registered instance: %v", err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
		}
	})
}

// TestHandOffRefusalsOnBothTransports: a bad option is refused the same
// on both transports (InvalidArgument, before anything is sent). A rank
// the daemon does not know differs: the session's hello refuses it at once
// (NotFound), a unary claim waits for the room's prefill to register
// (bounded by the context, here a short one).
func TestHandOffRefusalsOnBothTransports(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr client.Transport) {
		d := newDaemon(t, daemonConfig{})
		c := d.client(t, client.WithTransport(tr), fastRetry)
		ctx := ctxT(t)
		if _, err := c.Engine().OpenRoom(ctx, openReq(4, 100)); err != nil {
			t.Fatal(err)
		}
		p := c.Prefill(prefillRank(addr, 1, 0)) // never registered
		if _, err := p.SendRoom(ctx, 4, client.SendOptions{ChunkPages: -1}); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("SendRoom(ChunkPages -1) = %v, want ErrInvalidArgument", err)
		}
		want := client.ErrNotFound
		hctx := ctx
		if tr == client.TransportUnary {
			want = client.ErrDeadlineExceeded
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
		}
		if _, err := p.SendRoom(hctx, 4, client.SendOptions{}); !errors.Is(err, want) {
			t.Errorf("SendRoom of an unregistered rank = %v, want %v", err, want)
		}
		if _, err := p.ReportRoom(hctx, 4, client.SendOptions{}); !errors.Is(err, want) {
			t.Errorf("ReportRoom of an unregistered rank = %v, want %v", err, want)
		}
		if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 4}); err != nil {
			t.Fatal(err)
		}
	})
}
