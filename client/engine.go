package client

import (
	"context"
	"crypto/rand"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Engine is the decode engine's view of a daemon (Client.Engine): it opens
// rooms and waits for their KV (OpenAndWait, or OpenRoom then WaitRoom or
// WatchRoom), releases or aborts them, reports its running rooms'
// lengths, retracts and resumes rooms, and re-declares its rooms after a
// daemon restart (Resync). An engine that allocates its own pages
// (kv_pool.owner: engine) declares each room's destination
// (DeclareDestination), reports its capacity (ReportCapacity) and
// registers its buffer layout (RegisterEngineLayout).
// LookupDPRanks resolves rooms to prefill DP ranks. It holds no connection of its own: OpenAndWait's shared
// EngineSession stream, like every call, belongs to its Client, whose
// transport, retry policy, token and Close apply.
//
// The methods named after an RPC are that RPC: each takes the generated
// request (so that fields added to the API need no new signature), runs the
// call under the retry policy of its row in retryTable, and returns the
// generated answer or an *Error. OpenAndWait, WaitRoom and Resync are
// helpers over them.
type Engine struct {
	c *Client
}

// OpenRoom admits a request to the decode side and returns at once with the
// room's state; OpenAndWait also waits for the KV. Errors:
// ErrInvalidArgument (a field, named; a request that can never fit),
// ErrAlreadyExists, ErrResourceExhausted (admission queue full; see
// RetryAfter), ErrUnavailable (draining). Retried on Unavailable only when
// the request has an idempotency key (see WithAutoIdempotencyKey); the
// answer's Existing then says whether an earlier attempt opened the room.
// It is a unary call whatever the transport. A deadline of ctx is sent as
// the request's timeout (deadline.go): the daemon fails the room when it
// passes, naming the phase that used it.
func (e *Engine) OpenRoom(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	return e.c.openRoom(ctx, req)
}

// openRoom is OpenRoom, for OpenAndWait's unary path.
func (c *Client) openRoom(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	if c.autoKey && req.GetIdempotencyKey() == "" {
		if req == nil {
			req = &pb.OpenRoomRequest{}
		} else {
			req = proto.CloneOf(req)
		}
		req.IdempotencyKey = "auto-" + rand.Text()
	}
	return invoke(ctx, c, pb.Rooms_OpenRoom_FullMethodName, req,
		func(ctx context.Context, r *pb.OpenRoomRequest, opts ...grpc.CallOption) (*pb.OpenRoomResponse, error) {
			return c.rooms.OpenRoom(ctx, withDeadline(ctx, r), opts...) // what the deadline leaves at each attempt
		})
}

// WatchRoom streams a room's transitions: its current state first (and every
// earlier transition when req.History is set), then each transition until
// the room is terminal. A broken stream is re-opened and transitions already
// returned are not returned again. ErrNotFound comes from Next.
func (e *Engine) WatchRoom(ctx context.Context, req *pb.WatchRoomRequest) (*RoomWatch, error) {
	return e.c.watchRoom(ctx, req)
}

// watchRoom is WatchRoom, for WaitRoom.
func (c *Client) watchRoom(ctx context.Context, req *pb.WatchRoomRequest) (*RoomWatch, error) {
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

// AbortRoom fails a room in any phase with "Aborted by AbortReq." (or
// req.Reason) and returns its resources; aborting a finished room is OK
// (AlreadyTerminal). ErrNotFound for an unknown room. Retried on
// Unavailable.
//
// Under TransportStreams it rides OpenAndWait's shared engine session when
// one is up (engine_ops.go), with the same answers.
func (e *Engine) AbortRoom(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	c := e.c
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
func (e *Engine) ReleaseRoom(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	c := e.c
	if resp, ok, err := c.releaseOnSession(ctx, req); ok {
		return resp, err
	}
	return invoke(ctx, c, pb.Rooms_ReleaseRoom_FullMethodName, req, c.rooms.ReleaseRoom)
}

// ReportRunning reports running rooms' output lengths; the ledger grows
// their allocations and returns the new pages, and lists the rooms that
// could not grow. Never retried automatically: report absolute lengths
// again on the engine's next step instead.
func (e *Engine) ReportRunning(ctx context.Context, req *pb.ReportRunningRequest) (*pb.ReportRunningResponse, error) {
	return invoke(ctx, e.c, pb.Rooms_ReportRunning_FullMethodName, req, e.c.rooms.ReportRunning)
}

// RetractRoom takes a running room's pages back (RETRACT: the engine keeps
// a CPU copy; REBOOTSTRAP: held until ContinueGeneration).
// ErrFailedPrecondition: the room is not running. Never retried
// automatically.
func (e *Engine) RetractRoom(ctx context.Context, req *pb.RetractRoomRequest) (*pb.RetractRoomResponse, error) {
	return invoke(ctx, e.c, pb.Rooms_RetractRoom_FullMethodName, req, e.c.rooms.RetractRoom)
}

// ContinueGeneration re-enqueues every held (REBOOTSTRAP) room. The answer
// lists their ids (Rooms) and, per room, what the decode engine needs to
// request its prefill's recompute (Resumed): the prefill's generate_url
// (http://host:prefill_http_port/generate) and the prefill DP rank the
// room is pinned to. The daemon does not have the prompt; the engine POSTs
// it there. Never retried automatically.
func (e *Engine) ContinueGeneration(ctx context.Context) (*pb.ContinueGenerationResponse, error) {
	return invoke(ctx, e.c, pb.Rooms_ContinueGeneration_FullMethodName, &pb.ContinueGenerationRequest{}, e.c.rooms.ContinueGeneration)
}

// Resync re-declares, after a daemon restart, the rooms the decode engine
// still runs (Rooms.Resync): the rooms go in calls of at most
// pb.MaxResyncRooms, the last with done, after which the daemon admits. It
// returns the daemon's last answer. A call refused part-way (the error
// names rooms[i] of that call) stops Resync; the rooms of earlier calls,
// and those before i, stay adopted. ErrFailedPrecondition: admission has
// already started (no engine.resync_timeout, done already sent, or the
// wait expired), or a page or slot is held by another declared room.
// Never retried automatically.
func (e *Engine) Resync(ctx context.Context, rooms []*pb.ResyncRoom) (*pb.ResyncResponse, error) {
	c := e.c
	for start := 0; ; start += pb.MaxResyncRooms {
		end := min(start+pb.MaxResyncRooms, len(rooms))
		req := &pb.ResyncRequest{Rooms: rooms[start:end], Done: end == len(rooms)}
		resp, err := invoke(ctx, c, pb.Rooms_Resync_FullMethodName, req, c.rooms.Resync)
		if err != nil {
			return nil, fmt.Errorf("resync rooms %d..%d of %d: %w", start, end, len(rooms), err)
		}
		if req.Done {
			return resp, nil
		}
	}
}

// DeclareDestination declares the destination the decode engine allocated
// for a room when the engine owns its pages (kv_pool.owner: engine): its
// pages beyond the decode prefix in token order, its metadata row, its
// state indices and the decode prefix's length. The room, which waited in
// ROOM_PHASE_QUEUED, is admitted into them. ErrFailedPrecondition: the
// daemon owns the pages, the room does not wait for a destination, or a
// page, row or slot is still held by another room's hand-off (PageHeld
// reports it, with the index and the holder, which the message names too:
// reuse that page only once the holder's WatchRoom says its pages are
// reusable). ErrInvalidArgument names the field. A repeated declaration
// answers Already; retried on Unavailable.
//
// Under TransportStreams it rides OpenAndWait's shared engine session when
// one is up (engine_ops.go), with the same answers.
func (e *Engine) DeclareDestination(ctx context.Context, req *pb.DeclareDestinationRequest) (*pb.DeclareDestinationResponse, error) {
	c := e.c
	if resp, ok, err := c.declareOnSession(ctx, req); ok {
		return resp, err
	}
	return invoke(ctx, c, pb.Rooms_DeclareDestination_FullMethodName, req, c.rooms.DeclareDestination)
}

// RegisterEngineLayout registers the buffers the decode engine keeps one
// decode rank's rooms in, when it owns its pages (kv_pool.owner: engine):
// per layer its K and V buffers with their item lengths, its aux buffers
// with their row lengths and the marker column, its state buffers, and
// where each one's bytes live (pb.EngineLayout). Register every TP rank's
// layout of a decode DP shard before declaring a destination there. The
// answer's LayoutId names it in destinations; the same layout again
// answers Already. ErrInvalidArgument names the field (a buffer missing or
// of the wrong size for kv_pool); ErrFailedPrecondition: the daemon owns
// the pages, staging is on, a different layout while hand-offs of the shard
// hold pages, or the transfer agent refused the buffers (its reason in the
// message); ErrUnavailable: the agent is unreachable. Retried on
// Unavailable.
func (e *Engine) RegisterEngineLayout(ctx context.Context, req *pb.RegisterEngineLayoutRequest) (*pb.RegisterEngineLayoutResponse, error) {
	return invoke(ctx, e.c, pb.Rooms_RegisterEngineLayout_FullMethodName, req, e.c.rooms.RegisterEngineLayout)
}

// ReportCapacity reports what the decode engine has free on one decode DP
// shard when it owns its pages (kv_pool.owner: engine): the figures
// routers then read from the daemon (WatchCapacity, the etcd capacity
// record, metrics). Each report replaces the last; send one per scheduler
// step or on change. ErrFailedPrecondition: the daemon owns the pages.
// Retried on Unavailable.
func (e *Engine) ReportCapacity(ctx context.Context, req *pb.ReportCapacityRequest) (*pb.ReportCapacityResponse, error) {
	return invoke(ctx, e.c, pb.Capacity_ReportCapacity_FullMethodName, req, e.c.capacity.ReportCapacity)
}

// LookupDPRanks resolves rooms to prefill DP ranks, in SGLang's order;
// rooms it cannot resolve are listed as unresolved. Retried on Unavailable.
func (e *Engine) LookupDPRanks(ctx context.Context, req *pb.LookupDPRanksRequest) (*pb.LookupDPRanksResponse, error) {
	return invoke(ctx, e.c, pb.Bootstrap_LookupDPRanks_FullMethodName, req, e.c.boot.LookupDPRanks)
}
