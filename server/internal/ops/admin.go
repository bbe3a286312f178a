package ops

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/decodeplane/decodeplane/prealloc"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// statusReader is what Admin, Capacity and Fleet read of the manager (nil
// without one).
type statusReader struct {
	t *Table
	m StatusReader
}

func (t *Table) getStatus(context.Context, *pb.GetStatusRequest) (*pb.GetStatusResponse, error) {
	c := &t.cfg
	ready, readiness, draining := t.StatusReadiness()
	resp := &pb.GetStatusResponse{
		Version:      c.Version,
		Ready:        ready,
		Readiness:    readiness,
		StartedAt:    timestamppb.New(c.Started),
		Uptime:       durationpb.New(time.Since(c.Started).Round(time.Millisecond)),
		Draining:     draining,
		TransferPath: c.TransferPath,
		Layout:       layoutToProto(c.Layout),
		Incarnation:  c.Incarnation,
	}
	for _, e := range c.Entries {
		resp.Config = append(resp.Config, &pb.ConfigValue{Key: e.Key, Value: e.Value, Source: e.Source})
	}
	if m := t.stat.m; m != nil {
		st := m.Status()
		resp.RoomsByPhase = map[string]uint32{}
		resp.PendingClaims = uint32(st.PendingClaims)
		for p, n := range st.RoomsByPhase {
			resp.RoomsByPhase[p.String()] = uint32(n)
		}
		// blocked_by reads as the capacity feed reads it (Manager.Capacity:
		// the ledger's reason, or "resync" while admission waits for the
		// engine's resync), so that the two never disagree.
		caps := m.Capacity()
		for _, sh := range st.Shards {
			ps := shardToProto(sh)
			if sh.Shard >= 0 && sh.Shard < len(caps) {
				ps.BlockedBy = caps[sh.Shard].BlockedBy
			}
			resp.Shards = append(resp.Shards, ps)
		}
		for _, h := range st.Holds {
			if h.Shard >= 0 && h.Shard < len(resp.Shards) {
				resp.Shards[h.Shard].Holds = &pb.HandoffHolds{Queued: uint32(h.Queued), Held: uint32(h.Held), HeldPages: uint64(h.HeldPages),
					Draining: uint32(h.Draining), DrainingPages: uint64(h.DrainingPages), DeclarationsRefused: h.Refused, CapacityReported: h.CapacityReported}
			}
		}
		for _, l := range m.EngineLayouts() {
			resp.EngineLayouts = append(resp.EngineLayouts, engineLayoutToProto(l))
		}
		for _, p := range st.Prefills {
			ps := &pb.PrefillStatus{
				BootstrapAddr: p.Addr, RegisteredRanks: uint32(p.Registered), ExpectedRanks: clampU32(p.Expected),
				AttnTpSize: uint32(p.Topology.AttnTP), DpSize: uint32(p.Topology.DP), PpSize: uint32(p.Topology.PP),
				AttnCpSize: uint32(p.Topology.AttnCP), FollowBootstrapRoom: p.Topology.FollowBootstrapRoom,
				LastHeartbeat: timestamppb.New(p.LastHeartbeat), MissedHeartbeats: uint32(p.MissedHeartbeats),
				ActiveRooms: uint32(p.ActiveRooms), SilentRankCount: uint32(p.SilentRankCount),
			}
			for _, sr := range p.SilentRanks {
				ps.SilentRanks = append(ps.SilentRanks, &pb.SilentRank{Rank: rankToProto(sr.Rank), SilentFor: durationpb.New(sr.Silent), MissedHeartbeats: uint32(sr.Missed)})
			}
			t.prefillLiveness(ps)
			resp.Prefills = append(resp.Prefills, ps)
		}
	}
	return resp, nil
}

// StatusReadiness is the readiness GetStatus and the capacity feed report:
// the host's, with the resync wait's account while it lasts.
func (t *Table) StatusReadiness() (ready bool, readiness string, draining bool) {
	ready, readiness, draining = t.cfg.Host.Readiness()
	if ready {
		if w := resyncReadiness(t.stat.m); w != "" {
			readiness = w // health stays SERVING: the engine must reach the daemon to resync
		}
	}
	return ready, readiness, draining
}

func shardToProto(sh prealloc.Stats) *pb.ShardStatus {
	return &pb.ShardStatus{
		DpRank: uint32(sh.Shard), PagesTotal: uint64(sh.Pages.Total), PagesFree: uint64(sh.Pages.Free),
		ReqSlotsTotal: uint32(sh.ReqSlots.Total), ReqSlotsFree: uint32(sh.ReqSlots.Free),
		MetadataSlotsTotal: uint32(sh.MetaSlots.Total), MetadataSlotsFree: uint32(sh.MetaSlots.Free),
		Waiting: uint32(sh.Waiting), Queued: uint32(sh.Ready), Admitted: uint32(sh.Admitted), Claimed: uint32(sh.Claimed),
		Running: uint32(sh.Running), Retracted: uint32(sh.Retracted), Held: uint32(sh.Held),
		BlockedBy:       sh.LastBlocked.String(),
		StateSlotsTotal: uint64(sh.MambaSlots.Total + sh.SWAPages.Total), StateSlotsFree: uint64(sh.MambaSlots.Free + sh.SWAPages.Free),
		DrainingRooms: uint32(sh.Draining), DrainingPages: uint64(sh.Pages.Draining),
	}
}

func (t *Table) drain(context.Context, *pb.DrainRequest) (*pb.DrainResponse, error) {
	t.cfg.Host.Drain()
	resp := &pb.DrainResponse{}
	if m := t.stat.m; m != nil {
		resp.RoomsInFlight = uint32(m.InFlight())
	}
	return resp, nil
}

// prefillLiveness says what keeps an instance alive: its ranks' heartbeats
// to this daemon (the memory registry), or its lease in the fleet
// registry, where the last heartbeat is the last one this daemon heard
// (none when the ranks beat to another daemon) and no heartbeat is counted
// missed here.
func (t *Table) prefillLiveness(ps *pb.PrefillStatus) {
	v := t.cfg.Fleet
	if v == nil {
		ps.Liveness = livenessHeartbeat
		return
	}
	ps.Liveness, ps.MissedHeartbeats, ps.SilentRanks, ps.SilentRankCount = livenessLease, 0, nil, 0
	lease, heard, via, ok := v.PrefillLease(ps.GetBootstrapAddr())
	ps.LastHeartbeat = nil
	if !ok {
		return
	}
	ps.LeaseId, ps.RegisteredVia = lease, via
	if !heard.IsZero() {
		ps.LastHeartbeat = timestamppb.New(heard)
	}
}
