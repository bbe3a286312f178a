package ops

import (
	"context"

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
