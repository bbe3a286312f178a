package kvmanager

import (
	"fmt"
	"time"
)

// binding is one room → prefill DP rank entry reported by BindRoom.
type binding struct {
	dp int
	at time.Time
}

// resolveDP applies SGLang's order (spec §4.5): router hint, dp_size == 1,
// room % dp_size under follow_bootstrap_room (unless force_query), the
// binding table. ok is false when the room is not resolvable yet.
func (m *Manager) resolveDPLocked(addr string, room uint64, hint int, topo PrefillTopology) (dp int, rule DPRule, ok bool) {
	return m.resolveDPAt(m.bindings[addr], time.Time{}, room, hint, topo)
}

// resolveDPAt is resolveDPLocked with the instance's binding table and the
// time already read (now is read here if zero and a binding is consulted).
func (m *Manager) resolveDPAt(tab map[uint64]binding, now time.Time, room uint64, hint int, topo PrefillTopology) (dp int, rule DPRule, ok bool) {
	switch {
	case hint >= 0:
		return hint, DPRuleHint, true
	case topo.DP <= 1:
		return 0, DPRuleSingleDP, true
	case topo.FollowBootstrapRoom && !m.cfg.DPRank.ForceQuery:
		return int(room % uint64(topo.DP)), DPRuleFollowRoom, true
	}
	if b, found := tab[room]; found {
		if now.IsZero() {
			now = m.clock.Now()
		}
		if now.Sub(b.at) < m.cfg.DPRank.BindingTTL {
			return b.dp, DPRuleBinding, true
		}
	}
	return 0, DPRuleNone, false
}

// BindRoom records which prefill DP rank scheduled a room (SGLang's
// register_dp_rank), reported by that prefill rank. Under
// follow_bootstrap_room a rank other than room % dp_size is a conflict unless
// force_query is set; the room, if open, fails with SGLang's message.
func (m *Manager) BindRoom(addr string, room uint64, dp int) (replaced bool, err error) {
	m.mu.Lock()
	defer m.unlock()
	inst := m.prefills[addr]
	if inst == nil {
		return false, fmt.Errorf("bind room %d at %s: %w", room, addr, ErrPrefillNotFound)
	}
	if dp < 0 || dp >= inst.topo.DP {
		return false, invalid("dp_rank", "%d is out of range: %s has dp_size %d (allowed 0..%d)", dp, addr, inst.topo.DP, inst.topo.DP-1)
	}
	if inst.topo.FollowBootstrapRoom && !m.cfg.DPRank.ForceQuery {
		if want := int(room % uint64(inst.topo.DP)); dp != want {
			msg := fmt.Sprintf("follow_bootstrap_room conflict: dispatched to dp_rank %d but bootstrap_room %d implies dp_rank %d. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.", dp, room, want)
			if r := m.rooms[room]; r != nil && r.addr == addr && r.handingOff() {
				m.failLocked(r, Failure{Code: FailureDPRankConflict, Message: msg})
			}
			return false, fmt.Errorf("%w: %s", ErrDPRankConflict, msg)
		}
	}
	tab := m.bindings[addr]
	if tab == nil {
		tab = map[uint64]binding{}
		m.bindings[addr] = tab
	}
	if old, ok := tab[room]; ok && old.dp != dp {
		replaced = true
	}
	tab[room] = binding{dp: dp, at: m.clock.Now()}
	if r := m.rooms[room]; r != nil && r.addr == addr {
		switch {
		case r.phase == PhaseResolvingDP:
			delete(inst.unresolved, room)
			m.dpResolvedLocked(r, inst, dp, DPRuleBinding)
		case r.prefillDP >= 0 && r.prefillDP != dp && r.handingOff():
			msg := fmt.Sprintf("prefill DP rank %d reported holding room %d, but the room was resolved to dp_rank %d (%s); the destination would go to the wrong ranks", dp, room, r.prefillDP, r.dpRule)
			m.failLocked(r, Failure{Code: FailureDPRankConflict, Message: msg})
			return replaced, fmt.Errorf("%w: %s", ErrDPRankConflict, msg)
		}
	}
	return replaced, nil
}

// DPResolution is one room resolved by LookupDPRanks.
type DPResolution struct {
	Room uint64
	DP   int
	Rule DPRule
}

// LookupDPRanks resolves rooms in SGLang's order; rooms no rule resolves are
// returned as unresolved, never guessed. The instance's binding table and
// the clock are read once per call, and the observer hears one count per
// rule per accepted call (none for a refused one), so the lock is held for little more than the map reads.
func (m *Manager) LookupDPRanks(addr string, rooms []uint64, hints map[uint64]int) ([]DPResolution, []uint64, error) {
	m.mu.Lock()
	defer m.unlock()
	inst := m.prefills[addr]
	if inst == nil || !inst.complete {
		return nil, nil, fmt.Errorf("lookup DP ranks at %s: %w (or not fully registered)", addr, ErrPrefillNotFound)
	}
	topo := inst.topo
	res := make([]DPResolution, 0, len(rooms))
	var unresolved []uint64
	var counts [len(dpRuleNames)]int
	tab := m.bindings[addr]
	var now time.Time
	if len(tab) > 0 {
		now = m.clock.Now()
	}
	for _, room := range rooms {
		hint := -1
		if len(hints) > 0 {
			if h, ok := hints[room]; ok {
				if h < 0 || h >= topo.DP {
					return nil, nil, invalid("hints", "room %d: dp_rank %d is out of range (dp_size %d)", room, h, topo.DP)
				}
				hint = h
			}
		}
		if dp, rule, ok := m.resolveDPAt(tab, now, room, hint, topo); ok {
			res = append(res, DPResolution{Room: room, DP: dp, Rule: rule})
			counts[rule]++
		} else {
			unresolved = append(unresolved, room)
		}
	}
	for rule, n := range counts {
		if n > 0 {
			m.obs.DPRankResolvedN(DPRule(rule), n)
		}
	}
	if len(res) == 0 {
		res = nil // as before pre-sizing: nothing resolved is a nil slice
	}
	return res, unresolved, nil
}
