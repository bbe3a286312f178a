package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestClaimRefusals: a claim by a rank its registered instance lacks is
// refused NOT_FOUND at once, whether its room is open or not (it waited
// for the room, then got a failure event); a claim that came before its
// room and is not a source of it (another instance) ends, when the room
// opens, with the status AwaitDestination gives that refusal for an open
// room (INVALID_ARGUMENT rank.bootstrap_addr), not a failure event and OK;
// on a session it is a failure event naming the field, under the claim's
// seq. No refusal fails the room.
func TestClaimRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx) // instance p1:1, TP 1, registered
	claimEnd := func(room uint64, rank *pb.PrefillRank) error {
		t.Helper()
		st, err := w.s.room.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: rank, Incarnation: w.own})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := st.Recv()
		if err == nil {
			t.Fatalf("claim of room %d by %v: event %v, want the stream's refusal", room, rank, ev)
		}
		return err
	}
	for _, open := range []bool{false, true} {
		room := uint64(21)
		if open {
			room = 22
			w.open(room)
		}
		err := claimEnd(room, prank(w.addr, 1)) // tp 1 of a TP-1 instance
		if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "is not registered with this daemon") {
			t.Errorf("claim by an unregistered rank (room open: %v) = %v, want NOT_FOUND at once", open, err)
		}
	}

	// p2:1, another registered instance, claims rooms opened for p1:1
	// before they are opened.
	other := *w
	other.addr = "p2:1"
	other.register("first") // the instance id the session helper's hello names
	done := make(chan error, 1)
	go func() { done <- claimEnd(23, prank(other.addr, 0)) }()
	waitPendingClaims(t, w, 1)
	if n := pendingClaimsGauge(t, w); n != 1 {
		t.Errorf("decodeplane_pending_claims = %v with one claim waiting, want 1", n)
	}
	w.open(23)
	if err := <-done; status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "rank.bootstrap_addr: ") {
		t.Errorf("early claim of another instance's room = %v, want INVALID_ARGUMENT rank.bootstrap_addr when the room opens", err)
	}
	s := openSession(t, ctx, w.s.conn)
	s.hello(prank(other.addr, 0), 0)
	seq := s.op(claimOp(24))
	if r := s.result(seq); r.GetError() != nil {
		t.Fatalf("early claim on the session = %v, want made", r)
	}
	w.open(24)
	ev := s.recv().GetRoom()
	if ev.GetClaimSeq() != seq || !strings.HasPrefix(ev.GetEvent().GetFailure().GetMessage(), "rank.bootstrap_addr: ") {
		t.Errorf("early session claim of another instance's room: %v, want a failure event naming rank.bootstrap_addr", ev)
	}
	for _, room := range []uint64{22, 23, 24} {
		if p := w.phase(room); p == pb.RoomPhase_ROOM_PHASE_FAILED {
			t.Errorf("room %d is FAILED: a refused claim must not fail it", room)
		}
	}
}

// waitPendingClaims waits until n claims wait for rooms not yet open
// (GetStatus.pending_claims), asking again after each answer.
func waitPendingClaims(t *testing.T, w *drainWire, n uint32) {
	t.Helper()
	admin := pb.NewAdminClient(w.s.conn)
	for {
		st, err := admin.GetStatus(w.ctx, &pb.GetStatusRequest{})
		if err != nil {
			t.Fatalf("GetStatus (waiting for %d pending claims): %v", n, err)
		}
		if st.GetPendingClaims() >= n {
			return
		}
	}
}

// pendingClaimsGauge reads decodeplane_pending_claims.
func pendingClaimsGauge(t *testing.T, w *drainWire) float64 {
	t.Helper()
	mfs, err := w.d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "decodeplane_pending_claims" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no decodeplane_pending_claims")
	return 0
}
