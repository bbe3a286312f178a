package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"google.golang.org/grpc/codes"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// OpenAndWait opens a room and watches it until its KV has landed: it
// returns the room once it is ROOM_PHASE_SUCCEEDED (the decode engine then
// owns its pages until ReleaseRoom). A room that fails is returned with a
// *RoomFailedError (errors.Is(err, ErrRoomFailed)); a refused open is
// returned as OpenRoom's *Error (code, message, RetryAfter), with a nil
// room. Bound the wait with ctx; on ctx's end the room is left as it is
// (abort it if it is no longer wanted). A deadline of ctx is sent as the
// request's timeout, less a reserve for the answer's way back
// (deadline.go): a room the daemon cannot hand off in time fails before
// ctx ends, with a *RoomFailedError whose code is
// FAILURE_CODE_DEADLINE_EXCEEDED and whose message names the phase that
// used the budget.
//
// Under TransportStreams (the default) the room travels on the Client's
// one EngineSession stream, shared by every OpenAndWait and opened at the
// first: the opens of concurrent calls are sent in batches (each room with
// its caller's trace context, so its span joins the caller's trace), and
// each call gets its room's events from the stream. When the stream ends
// (the daemon cut it as a slow consumer, restarted, or the network broke),
// the waiting calls back off under the RetryPolicy and the next attempt
// opens a new stream and resumes their rooms from the last event each saw
// (nothing twice, nothing missed). A call fails when its room cannot be
// resumed (after a daemon restart: the *IncarnationChangedError WaitRoom
// gives), when the stream's end is permanent (ErrUnauthenticated,
// ErrPermissionDenied, ...), or after MaxAttempts
// consecutive failed attempts (a daemon that is gone: ErrUnavailable). An
// open whose answer the stream's end lost is sent again only when the
// request has an idempotency key (or with WithAutoIdempotencyKey), as
// OpenRoom is retried; without one the call fails with ErrUnavailable (the
// room may be open), never opening it twice. A stream holds at most
// pb.MaxEngineSessionRooms rooms until their end: beyond, the open is
// refused with the daemon's ErrResourceExhausted. A room already waited on
// by another OpenAndWait of this Client is opened and watched on the unary
// path. Toward a daemon that does not serve EngineSession (older than the
// sessions: ErrUnimplemented), this call and those of the next minute take
// the unary path; then the session is tried again.
//
// Under TransportUnary it calls OpenRoom, then WaitRoom.
func (e *Engine) OpenAndWait(ctx context.Context, req *pb.OpenRoomRequest) (*pb.Room, error) {
	return e.OpenDeclareAndWait(ctx, req, nil)
}

// DeclareFunc is a decode engine's allocation of a room's destination when
// it owns its pages (kv_pool.owner: engine): given the room as it waits
// for its declaration (ROOM_PHASE_QUEUED: its prefill known, its DP rank
// resolved), the pages beyond the decode prefix, the metadata row and the
// state indices the engine allocated for it, as a DeclareDestinationRequest
// for that room. An error stops the call, which returns it (the room stays
// open: abort it, or declare it later).
type DeclareFunc func(ctx context.Context, room *pb.Room) (*pb.DeclareDestinationRequest, error)

// OpenDeclareAndWait is OpenAndWait for a decode engine that owns its pages
// (kv_pool.owner: engine): it opens the room, waits until the room waits
// for its destination (at once when the prefill is known; else through a
// watch of the room), asks declare for the destination the engine
// allocated, declares it (DeclareDestination, on the shared engine session
// under TransportStreams), and waits for the room's KV as OpenAndWait does.
// A room found past ROOM_PHASE_QUEUED (a retried call whose destination was
// declared) is not declared again. A refused declaration is returned as
// DeclareDestination's *Error (PageHeld tells a held page); the room stays
// open. A nil declare is OpenAndWait.
func (e *Engine) OpenDeclareAndWait(ctx context.Context, req *pb.OpenRoomRequest, declare DeclareFunc) (*pb.Room, error) {
	if e.c.transport == TransportStreams {
		return e.c.openAndWaitStream(ctx, req, declare)
	}
	return e.c.openAndWaitUnary(ctx, req, declare)
}

// openAndWaitUnary is OpenAndWait (and OpenDeclareAndWait) over OpenRoom
// and WaitRoom.
func (c *Client) openAndWaitUnary(ctx context.Context, req *pb.OpenRoomRequest, declare DeclareFunc) (*pb.Room, error) {
	resp, err := c.openRoom(ctx, req)
	if err != nil {
		return nil, err
	}
	r := resp.GetRoom()
	if r.GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		return r, nil
	}
	if err := c.declareOpened(ctx, r, declare); err != nil {
		return nil, err
	}
	return c.waitRoom(ctx, r.GetRoom(), pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
}

// declareOpened declares an opened room's destination with declare (nil:
// nothing to do): once the room waits for it (a room still bootstrapping
// is watched until it does), unless it is already past that.
func (c *Client) declareOpened(ctx context.Context, r *pb.Room, declare DeclareFunc) error {
	if declare == nil {
		return nil
	}
	switch r.GetPhase() {
	case pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK:
		var err error
		if r, err = c.waitRoom(ctx, r.GetRoom(), pb.RoomPhase_ROOM_PHASE_QUEUED); err != nil {
			return err
		}
	}
	if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
		return nil // declared already, or past it: the wait that follows tells
	}
	req, err := declare(ctx, r)
	if err != nil {
		return err
	}
	_, err = c.Engine().DeclareDestination(ctx, req)
	return err
}

// WaitRoom watches a room until it has reached one of phases (a phase it
// went through before the call counts: the watch replays the room's
// timeline) and returns its state as of that event, which may be later than
// the phase waited for. With no phases it waits for the room's end (released
// or failed). A room that fails without reaching one of phases is returned
// with a *RoomFailedError (unless ROOM_PHASE_FAILED is among phases); a room
// released first is returned with an ErrFailedPrecondition error.
func (e *Engine) WaitRoom(ctx context.Context, room uint64, phases ...pb.RoomPhase) (*pb.Room, error) {
	return e.c.waitRoom(ctx, room, phases...)
}

// waitRoom is WaitRoom, for OpenAndWait's unary path.
func (c *Client) waitRoom(ctx context.Context, room uint64, phases ...pb.RoomPhase) (*pb.Room, error) {
	w, err := c.watchRoom(ctx, &pb.WatchRoomRequest{Room: room, History: true})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	for {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) {
			// Next returns EOF only after a terminal event, handled below.
			return nil, localError("WaitRoom", codes.Internal, "room %d: the watch ended without a terminal event", room)
		}
		if err != nil {
			return nil, err
		}
		if r, done, err := waitStep(room, ev, phases); done {
			return r, err
		}
	}
}

// waitStep is what one of a room's events means to a wait for phases
// (WaitRoom's rules): done with the room when it reached one of them (or,
// with no phases, its end), done with an error when it ended without
// reaching one (a *RoomFailedError for a failure), not done otherwise.
func waitStep(room uint64, ev *pb.RoomEvent, phases []pb.RoomPhase) (r *pb.Room, done bool, err error) {
	r = ev.GetRoom()
	// The transition's phase, not the room's: replayed events carry the
	// room's current state with each past transition.
	ph := ev.GetTransition().GetPhase()
	if ev.GetTransition() == nil {
		ph = r.GetPhase()
	}
	switch {
	case slices.Contains(phases, ph):
		return r, true, nil
	case !ev.GetTerminal():
		return nil, false, nil
	case ph == pb.RoomPhase_ROOM_PHASE_FAILED:
		return r, true, roomFailed(room, r.GetFailure())
	case len(phases) == 0:
		return r, true, nil
	}
	return r, true, localError("WaitRoom", codes.FailedPrecondition, "room %d ended in %s before reaching %s", room, ph, phaseList(phases))
}

func phaseList(ps []pb.RoomPhase) string {
	if len(ps) == 1 {
		return ps[0].String()
	}
	return fmt.Sprint(ps)
}
