package server_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// helloOffers opens the session for rank with offers and returns the
// welcome.
func (s *sess) helloOffers(rank *pb.PrefillRank, inc uint64) *pb.PrefillWelcome {
	s.t.Helper()
	s.send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{Rank: rank, InstanceId: "first", Incarnation: inc, Offers: true}}})
	w := s.recv().GetWelcome()
	if w == nil {
		s.t.Fatal("no welcome")
	}
	return w
}

// offerOf reads the next event, which must be the offer of room, and the
// one after it, which must be its destination (the room is admitted).
func (s *sess) offerOf(room uint64) *pb.Destination {
	s.t.Helper()
	ev := s.recv().GetRoom()
	if ev.GetRoom() != room || !ev.GetOffer() || ev.GetClaimSeq() != 0 || ev.GetEvent() != nil {
		s.t.Fatalf("got %v, want the offer of room %d", ev, room)
	}
	ev = s.recv().GetRoom()
	d := ev.GetEvent().GetDestination()
	if ev.GetRoom() != room || ev.GetClaimSeq() != 0 || ev.GetOffer() || d == nil {
		s.t.Fatalf("got %v, want the offered destination of room %d", ev, room)
	}
	return d
}

// TestPrefillSessionOffers: a session with offers is offered the room
// opened before its hello (first after the welcome) and the room opened
// after it, each with its destination, without claiming them; a chunk on
// the offered destination completes its room, whose end comes under
// claim_seq 0. A claim op of an offered room supersedes the offer (its end
// under claim_seq 0, then the claim's result and the destination again
// under the claim's seq). A session without offers is offered nothing.
func TestPrefillSessionOffers(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	plain := openSession(t, ctx, w.s.conn)
	if wel := plain.hello(prank(w.addr, 0), 0); wel.GetOffers() {
		t.Fatalf("a hello without offers was welcomed with offers: %v", wel)
	}
	openSmall(w, 7)
	s := openSession(t, ctx, w.s.conn)
	if wel := s.helloOffers(prank(w.addr, 0), 0); !wel.GetOffers() || wel.GetIncarnation() != w.own {
		t.Fatalf("welcome = %v, want offers and incarnation %x", wel, w.own)
	}
	d7 := s.offerOf(7)
	if d7.GetIncarnation() != w.own || d7.GetAttempt() != 1 || d7.GetRoom() != 7 {
		t.Fatalf("offered destination of room 7 = %v", d7)
	}
	openSmall(w, 8)
	d8 := s.offerOf(8)
	if p := w.phase(8); p != pb.RoomPhase_ROOM_PHASE_CLAIMED {
		t.Fatalf("room 8 after its destination was offered: %v, want CLAIMED", p)
	}
	seq := s.op(chunkOp(lastChunk(8, d8)))
	var gotResult, gotDone bool
	for range 2 {
		ev := s.recv()
		switch {
		case ev.GetResult().GetSeq() == seq:
			if r := ev.GetResult(); r.GetError() != nil || r.GetChunk().GetPoll() != pb.KVPoll_KV_POLL_SUCCESS {
				t.Fatalf("room 8's chunk = %v", r)
			}
			gotResult = true
		case ev.GetRoom().GetRoom() == 8 && ev.GetRoom().GetClaimSeq() == 0 && ev.GetRoom().GetEvent().GetDone() != nil:
			gotDone = true
		default:
			t.Fatalf("room 8: unexpected %v", ev)
		}
	}
	if !gotResult || !gotDone || w.phase(8) != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("room 8: result %v, done %v, phase %v", gotResult, gotDone, w.phase(8))
	}

	// A claim op of room 7 supersedes its offer.
	seq = s.op(claimOp(7))
	if ev := s.recv().GetRoom(); ev.GetRoom() != 7 || ev.GetClaimSeq() != 0 ||
		ev.GetEvent().GetFailure().GetMessage() != "superseded by a newer AwaitDestination from the same rank" {
		t.Fatalf("the offer of room 7 after a claim op: %v, want its end (superseded)", ev)
	}
	if r := s.result(seq); r.GetError() != nil || r.GetClaim().GetRoom() != 7 {
		t.Fatalf("claim of room 7 = %v", r)
	}
	ev := s.recv().GetRoom()
	if d := ev.GetEvent().GetDestination(); ev.GetClaimSeq() != seq || d.GetAttempt() != d7.GetAttempt() {
		t.Fatalf("room 7 after the claim op: %v, want its destination under seq %d", ev, seq)
	}

	// The session without offers got nothing: its next event is the pong.
	plain.send(pingOp())
	if ev := plain.recv(); ev.GetPong() == nil {
		t.Fatalf("the session without offers got %v, want only the pong", ev)
	}
	if _, err := w.s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
		t.Fatal(err)
	}
}

// TestPrefillSessionOffersAcrossSessions: the rank's next session with
// offers takes over the rooms the previous one held: the room's
// destination is offered again on it (the same attempt), and the chunk on
// it completes the room.
func TestPrefillSessionOffersAcrossSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	first := openSession(t, ctx, w.s.conn)
	first.helloOffers(prank(w.addr, 0), w.own)
	openSmall(w, 5)
	d := first.offerOf(5)
	first.cancel()
	if err := first.streamEnd(); err == nil {
		t.Fatal("the cancelled session did not end")
	}
	second := openSession(t, ctx, w.s.conn)
	second.helloOffers(prank(w.addr, 0), w.own)
	if again := second.offerOf(5); again.GetAttempt() != d.GetAttempt() {
		t.Fatalf("room 5 offered again with attempt %d, first %d", again.GetAttempt(), d.GetAttempt())
	}
	seq := second.op(chunkOp(lastChunk(5, d)))
	for range 2 { // the chunk's result and the room's end, in either order
		ev := second.recv()
		if r := ev.GetResult(); r != nil && (r.GetSeq() != seq || r.GetError() != nil) {
			t.Fatalf("chunk on the second session = %v", r)
		}
		if re := ev.GetRoom(); re != nil && (re.GetClaimSeq() != 0 || re.GetEvent().GetDone() == nil) {
			t.Fatalf("room 5 on the second session: %v, want its end under claim_seq 0", re)
		}
	}
	if p := w.phase(5); p != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("room 5 is %v after the chunk on the second session", p)
	}
}
