package kvmanager

// The counts behind Status, InFlight and RoomsFor (shard.byPhase,
// shard.byAddr): kept under the shard's lock on every transition and when a
// room is forgotten, so that no status, scrape or drain path walks the
// rooms.

// addrRooms counts one bootstrap address's rooms of a shard: all held, and
// live (not terminal).
type addrRooms struct{ all, live int }

// count keeps byPhase and byAddr: r moves from one phase to another (from
// is PhaseUnspecified for a new room). Called by moved only.
func (sh *shard) count(e *entry, from, to Phase) {
	a := sh.byAddr[e.Addr()]
	if a == nil {
		if sh.byAddr == nil {
			sh.byAddr = map[string]*addrRooms{}
		}
		a = &addrRooms{}
		sh.byAddr[e.Addr()] = a
	}
	if from == PhaseUnspecified {
		e.counted = true
		a.all++
	} else {
		sh.byPhase[from]--
		if !from.Terminal() {
			a.live--
		}
	}
	sh.byPhase[to]++
	if !to.Terminal() {
		a.live++
	}
}

// uncount removes a forgotten room from the counts (nothing for a room
// refused before its first transition: it was never counted).
func (sh *shard) uncount(e *entry) {
	p := e.Phase()
	if p == PhaseUnspecified || !e.counted {
		return
	}
	sh.byPhase[p]--
	if a := sh.byAddr[e.Addr()]; a != nil {
		a.all--
		if !p.Terminal() {
			a.live--
		}
		if a.all <= 0 {
			delete(sh.byAddr, e.Addr())
		}
	}
}
