package kvmanager

import (
	"fmt"

	"github.com/decodeplane/decodeplane/kvmanager/registry"
)

// BindRoom records which prefill DP rank scheduled a room (SGLang's
// register_dp_rank), reported by that prefill rank (registry.Registry.BindRoom),
// and applies it to the room. Under follow_bootstrap_room a rank other than
// room % dp_size is a conflict unless force_query is set; the room, if open,
// fails with SGLang's message. A room resolving its DP rank is resolved; a
// room already resolved to another rank fails.
func (m *Manager) BindRoom(addr string, room uint64, dp int) (replaced bool, err error) {
	replaced, ev, err := m.reg.BindRoom(addr, room, dp)
	switch ev.Kind {
	case registry.BindConflict:
		if sh, r := m.lockRoom(room); r != nil {
			if r.addr == addr && r.handingOff() {
				m.failLocked(r, Failure{Code: FailureDPRankConflict, Message: ev.Message})
			}
			m.unlockShard(sh)
		}
		return false, err
	case registry.RoomBound:
	default:
		return false, err
	}
	sh, r := m.lockRoom(room)
	if r == nil {
		return replaced, nil
	}
	defer m.unlockShard(sh)
	if r.addr == addr {
		switch {
		case r.phase == PhaseResolvingDP:
			m.dpResolvedLocked(r, dp, DPRuleBinding)
		case r.prefillDP >= 0 && r.prefillDP != dp && r.handingOff():
			msg := fmt.Sprintf("prefill DP rank %d reported holding room %d, but the room was resolved to dp_rank %d (%s); the destination would go to the wrong ranks", dp, room, r.prefillDP, r.dpRule)
			m.failLocked(r, Failure{Code: FailureDPRankConflict, Message: msg})
			return replaced, fmt.Errorf("%w: %s", ErrDPRankConflict, msg)
		}
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
