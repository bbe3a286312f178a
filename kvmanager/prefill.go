package kvmanager

import (
	"fmt"
	"slices"
	"time"

	"github.com/decodeplane/decodeplane/internal/clock"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// The prefill registry's types, re-exported so that callers of the Manager
// (server/, client code) keep one import; they are the registry's own.
type (
	RankID             = registry.RankID
	ParallelInfo       = registry.ParallelInfo
	ModelFacts         = registry.ModelFacts
	Registration       = registry.Registration
	RegistrationResult = registry.RegistrationResult
	PrefillTopology    = registry.PrefillTopology
	DecodeRankMapping  = registry.DecodeRankMapping
	PrefillServerInfo  = registry.PrefillServerInfo
	SilentRank         = registry.SilentRank
	DPRule             = registry.DPRule
	DPResolution       = registry.DPResolution
	Target             = registry.Target
	HeadSlice          = registry.HeadSlice

	rankKey = registry.RankKey
)

// DP rank rules, in SGLang's resolution order (registry.DPRule).
const (
	DPRuleNone       = registry.DPRuleNone
	DPRuleHint       = registry.DPRuleHint
	DPRuleSingleDP   = registry.DPRuleSingleDP
	DPRuleFollowRoom = registry.DPRuleFollowRoom
	DPRuleBinding    = registry.DPRuleBinding
)

// ComputeHeadSliceParams mirrors SGLang's compute_head_slice_params
// (transfer.ComputeHeadSliceParams).
func ComputeHeadSliceParams(srcTP, dstTP, srcRank, dstRank, totalHeads int) HeadSlice {
	return transfer.ComputeHeadSliceParams(srcTP, dstTP, srcRank, dstRank, totalHeads)
}

// newRegistry builds the manager's registry from its configuration.
func newRegistry(cfg Config, layout prealloc.Layout, clk clock.Clock) *registry.Registry {
	iv, mf := cfg.Timeouts.EffectiveHeartbeat()
	return registry.New(registry.Config{Layout: layout, HeartbeatInterval: iv, MaxFailures: mf,
		ForceQuery: cfg.DPRank.ForceQuery, BindingTTL: cfg.DPRank.BindingTTL, Now: clk.Now})
}

// addrWait is SGLang's per-address topology retry budget (spec §4.3): rooms
// waiting for an instance's registration are re-checked with back-off
// 1, 1, 2, 4, 4, ... s; after PrefillInfoAttempts checks they fail (T3).
type addrWait struct {
	addr     string
	rooms    map[uint64]*room
	attempts int
	next     deadline // the next check, on the manager's deadline heap
}

// backoff returns the delay before check number n (0-based): base, base,
// 2·base, 4·base, ... capped.
func (t TimeoutConfig) backoff(n int) time.Duration {
	d := t.PrefillInfoBackoff
	for i := 1; i < n && d < t.PrefillInfoBackoffMax; i++ {
		d *= 2
	}
	return min(d, t.PrefillInfoBackoffMax)
}

// RegisterPrefill registers one prefill rank (registry.Registry.Check, then
// Record) and applies what it did to the rooms: a new instance id for a known
// address fails the rooms still handing off there, a new endpoint for a
// known rank fails those of its DP group, and a completed registration lets
// the rooms waiting for it go on.
//
// The checks that read no state (compatibility, the rank mapping) run
// before the manager's lock; recording and applying the events run under it.
func (m *Manager) RegisterPrefill(reg Registration) (RegistrationResult, error) {
	checked, err := m.reg.Check(reg)
	if err != nil {
		return RegistrationResult{}, err
	}
	m.mu.Lock()
	defer m.unlock()
	res, evs, err := m.reg.Record(checked)
	if err != nil {
		return RegistrationResult{}, err
	}
	res.RoomsFailed += m.applyLocked(evs)
	return res, nil
}

// applyLocked applies the registry's events to the rooms, in order, and
// returns how many rooms failed.
func (m *Manager) applyLocked(evs []registry.Event) int {
	failed := 0
	for _, e := range evs {
		addr := e.Addr
		switch e.Kind {
		case registry.RankRegistered:
			m.obs.PrefillRegistered(addr, e.Replaced)
		case registry.InstanceReplaced:
			failed += m.failRoomsLocked(func(r *room) bool { return r.addr == addr && r.handingOff() },
				Failure{Code: FailurePrefillLost, Message: e.Message})
		case registry.RankReplaced:
			dp := e.Rank.DP
			failed += m.failRoomsLocked(func(r *room) bool { return r.addr == addr && r.prefillDP == dp && r.handingOff() },
				Failure{Code: FailurePrefillLost, Message: e.Message})
		case registry.InstanceComplete:
			topo := e.Instance.Topology
			m.log.Info("prefill instance registered", "bootstrap_addr", addr, "ranks", e.Instance.Registered,
				"attn_tp", topo.AttnTP, "dp", topo.DP, "pp", topo.PP, "attn_cp", topo.AttnCP, "follow_bootstrap_room", topo.FollowBootstrapRoom)
			if w := m.waitPrefill[addr]; w != nil {
				m.clearDeadlineLocked(&w.next)
				delete(m.waitPrefill, addr)
				for _, r := range sortedRooms(w.rooms) {
					if r.phase == PhaseWaitingPrefill {
						m.afterPrefillKnownLocked(r, e.Instance, "T4")
					}
				}
			}
		case registry.HeartbeatMissed:
			for range e.Count {
				m.obs.HeartbeatMissed(addr)
			}
		case registry.InstanceLost:
			who := e.SilentList()
			n := m.countRoomsLocked(func(r *room) bool { return r.addr == addr && r.handingOff() })
			m.log.Warn("prefill instance lost: heartbeats stopped", "bootstrap_addr", addr, "rooms_affected", n,
				"silent_ranks", who, "silent_rank_count", e.SilentTotal, "heartbeat_interval", e.Interval, "heartbeat_max_failures", e.MaxFailures)
			failed += m.failRoomsLocked(func(r *room) bool { return r.addr == addr && r.handingOff() },
				Failure{Code: FailurePrefillLost, Message: e.LostMessage(n)})
			m.obs.PrefillLost(addr, n)
		}
	}
	return failed
}

// Heartbeat refreshes a registered rank (registry.Registry.Heartbeat). An
// unknown rank (never registered, or its instance was declared dead or
// replaced) is ErrPrefillNotFound: the rank must register again. It takes
// the registry's lock only, never the manager's.
func (m *Manager) Heartbeat(rank RankID, instanceID string) (time.Duration, int, error) {
	return m.reg.Heartbeat(rank, instanceID)
}

// checkLiveness declares dead every instance with a rank silent for
// max_failures heartbeat intervals (SGLang T15). The rooms' failure, the log
// line and the metrics say which ranks went silent and for how long.
func (m *Manager) checkLiveness() {
	m.mu.Lock()
	defer m.unlock()
	m.applyLocked(m.reg.CheckLiveness())
}

func (m *Manager) countRoomsLocked(match func(*room) bool) int {
	n := 0
	for _, r := range m.rooms {
		if match(r) {
			n++
		}
	}
	return n
}

func (m *Manager) failRoomsLocked(match func(*room) bool, f Failure) int {
	var victims []*room
	for _, r := range m.rooms {
		if match(r) {
			victims = append(victims, r)
		}
	}
	slices.SortFunc(victims, func(a, b *room) int { return compareU64(a.id, b.id) })
	for _, r := range victims {
		m.failLocked(r, f)
	}
	return len(victims)
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func sortedRooms(set map[uint64]*room) []*room {
	out := make([]*room, 0, len(set))
	for _, r := range set {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *room) int { return compareU64(a.id, b.id) })
	return out
}

// waitForPrefillLocked parks a room until its instance completes its
// registration, under SGLang's retry budget.
func (m *Manager) waitForPrefillLocked(r *room) {
	w := m.waitPrefill[r.addr]
	if w == nil {
		w = &addrWait{addr: r.addr, rooms: map[uint64]*room{}}
		m.waitPrefill[r.addr] = w
	}
	w.rooms[r.id] = r
	if !w.next.armed() {
		m.scheduleAttemptLocked(r.addr, w)
	}
}

func (m *Manager) scheduleAttemptLocked(addr string, w *addrWait) {
	if m.closed {
		return
	}
	m.setDeadlineLocked(&w.next, dlPrefillAttempt, m.clock.Now().Add(m.cfg.Timeouts.backoff(w.attempts)), 0, 0, w)
}

// prefillAttemptLocked is one check of an address's registration (one of SGLang's
// _ensure_prefill_info attempts).
func (m *Manager) prefillAttemptLocked(addr string, w *addrWait) {
	if m.waitPrefill[addr] != w {
		return
	}
	for id, r := range w.rooms {
		if r.phase != PhaseWaitingPrefill {
			delete(w.rooms, id)
		}
	}
	if len(w.rooms) == 0 {
		delete(m.waitPrefill, addr)
		return
	}
	w.attempts++
	inst, known := m.reg.Instance(addr)
	if known && inst.Complete {
		delete(m.waitPrefill, addr)
		for _, r := range sortedRooms(w.rooms) {
			m.afterPrefillKnownLocked(r, inst, "T4")
		}
		return
	}
	if w.attempts >= m.cfg.Timeouts.PrefillInfoAttempts {
		delete(m.waitPrefill, addr)
		registered := inst.Registered // zero when no rank of addr is registered
		msg := fmt.Sprintf("Could not fetch prefill parallel info from %s after %d attempts", addr, w.attempts)
		if registered > 0 {
			msg += fmt.Sprintf(" (Prefill server not fully registered yet (%d workers registered).)", registered)
		}
		for _, r := range sortedRooms(w.rooms) {
			m.failLocked(r, Failure{Code: FailurePrefillUnavailable, Message: msg})
		}
		return
	}
	m.scheduleAttemptLocked(addr, w)
}
