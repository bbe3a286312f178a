package client

import (
	"context"

	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The rank's room RPCs: BindRoom, and the steps of a hand-off
// (AwaitDestination, Transfer, ReportTransfer, AckRoomEnd) for a prefill
// that drives them itself; SendRoom and ReportRoom drive them all. Each is
// one unary RPC (or server stream) whatever the transport.

// BindRoom reports that this rank's DP group scheduled room (BindRoom,
// SGLang's POST /register_dp_rank), for prefills that do not follow
// follow_bootstrap_room. It returns whether an earlier binding was
// replaced. ErrFailedPrecondition: the binding contradicts
// follow_bootstrap_room. Retried on Unavailable.
func (p *Prefill) BindRoom(ctx context.Context, room uint64) (bool, error) {
	req := &pb.BindRoomRequest{BootstrapAddr: p.rank.GetBootstrapAddr(), Room: room, DpRank: p.rank.GetDpRank()}
	resp, err := invoke(ctx, p.c, pb.Bootstrap_BindRoom_FullMethodName, req, p.c.boot.BindRoom)
	if err != nil {
		return false, err
	}
	return resp.GetReplaced(), nil
}

// AwaitDestination claims a room for this rank and returns the stream of
// its events: the destination once the room is admitted, then the room's
// end. Errors (including the room's failure, a *RoomFailedError) come from
// Next. req.Rank, when unset, is this rank's. Set req.Incarnation to the
// daemon incarnation the rank registered with (Incarnation): a claim of an
// earlier incarnation is refused, and Next returns an
// *IncarnationChangedError. SendRoom drives the whole hand-off.
func (p *Prefill) AwaitDestination(ctx context.Context, req *pb.AwaitDestinationRequest) (*DestinationStream, error) {
	c := p.c
	req = proto.CloneOf(req)
	if req == nil {
		req = &pb.AwaitDestinationRequest{}
	}
	if req.Rank == nil {
		req.Rank = p.rank
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
// room's pages and returns when it landed. req.Rank, when unset, is this
// rank's. The rank must have received the destination first. The last
// chunk must carry aux.room_marker = room, or the room never succeeds.
// Errors: ErrAborted (the chunk failed: the room failed),
// ErrFailedPrecondition (not claimed, room terminal, pages outside the
// destination), ErrInvalidArgument. Retried on Unavailable: (room, rank,
// chunk_index) is the daemon's idempotency key, and a retry of a landed
// chunk answers duplicate=true.
func (p *Prefill) Transfer(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	if req.GetRank() == nil {
		req = proto.CloneOf(req)
		if req == nil {
			req = &pb.TransferRequest{}
		}
		req.Rank = p.rank
	}
	return invoke(ctx, p.c, pb.Rooms_Transfer_FullMethodName, req, p.c.rooms.Transfer)
}

// ReportTransfer records a chunk the prefill moved itself, or its failure
// (which fails the room). req.Rank, when unset, is this rank's. Same
// errors and idempotency key as Transfer. Retried on Unavailable.
func (p *Prefill) ReportTransfer(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	if req.GetRank() == nil {
		req = proto.CloneOf(req)
		if req == nil {
			req = &pb.ReportTransferRequest{}
		}
		req.Rank = p.rank
	}
	return invoke(ctx, p.c, pb.Rooms_ReportTransfer_FullMethodName, req, p.c.rooms.ReportTransfer)
}

// AckRoomEnd tells the daemon that this rank will write nothing more into
// dest (the room's destination of one generation): the daemon's deferred
// release returns the room's pages once every rank that owed it acked. An
// ack from a rank that owes none is accepted as a no-op (Owed false).
// Retried on Unavailable.
func (p *Prefill) AckRoomEnd(ctx context.Context, room uint64, dest *pb.Destination) (*pb.AckRoomEndResponse, error) {
	return invoke(ctx, p.c, pb.Rooms_AckRoomEnd_FullMethodName, &pb.AckRoomEndRequest{
		Room: room, Rank: p.rank, Attempt: dest.GetAttempt(), Incarnation: dest.GetIncarnation(),
	}, p.c.rooms.AckRoomEnd)
}
