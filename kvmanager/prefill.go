package kvmanager

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/kvmanager/room"
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
func newRegistry(cfg Config, layout kvlayout.Layout, clk kvlayout.Clock, leaseLiveness bool) *registry.Registry {
	iv, mf := cfg.Timeouts.EffectiveHeartbeat()
	return registry.New(registry.Config{Layout: layout, HeartbeatInterval: iv, MaxFailures: mf,
		ForceQuery: cfg.DPRank.ForceQuery, BindingTTL: cfg.DPRank.BindingTTL, Now: clk.Now, LeaseLiveness: leaseLiveness})
}

// addrWait is SGLang's per-address topology retry budget (_ensure_prefill_info): rooms
// waiting for an instance's registration are re-checked with back-off
// 1, 1, 2, 4, 4, ... s; after PrefillInfoAttempts checks they fail (T3).
type addrWait struct {
	addr     string
	rooms    map[uint64]*entry // of every shard; waitList.mu guards the map (and attempts)
	attempts int
	next     deadline // the next check, on the manager's deadline heap
}

// waitList is the rooms waiting for their prefill instance's registration,
// by address, with SGLang's retry schedule per address. A leaf lock (taken
// under a shard's).
type waitList struct {
	m     *Manager
	mu    sync.Mutex
	addrs map[string]*addrWait
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
	for _, ev := range evs {
		addr := ev.Addr
		switch ev.Kind {
		case registry.RankRegistered:
			m.obs.PrefillRegistered(addr, ev.Replaced)
		case registry.InstanceReplaced:
			m.obs.PrefillInstanceReplaced(addr)
			n := m.shards.fail(func(e *entry) bool { return e.Addr() == addr && e.HandingOff() },
				Failure{Code: FailurePrefillLost, Message: ev.Message})
			m.log.Warn("prefill instance replaced: a new instance id registered at its address", "bootstrap_addr", addr, "rooms_failed", n, "reason", ev.Message)
			failed += n
		case registry.RankReplaced:
			dp := ev.Rank.DP
			n := m.shards.fail(func(e *entry) bool { return e.Addr() == addr && e.PrefillDP() == dp && e.HandingOff() },
				Failure{Code: FailurePrefillLost, Message: ev.Message})
			m.log.Warn("prefill rank replaced: a new endpoint registered for it", "bootstrap_addr", addr, "rank", ev.Rank.String(), "rooms_failed", n, "reason", ev.Message)
			failed += n
		case registry.InstanceComplete:
			topo := ev.Instance.Topology
			m.log.Info("prefill instance registered", "bootstrap_addr", addr, "ranks", ev.Instance.Registered,
				"attn_tp", topo.AttnTP, "dp", topo.DP, "pp", topo.PP, "attn_cp", topo.AttnCP, "follow_bootstrap_room", topo.FollowBootstrapRoom)
			if w := m.wait.take(addr, nil); w != nil {
				m.dl.clear(&w.next)
				m.wait.each(w, func(sh *shard, e *entry) { sh.prefillKnown(e, ev.Instance) })
			}
		case registry.HeartbeatMissed:
			for range ev.Count {
				m.obs.HeartbeatMissed(addr)
			}
		case registry.InstanceLost:
			who := ev.SilentList()
			n := 0
			m.shards.each(func(sh *shard) {
				for _, e := range sh.rooms {
					if e.Addr() == addr && e.HandingOff() {
						n++
					}
				}
			})
			if ev.Message != "" {
				m.log.Warn("prefill instance lost", "bootstrap_addr", addr, "rooms_affected", n, "reason", ev.Message)
			} else {
				m.log.Warn("prefill instance lost: heartbeats stopped", "bootstrap_addr", addr, "rooms_affected", n,
					"silent_ranks", who, "silent_rank_count", ev.SilentTotal, "heartbeat_interval", ev.Interval, "heartbeat_max_failures", ev.MaxFailures)
			}
			failed += m.shards.fail(func(e *entry) bool { return e.Addr() == addr && e.HandingOff() },
				Failure{Code: FailurePrefillLost, Message: ev.LostMessage(n)})
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

// failRooms fails the rooms match selects, shard by shard (each shard's in
// room order), and returns how many it failed.
func (ss shardSet) fail(match func(*entry) bool, f Failure) int {
	n := 0
	ss.each(func(sh *shard) {
		for _, e := range sh.sorted(match) {
			sh.fail(e, f)
			n++
		}
	})
	return n
}

// toPrefill continues a room once its prefill instance is fully
// registered, or parks it until it is. A registration completed while the
// room was being parked is seen by the second look (the registry records
// the completion before its event takes the waiting rooms).
func (sh *shard) toPrefill(e *entry) {
	m := sh.m
	if inst, ok := m.reg.Instance(e.Addr()); ok && inst.Complete {
		sh.prefillKnown(e, inst)
		return
	}
	if e.Phase().Terminal() {
		return
	}
	m.wait.park(e)
	if inst, ok := m.reg.Instance(e.Addr()); ok && inst.Complete && e.Phase() == PhaseWaitingPrefill {
		sh.prefillKnown(e, inst)
	}
}

// prefillKnown continues a room whose prefill instance is fully
// registered: its rank plan, then its DP rank (the registry's rules, read
// here when the room needs them).
func (sh *shard) prefillKnown(e *entry, inst registry.Instance) {
	if e.Phase() != PhaseWaitingPrefill {
		return
	}
	topo := inst.Topology
	ev := room.PrefillKnown{Now: sh.m.clock.Now(), Plan: inst.Plan, Topology: topo}
	if e.NeedsDPRule(topo.DP) {
		ev.DP, ev.Rule, ev.Resolved = sh.m.reg.ResolveDP(e.Addr(), e.ID(), e.HintDP(), topo)
	}
	sh.exec(e, ev)
}

// park adds a room to its address's waiting rooms, under SGLang's retry
// budget (the room's shard lock is held).
func (wl *waitList) park(e *entry) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	w := wl.addrs[e.Addr()]
	if w == nil {
		w = &addrWait{addr: e.Addr(), rooms: map[uint64]*entry{}}
		wl.addrs[e.Addr()] = w
	}
	w.rooms[e.ID()] = e
	e.parked = true
	if !wl.m.dl.armed(&w.next) {
		wl.schedule(w)
	}
}

// leave takes a room off its address's waiting rooms (its shard lock is
// held).
func (wl *waitList) leave(e *entry) {
	if !e.parked {
		return
	}
	e.parked = false
	wl.mu.Lock()
	if w := wl.addrs[e.Addr()]; w != nil {
		delete(w.rooms, e.ID())
	}
	wl.mu.Unlock()
}

// take removes and returns the address's waiting rooms (only if they are
// w, when w is set).
func (wl *waitList) take(addr string, w *addrWait) *addrWait {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	cur := wl.addrs[addr]
	if cur == nil || (w != nil && cur != w) {
		return nil
	}
	delete(wl.addrs, addr)
	return cur
}

// each runs f on w's rooms still waiting for their prefill (w is no
// longer in the waiting addresses), shard by shard and in room order, each
// under its shard lock and only while the shard still holds it.
func (wl *waitList) each(w *addrWait, f func(*shard, *entry)) {
	wl.mu.Lock()
	rooms := make([]*entry, 0, len(w.rooms))
	for _, e := range w.rooms {
		rooms = append(rooms, e)
	}
	wl.mu.Unlock()
	slices.SortFunc(rooms, func(a, b *entry) int { return compareU64(a.ID(), b.ID()) })
	for _, sh := range wl.m.shards {
		locked := false
		for _, e := range rooms {
			if e.DecodeDP() != sh.idx {
				continue
			}
			if !locked {
				sh.mu.Lock()
				locked = true
			}
			if sh.rooms[e.ID()] == e && e.Phase() == PhaseWaitingPrefill {
				f(sh, e)
			}
		}
		if locked {
			sh.unlock()
		}
	}
}

func (wl *waitList) schedule(w *addrWait) {
	m := wl.m
	if m.closed.Load() {
		return
	}
	m.dl.set(&w.next, dlPrefillAttempt, m.clock.Now().Add(m.cfg.Timeouts.backoff(w.attempts)), 0, w)
}

// attempt is one check of an address's registration (one of SGLang's
// _ensure_prefill_info attempts). What it decides is decided under the
// waiting addresses' lock; the rooms it continues or fails are then handled
// shard by shard.
func (wl *waitList) attempt(w *addrWait) {
	m := wl.m
	wl.mu.Lock()
	addr := w.addr
	if wl.addrs[addr] != w {
		wl.mu.Unlock()
		return
	}
	if len(w.rooms) == 0 {
		delete(wl.addrs, addr)
		wl.mu.Unlock()
		return
	}
	w.attempts++
	inst, known := m.reg.Instance(addr)
	if known && inst.Complete {
		delete(wl.addrs, addr)
		wl.mu.Unlock()
		wl.each(w, func(sh *shard, e *entry) { sh.prefillKnown(e, inst) })
		return
	}
	if w.attempts >= m.cfg.Timeouts.PrefillInfoAttempts {
		delete(wl.addrs, addr)
		wl.mu.Unlock()
		registered := inst.Registered // zero when no rank of addr is registered
		msg := fmt.Sprintf("Could not fetch prefill parallel info from %s after %d attempts", addr, w.attempts)
		if registered > 0 {
			msg += fmt.Sprintf(" (Prefill server not fully registered yet (%d workers registered).)", registered)
		}
		wl.each(w, func(sh *shard, e *entry) { sh.fail(e, Failure{Code: FailurePrefillUnavailable, Message: msg}) })
		return
	}
	wl.schedule(w)
	wl.mu.Unlock()
}
