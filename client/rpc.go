package client

import (
	"context"
	"crypto/rand"

	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// This file has one method per RPC. Each takes the generated request (so that
// fields added to the API need no new signature), runs the call under the
// retry policy of its row in retryTable, and returns the generated answer or
// an *Error.

// ---- Admin ----

// Status returns the daemon's version, readiness, effective configuration
// and a summary of rooms, shards (the page ledgers) and prefills.
// Retried on Unavailable.
func (c *Client) Status(ctx context.Context) (*pb.GetStatusResponse, error) {
	return invoke(ctx, c, pb.Admin_GetStatus_FullMethodName, &pb.GetStatusRequest{}, c.admin.GetStatus)
}

// Drain stops the daemon admitting rooms (OpenRoom then fails with
// ErrUnavailable) and flips its health to NOT_SERVING; rooms in flight
// finish. Idempotent on the daemon, but never retried automatically.
// Needs the token when the daemon has one.
func (c *Client) Drain(ctx context.Context) (*pb.DrainResponse, error) {
	return invoke(ctx, c, pb.Admin_Drain_FullMethodName, &pb.DrainRequest{}, c.admin.Drain)
}

// ---- Bootstrap (prefill side, and LookupDPRanks for the decode side) ----

// RegisterPrefill registers one prefill rank (SGLang's PUT /route) and
// returns the decode layout, the rank mapping and the heartbeat interval.
// Errors: ErrInvalidArgument (a field, named), ErrFailedPrecondition (page
// size or KV dtype mismatch, with SGLang's message; parallel sizes that
// contradict the instance's other ranks), ErrUnauthenticated. Retried on
// Unavailable. Prefill.Register wraps it.
func (c *Client) RegisterPrefill(ctx context.Context, req *pb.RegisterPrefillRequest) (*pb.RegisterPrefillResponse, error) {
	return invoke(ctx, c, pb.Bootstrap_RegisterPrefill_FullMethodName, req, c.boot.RegisterPrefill)
}

// Heartbeat keeps a registered prefill rank alive. ErrNotFound means the
// rank is not registered (or was declared dead): register again.
// Prefill.RunHeartbeat does both. Retried on Unavailable.
func (c *Client) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	return invoke(ctx, c, pb.Bootstrap_Heartbeat_FullMethodName, req, c.boot.Heartbeat)
}

// BindRoom records which prefill DP rank scheduled a room (SGLang's
// POST /register_dp_rank). ErrFailedPrecondition: the binding contradicts
// follow_bootstrap_room. Retried on Unavailable.
func (c *Client) BindRoom(ctx context.Context, req *pb.BindRoomRequest) (*pb.BindRoomResponse, error) {
	return invoke(ctx, c, pb.Bootstrap_BindRoom_FullMethodName, req, c.boot.BindRoom)
}

// LookupDPRanks resolves rooms to prefill DP ranks, in SGLang's order;
// rooms it cannot resolve are listed as unresolved. Retried on Unavailable.
func (c *Client) LookupDPRanks(ctx context.Context, req *pb.LookupDPRanksRequest) (*pb.LookupDPRanksResponse, error) {
	return invoke(ctx, c, pb.Bootstrap_LookupDPRanks_FullMethodName, req, c.boot.LookupDPRanks)
}

// ---- Rooms, prefill side ----

// AwaitDestination claims a room for a prefill rank and returns the stream
// of its events: the destination once the room is admitted, then the room's
// end. Errors (including the room's failure, a *RoomFailedError) come from
// Next. Set req.Incarnation to the daemon incarnation the rank registered
// with: a claim of an earlier incarnation is refused, and Next returns an
// *IncarnationChangedError. Prefill.SendRoom drives the whole hand-off.
func (c *Client) AwaitDestination(ctx context.Context, req *pb.AwaitDestinationRequest) (*DestinationStream, error) {
	req = proto.CloneOf(req)
	if req == nil {
		req = &pb.AwaitDestinationRequest{}
	}
	s, err := openResumable(ctx, c, pb.Rooms_AwaitDestination_FullMethodName, req,
		func(ctx context.Context, _ bool) (serverStream[pb.DestinationEvent], error) {
			return c.rooms.AwaitDestination(ctx, req, c.callOpts...)
		})
	if err != nil {
		return nil, err
	}
	return &DestinationStream{s: s, room: req.GetRoom(), inc: req.GetIncarnation()}, nil
}

// Transfer asks the daemon's transfer engine to move one chunk into the
// room's pages and returns when it landed. The rank must have received the
// destination first. The last chunk must carry aux.room_marker = room, or the
// room never succeeds. Errors: ErrAborted (the chunk failed: the room failed),
// ErrFailedPrecondition (not claimed, room terminal, pages outside the
// destination), ErrInvalidArgument. Retried on Unavailable: (room, rank,
// chunk_index) is the daemon's idempotency key, and a retry of a landed
// chunk answers duplicate=true.
func (c *Client) Transfer(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	return invoke(ctx, c, pb.Rooms_Transfer_FullMethodName, req, c.rooms.Transfer)
}

// ReportTransfer records a chunk the prefill moved itself, or its failure
// (which fails the room). Same errors and idempotency key as Transfer.
// Retried on Unavailable.
func (c *Client) ReportTransfer(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	return invoke(ctx, c, pb.Rooms_ReportTransfer_FullMethodName, req, c.rooms.ReportTransfer)
}

// ---- Rooms, decode side ----

// OpenRoom admits a request to the decode side and returns at once with the
// room's state; OpenAndWait also waits for the KV. Errors:
// ErrInvalidArgument (a field, named; a request that can never fit),
// ErrAlreadyExists, ErrResourceExhausted (admission queue full; see
// RetryAfter), ErrUnavailable (draining). Retried on Unavailable only when
// the request has an idempotency key (see WithAutoIdempotencyKey); the
// answer's Existing then says whether an earlier attempt opened the room.
func (c *Client) OpenRoom(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	if c.autoKey && req.GetIdempotencyKey() == "" {
		if req == nil {
			req = &pb.OpenRoomRequest{}
		} else {
			req = proto.CloneOf(req)
		}
		req.IdempotencyKey = "auto-" + rand.Text()
	}
	return invoke(ctx, c, pb.Rooms_OpenRoom_FullMethodName, req, c.rooms.OpenRoom)
}

// WatchRoom streams a room's transitions: its current state first (and every
// earlier transition when req.History is set), then each transition until
// the room is terminal. A broken stream is re-opened and transitions already
// returned are not returned again. ErrNotFound comes from Next.
func (c *Client) WatchRoom(ctx context.Context, req *pb.WatchRoomRequest) (*RoomWatch, error) {
	req = proto.CloneOf(req)
	if req == nil {
		req = &pb.WatchRoomRequest{}
	}
	s, err := openResumable(ctx, c, pb.Rooms_WatchRoom_FullMethodName, req,
		func(ctx context.Context, reopen bool) (serverStream[pb.RoomEvent], error) {
			r := req
			if reopen {
				// Ask for the whole timeline: Next skips what it already
				// returned and so misses nothing that happened meanwhile.
				r = proto.CloneOf(req)
				r.History = true
			}
			return c.rooms.WatchRoom(ctx, r, c.callOpts...)
		})
	if err != nil {
		return nil, err
	}
	return &RoomWatch{s: s, c: c, ctx: ctx, room: req.GetRoom()}, nil
}

// GetRoom returns a room's state and timeline (and its pages when
// req.IncludePages is set). ErrNotFound for an unknown room. Retried on
// Unavailable.
func (c *Client) GetRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.Room, error) {
	return invoke(ctx, c, pb.Rooms_GetRoom_FullMethodName, req, c.rooms.GetRoom)
}

// ListRooms lists live and recently finished rooms, filtered by req.
// Retried on Unavailable.
func (c *Client) ListRooms(ctx context.Context, req *pb.ListRoomsRequest) (*pb.ListRoomsResponse, error) {
	return invoke(ctx, c, pb.Rooms_ListRooms_FullMethodName, req, c.rooms.ListRooms)
}

// AbortRoom fails a room in any phase with "Aborted by AbortReq." (or
// req.Reason) and returns its resources; aborting a finished room is OK
// (AlreadyTerminal). ErrNotFound for an unknown room. Retried on
// Unavailable.
//
// Under TransportStreams it rides OpenAndWait's shared engine session when
// one is up (engine_ops.go), with the same answers.
func (c *Client) AbortRoom(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	if resp, ok, err := c.abortOnSession(ctx, req); ok {
		return resp, err
	}
	return invoke(ctx, c, pb.Rooms_AbortRoom_FullMethodName, req, c.rooms.AbortRoom)
}

// ReleaseRoom hands a successful room's pages and slots back; idempotent
// (AlreadyReleased). ErrFailedPrecondition: the room has not succeeded (abort
// it instead). Retried on Unavailable.
//
// Under TransportStreams it rides OpenAndWait's shared engine session when
// one is up (engine_ops.go), with the same answers.
func (c *Client) ReleaseRoom(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	if resp, ok, err := c.releaseOnSession(ctx, req); ok {
		return resp, err
	}
	return invoke(ctx, c, pb.Rooms_ReleaseRoom_FullMethodName, req, c.rooms.ReleaseRoom)
}

// ReportRunning reports running rooms' output lengths; the ledger grows
// their allocations and returns the new pages, and lists the rooms that
// could not grow. Never retried automatically: report absolute lengths
// again on the engine's next step instead.
func (c *Client) ReportRunning(ctx context.Context, req *pb.ReportRunningRequest) (*pb.ReportRunningResponse, error) {
	return invoke(ctx, c, pb.Rooms_ReportRunning_FullMethodName, req, c.rooms.ReportRunning)
}

// RetractRoom takes a running room's pages back (RETRACT: the engine keeps
// a CPU copy; REBOOTSTRAP: held until ContinueGeneration).
// ErrFailedPrecondition: the room is not running. Never retried
// automatically.
func (c *Client) RetractRoom(ctx context.Context, req *pb.RetractRoomRequest) (*pb.RetractRoomResponse, error) {
	return invoke(ctx, c, pb.Rooms_RetractRoom_FullMethodName, req, c.rooms.RetractRoom)
}

// ContinueGeneration re-enqueues every held (REBOOTSTRAP) room and returns
// their ids. Never retried automatically.
func (c *Client) ContinueGeneration(ctx context.Context) ([]uint64, error) {
	resp, err := invoke(ctx, c, pb.Rooms_ContinueGeneration_FullMethodName, &pb.ContinueGenerationRequest{}, c.rooms.ContinueGeneration)
	if err != nil {
		return nil, err
	}
	return resp.GetRooms(), nil
}
