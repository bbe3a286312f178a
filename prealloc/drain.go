package prealloc

// drainedRes is what the draining rooms hold, maintained by DrainRoom and
// drop (a draining room cannot grow or shrink), for Stats.
type drainedRes struct{ pages, swa, req, meta, mamba int64 }

// account adds (sign 1) or removes (sign -1) what r holds.
func (d *drainedRes) account(r *room, sign int64) {
	d.pages += sign * int64(len(r.pages))
	if r.swa != nil {
		d.swa += sign * int64(len(r.swa)-r.swaOff)
	}
	if r.reqSlot != 0 {
		d.req += sign
	}
	if r.metaSlot >= 0 {
		d.meta += sign
	}
	d.mamba += sign * int64(r.nMamba)
}

// DrainRoom ends a room whose pages a prefill rank may still be writing by
// itself (the deferred release): from admitted, claimed, resumed or
// running it becomes RoomDraining. It keeps exactly what it holds — pages,
// SWA pages, req slot, Mamba slots, and its metadata slot if it has one
// (admitted or claimed: prefill may still write the aux row, so the slot
// and its marker stay held too) — but it is no longer a request: it leaves
// the claim deadline heap and the running set, and counts in no budget term
// of a live request (not active, so no reserved decode tokens; not
// retractable). Its pages simply are not free, so admission never hands
// them out. Release frees everything once every writer is known to have
// stopped (or the caller's bound expired); nothing else applies to a
// draining room (ErrWrongState). Idempotent for a draining room.
// ErrWrongState for a room that holds nothing (waiting, ready, retracted,
// held): the caller just releases it. ErrUnknownRoom for an unknown room.
//
// It is not Drain, which stops the whole ledger taking new rooms.
func (l *Ledger) DrainRoom(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("drain", id)
	if err != nil {
		return err
	}
	switch r.state {
	case RoomDraining:
		return nil
	case RoomAdmitted:
		if r.dlIdx >= 0 {
			l.deadlines.remove(r)
		}
	case RoomRunning:
		l.removeRunning(r)
	case RoomClaimed, RoomResumed:
	default:
		return wrongState("drain", r)
	}
	l.setState(r, RoomDraining)
	l.drained.account(r, 1)
	return nil
}
