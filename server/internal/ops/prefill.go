package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/transfer"
)

// Rooms, a prefill rank's side: claims (AwaitDestination), chunks
// (Transfer), reports and acknowledgements, with the session forms of the
// first two (a claim's events to a sink, a chunk without waiting).

// ReasonStaleAttempt is the ErrorInfo reason of an AckRoomEnd that names an
// attempt other than the room's current one.
const ReasonStaleAttempt = "STALE_ATTEMPT"

// prefillRooms are a prefill rank's room ops.
type prefillRooms struct {
	t *Table
	m PrefillRooms
}

func (p *prefillRooms) awaitDestination(ctx context.Context, req *pb.AwaitDestinationRequest, send func(*pb.DestinationEvent) error) error {
	c, err := p.m.AwaitDestination(req.GetRoom(), rankFromProto(req.GetRank()))
	if err != nil {
		return p.t.status(ctx, err)
	}
	defer c.Close()
	inc := p.t.cfg.Incarnation
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return nil
			}
			if ev.Refused != nil {
				// Refused when the room opened (the claim came first): the
				// status AwaitDestination gives an open room's refusal.
				return p.t.status(ctx, ev.Refused)
			}
			if err := send(destinationEventToProto(ev, inc)); err != nil {
				return err
			}
			if ev.Destination != nil {
				c.Delivered(ev.Destination)
			}
			if ev.Failure != nil || ev.Done != nil {
				return nil
			}
		case <-ctx.Done():
			return ContextStatus(ctx.Err())
		}
	}
}

// AwaitDestinationFunc is AwaitDestination for a multiplexed session
// (PrefillSession's claim): the claim's events go to sink
// (kvmanager.ClaimSink: under a lock, in order; a claim refused at once is
// given its refusal, then refused here). Call Delivered once a
// destination was written, Close once the claim's end was (or the session
// ended). Errors are statuses.
func (t *Table) AwaitDestinationFunc(ctx context.Context, req *pb.AwaitDestinationRequest, sink kvmanager.ClaimSink) (*kvmanager.Claim, error) {
	c, err := t.prefill.m.AwaitDestinationFunc(req.GetRoom(), rankFromProto(req.GetRank()), sink)
	if err != nil {
		return nil, t.status(ctx, err)
	}
	return c, nil
}

// OfferRooms subscribes a session's rank to the rooms this daemon holds
// for it (PrefillSession's offers, kvmanager.Manager.OfferRooms): sink
// makes each offered claim's sink; stop ends the subscription.
func (t *Table) OfferRooms(rank *pb.PrefillRank, sink kvmanager.OfferSink) (stop func()) {
	return t.prefill.m.OfferRooms(rankFromProto(rank), sink)
}

func (p *prefillRooms) transfer(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	res, dup, err := p.m.Transfer(ctx, chunkFromTransfer(req))
	if err != nil {
		return nil, p.t.status(ctx, err)
	}
	return p.transferResponse(req.GetRoom(), res, dup), nil
}

// TransferAsync is Transfer without waiting for the chunk to land (a
// session's chunk): the chunk is checked and registered with its room
// before TransferAsync returns, so the chunks of one caller are
// registered in its order (a last chunk is checked against those before
// it, landed or in flight), and done gets Transfer's answer once, when
// the chunk landed (kvmanager.Manager.TransferAsync). done must not block.
func (t *Table) TransferAsync(ctx context.Context, req *pb.TransferRequest, done func(*pb.TransferResponse, error)) {
	p := &t.prefill
	p.m.TransferAsync(ctx, chunkFromTransfer(req), func(res transfer.ChunkResult, dup bool, err error) {
		if err != nil {
			done(nil, t.status(ctx, err))
			return
		}
		done(p.transferResponse(req.GetRoom(), res, dup), nil)
	})
}

// transferResponse is a landed chunk's answer, with its room's poll now.
func (p *prefillRooms) transferResponse(room uint64, res transfer.ChunkResult, dup bool) *pb.TransferResponse {
	b := &transferBlock{}
	b.d.Seconds, b.d.Nanos = durationParts(res.Duration)
	b.resp = pb.TransferResponse{Bytes: uint64(res.Bytes), Duration: &b.d, Poll: pollToProto(p.m.Poll(room)), Duplicate: dup}
	return &b.resp
}

// transferBlock is a Transfer answer and its duration.
type transferBlock struct {
	resp pb.TransferResponse
	d    durationpb.Duration
}

// durationParts is durationpb.New(d)'s seconds and nanoseconds.
func durationParts(d time.Duration) (int64, int32) {
	nanos := d.Nanoseconds()
	return nanos / 1e9, int32(nanos % 1e9)
}

func (p *prefillRooms) reportTransfer(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	poll, dup, err := p.m.ReportTransfer(chunkFromReport(req))
	if err != nil {
		return nil, p.t.status(ctx, err)
	}
	return &pb.ReportTransferResponse{Poll: pollToProto(poll), Duplicate: dup}, nil
}

// ackRoomEnd is a prefill rank's acknowledgement that it stopped writing
// into a room's destination (kvmanager.Manager.AckRoomEnd). The
// incarnation is checked by the op's Check; the attempt here.
func (p *prefillRooms) ackRoomEnd(ctx context.Context, req *pb.AckRoomEndRequest) (*pb.AckRoomEndResponse, error) {
	res, err := p.m.AckRoomEnd(req.GetRoom(), rankFromProto(req.GetRank()), req.GetAttempt())
	if errors.Is(err, kvmanager.ErrStaleAttempt) {
		st := status.New(codes.FailedPrecondition, fmt.Sprintf("%v: the acknowledgement is for an earlier generation of the room and changes nothing", err))
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonStaleAttempt, Domain: ErrorDomain}); derr == nil {
			st = d
		}
		return nil, st.Err()
	}
	if err != nil {
		return nil, p.t.status(ctx, err)
	}
	return &pb.AckRoomEndResponse{Owed: res.Owed, Remaining: uint32(res.Remaining), Released: res.Released}, nil
}

// DestinationEventProto is a claim's event on the wire (the daemon's
// incarnation in every destination).
func (t *Table) DestinationEventProto(ev kvmanager.DestinationEvent) *pb.DestinationEvent {
	return destinationEventToProto(ev, t.cfg.Incarnation)
}

// RoomEventProto is a watched room's event on the wire.
func (t *Table) RoomEventProto(ev kvmanager.RoomEvent) *pb.RoomEvent {
	return roomEventToProto(ev, t.cfg.Incarnation)
}
