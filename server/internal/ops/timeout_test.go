package ops

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// OpenRoomRequest.timeout: the wire's bounds are the domain's, and the
// domain gets the budget in whole milliseconds (unset: none).
func TestOpenRoomTimeout(t *testing.T) {
	if pb.MaxRoomTimeout != kvmanager.MaxRoomTimeout || pb.MinRoomTimeout != time.Millisecond {
		t.Fatalf("wire bounds %s..%s, the domain's %s..%s", pb.MinRoomTimeout, pb.MaxRoomTimeout, time.Millisecond, kvmanager.MaxRoomTimeout)
	}
	for _, c := range []struct {
		in   *durationpb.Duration
		want time.Duration
	}{
		{nil, 0},
		{durationpb.New(2 * time.Second), 2 * time.Second},
		{durationpb.New(2500*time.Millisecond + 999*time.Microsecond), 2500 * time.Millisecond},
		{durationpb.New(pb.MaxRoomTimeout), kvmanager.MaxRoomTimeout},
	} {
		if got := openFromProto(&pb.OpenRoomRequest{Timeout: c.in}).Timeout; got != c.want {
			t.Errorf("timeout %v: the domain gets %s, want %s", c.in, got, c.want)
		}
	}
}

// A room's timeout, deadline and phase times on the wire.
func TestRoomBudgetToProto(t *testing.T) {
	opened := time.Unix(1_700_000_000, 0)
	r := roomToProto(kvmanager.RoomSnapshot{OpenedAt: opened, Timeout: 2 * time.Second, Deadline: opened.Add(2 * time.Second),
		PhaseTimes: []kvmanager.PhaseTime{{Phase: kvmanager.PhaseWaitingPrefill}, {Phase: kvmanager.PhaseAdmitted, Spent: 1500 * time.Millisecond}}})
	if r.GetTimeout().AsDuration() != 2*time.Second || !r.GetDeadline().AsTime().Equal(opened.Add(2*time.Second)) {
		t.Errorf("timeout %v deadline %v", r.GetTimeout(), r.GetDeadline())
	}
	pts := r.GetPhaseTimes()
	if len(pts) != 2 || pts[0].GetPhase() != pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL || pts[0].GetSpent().AsDuration() != 0 ||
		pts[1].GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED || pts[1].GetSpent().AsDuration() != 1500*time.Millisecond {
		t.Errorf("phase times %v", pts)
	}
	if r := roomToProto(kvmanager.RoomSnapshot{OpenedAt: opened}); r.Timeout != nil || r.Deadline != nil || r.PhaseTimes != nil {
		t.Errorf("a room without a budget: timeout %v deadline %v phase times %v, want none", r.Timeout, r.Deadline, r.PhaseTimes)
	}
}
