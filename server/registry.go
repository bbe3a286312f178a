package server

import (
	"context"
	"net"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/internal/ops"
)

// SetRegistryState records the shared registry's state: while it is
// degraded (etcd unreachable) the readiness text (GetStatus, WatchCapacity)
// ends with "; registry degraded: <reason>". Health stays as it is: rooms
// keep flowing on the cached view, only new registrations are refused.
func (s *Server) SetRegistryState(degraded bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !degraded {
		reason = ""
	} else if reason == "" {
		reason = "etcd unreachable"
	}
	if s.registryDegraded != reason {
		s.log.Info("registry state changed", "degraded", degraded, "reason", reason)
	}
	s.registryDegraded = reason
}

func registrySuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return "; registry degraded: " + reason
}

// LayoutProto is the wire form of a decode KV layout (as GetStatus reports
// it), for the daemon's record in the fleet registry.
func LayoutProto(l kvlayout.Layout) *pb.KVLayout { return ops.LayoutProto(l) }

// FingerprintProto is the wire form of a decode pool's fingerprint (with
// its digest), for the daemon's record in the fleet registry.
func FingerprintProto(f kvlayout.Fingerprint) *pb.Fingerprint { return ops.FingerprintProto(f) }

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

// Capacity returns the current figures (sequence 0): the daemon's
// incarnation, address (Address: the advertised one, else the one it
// serves on), readiness and every shard's capacity
// (kvmanager.ShardCapacity).
func (s *Server) Capacity() *pb.CapacityUpdate { return s.ops.Capacity() }

// FeedCapacity sends the capacity feed to send until ctx ends (it returns
// nil), send fails (it returns send's error) or the server shuts down (it
// sends a last update with ready=false, readiness ReadinessShuttingDown, at
// once, and returns that send's result): Capacity.WatchCapacity's feed,
// which the daemon's etcd publisher uses too (ops.Table.FeedCapacity says
// how often).
func (s *Server) FeedCapacity(ctx context.Context, minInterval, keepalive time.Duration, send func(*pb.CapacityUpdate) error) error {
	return s.ops.FeedCapacity(ctx, minInterval, keepalive, send)
}

// Incarnation is the daemon's incarnation (Deps.Incarnation).
func (s *Server) Incarnation() uint64 { return s.deps.Incarnation }
