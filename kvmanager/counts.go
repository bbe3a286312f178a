package kvmanager

// The counts behind Status, InFlight and RoomsFor (shard.byPhase,
// shard.byAddr): kept under the shard's lock on every transition and when a
// room is forgotten, so that no status, scrape or drain path walks the
// rooms.

// addrRooms counts one bootstrap address's rooms of a shard: all held, and
// live (not terminal).
type addrRooms struct{ all, live int }

// count keeps byPhase and byAddr: r moves from one phase to another (from
// is PhaseUnspecified for a new room). Called by movedLocked only.
func (sh *shard) count(r *room, from, to Phase) {
	a := sh.byAddr[r.addr]
	if a == nil {
		if sh.byAddr == nil {
			sh.byAddr = map[string]*addrRooms{}
		}
		a = &addrRooms{}
		sh.byAddr[r.addr] = a
	}
	if from == PhaseUnspecified {
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
func (sh *shard) uncount(r *room) {
	if r.phase == PhaseUnspecified {
		return
	}
	sh.byPhase[r.phase]--
	if a := sh.byAddr[r.addr]; a != nil {
		a.all--
		if !r.phase.Terminal() {
			a.live--
		}
		if a.all <= 0 {
			delete(sh.byAddr, r.addr)
		}
	}
}
