package ops

import (
	"cmp"
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// FleetView is the shared registry's view of the fleet (registry.backend
// etcd): every decode daemon and prefill instance it knows, read from its
// cached view without waiting on etcd. Fleet.GetFleet answers from it when
// Deps.Fleet is set, after sorting and bounding its lists (MaxFleetEntries).
type FleetView interface {
	GetFleet(ctx context.Context) (*pb.GetFleetResponse, error)
	// PrefillLease is an instance's liveness in the registry, for
	// Admin.GetStatus: its lease, the last heartbeat this daemon received
	// from it (zero when none), the daemon that created its record; ok is
	// false when the view does not hold the instance.
	PrefillLease(addr string) (lease int64, heardHere time.Time, registeredVia string, ok bool)
}

// MaxFleetEntries bounds each list of a GetFleet answer (daemons,
// prefills); truncated says when one was cut.
const MaxFleetEntries = 10000

// Registry state and liveness names of the memory registry (fleet.proto).
const (
	registryMemory    = "memory"
	registryOK        = "ok"
	livenessHeartbeat = "heartbeat"
	livenessLease     = "lease"
)

// getFleet answers from Config.Fleet, or, with the memory registry (nil),
// from this daemon alone: itself as the fleet's one daemon and the prefill
// instances registered with it.
func (t *Table) getFleet(ctx context.Context, _ *pb.GetFleetRequest) (*pb.GetFleetResponse, error) {
	if v := t.cfg.Fleet; v != nil {
		resp, err := v.GetFleet(ctx)
		if err != nil {
			return nil, t.status(ctx, err)
		}
		if resp == nil {
			t.log.ErrorContext(ctx, "the fleet view answered nothing")
			return nil, status.Error(codes.Internal, "the fleet view answered nothing (logged by the daemon)")
		}
		for _, d := range resp.GetDaemons() {
			if d.GetSelf() {
				d.Capacity = t.Capacity() // this daemon's own figures are read now, not as last published
			}
		}
		return sortFleet(resp), nil
	}
	return sortFleet(t.memoryFleet()), nil
}

// memoryFleet is the memory registry's fleet: this daemon, and the prefill
// instances of its room manager's registry. Every instance's record was
// created here (registered_via is this daemon) and is alive by its ranks'
// heartbeats to this daemon; a registration counts as a heartbeat
// (heard_here is the later of the two).
func (t *Table) memoryFleet() *pb.GetFleetResponse {
	c := &t.cfg
	self := c.Host.Address()
	resp := &pb.GetFleetResponse{
		Registry: &pb.RegistryState{Backend: registryMemory, State: registryOK, Since: timestamppb.New(c.Started)},
		Daemons: []*pb.FleetDaemon{{
			Address: self, Incarnation: c.Incarnation, Self: true, Version: c.Version,
			StartedAt: timestamppb.New(c.Started), Layout: layoutToProto(c.Layout), Fingerprint: proto.CloneOf(t.fp),
		}},
	}
	m := t.stat.m
	if m == nil {
		return resp
	}
	resp.Daemons[0].Capacity = t.Capacity()
	for _, p := range m.Status().Prefills {
		fp := &pb.FleetPrefill{
			BootstrapAddr: p.Addr, InstanceId: p.InstanceID,
			RegisteredRanks: clampU32(p.Registered), ExpectedRanks: clampU32(p.Expected),
			AttnTpSize: clampU32(p.Topology.AttnTP), DpSize: clampU32(p.Topology.DP), PpSize: clampU32(p.Topology.PP),
			AttnCpSize: clampU32(p.Topology.AttnCP), Liveness: livenessHeartbeat, RegisteredVia: self,
			HandOffDigests: []string{t.fp.GetDigest()}, // registered here: this daemon's own check accepted it
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
