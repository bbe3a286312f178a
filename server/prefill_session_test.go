package server_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// sess is one PrefillSession stream under test: its events are read by a
// goroutine (unless paused) into a channel.
type sess struct {
	t      *testing.T
	st     grpc.BidiStreamingClient[pb.PrefillRequest, pb.PrefillEvent]
	cancel context.CancelFunc
	seq    uint64
	// held: the events of a message read but not yet returned (a message
	// carries its own event, then those packed in its more).
	held []*pb.PrefillEvent
}

// next returns the next event: the rest of the last message read, or the
// first of the next one.
func (s *sess) next() (*pb.PrefillEvent, error) {
	if len(s.held) == 0 {
		ev, err := s.st.Recv()
		if err != nil {
			return nil, err
		}
		more := ev.GetMore()
		ev.More = nil
		s.held = append([]*pb.PrefillEvent{ev}, more...)
	}
	ev := s.held[0]
	s.held = s.held[1:]
	return ev, nil
}

func openSession(t *testing.T, ctx context.Context, conn *grpc.ClientConn) *sess {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	st, err := pb.NewPrefillSessionClient(conn).Session(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &sess{t: t, st: st, cancel: cancel}
	t.Cleanup(cancel)
	return s
}

func (s *sess) send(m *pb.PrefillRequest) {
	s.t.Helper()
	if err := s.st.Send(m); err != nil {
		s.t.Fatalf("send %v: %v", m, err)
	}
}

func (s *sess) recv() *pb.PrefillEvent {
	s.t.Helper()
	ev, err := s.next()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	return ev
}

// hello opens the session for rank and returns the welcome.
func (s *sess) hello(rank *pb.PrefillRank, inc uint64) *pb.PrefillWelcome {
	s.t.Helper()
	s.send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{Rank: rank, InstanceId: "first", Incarnation: inc}}})
	w := s.recv().GetWelcome()
	if w == nil {
		s.t.Fatal("no welcome")
	}
	return w
}

// op sends an op with the next seq and returns the seq.
func (s *sess) op(m *pb.PrefillRequest) uint64 {
	s.t.Helper()
	s.seq++
	m.Seq = s.seq
	s.send(m)
	return s.seq
}

func claimOp(room uint64) *pb.PrefillRequest {
	return &pb.PrefillRequest{Op: &pb.PrefillRequest_Claim{Claim: &pb.AwaitDestinationRequest{Room: room}}}
}

func chunkOp(req *pb.TransferRequest) *pb.PrefillRequest {
	return &pb.PrefillRequest{Op: &pb.PrefillRequest_Chunk{Chunk: req}}
}

func reportOp(req *pb.ReportTransferRequest) *pb.PrefillRequest {
	return &pb.PrefillRequest{Op: &pb.PrefillRequest_Report{Report: req}}
}

func ackOp(req *pb.AckRoomEndRequest) *pb.PrefillRequest {
	return &pb.PrefillRequest{Op: &pb.PrefillRequest_Ack{Ack: req}}
}

func pingOp() *pb.PrefillRequest {
	return &pb.PrefillRequest{Op: &pb.PrefillRequest_Ping{Ping: &pb.PrefillPing{}}}
}

// result reads the next event, which must be the result of seq.
func (s *sess) result(seq uint64) *pb.PrefillResult {
	s.t.Helper()
	ev := s.recv()
	r := ev.GetResult()
	if r == nil || r.GetSeq() != seq {
		s.t.Fatalf("got %v, want the result of op %d", ev, seq)
	}
	return r
}

// roomEvent reads the next event, which must be an event of room.
func (s *sess) roomEvent(room uint64) *pb.DestinationEvent {
	s.t.Helper()
	ev := s.recv()
	if ev.GetRoom().GetRoom() != room {
		s.t.Fatalf("got %v, want an event of room %d", ev, room)
	}
	return ev.GetRoom().GetEvent()
}

// claim claims room on the session and returns its destination.
func (s *sess) claim(room uint64) *pb.Destination {
	s.t.Helper()
	seq := s.op(claimOp(room))
	if r := s.result(seq); r.GetError() != nil || r.GetClaim().GetRoom() != room {
		s.t.Fatalf("claim of room %d = %v", room, r)
	}
	d := s.roomEvent(room).GetDestination()
	if d == nil {
		s.t.Fatalf("room %d: no destination", room)
	}
	return d
}

// streamEnd reads until the stream ends and returns its error (io.EOF: OK).
func (s *sess) streamEnd() error {
	for {
		if _, err := s.next(); err != nil {
			return err
		}
	}
}

// openSmall opens a 100-token room (several fit the test pool at once).
func openSmall(w *drainWire, room uint64) {
	w.t.Helper()
	if _, err := w.s.room.OpenRoom(w.ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: w.addr, Room: room, PromptLen: 100, MaxNewTokens: 4}); err != nil {
		w.t.Fatal(err)
	}
}

func lastChunk(room uint64, d *pb.Destination) *pb.TransferRequest {
	return &pb.TransferRequest{Room: room, NumPages: uint32(len(d.GetPageIndices())), Last: true,
		Aux: &pb.Aux{RoomMarker: room}, Attempt: d.GetAttempt(), Incarnation: d.GetIncarnation()}
}

func wantOpError(t *testing.T, what string, r *pb.PrefillResult, code codes.Code, inMsg string) {
	t.Helper()
	if e := r.GetError(); e == nil || codes.Code(e.GetCode()) != code || !strings.Contains(e.GetMessage(), inMsg) {
		t.Errorf("%s = %v, want %v with %q", what, r, code, inMsg)
	}
}

func wantEnd(t *testing.T, what string, err error, code codes.Code, inMsg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), inMsg) {
		t.Errorf("%s ended with %v, want %v with %q", what, err, code, inMsg)
	}
}

// TestPrefillSessionDeliversRooms: two rooms over one session, the decode
// side with the unary API: the destination of each, a chunk, and the room's
// end; the rooms succeed.
func TestPrefillSessionDeliversRooms(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	s := openSession(t, ctx, w.s.conn)
	wel := s.hello(prank(w.addr, 0), 0)
	if wel.GetIncarnation() != w.own || wel.GetHeartbeatInterval().AsDuration() != time.Hour || wel.GetMaxQueued() != server.SessionQueue {
		t.Errorf("welcome = %v, want incarnation %x, interval 1h, queue %d", wel, w.own, server.SessionQueue)
	}
	openSmall(w, 7)
	openSmall(w, 8)
	d7 := s.claim(7)
	d8 := s.claim(8)
	if d7.GetIncarnation() != w.own || d7.GetAttempt() != 1 {
		t.Errorf("destination = %v", d7)
	}
	for _, x := range []struct {
		room uint64
		d    *pb.Destination
	}{{7, d7}, {8, d8}} {
		seq := s.op(chunkOp(lastChunk(x.room, x.d)))
		// The chunk's result and the room's end, in either order.
		var gotResult, gotDone bool
		for range 2 {
			ev := s.recv()
			switch {
			case ev.GetResult() != nil:
				r := ev.GetResult()
				if r.GetSeq() != seq || r.GetError() != nil || r.GetChunk().GetPoll() != pb.KVPoll_KV_POLL_SUCCESS {
					t.Errorf("room %d chunk result = %v", x.room, r)
				}
				gotResult = true
			case ev.GetRoom().GetRoom() == x.room && ev.GetRoom().GetEvent().GetDone() != nil:
				gotDone = true
			default:
				t.Fatalf("room %d: unexpected %v", x.room, ev)
			}
		}
		if !gotResult || !gotDone {
			t.Errorf("room %d: result %v, done %v", x.room, gotResult, gotDone)
		}
		if p := w.phase(x.room); p != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			t.Errorf("room %d is %v, want SUCCEEDED", x.room, p)
		}
	}
	// A ping is answered; closing the session ends it OK.
	s.send(pingOp())
	if s.recv().GetPong() == nil {
		t.Error("no pong")
	}
	if err := s.st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := s.streamEnd(); err != io.EOF {
		t.Errorf("after CloseSend: %v, want OK", err)
	}
}

// TestPrefillSessionFailureAndAbort: a room the rank writes itself
// (report) that is aborted ends on the session with ack_required; the ack
// on the session releases its pages. A chunk's failure reported on the
// session fails the room.
func TestPrefillSessionFailureAndAbort(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	s := openSession(t, ctx, w.s.conn)
	s.hello(prank(w.addr, 0), w.own)

	w.open(7)
	d := s.claim(7)
	rep := w.report(7, d, 0, 0, 8, true)
	rep.Rank = nil // the session's
	if r := s.result(s.op(reportOp(rep))); r.GetError() != nil || r.GetReport() == nil {
		t.Fatalf("report = %v", r)
	}
	if _, err := w.s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
		t.Fatal(err)
	}
	ev := s.roomEvent(7)
	if ev.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED || !ev.GetAckRequired() {
		t.Fatalf("abort event = %v, want ABORTED with ack_required", ev)
	}
	r, err := w.s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: 7})
	if err != nil || !strings.Contains(r.GetWaitingFor(), "AckRoomEnd") {
		t.Errorf("before the ack: %v %v, want waiting for AckRoomEnd", r.GetWaitingFor(), err)
	}
	ar := s.result(s.op(ackOp(&pb.AckRoomEndRequest{Room: 7, Attempt: d.GetAttempt(), Incarnation: d.GetIncarnation()})))
	if ar.GetError() != nil || !ar.GetAck().GetOwed() || !ar.GetAck().GetReleased() {
		t.Errorf("ack = %v, want owed and released", ar)
	}
	// The room may be claimed again on the session after its end: its end
	// again (a failure, no ack owed now).
	seq := s.op(claimOp(7))
	if r := s.result(seq); r.GetError() != nil {
		t.Fatalf("re-claim = %v", r)
	}
	if ev := s.roomEvent(7); ev.GetFailure() == nil || ev.GetAckRequired() {
		t.Errorf("re-claim of the aborted room = %v, want its failure without ack_required", ev)
	}

	// A failure reported on the session fails the room.
	openSmall(w, 9)
	d9 := s.claim(9)
	fail := w.report(9, d9, 0, 0, 8, false)
	fail.Rank = nil
	seq = s.op(reportOp(fail))
	// The report's result and the room's end, in either order (the end is
	// queued by the room as the report fails it).
	var gotResult, gotEnd bool
	for range 2 {
		ev := s.recv()
		switch {
		case ev.GetResult() != nil:
			if r := ev.GetResult(); r.GetSeq() != seq || r.GetError() != nil {
				t.Errorf("failure report = %v", r)
			}
			gotResult = true
		case ev.GetRoom().GetRoom() == 9:
			if f := ev.GetRoom().GetEvent().GetFailure(); f.GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED {
				t.Errorf("room 9 event = %v, want TRANSFER_FAILED", ev)
			}
			gotEnd = true
		}
	}
	if !gotResult || !gotEnd {
		t.Errorf("room 9: result %v, end %v", gotResult, gotEnd)
	}
	if p := w.phase(9); p != pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Errorf("room 9 is %v, want FAILED", p)
	}
}

// TestPrefillSessionBadOps: an op that is not valid, of another rank, a
// stale incarnation or no op at all is a result naming the field (or
// STALE_INCARNATION), and the session goes on; a second claim of a room
// supersedes the first.
func TestPrefillSessionBadOps(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	s := openSession(t, ctx, w.s.conn)
	s.hello(prank(w.addr, 0), 0)
	w.open(7)
	d := s.claim(7)

	bad := lastChunk(7, d)
	bad.PageOffset = 1 << 25
	wantOpError(t, "chunk with page_offset 2^25", s.result(s.op(chunkOp(bad))), codes.InvalidArgument, "chunk.page_offset")
	wantOpError(t, "claim of room 0", s.result(s.op(claimOp(0))), codes.InvalidArgument, "claim.room: 0 is reserved")
	// Refusals the Transfer handler decides (not wire bounds) name the
	// field with the op's prefix too.
	outside := lastChunk(7, d)
	outside.PageOffset = uint32(len(d.GetPageIndices()))
	wantOpError(t, "chunk outside the destination", s.result(s.op(chunkOp(outside))), codes.InvalidArgument, "chunk.page_offset: ")
	other := lastChunk(7, d)
	other.Rank = prank(w.addr, 1)
	wantOpError(t, "chunk of another rank", s.result(s.op(chunkOp(other))), codes.InvalidArgument, "chunk.rank: must be the session's rank")
	// A second claim of room 7 supersedes the first: its result, the first
	// claim's end and then the destination again, for the second.
	first := s.seq - 4 // the claim of room 7 (then the four bad ops above)
	again := s.op(claimOp(7))
	var gotResult, gotEnd, gotDest bool
	for !gotResult || !gotEnd || !gotDest {
		ev := s.recv()
		switch re := ev.GetRoom(); {
		case ev.GetResult() != nil:
			if r := ev.GetResult(); r.GetSeq() != again || r.GetError() != nil || r.GetClaim().GetRoom() != 7 {
				t.Fatalf("second claim's result = %v", r)
			}
			gotResult = true
		case re.GetClaimSeq() == first && strings.Contains(re.GetEvent().GetFailure().GetMessage(), "superseded"):
			gotEnd = true
		case re.GetClaimSeq() == again && re.GetEvent().GetDestination() != nil:
			if !gotEnd { // the room's events keep their order on the session
				t.Error("the second claim's destination came before the first claim's superseded end")
			}
			if re.GetEvent().GetDestination().GetAttempt() != d.GetAttempt() {
				t.Errorf("re-delivered destination %v, want attempt %d", re.GetEvent().GetDestination(), d.GetAttempt())
			}
			gotDest = true
		default:
			t.Fatalf("after the second claim: unexpected %v", ev)
		}
	}
	wantOpError(t, "ack with attempt 0", s.result(s.op(ackOp(&pb.AckRoomEndRequest{Room: 7}))), codes.InvalidArgument, "ack.attempt")
	wantOpError(t, "no op", s.result(s.op(&pb.PrefillRequest{})), codes.InvalidArgument, "op: is required")
	long := claimOp(8)
	long.Traceparent = strings.Repeat("x", pb.MaxPrefillTraceparentLen+1)
	wantOpError(t, "a traceparent too long", s.result(s.op(long)), codes.InvalidArgument, "traceparent")

	stale := lastChunk(7, d)
	stale.Incarnation = w.own + 1
	r := s.result(s.op(chunkOp(stale)))
	if e := r.GetError(); codes.Code(e.GetCode()) != codes.FailedPrecondition || e.GetReason() != server.ReasonStaleIncarnation {
		t.Errorf("stale chunk = %v, want FAILED_PRECONDITION STALE_INCARNATION", r)
	}
	staleClaim := claimOp(9)
	staleClaim.GetClaim().Incarnation = w.own + 1
	if e := s.result(s.op(staleClaim)).GetError(); e.GetReason() != server.ReasonStaleIncarnation {
		t.Errorf("stale claim = %v, want STALE_INCARNATION", e)
	}
	// Nothing of the above changed the room; the session still moves it.
	seq := s.op(chunkOp(lastChunk(7, d)))
	for range 2 {
		ev := s.recv()
		if r := ev.GetResult(); r != nil && (r.GetSeq() != seq || r.GetError() != nil) {
			t.Errorf("good chunk = %v", r)
		}
	}
	if p := w.phase(7); p != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("room 7 is %v, want SUCCEEDED", p)
	}
	ops := func(op, code string) float64 {
		return counter(t, w.d, "decodeplane_prefill_session_ops_total", map[string]string{"op": op, "code": code})
	}
	if ops("chunk", "InvalidArgument") != 3 || ops("chunk", "FailedPrecondition") != 1 || ops("chunk", "OK") != 1 ||
		ops("claim", "OK") != 2 || ops("claim", "AlreadyExists") != 0 || ops("hello", "OK") != 1 {
		t.Errorf("session ops: chunk InvalidArgument %v FailedPrecondition %v OK %v, claim OK %v AlreadyExists %v, hello %v; want 3 1 1 2 0 1",
			ops("chunk", "InvalidArgument"), ops("chunk", "FailedPrecondition"), ops("chunk", "OK"), ops("claim", "OK"), ops("claim", "AlreadyExists"), ops("hello", "OK"))
	}
	if n := counter(t, w.d, "decodeplane_stale_incarnation_total", map[string]string{"method": "Transfer"}); n != 1 {
		t.Errorf("decodeplane_stale_incarnation_total{Transfer} = %v, want 1 (the stale chunk)", n)
	}
}

// TestPrefillSessionProtocolViolations: no hello first, a bad hello, a
// second hello, a seq not above the previous one, a stale or unknown rank
// end the stream.
func TestPrefillSessionProtocolViolations(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	hello := func(r *pb.PrefillRank, inc uint64) *pb.PrefillRequest {
		return &pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{Rank: r, InstanceId: "first", Incarnation: inc}}}
	}
	cases := []struct {
		name  string
		msgs  []*pb.PrefillRequest
		code  codes.Code
		inMsg string
	}{
		{"claim first", []*pb.PrefillRequest{{Seq: 1, Op: claimOp(7).Op}}, codes.InvalidArgument, "hello: the first message"},
		{"hello without a rank", []*pb.PrefillRequest{hello(nil, 0)}, codes.InvalidArgument, "hello.rank: is required"},
		{"hello with a seq", []*pb.PrefillRequest{{Seq: 3, Op: hello(prank(w.addr, 0), 0).Op}}, codes.InvalidArgument, "seq"},
		{"stale hello", []*pb.PrefillRequest{hello(prank(w.addr, 0), w.own+1)}, codes.FailedPrecondition, "earlier decodeplane incarnation"},
		{"unregistered rank", []*pb.PrefillRequest{hello(prank("p9:1", 0), 0)}, codes.NotFound, ""},
		{"second hello", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), hello(prank(w.addr, 0), 0)}, codes.InvalidArgument, "hello: a session has one hello"},
		{"seq 0", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), {Op: claimOp(7).Op}}, codes.InvalidArgument, "seq: 0 must be > 0"},
		{"seq repeated", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), {Seq: 5, Op: claimOp(0).Op}, {Seq: 5, Op: claimOp(0).Op}}, codes.InvalidArgument, "seq: 5 must be > 0 and above the previous op's 5"},
		{"hello with more", []*pb.PrefillRequest{{Op: hello(prank(w.addr, 0), 0).Op, More: []*pb.PrefillRequest{pingOp()}}}, codes.InvalidArgument, "more: the hello is sent alone"},
		{"seq repeated inside a message", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), {Seq: 5, Op: claimOp(0).Op, More: []*pb.PrefillRequest{{Seq: 5, Op: claimOp(0).Op}}}}, codes.InvalidArgument, "seq: 5 must be > 0 and above the previous op's 5"},
		{"hello inside a message", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), {Op: pingOp().Op, More: []*pb.PrefillRequest{hello(prank(w.addr, 0), 0)}}}, codes.InvalidArgument, "more[0].hello: a session has one hello"},
		{"nested more", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), {Op: pingOp().Op, More: []*pb.PrefillRequest{{Op: pingOp().Op, More: []*pb.PrefillRequest{pingOp()}}}}}, codes.InvalidArgument, "more[0].more: must be empty"},
		{"too many in a message", []*pb.PrefillRequest{hello(prank(w.addr, 0), 0), {Op: pingOp().Op, More: slices.Repeat([]*pb.PrefillRequest{pingOp()}, pb.MaxPrefillRequestsPerMessage+1)}}, codes.InvalidArgument, "more: has 65 messages (at most 64 per message)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openSession(t, ctx, w.s.conn)
			for _, m := range c.msgs {
				_ = s.st.Send(m) // a send after the end fails: the end is read below
			}
			wantEnd(t, c.name, s.streamEnd(), c.code, c.inMsg)
		})
	}
}

// TestPrefillSessionNeedsTheToken: with a token configured the session is
// UNAUTHENTICATED without it, and opens with it.
func TestPrefillSessionNeedsTheToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) { c.Server.AuthToken = "tok" }})
	conn := d.Conn(t)
	s := openSession(t, ctx, conn)
	_ = s.st.Send(pingOp())
	wantEnd(t, "a session without the token", s.streamEnd(), codes.Unauthenticated, "Unauthorized")
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok")
	s = openSession(t, authed, conn)
	_ = s.st.Send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{Rank: prank("p1:1", 0)}}})
	// Past auth: the rank is not registered.
	wantEnd(t, "a session with the token", s.streamEnd(), codes.NotFound, "")
}

// TestPrefillSessionIsTheHeartbeat (synctest): with a 1s heartbeat
// interval, a session that pings every 500ms keeps its instance for a
// minute; one that sends nothing loses it after heartbeat_max_failures
// intervals, as a rank whose heartbeats stopped: its rooms fail with the
// lost connection, and the session's next message ends it NOT_FOUND.
func TestPrefillSessionIsTheHeartbeat(t *testing.T) {
	for _, ping := range []bool{true, false} {
		t.Run(fmt.Sprintf("ping=%v", ping), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dec := stgDecodeConfig(1)
				d, err := daemontest.New(daemontest.Options{Config: func(c *config.Config) {
					c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
					c.Timeouts.HeartbeatInterval = time.Second
				}})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				conn := d.Conn(t)
				defer func() {
					cancel()
					conn.Close()
					d.Stop()
				}()
				w := &drainWire{t: t, ctx: ctx, d: d, own: d.Incarnation(), addr: "p1:1",
					s: &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}}
				w.register("first")
				s := openSession(t, ctx, conn)
				wel := s.hello(prank(w.addr, 0), 0)
				w.open(7)
				s.claim(7)
				mf := time.Duration(wel.GetHeartbeatMaxFailures())
				if mf == 0 {
					t.Fatal("welcome without max failures")
				}
				for range 2 * 60 {
					time.Sleep(500 * time.Millisecond)
					if ping {
						s.send(pingOp())
						if s.recv().GetPong() == nil {
							t.Fatal("no pong")
						}
					}
				}
				synctest.Wait()
				phase := w.phase(7)
				if ping {
					if phase != pb.RoomPhase_ROOM_PHASE_CLAIMED {
						t.Errorf("after a minute of pings room 7 is %v, want it live", phase)
					}
					if _, err := w.s.boot.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: prank(w.addr, 0), InstanceId: "first"}); err != nil {
						t.Errorf("after a minute of pings the rank is gone: %v", err)
					}
					return
				}
				if phase != pb.RoomPhase_ROOM_PHASE_FAILED {
					t.Errorf("after a silent minute room 7 is %v, want FAILED", phase)
				}
				ev := s.roomEvent(7)
				if ev.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST || !strings.Contains(ev.GetFailure().GetMessage(), "Lost connection with prefill instance") {
					t.Errorf("room 7's end = %v, want the lost prefill", ev)
				}
				s.send(pingOp())
				wantEnd(t, "the silent session's next message", s.streamEnd(), codes.NotFound, "")
			})
		})
	}
}
