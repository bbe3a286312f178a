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
func newRegistry(cfg Config, layout prealloc.Layout, clk clock.Clock, leaseLiveness bool) *registry.Registry {
	iv, mf := cfg.Timeouts.EffectiveHeartbeat()
	return registry.New(registry.Config{Layout: layout, HeartbeatInterval: iv, MaxFailures: mf,
		ForceQuery: cfg.DPRank.ForceQuery, BindingTTL: cfg.DPRank.BindingTTL, Now: clk.Now, LeaseLiveness: leaseLiveness})
}

// addrWait is SGLang's per-address topology retry budget (_ensure_prefill_info): rooms
// waiting for an instance's registration are re-checked with back-off
// 1, 1, 2, 4, 4, ... s; after PrefillInfoAttempts checks they fail (T3).
type addrWait struct {
	addr     string
	rooms    map[uint64]*room // of every shard; Manager.wait.mu guards the map (and attempts)
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
// first; recording takes the registry's lock only, and the events are
// applied afterwards, shard by shard.
func (m *Manager) RegisterPrefill(reg Registration) (RegistrationResult, error) {
	checked, err := m.reg.Check(reg)
	if err != nil {
		return RegistrationResult{}, err
	}
	res, evs, err := m.reg.Record(checked)
	if err != nil {
		return RegistrationResult{}, err
	}
	res.RoomsFailed += m.apply(evs)
	return res, nil
}

// apply applies the registry's events to the rooms, in order, and returns
// how many rooms failed. It holds no lock: each event is applied shard by
// shard, one shard lock at a time.
func (m *Manager) apply(evs []registry.Event) int {
	failed := 0
	for _, e := range evs {
		addr := e.Addr
		switch e.Kind {
		case registry.RankRegistered:
			m.obs.PrefillRegistered(addr, e.Replaced)
		case registry.InstanceReplaced:
			m.obs.PrefillInstanceReplaced(addr)
			failed += m.failRooms(func(r *room) bool { return r.addr == addr && r.handingOff() },
				Failure{Code: FailurePrefillLost, Message: e.Message})
		case registry.RankReplaced:
			dp := e.Rank.DP
			failed += m.failRooms(func(r *room) bool { return r.addr == addr && r.prefillDP == dp && r.handingOff() },
				Failure{Code: FailurePrefillLost, Message: e.Message})
		case registry.InstanceComplete:
			topo := e.Instance.Topology
			m.log.Info("prefill instance registered", "bootstrap_addr", addr, "ranks", e.Instance.Registered,
				"attn_tp", topo.AttnTP, "dp", topo.DP, "pp", topo.PP, "attn_cp", topo.AttnCP, "follow_bootstrap_room", topo.FollowBootstrapRoom)
			if w := m.takeWait(addr, nil); w != nil {
				m.clearDeadlineLocked(&w.next)
				m.eachWaiting(w, func(r *room) {
					if r.phase == PhaseWaitingPrefill {
						m.afterPrefillKnownLocked(r, e.Instance, "T4")
					}
				})
			}
		case registry.HeartbeatMissed:
			for range e.Count {
				m.obs.HeartbeatMissed(addr)
			}
		case registry.InstanceLost:
			who := e.SilentList()
			n := m.countRooms(func(r *room) bool { return r.addr == addr && r.handingOff() })
			if e.Message != "" {
				m.log.Warn("prefill instance lost", "bootstrap_addr", addr, "rooms_affected", n, "reason", e.Message)
			} else {
				m.log.Warn("prefill instance lost: heartbeats stopped", "bootstrap_addr", addr, "rooms_affected", n,
					"silent_ranks", who, "silent_rank_count", e.SilentTotal, "heartbeat_interval", e.Interval, "heartbeat_max_failures", e.MaxFailures)
			}
			failed += m.failRooms(func(r *room) bool { return r.addr == addr && r.handingOff() },
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
	m.apply(m.reg.CheckLiveness())
}

// countRooms counts the rooms match selects, shard by shard.
func (m *Manager) countRooms(match func(*room) bool) int {
	n := 0
	m.eachShard(func(sh *shard) {
		for _, r := range sh.rooms {
			if match(r) {
				n++
			}
		}
	})
	return n
}

// failRooms fails the rooms match selects, shard by shard (each shard's in
// room order), and returns how many it failed.
func (m *Manager) failRooms(match func(*room) bool, f Failure) int {
	n := 0
	m.eachShard(func(sh *shard) {
		var victims []*room
		for _, r := range sh.rooms {
			if match(r) {
				victims = append(victims, r)
			}
		}
		slices.SortFunc(victims, func(a, b *room) int { return compareU64(a.id, b.id) })
		for _, r := range victims {
			m.failLocked(r, f)
		}
		n += len(victims)
	})
	return n
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
// registration, under SGLang's retry budget (the room's shard lock is held;
// the waiting addresses' leaf lock is taken here).
func (m *Manager) waitForPrefillLocked(r *room) {
	m.wait.mu.Lock()
	defer m.wait.mu.Unlock()
	w := m.wait.addrs[r.addr]
	if w == nil {
		w = &addrWait{addr: r.addr, rooms: map[uint64]*room{}}
		m.wait.addrs[r.addr] = w
	}
	w.rooms[r.id] = r
	r.parked = true
	if !m.dlArmed(&w.next) {
		m.scheduleAttempt(w)
	}
}

// unwait takes a room off its address's waiting rooms (its shard lock is
// held).
func (m *Manager) unwait(r *room) {
	if !r.parked {
		return
	}
	r.parked = false
	m.wait.mu.Lock()
	if w := m.wait.addrs[r.addr]; w != nil {
		delete(w.rooms, r.id)
	}
	m.wait.mu.Unlock()
}

// takeWait removes and returns the address's waiting rooms (only if they
// are w, when w is set).
func (m *Manager) takeWait(addr string, w *addrWait) *addrWait {
	m.wait.mu.Lock()
	defer m.wait.mu.Unlock()
	cur := m.wait.addrs[addr]
	if cur == nil || (w != nil && cur != w) {
		return nil
	}
	delete(m.wait.addrs, addr)
	return cur
}

// eachWaiting runs f on w's rooms (w is no longer in the waiting
// addresses), shard by shard and in room order, each under its shard lock
// and only while the shard still holds it.
func (m *Manager) eachWaiting(w *addrWait, f func(*room)) {
	m.wait.mu.Lock()
	rooms := sortedRooms(w.rooms)
	m.wait.mu.Unlock()
	for _, sh := range m.shards {
		locked := false
		for _, r := range rooms {
			if r.decodeDP != sh.idx {
				continue
			}
			if !locked {
				sh.mu.Lock()
				locked = true
			}
			if sh.rooms[r.id] == r {
				f(r)
			}
		}
		if locked {
			m.unlockShard(sh)
		}
	}
}

func (m *Manager) scheduleAttempt(w *addrWait) {
	if m.closed.Load() {
		return
	}
	m.setDeadlineLocked(&w.next, dlPrefillAttempt, m.clock.Now().Add(m.cfg.Timeouts.backoff(w.attempts)), 0, 0, w)
}

// prefillAttempt is one check of an address's registration (one of SGLang's
// _ensure_prefill_info attempts). What it decides is decided under the
// waiting addresses' lock; the rooms it continues or fails are then handled
// shard by shard.
func (m *Manager) prefillAttempt(w *addrWait) {
	m.wait.mu.Lock()
	addr := w.addr
	if m.wait.addrs[addr] != w {
		m.wait.mu.Unlock()
		return
	}
	if len(w.rooms) == 0 {
		delete(m.wait.addrs, addr)
		m.wait.mu.Unlock()
		return
	}
	w.attempts++
	inst, known := m.reg.Instance(addr)
	if known && inst.Complete {
		delete(m.wait.addrs, addr)
		m.wait.mu.Unlock()
		m.eachWaiting(w, func(r *room) {
			if r.phase == PhaseWaitingPrefill {
				m.afterPrefillKnownLocked(r, inst, "T4")
			}
		})
		return
	}
	if w.attempts >= m.cfg.Timeouts.PrefillInfoAttempts {
		delete(m.wait.addrs, addr)
		m.wait.mu.Unlock()
		registered := inst.Registered // zero when no rank of addr is registered
		msg := fmt.Sprintf("Could not fetch prefill parallel info from %s after %d attempts", addr, w.attempts)
		if registered > 0 {
			msg += fmt.Sprintf(" (Prefill server not fully registered yet (%d workers registered).)", registered)
		}
		m.eachWaiting(w, func(r *room) {
			if r.phase == PhaseWaitingPrefill {
				m.failLocked(r, Failure{Code: FailurePrefillUnavailable, Message: msg})
			}
		})
		return
	}
	m.scheduleAttempt(w)
	m.wait.mu.Unlock()
}
