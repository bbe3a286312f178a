package server

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

type bootstrapService struct {
	pb.UnimplementedBootstrapServer
	s   *Server
	m   *kvmanager.Manager
	reg Registrar
}

var _ pb.BootstrapServer = (*bootstrapService)(nil)

func (b *bootstrapService) RegisterPrefill(ctx context.Context, req *pb.RegisterPrefillRequest) (*pb.RegisterPrefillResponse, error) {
	res, err := b.reg.RegisterPrefill(ctx, registrationFromProto(req))
	if err != nil {
		return nil, toStatus(ctx, b.s.log, err)
	}
	resp := registrationToProto(res, b.m.Layout())
	resp.Incarnation = b.s.deps.Incarnation
	return resp, nil
}

func (b *bootstrapService) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	iv, mf, err := b.reg.Heartbeat(ctx, rankFromProto(req.GetRank()), req.GetInstanceId())
	if err != nil {
		return nil, toStatus(ctx, b.s.log, err)
	}
	return &pb.HeartbeatResponse{Interval: durationpb.New(iv), MaxFailures: uint32(mf), Incarnation: b.s.deps.Incarnation}, nil
}

func (b *bootstrapService) BindRoom(ctx context.Context, req *pb.BindRoomRequest) (*pb.BindRoomResponse, error) {
	replaced, err := b.m.BindRoom(req.GetBootstrapAddr(), req.GetRoom(), int(req.GetDpRank()))
	if err != nil {
		return nil, toStatus(ctx, b.s.log, err)
	}
	return &pb.BindRoomResponse{Replaced: replaced}, nil
}

func (b *bootstrapService) LookupDPRanks(ctx context.Context, req *pb.LookupDPRanksRequest) (*pb.LookupDPRanksResponse, error) {
	hints := make(map[uint64]int, len(req.GetHints()))
	for _, h := range req.GetHints() {
		hints[h.GetRoom()] = int(h.GetDpRank())
	}
	res, unresolved, err := b.m.LookupDPRanks(req.GetBootstrapAddr(), req.GetRooms(), hints)
	if err != nil {
		return nil, toStatus(ctx, b.s.log, err)
	}
	out := &pb.LookupDPRanksResponse{Unresolved: unresolved}
	for _, r := range res {
		out.Resolved = append(out.Resolved, &pb.DPRankResult{Room: r.Room, DpRank: uint32(r.DP), Rule: dpRuleToProto(r.Rule)})
	}
	return out, nil
}
