package fleet

import (
	"context"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// MaxListed bounds each list of GetFleet.
const MaxListed = 10000

// RegistryState is the registry's state for GetFleet and GetStatus.
func (e *Etcd) RegistryState() *pb.RegistryState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.registryStateLocked()
}

func (e *Etcd) registryStateLocked() *pb.RegistryState {
	st := &pb.RegistryState{Backend: BackendEtcd, State: "ok", Since: timestamppb.New(e.since), Revision: e.view.rev,
		Prefix: e.cfg.Prefix, LeaseTtl: durationpb.New(e.cfg.LeaseTTL)}
	if e.degraded {
		st.State, st.Reason = "degraded", e.reason
	}
	return st
}

// GetFleet lists the cached view (Fleet.GetFleet): it never waits on etcd.
func (e *Etcd) GetFleet(context.Context) (*pb.GetFleetResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	resp := &pb.GetFleetResponse{Registry: e.registryStateLocked()}
	self := e.cfg.AdvertiseAddress
	sawSelf := false
	for _, addr := range sortedKeys(e.view.daemons) {
		if len(resp.Daemons) == MaxListed {
			resp.Truncated = true
			break
		}
		rec := e.view.daemons[addr]
		d := &pb.FleetDaemon{Address: addr, Incarnation: rec.incarnation(), Self: addr == self, Version: rec.Version,
			StartedAt: timestamppb.New(rec.StartedAt)}
		if len(rec.Layout) > 0 {
			l := &pb.KVLayout{}
			if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(rec.Layout, l) == nil {
				d.Layout = l
			}
		}
		if c := e.view.capacity[addr]; c != nil {
			d.Capacity = proto.CloneOf(c)
		}
		if f := e.view.fingerprints[addr]; f != nil {
			d.Fingerprint = proto.CloneOf(f.wire)
		}
		sawSelf = sawSelf || d.Self
		resp.Daemons = append(resp.Daemons, d)
	}
	if !sawSelf && !resp.Truncated {
		// Not (yet) in the view: degraded since startup, or just started.
		s := e.deps.Self
		resp.Daemons = append(resp.Daemons, &pb.FleetDaemon{Address: self, Incarnation: s.Incarnation, Self: true, Version: s.Version,
			StartedAt: timestamppb.New(s.StartedAt), Layout: s.Layout, Fingerprint: proto.CloneOf(s.Fingerprint)})
	}
	for _, addr := range sortedKeys(e.view.instances) {
		if len(resp.Prefills) == MaxListed {
			resp.Truncated = true
			break
		}
		iv := e.view.instances[addr]
		if iv.rec.Deregistered != "" {
			continue // deregistered: its lease is being revoked
		}
		p := &pb.FleetPrefill{BootstrapAddr: addr, InstanceId: iv.rec.InstanceID, Liveness: "lease", LeaseId: iv.rec.Lease, RegisteredVia: iv.rec.RegisteredVia}
		for _, r := range iv.ranks {
			if r.InstanceID != iv.rec.InstanceID {
				continue
			}
			p.RegisteredRanks++
			if p.RegisteredRanks > 1 {
				continue // every rank of an instance on record carries the same sizes
			}
			par := r.Parallel
			dp := max(1, par.AttnDP)
			if par.SystemDP > 1 {
				dp = par.SystemDP
			}
			p.AttnTpSize, p.DpSize, p.PpSize, p.AttnCpSize = uint32(max(1, par.AttnTP)), uint32(dp), uint32(max(1, par.PP)), uint32(max(1, par.AttnCP))
			p.ExpectedRanks = uint32(min(uint64(p.AttnTpSize)*uint64(p.DpSize)*uint64(p.PpSize)*uint64(p.AttnCpSize), 1<<32-1))
		}
		if h := e.heard[addr]; h != nil && !h.at.IsZero() {
			p.HeardHere = timestamppb.New(h.at)
		}
		resp.Prefills = append(resp.Prefills, p)
	}
	e.handOffs(resp)
	return resp, nil
}

// LeaseTTL is registry.etcd.lease_ttl.
func (e *Etcd) LeaseTTL() time.Duration { return e.cfg.LeaseTTL }

// PrefillLease is the instance at addr as the view holds it, for
// Admin.GetStatus: its lease, the last heartbeat (or registration) this
// daemon received from any of its ranks (zero when none), the daemon that
// created its record; ok is false when the view does not hold it.
func (e *Etcd) PrefillLease(addr string) (lease int64, heardHere time.Time, registeredVia string, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	iv := e.view.instances[addr]
	if !iv.live() {
		return 0, time.Time{}, "", false
	}
	if h := e.heard[addr]; h != nil {
		heardHere = h.at
	}
	return iv.rec.Lease, heardHere, iv.rec.RegisteredVia, true
}
