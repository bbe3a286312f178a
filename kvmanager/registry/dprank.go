package registry

import (
	"fmt"
	"time"
)

// binding is one room → prefill DP rank entry reported by BindRoom.
type binding struct {
	dp int
	at time.Time
}

// ResolveDP applies SGLang's order (_resolve_prefill_dp_rank) for a room of the instance at
// addr: router hint (hint >= 0), dp_size == 1, room % dp_size under
// follow_bootstrap_room (unless force_query), the binding table. ok is false
// when the room is not resolvable yet.
func (g *Registry) ResolveDP(addr string, room uint64, hint int, topo PrefillTopology) (dp int, rule DPRule, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resolveAt(g.bindings[addr], time.Time{}, room, hint, topo)
}

// resolveAt is ResolveDP with the instance's binding table and the time
// already read (now is read here if zero and a binding is consulted).
func (g *Registry) resolveAt(tab map[uint64]binding, now time.Time, room uint64, hint int, topo PrefillTopology) (dp int, rule DPRule, ok bool) {
	switch {
	case hint >= 0:
		return hint, DPRuleHint, true
	case topo.DP <= 1:
		return 0, DPRuleSingleDP, true
	case topo.FollowBootstrapRoom && !g.cfg.ForceQuery:
		return int(room % uint64(topo.DP)), DPRuleFollowRoom, true
	}
	if b, found := tab[room]; found {
		if now.IsZero() {
			now = g.cfg.Now()
		}
		if now.Sub(b.at) < g.cfg.BindingTTL {
			return b.dp, DPRuleBinding, true
		}
	}
	return 0, DPRuleNone, false
}

// BindRoom records which prefill DP rank scheduled a room (SGLang's
// register_dp_rank), reported by that prefill rank. Under
// follow_bootstrap_room a rank other than room % dp_size is a conflict
// unless force_query is set: the error wraps ErrDPRankConflict with SGLang's
// message and the event is BindConflict (nothing is recorded). Otherwise the
// binding is recorded and the event is RoomBound; replaced reports that it
// overwrote a binding to another rank. Other errors come with no event.
func (g *Registry) BindRoom(addr string, room uint64, dp int) (replaced bool, ev Event, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[addr]
	if inst == nil {
		return false, Event{}, fmt.Errorf("bind room %d at %s: %w", room, addr, ErrPrefillNotFound)
	}
	if dp < 0 || dp >= inst.topo.DP {
		return false, Event{}, invalid("dp_rank", "%d is out of range: %s has dp_size %d (allowed 0..%d)", dp, addr, inst.topo.DP, inst.topo.DP-1)
	}
	if inst.topo.FollowBootstrapRoom && !g.cfg.ForceQuery {
		if want := int(room % uint64(inst.topo.DP)); dp != want {
			msg := fmt.Sprintf("follow_bootstrap_room conflict: dispatched to dp_rank %d but bootstrap_room %d implies dp_rank %d. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.", dp, room, want)
			return false, Event{Kind: BindConflict, Addr: addr, Room: room, DP: dp, Message: msg}, fmt.Errorf("%w: %s", ErrDPRankConflict, msg)
		}
	}
	tab := g.bindings[addr]
	if tab == nil {
		tab = map[uint64]binding{}
		g.bindings[addr] = tab
	}
	if old, ok := tab[room]; ok && old.dp != dp {
		replaced = true
	}
	tab[room] = binding{dp: dp, at: g.cfg.Now()}
	return replaced, Event{Kind: RoomBound, Addr: addr, Room: room, DP: dp}, nil
}

// LookupDPRanks resolves rooms in SGLang's order; rooms no rule resolves are
// returned as unresolved, never guessed. The instance's binding table and
// the clock are read once per call; ByRule counts the resolutions by rule.
// The instance must be complete (else ErrPrefillNotFound); a hint out of
// range refuses the whole call.
func (g *Registry) LookupDPRanks(addr string, rooms []uint64, hints map[uint64]int) (Lookup, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[addr]
	if inst == nil || !inst.complete {
		return Lookup{}, fmt.Errorf("lookup DP ranks at %s: %w (or not fully registered)", addr, ErrPrefillNotFound)
	}
	topo := inst.topo
	lk := Lookup{Resolved: make([]DPResolution, 0, len(rooms))}
	tab := g.bindings[addr]
	var now time.Time
	if len(tab) > 0 {
		now = g.cfg.Now()
	}
	for _, room := range rooms {
		hint := -1
		if len(hints) > 0 {
			if h, ok := hints[room]; ok {
				if h < 0 || h >= topo.DP {
					return Lookup{}, invalid("hints", "room %d: dp_rank %d is out of range (dp_size %d)", room, h, topo.DP)
				}
				hint = h
			}
		}
		if dp, rule, ok := g.resolveAt(tab, now, room, hint, topo); ok {
			lk.Resolved = append(lk.Resolved, DPResolution{Room: room, DP: dp, Rule: rule})
			lk.ByRule[rule]++
		} else {
			lk.Unresolved = append(lk.Unresolved, room)
		}
	}
	if len(lk.Resolved) == 0 {
		lk.Resolved = nil // as before pre-sizing: nothing resolved is a nil slice
	}
	return lk, nil
}

// BoundDPRanks answers rooms from the instance's binding table alone
// (BindRoom, SGLang's register_dp_rank), as SGLang's bootstrap server
// answers /query_dp_ranks: a room bound within the binding TTL is
// resolved to its rank (Rule DPRuleBinding), every other room is left out
// — whatever the instance's topology, and whether or not it is known or
// complete — and no rule that the decode side can apply by itself
// (dp_size 1, follow_bootstrap_room) is applied. The results are appended
// to out in the order of rooms.
func (g *Registry) BoundDPRanks(addr string, rooms []uint64, out []DPResolution) []DPResolution {
	g.mu.Lock()
	defer g.mu.Unlock()
	tab := g.bindings[addr]
	if len(tab) == 0 {
		return out
	}
	now := g.cfg.Now()
	for _, room := range rooms {
		if b, ok := tab[room]; ok && now.Sub(b.at) < g.cfg.BindingTTL {
			out = append(out, DPResolution{Room: room, DP: b.dp, Rule: DPRuleBinding})
		}
	}
	return out
}

// ExpireBindings forgets the bindings older than the binding TTL.
func (g *Registry) ExpireBindings() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.cfg.Now()
	for addr, tab := range g.bindings {
		for room, b := range tab {
			if now.Sub(b.at) >= g.cfg.BindingTTL {
				delete(tab, room)
			}
		}
		if len(tab) == 0 {
			delete(g.bindings, addr)
		}
	}
}
