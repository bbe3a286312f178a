package prealloc

import "fmt"

// Running rooms: the transfer's success (StartRunning), the engine's decode
// steps (UpdateRunning), retraction (Retract, Hold) and rebootstrap
// (ResumeHeld).

func (l *Ledger) addRunning(r *room) {
	r.runTokens = int64(r.req.PromptLen) + int64(r.req.OutputLen)
	r.runKey = l.clipped(r.req.MaxNewTokens) + int64(r.req.PromptLen)
	l.retractable += r.runTokens
	l.runMax.push(r)
	if l.swaMode == swaTail {
		r.runSWATok = l.swaTailLen(int64(r.req.PromptLen)) + int64(r.req.OutputLen)
		r.runSWAKey = l.swaTailLen(int64(r.req.PromptLen)) + l.clipped(r.req.MaxNewTokens)
		l.retractableSWA += r.runSWATok
		l.runSWAMax.push(r)
	}
}

func (l *Ledger) removeRunning(r *room) {
	l.retractable -= r.runTokens
	l.runMax.remove(r)
	if l.swaMode == swaTail {
		l.retractableSWA -= r.runSWATok
		l.runSWAMax.remove(r)
	}
	r.runTokens, r.runSWATok = 0, 0
}

// StartRunning records that the room's transfer succeeded (admitted or
// claimed room) or that its CPU copy was restored (resumed room): it joins
// the running set with PromptLen + OutputLen tokens and keeps its pages; its
// metadata slot is reset and freed (pop_transferred). A rebootstrap room
// stops being one (the recompute is done). errWrongState otherwise.
func (l *Ledger) StartRunning(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("start running", id)
	if err != nil {
		return err
	}
	switch r.state {
	case RoomAdmitted, RoomClaimed, RoomResumed:
	default:
		return wrongState("start running", r)
	}
	l.freeMeta(r)
	r.req.Rebootstrap = false
	l.setState(r, RoomRunning)
	l.addRunning(r)
	return nil
}

// UpdateRunning records that a running room's output now has outputLen
// tokens (len(output_ids)). It allocates KV pages when the sequence
// (prompt + outputLen tokens, the KV the next decode step writes) crosses a
// page boundary and returns the new page indices in token order (nil if
// none). On a hybrid-swa pool it also grows the room's SWA pages and frees
// the SWA pages that slid out of the window (see the package documentation).
// If the pools are short it returns ErrNoCapacity and allocates nothing.
// outputLen may not shrink (ErrInvalidRequest, nothing changed). Every call
// that is not refused — grown, unchanged or ErrNoCapacity — is also the
// engine's decode-step report that lets rooms retracted before it resume
// (see Retract).
func (l *Ledger) UpdateRunning(id uint64, outputLen int) ([]int32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("update running", id)
	if err != nil {
		return nil, err
	}
	if r.state != RoomRunning {
		return nil, wrongState("update running", r)
	}
	if outputLen < r.req.OutputLen || outputLen > maxRequestTokens {
		return nil, fmt.Errorf("update running room %d: output length %d (was %d): %w", id, outputLen, r.req.OutputLen, ErrInvalidRequest)
	}
	// A valid report, grown or not: rooms retracted before it may resume.
	l.steps++
	seq := int64(r.req.PromptLen) + int64(outputLen)
	have := len(r.pages)
	want := max(have, int(ceilDiv(seq, l.page)))
	newFull := want - have

	// SWA: ScheduleBatch._evict_swa frees the SWA KV of tokens before
	// page_floor(max(evicted, pre_len - window - page)) with pre_len = seq - 1.
	var swaEvict, swaAlloc, newFirst int
	if l.swaMode != swaNone {
		liveEnd := r.swaFirst + len(r.swa) - r.swaOff
		evTok := max(int64(r.swaFirst)*l.page, seq-1-l.window-l.page)
		newFirst = max(r.swaFirst, int(evTok/l.page))
		swaEvict = min(newFirst, liveEnd) - r.swaFirst
		swaAlloc = max(0, want-max(liveEnd, newFirst))
		if l.swaPages.avail()+swaEvict < swaAlloc {
			return nil, fmt.Errorf("update running room %d: %d SWA pages needed, %d free: %w", id, swaAlloc, l.swaPages.avail()+swaEvict, ErrNoCapacity)
		}
	}
	if l.pages.avail() < newFull {
		return nil, fmt.Errorf("update running room %d: %d pages needed, %d free: %w", id, newFull, l.pages.avail(), ErrNoCapacity)
	}
	// Commit.
	delta := int64(outputLen - r.req.OutputLen)
	r.req.OutputLen = outputLen
	r.runTokens += delta
	l.retractable += delta
	if l.swaMode == swaTail {
		r.runSWATok += delta
		l.retractableSWA += delta
	}
	if l.swaMode != swaNone {
		if swaEvict > 0 {
			l.swaPages.give(r.swa[r.swaOff : r.swaOff+swaEvict])
			r.swaOff += swaEvict
		}
		if newFirst > r.swaFirst+swaEvict {
			// Every live SWA page was evicted and the window starts past them.
			r.swaOff = len(r.swa)
		}
		r.swaFirst = newFirst
		if swaAlloc > 0 {
			if cap(r.swa)-len(r.swa) < swaAlloc {
				live := r.swa[r.swaOff:]
				ns := append(l.pool.get(len(live)+swaAlloc), live...)
				if r.swa != nil {
					r.retired = append(r.retired, r.swa)
				}
				r.swa, r.swaOff = ns, 0
			}
			r.swa = l.swaPages.take(r.swa, swaAlloc)
		}
	}
	if newFull == 0 {
		return nil, nil
	}
	if cap(r.pages)-have < newFull {
		np := append(l.pool.get(want), r.pages...)
		if r.pages != nil {
			r.retired = append(r.retired, r.pages)
		}
		r.pages = np
	}
	r.pages = l.pages.take(r.pages, newFull)
	return r.pages[have:want:want], nil
}

// Retract moves a running room to the retracted queue (KV pressure; the
// engine keeps a CPU copy): its req slot, pages and state slots are freed at
// once. Admission passes resume retracted rooms first, in retraction order,
// and admit nothing new while any remain. SGLang retracts inside
// update_running_batch: the running batch then grows into the freed pages,
// and only the next process_decode_queue resumes retracted requests. The
// ledger keeps that order across separate calls: while rooms are running, a
// retracted room is not resumed before the next UpdateRunning (the engine's
// next decode-step report); with no running room it may resume at the next
// pass. Refused unless running; ErrCannotResume if the room could not resume even
// on an empty shard (fill_len + R beyond the pool, or its SWA tail beyond
// the SWA pool): nothing changes then (Hold or Release it instead).
func (l *Ledger) Retract(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("retract", id)
	if err != nil {
		return err
	}
	if r.state != RoomRunning {
		return wrongState("retract", r)
	}
	// _prealloc_required_tokens of the retracted request: fill_len + R for
	// the full pool and swa_tail_len(fill_len) (+0, no radix cache) for SWA.
	fill := fillLen(r.req)
	full := fill + l.reserve
	var swaNeed int64
	if l.swaMode == swaTail {
		swaNeed = l.swaTailLen(fill)
	}
	// A room that could not resume even on an empty shard would stay
	// retracted forever and block every admission behind it: refuse.
	_, swaPages := l.need(fill)
	if full > l.maxTotal || swaNeed > l.swaCap || swaPages > l.swaPages.total {
		return fmt.Errorf("retract room %d: it could never resume: fill_len %d + %d reserved tokens > %d pool tokens (or its SWA tail > %d): %w",
			id, fill, l.reserve, l.maxTotal, l.swaCap, ErrCannotResume)
	}
	l.removeRunning(r)
	l.freeResources(r)
	r.retFill, r.retFull, r.retSWA = fill, full, swaNeed
	r.retStep = l.steps
	l.retractedFull += r.retFull
	l.retractedSWA += r.retSWA
	l.setState(r, RoomRetracted)
	l.retracted.pushBack(r)
	return nil
}

// Hold moves a running room to the held rebootstrap list
// (pause_generation(mode="retract")): its resources are freed and it is not
// admitted again until ResumeHeld. Like SGLang, the boundary token is popped
// from the output (OutputLen decreases by one if positive); it is replayed
// at commit. errWrongState unless running.
func (l *Ledger) Hold(id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.lookup("hold", id)
	if err != nil {
		return err
	}
	if r.state != RoomRunning {
		return wrongState("hold", r)
	}
	l.removeRunning(r)
	l.freeResources(r)
	r.req.OutputLen = max(r.req.OutputLen-1, 0)
	r.req.Rebootstrap = true
	l.setState(r, RoomHeld)
	l.held.pushBack(r)
	return nil
}

// ResumeHeld is continue_generation: every held room re-enters the queue, in
// hold order, behind the rooms already queued, as a rebootstrap request
// (fill_len with no -1) that is NOT ready (it needs a new handshake). It
// returns the rooms that re-entered. A held room that fails the entry
// capacity check (SGLang's add() aborts it) is released and omitted. Held
// rooms re-enter even beyond admission.max_queued or while draining: they
// are existing requests, not new ones.
func (l *Ledger) ResumeHeld() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held.n == 0 {
		return nil
	}
	out := make([]uint64, 0, l.held.n)
	for r := l.held.head; r != nil; {
		next := r.next
		if l.capacityCheck(r.req) != nil {
			l.drop(r)
			r = next
			continue
		}
		l.held.remove(r)
		r.seq = l.nextSeq
		r.bypassed = 0
		l.nextSeq++
		l.setState(r, RoomWaiting)
		out = append(out, r.id)
		r = next
	}
	return out
}
