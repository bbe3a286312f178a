package kvmanager

import (
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// BindRoom records which prefill DP rank scheduled a room (SGLang's
// register_dp_rank), reported by that prefill rank (registry.Registry.BindRoom),
// and applies it to the room. Under follow_bootstrap_room a rank other than
// room % dp_size is a conflict unless force_query is set; the room, if open,
// fails with SGLang's message. A room resolving its DP rank is resolved; a
// room already resolved to another rank fails.
func (m *Manager) BindRoom(addr string, id uint64, dp int) (replaced bool, err error) {
	replaced, ev, err := m.reg.BindRoom(addr, id, dp)
	switch ev.Kind {
	case registry.BindConflict:
		if sh, e := m.shards.lock(id); e != nil {
			if e.Addr() == addr && e.HandingOff() {
				sh.fail(e, Failure{Code: FailureDPRankConflict, Message: ev.Message})
			}
			sh.unlock()
		}
		return false, err
	case registry.RoomBound:
	default:
		return false, err
	}
	sh, e := m.shards.lock(id)
	if e == nil {
		return replaced, nil
	}
	defer sh.unlock()
	if ef := sh.exec(e, room.Bound{Now: m.clock.Now(), Addr: addr, DP: dp, SelfWriter: m.selfWriters.known(addr)}); ef.Err != nil {
		return replaced, ef.Err
	}
	return replaced, nil
}

// LookupDPRanks resolves rooms in SGLang's order (registry.Registry.LookupDPRanks);
// rooms no rule resolves are returned as unresolved, never guessed. It takes
// the registry's lock only, never the manager's: the instance's binding
// table and the clock are read once per call, and the observer hears one
// count per rule per accepted call (none for a refused one), after the lock.
func (m *Manager) LookupDPRanks(addr string, rooms []uint64, hints map[uint64]int) ([]DPResolution, []uint64, error) {
	lk, err := m.reg.LookupDPRanks(addr, rooms, hints)
	if err != nil {
		return nil, nil, err
	}
	for rule, n := range lk.ByRule {
		if n > 0 {
			m.obs.DPRankResolvedN(DPRule(rule), n)
		}
	}
	return lk.Resolved, lk.Unresolved, nil
}

// BoundDPRanks answers rooms from the instance's bindings alone (BindRoom,
// SGLang's register_dp_rank), as SGLang's bootstrap server answers
// /query_dp_ranks: rooms bound within dp_rank.binding_ttl, in the order
// asked, appended to out; rooms without a binding are left out, whatever
// else would resolve them (registry.Registry.BoundDPRanks). LookupDPRanks
// applies every rule. The observer counts the answers as binding
// resolutions.
func (m *Manager) BoundDPRanks(addr string, rooms []uint64, out []DPResolution) []DPResolution {
	n := len(out)
	out = m.reg.BoundDPRanks(addr, rooms, out)
	if k := len(out) - n; k > 0 {
		m.obs.DPRankResolvedN(DPRuleBinding, k)
	}
	return out
}
