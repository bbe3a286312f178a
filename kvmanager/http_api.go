package kvmanager

import "time"

// This file is the registry's read side for SGLang's HTTP bootstrap routes
// (GET /route, the daemon's /health poll of HTTP-registered prefills). Each
// takes the registry's lock only, never the manager's.

// PrefillInfo returns what the first registration of the instance at addr
// set (SGLang's first-PUT-wins fields) and how many ranks registered; ok is
// false when no rank of addr is registered.
func (m *Manager) PrefillInfo(addr string) (info PrefillServerInfo, ok bool) {
	return m.reg.Info(addr)
}

// RankEndpoint returns the endpoint ("rank_ip:rank_port") rank registered
// with, and whether its instance is complete; ok is false when the rank is
// not registered.
func (m *Manager) RankEndpoint(rank RankID) (endpoint string, complete, ok bool) {
	return m.reg.RankEndpoint(rank)
}

// TouchPrefill counts as a heartbeat of every registered rank of the
// instance at addr (HTTP-registered prefills never heartbeat: the daemon
// polls their /health and touches them on success). It reports false when
// the instance is not registered, or was replaced by another instance id
// than instanceID (when both are set): the caller stops polling it.
func (m *Manager) TouchPrefill(addr, instanceID string) bool {
	return m.reg.Touch(addr, instanceID)
}

// HeartbeatPolicy is the effective heartbeat interval and max failures
// (after SGLang's floors), for pollers that keep instances alive.
func (m *Manager) HeartbeatPolicy() (time.Duration, int) {
	return m.cfg.Timeouts.EffectiveHeartbeat()
}
