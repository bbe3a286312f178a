package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/transfer"
)

type roomsService struct {
	pb.UnimplementedRoomsServer
	s *Server
	m *kvmanager.Manager
}

var _ pb.RoomsServer = (*roomsService)(nil)

func (h *roomsService) err(ctx context.Context, err error) error { return toStatus(ctx, h.s.log, err) }

func (h *roomsService) OpenRoom(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	snap, existing, err := h.m.OpenRoom(ctx, openFromProto(req))
	if err != nil {
		return nil, h.err(ctx, err)
	}
	b := &openRoomBlock{}
	b.room.fill(snap)
	b.resp = pb.OpenRoomResponse{Room: &b.room.room, Existing: existing}
	return &b.resp, nil
}

func (h *roomsService) AwaitDestination(req *pb.AwaitDestinationRequest, stream grpc.ServerStreamingServer[pb.DestinationEvent]) error {
	ctx := stream.Context()
	c, err := h.m.AwaitDestination(req.GetRoom(), rankFromProto(req.GetRank()))
	if err != nil {
		return h.err(ctx, err)
	}
	defer c.Close()
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return nil
			}
			if ev.Refused != nil {
				// Refused when the room opened (the claim came first): the
				// status AwaitDestination gives an open room's refusal.
				return h.err(ctx, ev.Refused)
			}
			if err := stream.Send(destinationEventToProto(ev, h.s.deps.Incarnation)); err != nil {
				return err
			}
			if ev.Destination != nil {
				c.Delivered(ev.Destination)
			}
			if ev.Failure != nil || ev.Done != nil {
				return nil
			}
		case <-ctx.Done():
			return contextStatus(ctx.Err())
		}
	}
}

func (h *roomsService) Transfer(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	res, dup, err := h.m.Transfer(ctx, chunkFromTransfer(req))
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return h.transferResponse(req.GetRoom(), res, dup), nil
}

// transferAsync is Transfer without waiting for the chunk to land: the
// chunk is checked and registered with its room before transferAsync
// returns (so the chunks of one caller are registered in its order), and
// done gets Transfer's answer once (kvmanager.Manager.TransferAsync).
func (h *roomsService) transferAsync(ctx context.Context, req *pb.TransferRequest, done func(*pb.TransferResponse, error)) {
	h.m.TransferAsync(ctx, chunkFromTransfer(req), func(res transfer.ChunkResult, dup bool, err error) {
		if err != nil {
			done(nil, h.err(ctx, err))
			return
		}
		done(h.transferResponse(req.GetRoom(), res, dup), nil)
	})
}

// transferResponse is a landed chunk's answer, with its room's poll now.
func (h *roomsService) transferResponse(room uint64, res transfer.ChunkResult, dup bool) *pb.TransferResponse {
	b := &transferBlock{}
	b.d.Seconds, b.d.Nanos = durationParts(res.Duration)
	b.resp = pb.TransferResponse{Bytes: uint64(res.Bytes), Duration: &b.d, Poll: pollToProto(h.m.Poll(room)), Duplicate: dup}
	return &b.resp
}

// contextStatus is status.FromContextError(err).Err(), made once for the
// two context errors: a watch or claim stream the client cancels (as the
// decode engine does once its room succeeded) ends without allocating.
func contextStatus(err error) error {
	switch err {
	case context.Canceled:
		return errCanceled
	case context.DeadlineExceeded:
		return errDeadline
	}
	return status.FromContextError(err).Err()
}

var (
	errCanceled = status.FromContextError(context.Canceled).Err()
	errDeadline = status.FromContextError(context.DeadlineExceeded).Err()
)

// openRoomBlock is an OpenRoom answer in one allocation (convert.go).
type openRoomBlock struct {
	resp pb.OpenRoomResponse
	room roomBlock
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

func (h *roomsService) ReportTransfer(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	poll, dup, err := h.m.ReportTransfer(chunkFromReport(req))
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return &pb.ReportTransferResponse{Poll: pollToProto(poll), Duplicate: dup}, nil
}

func (h *roomsService) WatchRoom(req *pb.WatchRoomRequest, stream grpc.ServerStreamingServer[pb.RoomEvent]) error {
	ctx := stream.Context()
	w, err := h.m.Watch(req.GetRoom(), req.GetHistory())
	if err != nil {
		return h.err(ctx, err)
	}
	defer w.Close()
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return h.err(ctx, w.Err())
			}
			if err := stream.Send(roomEventToProto(ev, h.s.deps.Incarnation)); err != nil {
				return err
			}
			if ev.Terminal {
				return nil
			}
		case <-ctx.Done():
			return contextStatus(ctx.Err())
		}
	}
}

func (h *roomsService) GetRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.Room, error) {
	snap, err := h.m.GetRoom(req.GetRoom(), req.GetIncludePages())
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return roomToProto(snap), nil
}

func (h *roomsService) AbortRoom(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	snap, already, err := h.m.AbortRoom(req.GetRoom(), req.GetReason())
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return &pb.AbortRoomResponse{Room: roomToProto(snap), AlreadyTerminal: already}, nil
}

func (h *roomsService) ReleaseRoom(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	pages, already, err := h.m.ReleaseRoom(req.GetRoom())
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return &pb.ReleaseRoomResponse{PagesReleased: uint32(pages), AlreadyReleased: already}, nil
}

// defaultListLimit caps ListRooms when the request sets no limit.
const defaultListLimit = 1000

func (h *roomsService) ListRooms(ctx context.Context, req *pb.ListRoomsRequest) (*pb.ListRoomsResponse, error) {
	f := kvmanager.ListFilter{Addr: req.GetBootstrapAddr(), LiveOnly: req.GetLiveOnly(), Limit: int(req.GetLimit()), NewestFirst: req.GetNewestFirst()}
	if f.Limit == 0 {
		f.Limit = defaultListLimit
	}
	for _, p := range req.GetPhases() {
		f.Phases = append(f.Phases, phaseFromProto(p))
	}
	rooms, total := h.m.ListRooms(f)
	out := &pb.ListRoomsResponse{Total: uint32(total)}
	for _, r := range rooms {
		out.Rooms = append(out.Rooms, roomToProto(r))
	}
	return out, nil
}

func (h *roomsService) ReportRunning(ctx context.Context, req *pb.ReportRunningRequest) (*pb.ReportRunningResponse, error) {
	usage := make([]kvmanager.Usage, len(req.GetRooms()))
	for i, u := range req.GetRooms() {
		usage[i] = kvmanager.Usage{Room: u.GetRoom(), OutputLen: int(u.GetOutputLen())}
	}
	grown, noCap, notRunning := h.m.ReportRunning(usage)
	if len(notRunning) > 0 && len(notRunning) == len(usage) {
		return nil, h.err(ctx, &kvmanager.InvalidError{Field: "rooms", Msg: "no listed room is running (succeeded and not released)"})
	}
	out := &pb.ReportRunningResponse{NoCapacity: noCap}
	for _, g := range grown {
		out.Grown = append(out.Grown, &pb.GrownPages{Room: g.Room, NewPageIndices: g.NewPages})
	}
	if len(noCap) > 0 {
		out.RetryAfter = durationpb.New(defaultRetryAfter)
	}
	return out, nil
}

func (h *roomsService) RetractRoom(ctx context.Context, req *pb.RetractRoomRequest) (*pb.RetractRoomResponse, error) {
	mode := kvmanager.RetractCPU
	if req.GetMode() == pb.RetractMode_RETRACT_MODE_REBOOTSTRAP {
		mode = kvmanager.RetractRebootstrap
	}
	snap, err := h.m.RetractRoom(req.GetRoom(), mode)
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return &pb.RetractRoomResponse{Room: roomToProto(snap)}, nil
}

func (h *roomsService) ContinueGeneration(ctx context.Context, _ *pb.ContinueGenerationRequest) (*pb.ContinueGenerationResponse, error) {
	return continueGenerationToProto(h.m.ContinueGenerationResumed(ctx)), nil
}
