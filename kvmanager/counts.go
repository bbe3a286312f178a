package kvmanager

// The counts behind Status, InFlight and RoomsFor (Manager.byPhase,
// Manager.byAddr): kept on every transition and when a room is forgotten,
// so that no status, scrape or drain path walks the rooms under the lock.

// addrRooms counts one bootstrap address's rooms: all held, and live (not
// terminal).
type addrRooms struct{ all, live int }

// countTransitionLocked keeps byPhase and byAddr: r moves from one phase to
// another (from is PhaseUnspecified for a new room). Called by
// transitionLocked only.
func (m *Manager) countTransitionLocked(r *room, from, to Phase) {
	a := m.byAddr[r.addr]
	if a == nil {
		if m.byAddr == nil {
			m.byAddr = map[string]*addrRooms{}
		}
		a = &addrRooms{}
		m.byAddr[r.addr] = a
	}
	if from == PhaseUnspecified {
		a.all++
	} else {
		m.byPhase[from]--
		if !from.Terminal() {
			a.live--
		}
	}
	m.byPhase[to]++
	if !to.Terminal() {
		a.live++
	}
}

// forgetLocked removes r from the rooms held and from the counts.
func (m *Manager) forgetLocked(r *room) {
	delete(m.rooms, r.id)
	m.byPhase[r.phase]--
	if a := m.byAddr[r.addr]; a != nil {
		a.all--
		if !r.phase.Terminal() {
			a.live--
		}
		if a.all <= 0 {
			delete(m.byAddr, r.addr)
		}
	}
}
