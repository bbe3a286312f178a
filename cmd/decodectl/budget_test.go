package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestRoomBudget: decodectl room shows a room's deadline (its request's
// timeout) and the time each phase of its hand-off took, and the failure
// of a room whose prefill never claimed it within the budget, naming the
// phase.
func TestRoomBudget(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	d.register(t, prefillRank(prefillA, 1, 0)) // registered; it never claims
	if _, err := d.c.Engine().OpenRoom(t.Context(), &pb.OpenRoomRequest{
		Rid: "req-61", BootstrapAddr: prefillA, Room: 61, PromptLen: 100, MaxNewTokens: 16, Timeout: durationpb.New(300 * time.Millisecond),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.c.Engine().WaitRoom(testCtx(t), 61, pb.RoomPhase_ROOM_PHASE_FAILED); err != nil {
		t.Fatal(err)
	}
	out := d.mustCtl(t, "room", "61")
	for _, want := range []string{
		"(timeout 300ms from opening; it bounds the first attempt's hand-off)\n",
		"Phase times:  waiting_prefill ",
		", of a 300ms budget)\n",
		"Failure:      deadline_exceeded: Request 61 exceeded its deadline (timeout 300ms from OpenRoom) in KVPoll.WaitingForInput, phase admitted: the destination was not claimed by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998;",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("decodectl room 61 lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "admitted ") || !strings.Contains(out, "Deadline:") {
		t.Errorf("decodectl room 61 names neither the admitted phase's time nor the deadline:\n%s", out)
	}
}
