package ops

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Rooms, the decode engine's side: open, release, abort, retract, report
// running, continue, resync; and the reads: get, list, watch.

// engineRooms are the decode engine's room ops.
type engineRooms struct {
	t *Table
	m EngineRooms
}

func (e *engineRooms) openRoom(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	snap, existing, err := e.m.OpenRoom(ctx, openFromProto(req))
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	b := &openRoomBlock{}
	b.room.fill(snap)
	b.resp = pb.OpenRoomResponse{Room: &b.room.room, Existing: existing}
	return &b.resp, nil
}

// openRoomBlock is an OpenRoom answer in one allocation (convert.go).
type openRoomBlock struct {
	resp pb.OpenRoomResponse
	room roomBlock
}

func (e *engineRooms) releaseRoom(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	pages, already, err := e.m.ReleaseRoom(req.GetRoom())
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	return &pb.ReleaseRoomResponse{PagesReleased: uint32(pages), AlreadyReleased: already}, nil
}

func (e *engineRooms) abortRoom(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	snap, already, err := e.m.AbortRoom(req.GetRoom(), req.GetReason())
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	return &pb.AbortRoomResponse{Room: roomToProto(snap), AlreadyTerminal: already}, nil
}

func (e *engineRooms) retractRoom(ctx context.Context, req *pb.RetractRoomRequest) (*pb.RetractRoomResponse, error) {
	mode := kvmanager.RetractCPU
	if req.GetMode() == pb.RetractMode_RETRACT_MODE_REBOOTSTRAP {
		mode = kvmanager.RetractRebootstrap
	}
	snap, err := e.m.RetractRoom(req.GetRoom(), mode)
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	return &pb.RetractRoomResponse{Room: roomToProto(snap)}, nil
}

func (e *engineRooms) reportRunning(ctx context.Context, req *pb.ReportRunningRequest) (*pb.ReportRunningResponse, error) {
	usage := make([]kvmanager.Usage, len(req.GetRooms()))
	for i, u := range req.GetRooms() {
		usage[i] = kvmanager.Usage{Room: u.GetRoom(), OutputLen: int(u.GetOutputLen())}
	}
	grown, noCap, notRunning, err := e.m.ReportRunning(usage)
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	if len(notRunning) > 0 && len(notRunning) == len(usage) {
		return nil, e.t.status(ctx, &kvmanager.InvalidError{Field: "rooms", Msg: "no listed room is running (succeeded and not released)"})
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

// continueGeneration resumes the held rooms (rebootstrap): per room, what
// the decode engine needs to request its prefill's recompute (the
// prefill's HTTP endpoint, the pinned DP rank).
func (e *engineRooms) continueGeneration(ctx context.Context, _ *pb.ContinueGenerationRequest) (*pb.ContinueGenerationResponse, error) {
	resumed := e.m.ContinueGenerationResumed(ctx)
	out := &pb.ContinueGenerationResponse{Rooms: make([]uint64, 0, len(resumed)), Resumed: make([]*pb.ResumedRoom, 0, len(resumed))}
	for _, r := range resumed {
		out.Rooms = append(out.Rooms, r.Room)
		out.Resumed = append(out.Resumed, &pb.ResumedRoom{
			Room: r.Room, Rid: r.RID, Attempt: r.Attempt, Phase: phaseToProto(r.Phase),
			PrefillBootstrapAddr: r.PrefillAddr, PrefillHttpHost: r.PrefillHTTPHost,
			PrefillHttpPort: uint32(max(0, min(r.PrefillHTTPPort, 65535))), GenerateUrl: r.GenerateURL,
			PrefillDpRank: int32(max(-1, min(r.PrefillDP, 1<<31-1))),
		})
	}
	return out, nil
}

// resync is the decode engine's re-declaration of its running rooms after
// a daemon restart (kvmanager/resync.go).
func (e *engineRooms) resync(ctx context.Context, req *pb.ResyncRequest) (*pb.ResyncResponse, error) {
	rooms := make([]kvmanager.ResyncRoom, len(req.GetRooms()))
	for i, r := range req.GetRooms() {
		pdp := -1
		if r.PrefillDpRank != nil {
			pdp = int(r.GetPrefillDpRank())
		}
		rooms[i] = kvmanager.ResyncRoom{
			Room: r.GetRoom(), RID: r.GetRid(), PromptLen: int(r.GetPromptLen()), OutputLen: int(r.GetOutputLen()),
			MaxNewTokens: int(r.GetMaxNewTokens()), DecodeDP: int(r.GetDecodeDpRank()), ReqSlot: r.GetReqSlot(),
			Pages: r.GetPageIndices(), SWAPages: r.GetSwaPageIndices(), MambaSlots: r.GetMambaSlots(),
			Addr: r.GetBootstrapAddr(), PrefillDP: pdp,
			InFlight: r.GetInFlight(), MetadataSlot: r.GetMetadataSlot(), State: stateFromProto(r.GetState()),
			DecodePrefixLen: int(r.GetDecodePrefixLen()),
		}
	}
	n, st, err := e.m.Resync(rooms, req.GetDone())
	if err != nil {
		return nil, e.t.status(ctx, fmt.Errorf("resync (%d rooms of this call adopted before it): %w", n, err))
	}
	return &pb.ResyncResponse{Adopted: uint32(n), Declared: uint32(st.Declared), Pages: uint64(st.Pages), Admitting: !st.Waiting}, nil
}

// declareDestination admits a room into the destination the decode engine
// allocated (kv_pool.owner: engine). A page, row or slot another room's
// hand-off holds is FAILED_PRECONDITION with reason PAGE_HELD.
func (e *engineRooms) declareDestination(ctx context.Context, req *pb.DeclareDestinationRequest) (*pb.DeclareDestinationResponse, error) {
	snap, already, err := e.m.DeclareDestination(kvmanager.Declaration{Room: req.GetRoom(), Pages: req.GetPageIndices(),
		MetadataSlot: req.GetMetadataSlot(), State: stateFromProto(req.GetState()), DecodePrefixLen: int(req.GetDecodePrefixLen())})
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	return &pb.DeclareDestinationResponse{Room: roomToProto(snap), Already: already}, nil
}

// reportCapacity records the decode engine's capacity of one shard
// (kv_pool.owner: engine).
func (e *engineRooms) reportCapacity(ctx context.Context, req *pb.ReportCapacityRequest) (*pb.ReportCapacityResponse, error) {
	if e.m == nil { // the Capacity service is served without a room manager (tests of the gRPC layer alone)
		return nil, status.Error(codes.FailedPrecondition, "this server has no room manager: there is no capacity to report")
	}
	err := e.m.ReportCapacity(int(req.GetDecodeDpRank()), kvmanager.EngineCapacity{
		TokensFree: int64(req.GetTokensFree()), PagesFree: int64(req.GetPagesFree()), ReqSlotsFree: int64(req.GetReqSlotsFree()),
		MetaSlotsFree: int64(req.GetMetadataSlotsFree()), StateSlots: int64(req.GetStateSlotsFree()),
		QueueDepth: int(req.GetQueueDepth()), Running: int(req.GetRunning())})
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	return &pb.ReportCapacityResponse{}, nil
}

// resyncReadiness is the readiness text while admission waits for the
// engine's resync ("" when it does not wait).
func resyncReadiness(m StatusReader) string {
	if m == nil {
		return ""
	}
	st := m.ResyncStatus()
	if !st.Waiting {
		return ""
	}
	return fmt.Sprintf("waiting for the decode engine's resync (%d rooms declared so far), until %s", st.Declared, st.Until.UTC().Format(time.RFC3339))
}

// roomReader are the reads and watches of rooms.
type roomReader struct {
	t *Table
	m RoomReader
}

func (r *roomReader) getRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.Room, error) {
	snap, err := r.m.GetRoom(req.GetRoom(), req.GetIncludePages())
	if err != nil {
		return nil, r.t.status(ctx, err)
	}
	return roomToProto(snap), nil
}

// defaultListLimit caps ListRooms when the request sets no limit.
const defaultListLimit = 1000

func (r *roomReader) listRooms(_ context.Context, req *pb.ListRoomsRequest) (*pb.ListRoomsResponse, error) {
	f := kvmanager.ListFilter{Addr: req.GetBootstrapAddr(), LiveOnly: req.GetLiveOnly(), Limit: int(req.GetLimit()), NewestFirst: req.GetNewestFirst()}
	if f.Limit == 0 {
		f.Limit = defaultListLimit
	}
	for _, p := range req.GetPhases() {
		f.Phases = append(f.Phases, phaseFromProto(p))
	}
	rooms, total := r.m.ListRooms(f)
	out := &pb.ListRoomsResponse{Total: uint32(total)}
	for _, s := range rooms {
		out.Rooms = append(out.Rooms, roomToProto(s))
	}
	return out, nil
}

func (r *roomReader) watchRoom(ctx context.Context, req *pb.WatchRoomRequest, send func(*pb.RoomEvent) error) error {
	w, err := r.m.Watch(req.GetRoom(), req.GetHistory())
	if err != nil {
		return r.t.status(ctx, err)
	}
	defer w.Close()
	inc := r.t.cfg.Incarnation
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return r.t.status(ctx, w.Err())
			}
			if err := send(roomEventToProto(ev, inc)); err != nil {
				return err
			}
			// The room's last event says its pages are reusable: the
			// terminal event, or, for a room that failed while a prefill
			// rank could still write, the event after it once it drained.
			if ev.PagesReusable {
				return nil
			}
		case <-ctx.Done():
			return ContextStatus(ctx.Err())
		}
	}
}

// WatchFunc is WatchRoom for a multiplexed session (EngineSession): the
// room's events go to sink (kvmanager.WatchSink: under the room's shard
// lock, in order), its whole timeline (as WatchRoom with history) or only
// its outcome. Errors are statuses.
func (t *Table) WatchFunc(ctx context.Context, room uint64, outcome bool, sink kvmanager.WatchSink) (*kvmanager.Watcher, error) {
	w, err := t.reader.m.WatchFunc(room, !outcome, outcome, sink)
	if err != nil {
		return nil, t.status(ctx, err)
	}
	return w, nil
}
