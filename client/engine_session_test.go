package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/transfer"
)

// session opens an EngineSession closed at cleanup.
func session(t *testing.T, c *client.Client) *client.EngineSession {
	t.Helper()
	s, err := client.OpenEngineSession(ctxT(t), c)
	if err != nil {
		t.Fatalf("EngineSession: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// roomEvents collects a session's events per room until every room in
// want has sent its terminal event (or stop says so), checking that each
// room's seqs go 1, 2, 3... from first (no gap, no duplicate).
type roomEvents struct {
	t     *testing.T
	next  map[uint64]uint32 // the seq expected next
	evs   map[uint64][]*pb.EngineRoomEvent
	ended map[uint64]bool
}

func newRoomEvents(t *testing.T) *roomEvents {
	return &roomEvents{t: t, next: map[uint64]uint32{}, evs: map[uint64][]*pb.EngineRoomEvent{}, ended: map[uint64]bool{}}
}

// expect sets the seq room's next event must carry.
func (re *roomEvents) expect(room uint64, seq uint32) { re.next[room] = seq }

func (re *roomEvents) add(ev *pb.EngineRoomEvent) {
	re.t.Helper()
	want := re.next[ev.GetRoom()]
	if want == 0 {
		want = 1
	}
	if ev.GetSeq() != want {
		re.t.Errorf("room %d: event seq %d, want %d (no gap, no duplicate)", ev.GetRoom(), ev.GetSeq(), want)
	}
	re.next[ev.GetRoom()] = ev.GetSeq() + 1
	re.evs[ev.GetRoom()] = append(re.evs[ev.GetRoom()], ev)
	if ev.GetEvent().GetTerminal() {
		re.ended[ev.GetRoom()] = true
	}
}

// until reads s until done() holds.
func (re *roomEvents) until(s *client.EngineSession, done func() bool) {
	re.t.Helper()
	for !done() {
		ev, err := s.Next()
		if err != nil {
			re.t.Fatalf("Next: %v", err)
		}
		re.add(ev)
	}
}

// reached reports whether room has an event whose transition is phase.
func (re *roomEvents) reached(room uint64, phase pb.RoomPhase) bool {
	for _, ev := range re.evs[room] {
		if ev.GetEvent().GetTransition().GetPhase() == phase {
			return true
		}
	}
	return false
}

func (re *roomEvents) phases(room uint64) []pb.RoomPhase {
	var out []pb.RoomPhase
	for _, ev := range re.evs[room] {
		out = append(out, ev.GetEvent().GetTransition().GetPhase())
	}
	return out
}

func timelinePhases(r *pb.Room) []pb.RoomPhase {
	var out []pb.RoomPhase
	for _, tr := range r.GetTransitions() {
		out = append(out, tr.GetPhase())
	}
	return out
}

// TestEngineSessionLifecycle: a batch opened on the session is admitted,
// the prefill side (the unary Prefill.SendRoom) delivers, the session
// sees each room succeed and releases it; the phases are those of a room
// driven by the unary path in the same daemon.
func TestEngineSessionLifecycle(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)

	// The unary path, for comparison.
	sent := make(chan error, 4)
	go func() { _, err := p.SendRoom(ctx, 500, client.SendOptions{}); sent <- err }()
	if _, err := c.Engine().OpenAndWait(ctx, openReq(500, 100)); err != nil {
		t.Fatalf("OpenAndWait: %v", err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("SendRoom(500): %v", err)
	}
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 500}); err != nil {
		t.Fatal(err)
	}
	unary, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 500})
	if err != nil {
		t.Fatal(err)
	}

	s := session(t, c)
	rooms := []uint64{501, 502, 503}
	res, err := s.Open(ctx, openReq(501, 100), openReq(502, 200), openReq(503, 300))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if len(res) != len(rooms) {
		t.Fatalf("Open answered %d results, want %d", len(res), len(rooms))
	}
	for i, r := range res {
		if r.Err != nil || r.Room != rooms[i] || r.Open.GetRoom().GetRoom() != rooms[i] {
			t.Fatalf("Open result %d = %+v, want room %d opened", i, r, rooms[i])
		}
	}
	for _, room := range rooms {
		go func() { _, err := p.SendRoom(ctx, room, client.SendOptions{ChunkPages: 1}); sent <- err }()
	}
	re := newRoomEvents(t)
	re.until(s, func() bool {
		for _, room := range rooms {
			if !re.reached(room, pb.RoomPhase_ROOM_PHASE_SUCCEEDED) {
				return false
			}
		}
		return true
	})
	for range rooms {
		if err := <-sent; err != nil {
			t.Fatalf("SendRoom: %v", err)
		}
	}
	for _, room := range rooms {
		rel, err := s.Release(ctx, &pb.ReleaseRoomRequest{Room: room})
		if err != nil || rel.GetPagesReleased() == 0 {
			t.Fatalf("Release(%d) = %v, %v; want its pages back", room, rel, err)
		}
	}
	// Releasing again is idempotent, as ReleaseRoom.
	if rel, err := s.Release(ctx, &pb.ReleaseRoomRequest{Room: 501}); err != nil || !rel.GetAlreadyReleased() {
		t.Errorf("second Release = %v, %v; want already released", rel, err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	re.until(s, func() bool { return len(re.ended) == len(rooms) })
	if ev, err := s.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after every room ended and CloseSend = %v, %v; want io.EOF", ev, err)
	}
	for _, room := range rooms {
		got := re.phases(room)
		if want := timelinePhases(unary); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("room %d: session phases %v, unary room's %v", room, got, want)
		}
		if last := re.evs[room][len(re.evs[room])-1]; last.GetEvent().GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_RELEASED {
			t.Errorf("room %d: last event %v, want RELEASED", room, last)
		}
	}
	assertPoolFull(t, c)
}

// TestEngineSessionFailures: a transfer failure, an abort and a prefill
// lost (its instance replaced) end the rooms with their terminal events on
// the session, with the codes the unary path gives.
func TestEngineSessionFailures(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	d.engine.SetFault(func(op transfer.ChunkOp) error {
		if op.Room == 601 && op.ChunkIndex == 1 {
			return errors.New("nic down")
		}
		return nil
	})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	s := session(t, c)
	if res, err := s.Open(ctx, openReq(601, 1000), openReq(602, 100)); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Open = %+v, %v", res, err)
	}
	if _, err := p.SendRoom(ctx, 601, client.SendOptions{ChunkPages: 4}); !errors.Is(err, client.ErrRoomFailed) {
		t.Fatalf("SendRoom(601) = %v, want the room failed", err)
	}
	// 602 has no sender: it waits for its prefill until aborted.
	ab, err := s.Abort(ctx, &pb.AbortRoomRequest{Room: 602})
	if err != nil || ab.GetAlreadyTerminal() {
		t.Fatalf("Abort = %v, %v", ab, err)
	}
	re := newRoomEvents(t)
	re.until(s, func() bool { return len(re.ended) == 2 })
	last := func(room uint64) *pb.Room { return re.evs[room][len(re.evs[room])-1].GetEvent().GetRoom() }
	if f := last(601).GetFailure(); f.GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(f.GetMessage(), "nic down") {
		t.Errorf("601's terminal event failure = %v, want TRANSFER_FAILED naming the fault", f)
	}
	if f := last(602).GetFailure(); f.GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED || f.GetMessage() != "Aborted by AbortReq." {
		t.Errorf("602's terminal event failure = %v, want ABORTED \"Aborted by AbortReq.\"", f)
	}
	// Aborting again is OK; releasing a failed room is refused as ReleaseRoom refuses it.
	if ab, err := s.Abort(ctx, &pb.AbortRoomRequest{Room: 602}); err != nil || !ab.GetAlreadyTerminal() {
		t.Errorf("second Abort = %v, %v; want already terminal", ab, err)
	}
	_, sessErr := s.Release(ctx, &pb.ReleaseRoomRequest{Room: 601})
	_, unaryErr := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 601})
	if !errors.Is(sessErr, client.ErrFailedPrecondition) || status.Convert(sessErr).Message() != status.Convert(unaryErr).Message() {
		t.Errorf("Release(failed room) on the session = %v; unary = %v: want the same FAILED_PRECONDITION", sessErr, unaryErr)
	}
	_, sessErr = s.Abort(ctx, &pb.AbortRoomRequest{Room: 99999})
	_, unaryErr = c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 99999})
	if !errors.Is(sessErr, client.ErrNotFound) || status.Convert(sessErr).Message() != status.Convert(unaryErr).Message() {
		t.Errorf("Abort(unknown room) on the session = %v; unary = %v: want the same NOT_FOUND", sessErr, unaryErr)
	}

	// The prefill instance is replaced (a new instance_id behind its
	// address): its rooms fail PREFILL_LOST, the session's as the unary
	// path's.
	if res, err := s.Open(ctx, openReq(603, 100)); err != nil || res[0].Err != nil {
		t.Fatalf("Open(603) = %+v, %v", res, err)
	}
	if _, err := c.Engine().OpenRoom(ctx, openReq(604, 100)); err != nil {
		t.Fatal(err)
	}
	unaryEnd := make(chan error, 1)
	go func() { _, err := c.Engine().WaitRoom(ctx, 604, pb.RoomPhase_ROOM_PHASE_SUCCEEDED); unaryEnd <- err }()
	re.until(s, func() bool { return len(re.evs[603]) > 0 })
	again := prefillRank(addr, 1, 0)
	again.InstanceId = "prefill-restarted"
	if _, err := c.Prefill(again).Register(ctx); err != nil {
		t.Fatalf("RegisterPrefill(new instance): %v", err)
	}
	re.until(s, func() bool { return re.ended[603] })
	lost := last(603).GetFailure()
	var rf *client.RoomFailedError
	if err := <-unaryEnd; !errors.As(err, &rf) || lost.GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST || rf.Code != lost.GetCode() {
		t.Errorf("prefill replaced: the session's room ended with %v, the unary room's wait with %v; want PREFILL_LOST both", lost, err)
	}
	assertPoolFull(t, c)
}

// TestEngineSessionBadInput: a bad op or room is answered INVALID_ARGUMENT
// naming the field, and the stream stays usable.
func TestEngineSessionBadInput(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	s := session(t, c)

	bad := openReq(701, 100)
	bad.PromptLen = 0
	res, err := s.Open(ctx, bad, openReq(702, 100))
	if err != nil {
		t.Fatalf("Open = %v, want per-room results", err)
	}
	_, unaryErr := c.Engine().OpenRoom(ctx, bad)
	if !errors.Is(res[0].Err, client.ErrInvalidArgument) || !strings.HasPrefix(status.Convert(res[0].Err).Message(), "open.rooms[0].prompt_len: ") ||
		status.Convert(res[0].Err).Message() != "open.rooms[0]."+status.Convert(unaryErr).Message() {
		t.Errorf("bad room's result = %v; unary OpenRoom = %v: want INVALID_ARGUMENT open.rooms[0].prompt_len, the unary message prefixed", res[0].Err, unaryErr)
	}
	if res[1].Err != nil {
		t.Errorf("good room of the batch = %v, want opened", res[1].Err)
	}
	// A refusal decided by OpenRoom itself (not a wire bound: the daemon
	// has one decode shard) is prefixed the same; one that names no field
	// (SGLang's message) is not.
	noShard, tooBig := openReq(704, 100), openReq(705, 100)
	one := uint32(1)
	noShard.DecodeDpRank = &one
	tooBig.PromptLen = 16 << 20 // the wire bound, beyond the pool
	res, err = s.Open(ctx, noShard, tooBig)
	if err != nil {
		t.Fatalf("Open = %v, want per-room results", err)
	}
	if m := status.Convert(res[0].Err).Message(); !errors.Is(res[0].Err, client.ErrInvalidArgument) || !strings.HasPrefix(m, "open.rooms[0].decode_dp_rank: ") {
		t.Errorf("a room on a decode shard the daemon lacks = %v, want INVALID_ARGUMENT open.rooms[0].decode_dp_rank", res[0].Err)
	}
	if m := status.Convert(res[1].Err).Message(); !errors.Is(res[1].Err, client.ErrInvalidArgument) || !strings.HasPrefix(m, "Request rid-705 exceeds the maximum number of tokens") {
		t.Errorf("a room that can never fit = %v, want SGLang's message unprefixed", res[1].Err)
	}
	if _, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 701}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetRoom(bad room) = %v, want not found: nothing opened", err)
	}
	cases := []struct {
		name  string
		run   func() error
		field string
	}{
		{"empty batch", func() error { _, err := s.Open(ctx); return err }, "open.rooms: "},
		{"room twice", func() error { _, err := s.Open(ctx, openReq(703, 10), openReq(703, 10)); return err }, "open.rooms[1].room: "},
		{"abort room 0", func() error { _, err := s.Abort(ctx, &pb.AbortRoomRequest{}); return err }, "abort.room: "},
		{"release room 0", func() error { _, err := s.Release(ctx, &pb.ReleaseRoomRequest{}); return err }, "release.room: "},
		{"resume room 0", func() error { _, err := s.Resume(ctx, map[uint64]uint32{0: 1}); return err }, "watch.rooms[0].room: "},
		{"batch of 257", func() error {
			reqs := make([]*pb.OpenRoomRequest, pb.MaxEngineOpenRooms+1)
			for i := range reqs {
				reqs[i] = openReq(uint64(1000+i), 10)
			}
			_, err := s.Open(ctx, reqs...)
			return err
		}, "open.rooms: has 257 rooms (at most 256"},
	}
	for _, tc := range cases {
		err := tc.run()
		if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(status.Convert(err).Message(), tc.field) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", tc.name, err, tc.field)
		}
	}
	// The stream is still usable.
	if res, err := s.Open(ctx, openReq(705, 100)); err != nil || res[0].Err != nil {
		t.Fatalf("Open after bad ops = %+v, %v", res, err)
	}
	re := newRoomEvents(t)
	re.until(s, func() bool { return len(re.evs[705]) > 0 && len(re.evs[702]) > 0 })

	// A traceparent the W3C format refuses (the Go client sends only
	// valid ones: the raw stream).
	st := rawSession(t, d)
	for i, tp := range []string{"00-zz", "00-00000000000000000000000000000000-0000000000000001-01", strings.Repeat("a", pb.MaxTraceparentLen+1)} {
		seq := uint64(i + 1)
		o := &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{openReq(706, 10)}}
		if err := st.Send(&pb.EngineRequest{Seq: seq, Op: &pb.EngineRequest_Open{Open: o}, Traceparent: tp}); err != nil {
			t.Fatal(err)
		}
		if r := recvReply(t, st, seq); codes.Code(r.GetCode()) != codes.InvalidArgument || !strings.HasPrefix(r.GetMessage(), "traceparent: ") || len(r.GetResults()) != 0 {
			t.Errorf("traceparent %.20q: reply %v, want INVALID_ARGUMENT traceparent and no result", tp, r)
		}
	}
	// Per-room traceparents: one per room or none.
	o := &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{openReq(706, 10), openReq(707, 10)}, Traceparents: []string{""}}
	if err := st.Send(&pb.EngineRequest{Seq: 10, Op: &pb.EngineRequest_Open{Open: o}}); err != nil {
		t.Fatal(err)
	}
	if r := recvReply(t, st, 10); codes.Code(r.GetCode()) != codes.InvalidArgument || !strings.HasPrefix(r.GetMessage(), "open.traceparents: ") {
		t.Errorf("one traceparent for two rooms: reply %v, want INVALID_ARGUMENT open.traceparents", r)
	}
	if _, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 706}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetRoom(706) = %v, want not found: a refused op opens nothing", err)
	}
}

// TestEngineSessionSlowConsumerThenResume: a client that sends opens and
// reads nothing is cut with RESOURCE_EXHAUSTED once the daemon's queue is
// full; its rooms go on; a new session's Resume re-delivers a room's
// events without duplicates and nothing missed.
func TestEngineSessionSlowConsumerThenResume(t *testing.T) {
	// The handler's end, seen by a stream interceptor: the test reads
	// nothing before the daemon cut the stream.
	handled := make(chan error, 1)
	watchEnd := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		err := h(srv, ss)
		if info.FullMethod == pb.EngineSession_Session_FullMethodName {
			handled <- err
		}
		return err
	}
	d := newDaemon(t, daemonConfig{stream: []grpc.StreamServerInterceptor{watchEnd}})
	// Fixed 64 KiB windows (no BDP growth): the wire holds a few hundred
	// events, the rest must queue on the daemon.
	st := rawSession(t, d, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	const batches, batch = 24, 256
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for b := range batches {
			o := &pb.EngineOpen{}
			for i := range batch {
				o.Rooms = append(o.Rooms, openReq(uint64(10000+b*batch+i), 10))
			}
			if err := st.Send(&pb.EngineRequest{Seq: uint64(b + 1), Op: &pb.EngineRequest_Open{Open: o}}); err != nil {
				return // the daemon cut the stream
			}
		}
	}()
	var cut error
	select {
	case cut = <-handled:
	case <-ctxT(t).Done():
		live, err := d.client(t).Admin().ListRooms(context.Background(), &pb.ListRoomsRequest{LiveOnly: true, Limit: 100000})
		t.Fatalf("the daemon never cut the stream that reads nothing (%d rooms, %v)", live.GetTotal(), err)
	}
	want := fmt.Sprintf("slow consumer: %d events queued", pb.MaxEngineSessionQueue)
	if status.Code(cut) != codes.ResourceExhausted || status.Convert(cut).Message() != want {
		t.Fatalf("the handler returned %v, want RESOURCE_EXHAUSTED %q", cut, want)
	}
	if err := recvEnd(st); status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != want {
		t.Fatalf("the client's stream ended with %v, want RESOURCE_EXHAUSTED %q", err, want)
	}
	<-sending
	c := d.client(t)
	ctx := ctxT(t)
	live, err := c.Admin().ListRooms(ctx, &pb.ListRoomsRequest{LiveOnly: true, Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	// Each room opened queued its first event: at least a queue's worth
	// less the replies were opened before the cut, and they are all live.
	if live.GetTotal() < pb.MaxEngineSessionQueue-batches {
		t.Fatalf("%d rooms live after the cut, want the %d+ opened still there", live.GetTotal(), pb.MaxEngineSessionQueue-batches)
	}
	for _, r := range live.GetRooms() {
		if r.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED {
			t.Fatalf("room %d failed after its stream was cut: %v", r.GetRoom(), r.GetFailure())
		}
	}

	// Resume: room 10000 was opened on the cut stream; say its first event
	// (seq 1) was seen, and 10001 none.
	p := registered(t, c)
	s := session(t, c)
	res, err := s.Resume(ctx, map[uint64]uint32{10000: 1, 10001: 0})
	if err != nil || len(res) != 2 || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Resume = %+v, %v", res, err)
	}
	// Resuming a subscribed room again changes nothing (no second copy).
	if res, err := s.Resume(ctx, map[uint64]uint32{10000: 0}); err != nil || res[0].Err != nil {
		t.Fatalf("second Resume = %+v, %v", res, err)
	}
	re := newRoomEvents(t)
	re.expect(10000, 2)
	sent := make(chan error, 1)
	go func() { _, err := p.SendRoom(ctx, 10000, client.SendOptions{}); sent <- err }()
	re.until(s, func() bool { return re.reached(10000, pb.RoomPhase_ROOM_PHASE_SUCCEEDED) && len(re.evs[10001]) > 0 })
	if err := <-sent; err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if n := len(re.evs[10001]); re.evs[10001][0].GetSeq() != 1 || n < 1 {
		t.Errorf("10001 resumed from 0: first event seq %d, want 1", re.evs[10001][0].GetSeq())
	}
	// The session's events are the room's whole timeline after seq 1.
	r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(re.evs[10000]), len(r.GetTransitions())-1; got != want || re.next[10000] != uint32(len(r.GetTransitions()))+1 {
		t.Errorf("resumed room 10000: %d events up to seq %d; its timeline has %d transitions: want %d events, the last seq %d",
			got, re.next[10000]-1, len(r.GetTransitions()), want, len(r.GetTransitions()))
	}
	// Cursors name what a next resume would need.
	if cur := s.Cursors(); cur[10000] != re.next[10000]-1 || cur[10001] != re.next[10001]-1 {
		t.Errorf("Cursors = %v, want 10000:%d 10001:%d", cur, re.next[10000]-1, re.next[10001]-1)
	}
}

// TestEngineSessionReconnectResume: a session dropped while its room
// progresses; a new session resumes from Cursors and gets exactly what was
// missed, then the live events.
func TestEngineSessionReconnectResume(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	first, err := client.OpenEngineSession(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := first.Open(ctx, openReq(901, 100), openReq(902, 100)); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Open = %+v, %v", res, err)
	}
	re := newRoomEvents(t)
	re.until(first, func() bool { return len(re.evs[901]) > 0 && len(re.evs[902]) > 0 })
	cur := first.Cursors()
	first.Close() // the stream drops; the rooms go on
	if _, err := p.SendRoom(ctx, 901, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom while no session: %v", err)
	}
	second := session(t, c)
	if _, err := second.Resume(ctx, cur); err != nil {
		t.Fatal(err)
	}
	re.until(second, func() bool { return re.reached(901, pb.RoomPhase_ROOM_PHASE_SUCCEEDED) })
	if _, err := second.Release(ctx, &pb.ReleaseRoomRequest{Room: 901}); err != nil {
		t.Fatal(err)
	}
	if _, err := second.Abort(ctx, &pb.AbortRoomRequest{Room: 902}); err != nil {
		t.Fatal(err)
	}
	re.until(second, func() bool { return len(re.ended) == 2 })
	for _, room := range []uint64{901, 902} {
		r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: room})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(re.phases(room)), fmt.Sprint(timelinePhases(r)); got != want {
			t.Errorf("room %d across two sessions: phases %s, its timeline %s (each once, in order)", room, got, want)
		}
	}
	assertPoolFull(t, c)
}

// TestEngineSessionTracing: a room opened on the session starts its span in
// the trace of the op's traceparent (or its own entry of a batch's
// traceparents); a room opened without one starts its own trace, not the
// stream's.
func TestEngineSessionTracing(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	d := newDaemon(t, daemonConfig{tracer: tp})
	c := d.client(t, client.WithTracerProvider(tp))
	ctx := ctxT(t)
	s := session(t, c)

	stepCtx, step := tp.Tracer("decode-engine").Start(ctx, "schedule batch")
	if res, err := s.Open(stepCtx, openReq(951, 100)); err != nil || res[0].Err != nil {
		t.Fatalf("Open = %+v, %v", res, err)
	}
	step.End()
	if res, err := s.Open(ctx, openReq(952, 100)); err != nil || res[0].Err != nil {
		t.Fatalf("Open = %+v, %v", res, err)
	}
	roomSpan := func(room uint64) tracetest.SpanStub {
		t.Helper()
		for _, sp := range spans.GetSpans() {
			if sp.Name != "room" {
				continue
			}
			for _, a := range sp.Attributes {
				if a.Key == "decodeplane.room" && a.Value.AsInt64() == int64(room) {
					return sp
				}
			}
		}
		t.Fatalf("no room span for %d among %d spans", room, len(spans.GetSpans()))
		return tracetest.SpanStub{}
	}
	// A room span ends with the room: abort both.
	for _, room := range []uint64{951, 952} {
		if _, err := s.Abort(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	traced := roomSpan(951)
	if traced.SpanContext.TraceID() != step.SpanContext().TraceID() || traced.Parent.SpanID() != step.SpanContext().SpanID() {
		t.Errorf("room 951's span: trace %s parent %s; want the caller's trace %s, parent %s",
			traced.SpanContext.TraceID(), traced.Parent.SpanID(), step.SpanContext().TraceID(), step.SpanContext().SpanID())
	}
	untraced := roomSpan(952)
	if untraced.Parent.IsValid() || untraced.SpanContext.TraceID() == traced.SpanContext.TraceID() {
		t.Errorf("room 952's span (no traceparent): parent %v, trace %s; want a new root trace", untraced.Parent, untraced.SpanContext.TraceID())
	}

	// Per-room trace contexts of a batch (Open.traceparents) win over the
	// op's: each room joins its own request's trace.
	_, reqA := tp.Tracer("decode-engine").Start(ctx, "request a")
	_, reqB := tp.Tracer("decode-engine").Start(ctx, "request b")
	reqA.End()
	reqB.End()
	w3c := func(sc trace.SpanContext) string { return fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()) }
	st := rawSession(t, d)
	o := &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{openReq(953, 100), openReq(954, 100)}, Traceparents: []string{w3c(reqA.SpanContext()), ""}}
	if err := st.Send(&pb.EngineRequest{Seq: 1, Op: &pb.EngineRequest_Open{Open: o}, Traceparent: w3c(reqB.SpanContext())}); err != nil {
		t.Fatal(err)
	}
	if r := recvReply(t, st, 1); r.GetCode() != 0 || len(r.GetResults()) != 2 || r.GetResults()[0].GetCode() != 0 || r.GetResults()[1].GetCode() != 0 {
		t.Fatalf("batch with traceparents: %v", r)
	}
	for _, room := range []uint64{953, 954} {
		if _, err := s.Abort(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	for room, want := range map[uint64]trace.SpanContext{953: reqA.SpanContext(), 954: reqB.SpanContext()} {
		if sp := roomSpan(room); sp.SpanContext.TraceID() != want.TraceID() || sp.Parent.SpanID() != want.SpanID() {
			t.Errorf("room %d's span: trace %s parent %s; want trace %s parent %s", room, sp.SpanContext.TraceID(), sp.Parent.SpanID(), want.TraceID(), want.SpanID())
		}
	}
}

// TestEngineSessionShutdown: on shutdown every subscribed room's terminal
// event (FAILED, FAILURE_CODE_SHUTDOWN) comes, then the stream ends OK.
func TestEngineSessionShutdown(t *testing.T) {
	d, err := startDaemon(daemonConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t)
	ctx := ctxT(t)
	s := session(t, c)
	if res, err := s.Open(ctx, openReq(971, 100), openReq(972, 100)); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Open = %+v, %v", res, err)
	}
	re := newRoomEvents(t)
	re.until(s, func() bool { return len(re.evs[971]) > 0 && len(re.evs[972]) > 0 })
	if err := d.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next during shutdown = %v, want the rooms' ends then io.EOF", err)
		}
		re.add(ev)
	}
	for _, room := range []uint64{971, 972} {
		last := re.evs[room][len(re.evs[room])-1]
		if !last.GetEvent().GetTerminal() || last.GetEvent().GetRoom().GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN {
			t.Errorf("room %d: last event %v, want terminal FAILURE_CODE_SHUTDOWN", room, last)
		}
	}
}
