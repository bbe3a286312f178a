package server

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

type adminService struct {
	pb.UnimplementedAdminServer
	s *Server
}

var _ pb.AdminServer = (*adminService)(nil)

func (a *adminService) GetStatus(ctx context.Context, _ *pb.GetStatusRequest) (*pb.GetStatusResponse, error) {
	s := a.s
	ready, readiness, draining := s.Readiness()
	resp := &pb.GetStatusResponse{
		Version:      s.deps.Version,
		Ready:        ready,
		Readiness:    readiness,
		StartedAt:    timestamppb.New(s.started),
		Uptime:       durationpb.New(time.Since(s.started).Round(time.Millisecond)),
		Draining:     draining,
		TransferPath: s.deps.TransferPath,
		Layout:       layoutToProto(s.deps.Layout),
	}
	for _, c := range s.deps.Config {
		resp.Config = append(resp.Config, &pb.ConfigValue{Key: c.Key, Value: c.Value, Source: c.Source})
	}
	return resp, nil
}

func (a *adminService) Drain(ctx context.Context, _ *pb.DrainRequest) (*pb.DrainResponse, error) {
	a.s.Drain()
	return &pb.DrainResponse{}, nil
}
