package server_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/decodeplane/decodeplane/internal/config"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// inFlight is a hand-off in flight that the engine re-declares at its
// resync: a 1000-token prompt in pages first..first+15, metadata row slot,
// from the prefill's DP rank 0.
func inFlight(room uint64, first, slot int32) *pb.ResyncRoom {
	dp := uint32(0)
	return &pb.ResyncRoom{Room: room, Rid: "r-inflight", PromptLen: 1000, MaxNewTokens: 16, BootstrapAddr: ownerPrefill, PrefillDpRank: &dp,
		InFlight: true, PageIndices: pagesFrom(first, 16), MetadataSlot: slot}
}

// TestEngineOwnerResyncInFlightAtTheWire: after a restart the engine
// re-declares the hand-offs it still had in flight (ResyncRoom.in_flight);
// each is FAILED at once, its pages, row and slots held draining: a
// declaration naming one is PAGE_HELD naming it; its WatchRoom ends with
// pages reusable once its prefill rank acknowledges (any attempt,
// incarnation 0); then they are accepted for a new room. The refusals of
// the call are named per room and field.
func TestEngineOwnerResyncInFlightAtTheWire(t *testing.T) {
	w := newOwnerWire(t, true, func(c *config.Config) { c.Engine.ResyncTimeout = time.Hour })
	st := w.status()
	if !strings.HasPrefix(st.GetReadiness(), "waiting for the decode engine's resync") {
		t.Fatalf("readiness = %q; want the resync wait", st.GetReadiness())
	}
	running := inFlight(5, 0, 3)
	running.InFlight = false
	running.ReqSlot = 1
	_, err := w.rooms.Resync(w.ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{running}})
	wantCode(t, "Resync of a running room in an engine-owned pool", err, codes.InvalidArgument, "rooms[0].in_flight", "nothing to adopt")
	short := inFlight(5, 0, 3)
	short.PageIndices = short.PageIndices[:15]
	_, err = w.rooms.Resync(w.ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{short}})
	wantCode(t, "Resync of a hand-off one page short", err, codes.InvalidArgument, "rooms[0].page_indices", "take 16")

	resp, err := w.rooms.Resync(w.ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{inFlight(5, 0, 3)}})
	if err != nil || resp.GetAdopted() != 1 || resp.GetPages() != 16 {
		t.Fatalf("Resync(in flight) = %v, %v; want 1 adopted, 16 pages", resp, err)
	}
	// Another hand-off naming room 5's metadata row: refused naming that
	// field and the holder; the call's earlier rooms stay.
	_, err = w.rooms.Resync(w.ctx, &pb.ResyncRequest{Rooms: []*pb.ResyncRoom{inFlight(6, 40, 4), inFlight(7, 60, 3)}})
	wantCode(t, "Resync of a hand-off naming room 5's row", err, codes.FailedPrecondition, "rooms[1].metadata_slot", "metadata slot 3 is still held by room 5")
	if md := pageHeld(err); md["what"] != "metadata slot" || md["holder"] != "5" || md["draining"] != "true" {
		t.Fatalf("PAGE_HELD metadata = %v; want metadata slot held by room 5, draining", md)
	}
	if resp, err := w.rooms.Resync(w.ctx, &pb.ResyncRequest{Done: true}); err != nil || !resp.GetAdmitting() {
		t.Fatalf("Resync(done) = %v, %v", resp, err)
	}

	r, err := w.rooms.GetRoom(w.ctx, &pb.GetRoomRequest{Room: 5})
	if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || r.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN {
		t.Fatalf("GetRoom(5) = %v, %v; want FAILED (shutdown): its claims died with the previous daemon", r, err)
	}
	if h := w.holds(); h.GetDraining() != 2 || h.GetDrainingPages() != 32 {
		t.Fatalf("holds = %v; want rooms 5 and 6 draining, 32 pages", h)
	}
	watch, err := w.rooms.WatchRoom(w.ctx, &pb.WatchRoomRequest{Room: 5})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := watch.Recv(); err != nil || ev.GetPagesReusable() {
		t.Fatalf("WatchRoom(5) first event = %v, %v; want the failed room, pages not reusable", ev, err)
	}
	w.open(10)
	_, err = w.declare(10, 8, 9)
	if md := pageHeld(err); md["holder"] != "5" || md["index"] != "8" || md["draining"] != "true" {
		t.Fatalf("declaring the inherited hand-off's page 8 = %v (%v); want PAGE_HELD by room 5, draining", err, md)
	}
	ack, err := w.rooms.AckRoomEnd(w.ctx, &pb.AckRoomEndRequest{Room: 5, Rank: prank(ownerPrefill, 0), Attempt: 3})
	if err != nil || !ack.GetOwed() || !ack.GetReleased() {
		t.Fatalf("AckRoomEnd(5, any attempt, incarnation 0) = %v, %v; want owed and released", ack, err)
	}
	ev, err := watch.Recv()
	if err != nil || !ev.GetPagesReusable() {
		t.Fatalf("WatchRoom(5) after the ack = %v, %v; want pages reusable", ev, err)
	}
	if _, err := watch.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("WatchRoom(5) after pages reusable: %v; want its end", err)
	}
	if _, err := w.declare(10, 8, 3); err != nil {
		t.Fatalf("declaring room 5's pages and row once reusable = %v", err)
	}
	if h := w.holds(); h.GetDraining() != 1 || h.GetHeld() != 2 {
		t.Fatalf("holds at the end = %v; want room 6 still draining (never acknowledged), room 10 held", h)
	}
	if _, err := w.rooms.AbortRoom(w.ctx, &pb.AbortRoomRequest{Room: 10}); err != nil {
		t.Fatal(err)
	}
}
