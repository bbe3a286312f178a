package server

import (
	"context"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Registrar records prefill registrations and heartbeats (Deps.Registrar):
// the Manager itself with the memory registry, the fleet's shared registry
// with etcd. Its errors are the domain's (toStatus maps them;
// kvmanager.ErrRegistryUnavailable is UNAVAILABLE with a retry hint).
type Registrar interface {
	RegisterPrefill(ctx context.Context, reg kvmanager.Registration) (kvmanager.RegistrationResult, error)
	Heartbeat(ctx context.Context, rank kvmanager.RankID, instanceID string) (time.Duration, int, error)
	// Touch counts as a heartbeat of every rank of the instance at addr
	// (the HTTP bootstrap's health poll of an SGLang prefill); false when it
	// is not registered or was replaced.
	Touch(ctx context.Context, addr, instanceID string) bool
}

// managerRegistrar is the memory registry: the Manager's own calls.
type managerRegistrar struct{ m *kvmanager.Manager }

func (r managerRegistrar) RegisterPrefill(_ context.Context, reg kvmanager.Registration) (kvmanager.RegistrationResult, error) {
	return r.m.RegisterPrefill(reg)
}

func (r managerRegistrar) Heartbeat(_ context.Context, rank kvmanager.RankID, instanceID string) (time.Duration, int, error) {
	return r.m.Heartbeat(rank, instanceID)
}

func (r managerRegistrar) Touch(_ context.Context, addr, instanceID string) bool {
	return r.m.TouchPrefill(addr, instanceID)
}

func (s *Server) registrar() Registrar {
	if s.deps.Registrar != nil {
		return s.deps.Registrar
	}
	return managerRegistrar{s.deps.Manager}
}

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
func LayoutProto(l kvlayout.Layout) *pb.KVLayout { return layoutToProto(l) }
