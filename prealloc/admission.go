package prealloc

// fullBudget is DecodePreallocQueue._allocatable_token_budgets without a
// decode radix cache, HiSparse, HiCache or a prebuilt last batch:
//
//	available − max(R × active, need_space_for_single_req) − Σ retracted full_required
//
// where active = running + transfer queue + waiting queue (+ the rooms this
// pass already admitted, which the ledger counts as admitted at once, so the
// live count equals SGLang's extra_reserved_reqs = len(preallocated)+1 after
// each admission). available is the free full-pool tokens
// (full_available_size with tail SWA; min(full, SWA) when the SWA pool
// mirrors the full pool). withSingle selects need_space_for_single_req
// (resume_retracted_reqs passes no retractable_tokens, so it is 0 there);
// withRetracted selects count_retracted.
func (l *Ledger) fullBudget(withSingle, withRetracted bool) int64 {
	avail := int64(l.pages.avail()) * l.page
	if l.swaMode == swaMirror {
		avail = min(avail, int64(l.swaPages.avail())*l.page)
	}
	b := avail - max(l.reserve*l.active(), l.needSingle(withSingle))
	if withRetracted {
		b -= l.retractedFull
	}
	return b
}

// needSingle is _need_space_for_single_req:
// max over running x of (min(x.max_new_tokens, CLIP) + len(x.origin_input_ids))
// − retractable_tokens, or 0 with no running request. The max is the top of
// an indexed max-heap and retractable_tokens a running sum, so it is O(1).
func (l *Ledger) needSingle(with bool) int64 {
	if !with || l.runMax.len() == 0 {
		return 0
	}
	return l.runMax.peek().runKey - l.retractable
}

// swaBudget is _swa_tail_allocatable_token_budget (tail SWA only): the SWA
// reservation is capped by the sliding-window growth potential,
//
//	swa_reserved = min(R × active, max(0, active × window − swa_used))
//	budget = swa_available − max(swa_reserved, need_swa_single) − Σ retracted swa_required
//
// with need_swa_single = max over running x of
// (swa_tail_len(len(x.origin_input_ids)) + min(x.max_new_tokens, CLIP))
// − Σ running (swa_tail_len(prompt) + output) (_swa_retractable_len), or 0.
func (l *Ledger) swaBudget(withSingle, withRetracted bool) int64 {
	n := l.active()
	swaAvail := int64(l.swaPages.avail()) * l.page
	swaUsed := int64(l.swaPages.total)*l.page - swaAvail
	growth := max(0, n*l.window-swaUsed)
	res := min(l.reserve*n, growth)
	var single int64
	if withSingle && l.runSWAMax.len() > 0 {
		single = l.runSWAMax.peek().runSWAKey - l.retractableSWA
	}
	b := swaAvail - max(res, single)
	if withRetracted {
		b -= l.retractedSWA
	}
	return b
}

// Admit runs one admission pass with SGLang's semantics
// (process_decode_queue: resume_retracted_reqs, then pop_preallocated):
//
//  1. Retracted rooms resume first, in retraction order, each needing a req
//     slot and full_required (fill_len + R) ≤ the budget (SWA likewise);
//     the first that does not fit stops the loop, and so does a room
//     retracted since the last UpdateRunning while rooms are running (its
//     pages go to the running rooms' growth first, see Retract). Resumed
//     rooms come back with Resumed = true and no metadata slot. While any
//     retracted room remains, nothing new is admitted (BlockRetracted).
//  2. Unless draining (BlockDraining), ready rooms are admitted in queue
//     order: a shortage of req slots, metadata slots or Mamba slots stops
//     the pass; a room too big for the token or SWA budget stops it too
//     (SGLang's strict head-of-line), unless admission.max_bypass lets the
//     rooms behind it be admitted first (see admitReady). The reason the
//     pass stopped is returned; waiting (not ready) rooms are skipped
//     because they are not in the ready order at all. BlockNone means no
//     ready room is left.
//
// Each admitted room gets a req slot, a FIFO metadata slot, page-rounded
// pages for fill_len and its state slots. A blocked pass costs
// O(bypassLookahead × log n) at most, O(1) with max_bypass 0 or when the
// budget is below R (no room can fit); admitting k rooms costs
// O(k log n + pages).
func (l *Ledger) Admit() ([]Admission, BlockReason) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Admission
	if l.retracted.n > 0 {
		out = l.resumeRetracted(out)
		if l.retracted.n > 0 {
			l.lastBlocked = BlockRetracted
			return out, BlockRetracted
		}
	}
	if l.draining {
		l.lastBlocked = BlockDraining
		return out, BlockDraining
	}
	out, reason := l.admitReady(out)
	l.lastBlocked = reason
	return out, reason
}

// admitBound bounds the admissions left in this pass (each takes a req
// slot; new ones also a metadata slot), so the result is allocated once.
func (l *Ledger) admitBound() int {
	return l.retracted.n + min(l.ready.len(), l.reqSlots.avail(), l.meta.avail())
}

// resumeRetracted is resume_retracted_reqs. Its budgets are computed once,
// without need_space_for_single_req and without counting retracted rooms,
// and decremented by each resumed room's requirement.
func (l *Ledger) resumeRetracted(out []Admission) []Admission {
	budget := l.fullBudget(false, false)
	var swaB int64
	if l.swaMode == swaTail {
		swaB = l.swaBudget(false, false)
	}
	for r := l.retracted.head; r != nil; {
		next := r.next
		if r.retStep == l.steps && l.counts[RoomRunning] > 0 {
			// Retracted during the current decode step: the running rooms
			// grow into its pages first (see Retract). The rooms behind it
			// were retracted no earlier, so the loop stops here.
			break
		}
		if l.reqSlots.avail() <= 0 {
			break
		}
		if r.retFull > budget {
			break
		}
		if l.swaMode == swaTail && r.retSWA > swaB {
			break
		}
		if pOK, sOK := l.fitsPages(r.retFill); !pOK || !sOK || l.mambaS.avail() < l.mambaPerReq {
			break
		}
		if out == nil {
			out = make([]Admission, 0, l.admitBound())
		}
		l.retracted.remove(r)
		l.retractedFull -= r.retFull
		l.retractedSWA -= r.retSWA
		l.preAlloc(r, r.retFill, r.retFill)
		l.setState(r, RoomResumed)
		budget -= r.retFull
		swaB -= r.retSWA
		r.retFill, r.retFull, r.retSWA = 0, 0, 0
		out = append(out, Admission{Room: r.id, Resumed: true, Alloc: l.admissionView(r)})
		r = next
	}
	l.lastFull = budget
	l.lastSWABudget = swaB
	return out
}

// bypassLookahead bounds the blocked rooms one pass may step over with
// admission.max_bypass > 0, so that a pass over a queue whose ready rooms
// are all too big for the current budget costs O(bypassLookahead × log n),
// whatever the queue length.
const bypassLookahead = 8

// admitReady is the second loop of pop_preallocated over ready rooms. It only
// runs once the retracted queue is empty (as in SGLang, where
// process_decode_queue returns before pop_preallocated otherwise), so the
// count_retracted and Mamba "retracted needs" terms are kept for fidelity but
// are zero here.
//
// Head-of-line policy (admission.max_bypass = N). SGLang stops at the first
// room that does not fit. Here a ready room that does not fit the token or
// SWA budget (or the free pages) — a shortage that depends on the room's
// size — is set aside while fewer than N later rooms have been admitted
// ahead of it, and the pass goes on with the rooms behind it, in queue
// order; each admission made while rooms are set aside counts one bypass
// against each of them. A room bypassed N times blocks its queue strictly,
// as in SGLang, until it fits: admission on the shard then waits for the
// pool to drain to it, so it is admitted within N admissions plus a drain
// (or timeouts.bootstrap ends it first). At most bypassLookahead rooms are
// set aside per pass. Shortages every room shares (req slots, metadata
// slots, Mamba slots) stop the pass at once. N = 0 is SGLang's strict FIFO.
func (l *Ledger) admitReady(out []Admission) ([]Admission, BlockReason) {
	budget := l.fullBudget(true, true)
	var swaB int64
	if l.swaMode == swaTail {
		swaB = l.swaBudget(true, true)
	}
	var aside [bypassLookahead]*room
	nAside := 0
	asideReason := BlockNone // why the first room set aside did not fit
	reason := BlockNone
	for {
		r := l.ready.peek()
		if r == nil {
			break
		}
		if l.reqSlots.avail() <= 0 {
			reason = BlockReqSlots
			break
		}
		if l.meta.avail() <= 0 {
			reason = BlockMetadataSlots
			break
		}
		// Mamba: slots_per_req > mamba_available − retracted needs.
		if l.mambaPerReq > 0 && l.mambaPerReq > l.mambaS.avail()-l.mambaPerReq*l.retracted.n {
			reason = BlockMamba
			break
		}
		origin, fill := originLen(r.req), fillLen(r.req)
		swaReq, block := l.fitsBudget(r, origin, fill, budget, swaB)
		if block != BlockNone {
			// Stepping over r is pointless when no room at all fits the
			// budgets (every room needs at least R tokens and no negative
			// SWA amount): stop here, as the scan would admit nothing.
			noneFits := budget < l.reserve || (l.swaMode == swaTail && swaB < 0)
			if int(r.bypassed) < l.maxBypass && nAside < len(aside) && !noneFits {
				l.ready.pop()
				aside[nAside] = r
				nAside++
				if asideReason == BlockNone {
					asideReason = block
				}
				continue
			}
			reason = block
			break
		}
		if out == nil {
			out = make([]Admission, 0, l.admitBound())
		}
		l.ready.pop()
		l.preAlloc(r, fill, origin)
		r.metaSlot = l.meta.pop()
		l.setState(r, RoomAdmitted)
		out = append(out, Admission{Room: r.id, Alloc: l.admissionView(r)})
		// Recompute from the actual pool state (page rounding included),
		// with this room now counted as active.
		budget = l.fullBudget(true, true)
		swaB -= swaReq
		exhausted := false
		for _, a := range aside[:nAside] {
			a.bypassed++
			exhausted = exhausted || int(a.bypassed) >= l.maxBypass
		}
		if exhausted {
			// The oldest room set aside may not be overtaken again: the
			// queue is strict behind it from now on.
			reason = asideReason
			break
		}
	}
	for _, a := range aside[:nAside] {
		l.ready.push(a) // back at their queue positions (seq is unchanged)
	}
	if nAside > 0 && reason != BlockReqSlots && reason != BlockMetadataSlots && reason != BlockMamba {
		// The queue's head is the first room set aside: report why it
		// waits (unless a shared shortage stopped the pass).
		reason = asideReason
	}
	l.lastFull = budget
	l.lastSWABudget = swaB
	return out, reason
}

// fitsBudget is the per-room test of pop_preallocated (no decode radix
// cache: prefix_len = 0) plus the physical page guard: BlockNone and the
// room's SWA requirement when it can be admitted now, else why not.
func (l *Ledger) fitsBudget(r *room, origin, fill, budget, swaB int64) (swaReq int64, block BlockReason) {
	maxNew := l.clipped(r.req.MaxNewTokens)
	required := l.requiredAlloc(fill) + l.reserve
	if max(required, origin+maxNew-l.retractable) > budget {
		return 0, BlockTokens
	}
	if l.swaMode == swaTail {
		swaLen := l.swaTailLen(fill)
		swaReq = swaLen
		if max(swaReq, swaLen+maxNew-l.retractableSWA) > swaB {
			return 0, BlockSWA
		}
	}
	pOK, sOK := l.fitsPages(fill)
	switch {
	case !pOK:
		return 0, BlockTokens
	case !sOK && l.swaMode == swaTail:
		return 0, BlockSWA
	case !sOK:
		return 0, BlockTokens
	}
	return swaReq, BlockNone
}
