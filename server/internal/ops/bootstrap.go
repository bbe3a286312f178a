package ops

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// bootstrap are Bootstrap's ops: registration and heartbeats (through the
// Registrar), DP-rank bindings and lookups.
type bootstrap struct {
	t   *Table
	m   Bootstrapper
	reg Registrar
}

func (b *bootstrap) registerPrefill(ctx context.Context, req *pb.RegisterPrefillRequest) (*pb.RegisterPrefillResponse, error) {
	res, err := b.reg.RegisterPrefill(ctx, registrationFromProto(req))
	if err != nil {
		return nil, b.t.status(ctx, err)
	}
	resp := registrationToProto(res, b.m.Layout())
	resp.Incarnation = b.t.cfg.Incarnation
	return resp, nil
}

func (b *bootstrap) heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	iv, mf, err := b.reg.Heartbeat(ctx, rankFromProto(req.GetRank()), req.GetInstanceId())
	if err != nil {
		return nil, b.t.status(ctx, err)
	}
	return &pb.HeartbeatResponse{Interval: durationpb.New(iv), MaxFailures: uint32(mf), Incarnation: b.t.cfg.Incarnation}, nil
}

// defaultDeregisterReason is DeregisterPrefillRequest.reason when empty.
const defaultDeregisterReason = "the prefill instance stopped"

// deregisterPrefill removes an instance that stops cleanly: its rooms fail
// with a reason that names this daemon and the caller's reason.
func (b *bootstrap) deregisterPrefill(ctx context.Context, req *pb.DeregisterPrefillRequest) (*pb.DeregisterPrefillResponse, error) {
	why := req.GetReason()
	if why == "" {
		why = defaultDeregisterReason
	}
	msg := fmt.Sprintf("it deregistered (Bootstrap.DeregisterPrefill through %s): %s", b.t.cfg.Host.Address(), why)
	removed, failed, err := b.reg.DeregisterPrefill(ctx, req.GetBootstrapAddr(), req.GetInstanceId(), msg)
	if err != nil {
		return nil, b.t.status(ctx, err)
	}
	if removed {
		b.t.log.InfoContext(ctx, "prefill instance deregistered", "bootstrap_addr", req.GetBootstrapAddr(), "instance_id", req.GetInstanceId(),
			"rooms_failed", failed, "reason", why)
	}
	return &pb.DeregisterPrefillResponse{Deregistered: removed, RoomsFailed: clampU32(failed)}, nil
}

func (b *bootstrap) bindRoom(ctx context.Context, req *pb.BindRoomRequest) (*pb.BindRoomResponse, error) {
	replaced, err := b.m.BindRoom(req.GetBootstrapAddr(), req.GetRoom(), int(req.GetDpRank()))
	if err != nil {
		return nil, b.t.status(ctx, err)
	}
	return &pb.BindRoomResponse{Replaced: replaced}, nil
}

func (b *bootstrap) lookupDPRanks(ctx context.Context, req *pb.LookupDPRanksRequest) (*pb.LookupDPRanksResponse, error) {
	hints := make(map[uint64]int, len(req.GetHints()))
	for _, h := range req.GetHints() {
		hints[h.GetRoom()] = int(h.GetDpRank())
	}
	res, unresolved, err := b.m.LookupDPRanks(req.GetBootstrapAddr(), req.GetRooms(), hints)
	if err != nil {
		return nil, b.t.status(ctx, err)
	}
	out := &pb.LookupDPRanksResponse{Unresolved: unresolved}
	for _, r := range res {
		out.Resolved = append(out.Resolved, &pb.DPRankResult{Room: r.Room, DpRank: uint32(r.DP), Rule: dpRuleToProto(r.Rule)})
	}
	return out, nil
}
