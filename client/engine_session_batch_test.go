package client_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestEngineSessionOutcomeEvents: with ENGINE_EVENTS_OUTCOME a room sends
// one event, its SUCCEEDED transition (with its position in the room's
// timeline as seq), or its FAILED terminal event, then leaves the stream;
// a resume of a room whose outcome was seen sends nothing; a bad events
// value is INVALID_ARGUMENT naming the field.
func TestEngineSessionOutcomeEvents(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	s, err := client.OpenEngineSession(ctx, c, client.SessionEvents(pb.EngineEvents_ENGINE_EVENTS_OUTCOME))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if res, err := s.Open(ctx, openReq(1701, 100), openReq(1702, 100)); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Open = %+v, %v", res, err)
	}
	// Opened, no event read yet: both have a cursor (Resume on another
	// session would watch them), at 0.
	if cur := s.Cursors(); len(cur) != 2 || cur[1701] != 0 || cur[1702] != 0 {
		t.Errorf("Cursors after the open = %v, want 1701 and 1702 at 0", cur)
	}
	if _, err := p.SendRoom(ctx, 1701, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom(1701): %v", err)
	}
	if _, err := s.Abort(ctx, &pb.AbortRoomRequest{Room: 1702}); err != nil {
		t.Fatalf("Abort(1702): %v", err)
	}
	got := map[uint64]*pb.EngineRoomEvent{}
	for len(got) < 2 {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if prev := got[ev.GetRoom()]; prev != nil {
			t.Fatalf("room %d: a second event %v after %v (outcome only: one per room)", ev.GetRoom(), ev, prev)
		}
		got[ev.GetRoom()] = ev
	}
	r1, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 1701})
	if err != nil {
		t.Fatal(err)
	}
	var succSeq uint32
	for i, tr := range r1.GetTransitions() {
		if tr.GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			succSeq = uint32(i + 1)
		}
	}
	if ev := got[1701]; ev.GetEvent().GetTransition().GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || ev.GetSeq() != succSeq || succSeq < 3 {
		t.Errorf("1701's event = seq %d %v, want its SUCCEEDED transition at seq %d (its place in the timeline)", ev.GetSeq(), ev.GetEvent().GetTransition().GetPhase(), succSeq)
	}
	if ev := got[1702]; !ev.GetEvent().GetTerminal() || ev.GetEvent().GetRoom().GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED {
		t.Errorf("1702's event = %v, want the terminal ABORTED failure", ev)
	}
	if cur := s.Cursors(); len(cur) != 0 {
		t.Errorf("Cursors = %v, want none (both rooms' outcomes seen)", cur)
	}
	// The release's reply says it; no RELEASED event follows.
	if _, err := s.Release(ctx, &pb.ReleaseRoomRequest{Room: 1701}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// A resume past the outcome sends nothing; one before it sends the
	// outcome again (a new stream knows nothing of the first).
	s2, err := client.OpenEngineSession(ctx, c, client.SessionEvents(pb.EngineEvents_ENGINE_EVENTS_OUTCOME))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	res, err := s2.Resume(ctx, map[uint64]uint32{1702: got[1702].GetSeq(), 1701: 1})
	if err != nil || len(res) != 2 || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("Resume = %+v, %v", res, err)
	}
	ev, err := s2.Next()
	if err != nil || ev.GetRoom() != 1701 || ev.GetSeq() != succSeq {
		t.Fatalf("after Resume: Next = %v, %v; want 1701's SUCCEEDED at seq %d", ev, err, succSeq)
	}
	// Nothing more: open a third room and see its outcome next.
	if res, err := s2.Open(ctx, openReq(1703, 100)); err != nil || res[0].Err != nil {
		t.Fatalf("Open(1703) = %+v, %v", res, err)
	}
	if _, err := s2.Abort(ctx, &pb.AbortRoomRequest{Room: 1703}); err != nil {
		t.Fatal(err)
	}
	if ev, err := s2.Next(); err != nil || ev.GetRoom() != 1703 {
		t.Fatalf("Next = %v, %v; want 1703's outcome (nothing of 1701 or 1702 after their outcomes)", ev, err)
	}

	// A bad events value.
	st := rawSession(t, d)
	if err := st.Send(&pb.EngineRequest{Seq: 1, Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{
		Rooms: []*pb.OpenRoomRequest{openReq(1704, 10)}, Events: pb.EngineEvents(7)}}}); err != nil {
		t.Fatal(err)
	}
	if r := recvReply(t, st, 1); codes.Code(r.GetCode()) != codes.InvalidArgument || !strings.Contains(r.GetMessage(), "open.events: 7 is not an EngineEvents value") {
		t.Errorf("reply = %v, want INVALID_ARGUMENT open.events", r)
	}
	if err := st.Send(&pb.EngineRequest{Seq: 2, Op: &pb.EngineRequest_Watch{Watch: &pb.EngineWatch{
		Rooms: []*pb.EngineWatchRoom{{Room: 1701}}, Events: -1}}}); err != nil {
		t.Fatal(err)
	}
	if r := recvReply(t, st, 2); codes.Code(r.GetCode()) != codes.InvalidArgument || !strings.Contains(r.GetMessage(), "watch.events") {
		t.Errorf("reply = %v, want INVALID_ARGUMENT watch.events", r)
	}
	assertPoolFull(t, c)
}

// TestEngineSessionPackedRequests: several requests in one message
// (EngineRequest.more) are each answered as if sent alone, in order; a
// message over the bound or with a nested more ends the stream
// INVALID_ARGUMENT naming the field, as does a bad seq inside a batch.
func TestEngineSessionPackedRequests(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	abort := func(seq, room uint64) *pb.EngineRequest {
		return &pb.EngineRequest{Seq: seq, Op: &pb.EngineRequest_Abort{Abort: &pb.AbortRoomRequest{Room: room}}}
	}
	st := rawSession(t, d)
	first := abort(1, 1)
	for i := range uint64(pb.MaxEngineRequestsPerMessage) {
		first.More = append(first.More, abort(2+i, 2+i))
	}
	if err := st.Send(first); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 1+pb.MaxEngineRequestsPerMessage; seq++ {
		if r := recvReply(t, st, seq); len(r.GetResults()) != 1 || r.GetResults()[0].GetRoom() != seq || codes.Code(r.GetResults()[0].GetCode()) != codes.NotFound {
			t.Fatalf("reply %d = %v, want NOT_FOUND for room %d", seq, r, seq)
		}
	}
	for _, tc := range []struct {
		name  string
		msg   func() *pb.EngineRequest
		field string
	}{
		{"too many", func() *pb.EngineRequest {
			m := abort(100, 1)
			for i := range uint64(pb.MaxEngineRequestsPerMessage + 1) {
				m.More = append(m.More, abort(101+i, 1))
			}
			return m
		}, "more: has 65 requests (at most 64 per message)"},
		{"nested", func() *pb.EngineRequest {
			m := abort(100, 1)
			m.More = []*pb.EngineRequest{abort(101, 1)}
			m.More[0].More = []*pb.EngineRequest{abort(102, 1)}
			return m
		}, "more[0].more: must be empty"},
		{"seq inside", func() *pb.EngineRequest {
			m := abort(100, 1)
			m.More = []*pb.EngineRequest{abort(100, 1)}
			return m
		}, "seq: 100 is not above the previous request's seq 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := rawSession(t, d)
			if err := st.Send(tc.msg()); err != nil {
				t.Fatal(err)
			}
			if tc.name == "seq inside" { // the request before the bad one ran: its reply comes first
				if r := recvReply(t, st, 100); len(r.GetResults()) != 1 || codes.Code(r.GetResults()[0].GetCode()) != codes.NotFound {
					t.Errorf("reply 100 = %v, want NOT_FOUND for room 1", r)
				}
			}
			err := recvEnd(st)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Errorf("stream ended with %v, want INVALID_ARGUMENT %q", err, tc.field)
			}
		})
	}
}

// TestEngineSessionViolationAfterOps: the replies of the ops that ran
// before a protocol violation are sent before the stream ends with it,
// whether the violation came in the next message (sent at once, without
// reading) or later in the same one; the rooms those ops opened are open.
func TestEngineSessionViolationAfterOps(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	open := func(seq, room uint64) *pb.EngineRequest {
		return &pb.EngineRequest{Seq: seq, Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{openReq(room, 10)}}}}
	}
	for i, msgs := range [][]*pb.EngineRequest{
		{open(5, 1801), {Seq: 3, Op: &pb.EngineRequest_Abort{Abort: &pb.AbortRoomRequest{Room: 7}}}},
		{{Seq: 5, Op: open(5, 1802).Op, More: []*pb.EngineRequest{open(6, 1803), open(6, 1804)}}},
	} {
		st := rawSession(t, d)
		for _, m := range msgs {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		want := map[int][]uint64{0: {5}, 1: {5, 6}}[i]
		for _, seq := range want {
			if r := recvReply(t, st, seq); len(r.GetResults()) != 1 || r.GetResults()[0].GetCode() != 0 {
				t.Errorf("case %d: reply %d = %v, want the open's OK", i, seq, r)
			}
		}
		if err := recvEnd(st); status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "seq:") {
			t.Errorf("case %d: stream ended with %v, want INVALID_ARGUMENT seq", i, err)
		}
	}
	for _, room := range []uint64{1801, 1802, 1803} {
		if _, err := c.Admin().GetRoom(ctxT(t), &pb.GetRoomRequest{Room: room}); err != nil {
			t.Errorf("room %d: %v, want it open (its op ran and was answered)", room, err)
		}
		if _, err := c.Engine().AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Admin().GetRoom(ctxT(t), &pb.GetRoomRequest{Room: 1804}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("room 1804 (the violating entry's) = %v, want NOT_FOUND (never run)", err)
	}
	assertPoolFull(t, c)
}

// TestEngineSessionWatchAfterBeyondTheEnd: a Watch whose after is beyond
// the room's last event sends what comes next, its terminal event
// included.
func TestEngineSessionWatchAfterBeyondTheEnd(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	if _, err := c.Engine().OpenRoom(ctx, openReq(1901, 10)); err != nil {
		t.Fatal(err)
	}
	s := session(t, c)
	if res, err := s.Resume(ctx, map[uint64]uint32{1901: 53}); err != nil || res[0].Err != nil {
		t.Fatalf("Resume = %+v, %v", res, err)
	}
	if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 1901}); err != nil {
		t.Fatal(err)
	}
	ev, err := s.Next()
	if err != nil || ev.GetRoom() != 1901 || !ev.GetEvent().GetTerminal() {
		t.Fatalf("Next = %v, %v; want room 1901's terminal event", ev, err)
	}
	assertPoolFull(t, c)
}
