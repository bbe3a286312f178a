package kvmanager

import "time"

// This file is the registry's read side for SGLang's HTTP bootstrap routes
// (GET /route, the daemon's /health poll of HTTP-registered prefills).

// PrefillServerInfo is SGLang's PrefillServerInfo for one instance (the
// answer of GET /route with the -1 sentinels), plus the registration count.
type PrefillServerInfo struct {
	Topology   PrefillTopology
	PageSize   int
	KVDType    string
	HTTPPort   int
	InstanceID string
	Registered int
	Expected   int
	// Complete: every expected rank registered (SGLang answers 503 before).
	Complete bool
}

// PrefillInfo returns what the first registration of the instance at addr
// set (SGLang's first-PUT-wins fields) and how many ranks registered; ok is
// false when no rank of addr is registered.
func (m *Manager) PrefillInfo(addr string) (info PrefillServerInfo, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	inst := m.prefills[addr]
	if inst == nil {
		return PrefillServerInfo{}, false
	}
	return PrefillServerInfo{Topology: inst.topo, PageSize: inst.pageSize, KVDType: inst.dtype, HTTPPort: inst.httpPort,
		InstanceID: inst.instanceID, Registered: len(inst.ranks), Expected: inst.expected, Complete: inst.complete}, true
}

// RankEndpoint returns the endpoint ("rank_ip:rank_port") rank registered
// with, and whether its instance is complete; ok is false when the rank is
// not registered.
func (m *Manager) RankEndpoint(rank RankID) (endpoint string, complete, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	inst := m.prefills[rank.Addr]
	if inst == nil {
		return "", false, false
	}
	rk := inst.ranks[rank]
	if rk == nil {
		return "", inst.complete, false
	}
	return rk.endpoint, inst.complete, true
}

// TouchPrefill counts as a heartbeat of every registered rank of the
// instance at addr (HTTP-registered prefills never heartbeat: the daemon
// polls their /health and touches them on success). It reports false when
// the instance is not registered, or was replaced by another instance id
// than instanceID (when both are set): the caller stops polling it.
func (m *Manager) TouchPrefill(addr, instanceID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	inst := m.prefills[addr]
	if inst == nil || (instanceID != "" && inst.instanceID != "" && inst.instanceID != instanceID) {
		return false
	}
	now := m.clock.Now()
	for _, rk := range inst.ranks {
		rk.lastSeen = now
		rk.missed = 0
	}
	return true
}

// HeartbeatPolicy is the effective heartbeat interval and max failures
// (after SGLang's floors), for pollers that keep instances alive.
func (m *Manager) HeartbeatPolicy() (time.Duration, int) {
	return m.cfg.Timeouts.EffectiveHeartbeat()
}
