package server

import (
	"cmp"
	"context"
	"net"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// FleetView is the shared registry's view of the fleet (registry.backend
// etcd): every decode daemon and prefill instance it knows, read from its
// cached view without waiting on etcd. Fleet.GetFleet answers from it when
// Deps.Fleet is set, after sorting and bounding its lists (MaxFleetEntries).
type FleetView interface {
	GetFleet(ctx context.Context) (*pb.GetFleetResponse, error)
}

// MaxFleetEntries bounds each list of a GetFleet answer (daemons,
// prefills); truncated says when one was cut.
const MaxFleetEntries = 10000

// Registry state and liveness names of the memory registry (fleet.proto).
const (
	registryMemory    = "memory"
	registryOK        = "ok"
	livenessHeartbeat = "heartbeat"
)

type fleetService struct {
	pb.UnimplementedFleetServer
	s *Server
}

var _ pb.FleetServer = (*fleetService)(nil)

// GetFleet answers from Deps.Fleet, or, with the memory registry (nil),
// from this daemon alone: itself as the fleet's one daemon and the prefill
// instances registered with it.
func (f *fleetService) GetFleet(ctx context.Context, _ *pb.GetFleetRequest) (*pb.GetFleetResponse, error) {
	s := f.s
	if v := s.deps.Fleet; v != nil {
		resp, err := v.GetFleet(ctx)
		if err != nil {
			return nil, toStatus(ctx, s.log, err)
		}
		if resp == nil {
			s.log.ErrorContext(ctx, "the fleet view answered nothing")
			return nil, status.Error(codes.Internal, "the fleet view answered nothing (logged by the daemon)")
		}
		for _, d := range resp.GetDaemons() {
			if d.GetSelf() {
				d.Capacity = s.Capacity() // this daemon's own figures are read now, not as last published
			}
		}
		return sortFleet(resp), nil
	}
	return sortFleet(s.memoryFleet()), nil
}

// memoryFleet is the memory registry's fleet: this daemon, and the prefill
// instances of its room manager's registry. Every instance's record was
// created here (registered_via is this daemon) and is alive by its ranks'
// heartbeats to this daemon; a registration counts as a heartbeat
// (heard_here is the later of the two).
func (s *Server) memoryFleet() *pb.GetFleetResponse {
	self := s.Address()
	resp := &pb.GetFleetResponse{
		Registry: &pb.RegistryState{Backend: registryMemory, State: registryOK, Since: timestamppb.New(s.started)},
		Daemons: []*pb.FleetDaemon{{
			Address: self, Incarnation: s.deps.Incarnation, Self: true, Version: s.deps.Version,
			StartedAt: timestamppb.New(s.started), Layout: layoutToProto(s.deps.Layout),
		}},
	}
	m := s.deps.Manager
	if m == nil {
		return resp
	}
	resp.Daemons[0].Capacity = s.Capacity()
	for _, p := range m.Status().Prefills {
		fp := &pb.FleetPrefill{
			BootstrapAddr: p.Addr, InstanceId: p.InstanceID,
			RegisteredRanks: clampU32(p.Registered), ExpectedRanks: clampU32(p.Expected),
			AttnTpSize: clampU32(p.Topology.AttnTP), DpSize: clampU32(p.Topology.DP), PpSize: clampU32(p.Topology.PP),
			AttnCpSize: clampU32(p.Topology.AttnCP), Liveness: livenessHeartbeat, RegisteredVia: self,
		}
		if !p.LastHeartbeat.IsZero() {
			fp.HeardHere = timestamppb.New(p.LastHeartbeat)
		}
		resp.Prefills = append(resp.Prefills, fp)
	}
	return resp
}

// sortFleet sorts the daemons by address and the prefills by
// bootstrap_addr, and keeps at most MaxFleetEntries of each (truncated then
// says so).
func sortFleet(resp *pb.GetFleetResponse) *pb.GetFleetResponse {
	slices.SortStableFunc(resp.Daemons, func(a, b *pb.FleetDaemon) int { return cmp.Compare(a.GetAddress(), b.GetAddress()) })
	slices.SortStableFunc(resp.Prefills, func(a, b *pb.FleetPrefill) int { return cmp.Compare(a.GetBootstrapAddr(), b.GetBootstrapAddr()) })
	if len(resp.Daemons) > MaxFleetEntries {
		resp.Daemons, resp.Truncated = resp.Daemons[:MaxFleetEntries], true
	}
	if len(resp.Prefills) > MaxFleetEntries {
		resp.Prefills, resp.Truncated = resp.Prefills[:MaxFleetEntries], true
	}
	return resp
}

// Address is the address this daemon goes by in its fleet:
// Deps.AdvertiseAddress when set, else the address of the listener Serve
// serves (a TCP host:port, or unix://path), else server.listen.
func (s *Server) Address() string {
	if a := s.deps.AdvertiseAddress; a != "" {
		return a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.served != "" {
		return s.served
	}
	return s.cfg.Listen
}

// servedAddress is lis's address as a gRPC target, or "" when it has none
// (an in-memory listener).
func servedAddress(lis net.Listener) string {
	switch a := lis.Addr().(type) {
	case *net.TCPAddr:
		return a.String()
	case *net.UnixAddr:
		return "unix://" + a.Name
	}
	return ""
}
