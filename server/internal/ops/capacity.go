package ops

import (
	"context"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Capacity.WatchCapacity (capacity.proto): one capacity feed, read from the
// ledgers (kvmanager.Manager.Capacity), that the gRPC stream and the
// daemon's etcd publisher both use.

// ReadinessShuttingDown is the readiness of the last update of a capacity
// feed, sent when the server shuts down.
const ReadinessShuttingDown = "shutting down"

// watchCapacity streams the capacity feed with the request's intervals
// (checked by the op's Check: WatchCapacityRequest.Validate).
func (t *Table) watchCapacity(ctx context.Context, req *pb.WatchCapacityRequest, send func(*pb.CapacityUpdate) error) error {
	minInterval, keepalive := req.Intervals()
	return t.FeedCapacity(ctx, minInterval, keepalive, send)
}

// capacitySnap is what a capacity update says, read at one moment; two
// snapshots are compared without their time.
type capacitySnap struct {
	at        time.Time
	ready     bool
	readiness string
	draining  bool
	shards    []kvmanager.ShardCapacity
}

func (a capacitySnap) same(b capacitySnap) bool {
	return a.ready == b.ready && a.readiness == b.readiness && a.draining == b.draining && slices.Equal(a.shards, b.shards)
}

// snapCapacity reads the figures: readiness as GetStatus reports it (or
// ReadinessShuttingDown once Shutdown stops serving), and every shard's
// ledger.
func (t *Table) snapCapacity() capacitySnap {
	sn := capacitySnap{at: time.Now()}
	sn.ready, sn.readiness, sn.draining = t.StatusReadiness()
	if t.cfg.Host.Stopping().Err() != nil {
		sn.ready, sn.readiness, sn.draining = false, ReadinessShuttingDown, true
	}
	if m := t.stat.m; m != nil {
		sn.shards = m.Capacity()
	}
	return sn
}

func (t *Table) capacityProto(sn capacitySnap, seq uint64) *pb.CapacityUpdate {
	u := &pb.CapacityUpdate{
		Incarnation: t.cfg.Incarnation, Address: t.cfg.Host.Address(),
		Ready: sn.ready, Readiness: sn.readiness, Draining: sn.draining,
		At: timestamppb.New(sn.at), Sequence: seq,
		Shards:      make([]*pb.ShardCapacity, 0, len(sn.shards)),
		Fingerprint: proto.CloneOf(t.fp),
	}
	for _, c := range sn.shards {
		u.Shards = append(u.Shards, &pb.ShardCapacity{
			DpRank: uint32(c.Shard), PageSize: uint32(c.PageSize),
			TokensTotal: uint64(c.TokensTotal), TokensFree: uint64(c.TokensFree),
			PagesTotal: uint64(c.PagesTotal), PagesFree: uint64(c.PagesFree),
			ReqSlotsTotal: uint32(c.ReqSlotsTotal), ReqSlotsFree: uint32(c.ReqSlotsFree),
			QueueDepth: uint32(c.QueueDepth), BlockedBy: c.BlockedBy,
			DrainingPages: uint64(c.DrainingPages), Running: uint32(c.Running),
			ReservedDecodeTokens: uint32(c.ReservedDecodeTokens),
		})
	}
	return u
}

// Capacity returns the current figures (sequence 0): the daemon's
// incarnation, address (Host.Address: the advertised one, else the one it
// serves on), readiness and every shard's capacity
// (kvmanager.ShardCapacity).
func (t *Table) Capacity() *pb.CapacityUpdate {
	return t.capacityProto(t.snapCapacity(), 0)
}

// FeedCapacity sends the capacity feed to send until ctx ends (it returns
// nil), send fails (it returns send's error) or the server shuts down (it
// sends a last update with ready=false, readiness ReadinessShuttingDown, at
// once, and returns that send's result). The first update goes out at
// once; after it, an update goes out when a figure changed, at most one per
// minInterval, and at least one per keepalive even when nothing changed.
// Sequences count the updates from 1.
//
// Changes are found by polling: every minInterval the figures are read
// again (Manager.Capacity: each shard's ledger stats under the ledger's
// lock, no shard lock) and compared with the last update sent, so the room
// path pays nothing for a watcher but that read. The timers are the time
// package's (the server has no injected clock): under testing/synctest they
// run on the bubble's clock. minInterval <= 0 is the default
// (pb.DefaultCapacityMinInterval); a keepalive below minInterval is
// minInterval.
func (t *Table) FeedCapacity(ctx context.Context, minInterval, keepalive time.Duration, send func(*pb.CapacityUpdate) error) error {
	if minInterval <= 0 {
		minInterval = pb.DefaultCapacityMinInterval
	}
	keepalive = max(keepalive, minInterval)
	var seq uint64
	emit := func(sn capacitySnap) error {
		seq++
		return send(t.capacityProto(sn, seq))
	}
	stop := t.cfg.Host.Stopping()
	last := t.snapCapacity()
	if err := emit(last); err != nil {
		return err
	}
	if stop.Err() != nil {
		return nil // that was the last update: the server stops
	}
	poll := time.NewTimer(minInterval)
	defer poll.Stop()
	keep := time.NewTimer(keepalive)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stop.Done():
			if ctx.Err() != nil {
				return nil
			}
			return emit(t.snapCapacity())
		case <-poll.C:
			sn := t.snapCapacity()
			if sn.same(last) {
				poll.Reset(minInterval)
				continue
			}
			last = sn
		case <-keep.C:
			last = t.snapCapacity()
		}
		if err := emit(last); err != nil {
			return err
		}
		if last.readiness == ReadinessShuttingDown && stop.Err() != nil {
			return nil // that was the last update
		}
		// The next update is at least minInterval away (the keepalive is
		// not below it) and at most keepalive.
		poll.Reset(minInterval)
		keep.Reset(keepalive)
	}
}
