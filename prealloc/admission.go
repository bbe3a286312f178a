package prealloc

import "time"

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
//     the first that does not fit stops the loop. Resumed rooms come back
//     with Resumed = true and no metadata slot. While any retracted room
//     remains, nothing new is admitted (BlockRetracted).
//  2. Unless draining (BlockDraining), ready rooms are admitted strictly
//     head-of-line in queue order: a shortage of req slots, metadata slots,
//     Mamba slots, full tokens or SWA tokens stops the pass and is returned;
//     waiting (not ready) rooms are skipped because they are not in the
//     ready order at all. BlockNone means no ready room is left.
//
// Each admitted room gets a req slot, a FIFO metadata slot (marker 0),
// page-rounded pages for fill_len, its state slots and, with
// admission.claim_timeout > 0, a claim deadline. A blocked pass costs O(1)
// in the queue length; admitting k rooms costs O(k log n + pages).
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

// admitReady is the second loop of pop_preallocated over ready rooms. It only
// runs once the retracted queue is empty (as in SGLang, where
// process_decode_queue returns before pop_preallocated otherwise), so the
// count_retracted and Mamba "retracted needs" terms are kept for fidelity but
// are zero here.
func (l *Ledger) admitReady(out []Admission) ([]Admission, BlockReason) {
	budget := l.fullBudget(true, true)
	var swaB int64
	if l.swaMode == swaTail {
		swaB = l.swaBudget(true, true)
	}
	var deadline time.Time // read from the clock at the first admission
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
		maxNew := l.clipped(r.req.MaxNewTokens)
		required := l.requiredAlloc(fill) + l.reserve
		// No decode radix cache: prefix_len = 0.
		if max(required, origin+maxNew-l.retractable) > budget {
			reason = BlockTokens
			break
		}
		var swaReq int64
		if l.swaMode == swaTail {
			swaLen := l.swaTailLen(fill)
			swaReq = swaLen
			if max(swaReq, swaLen+maxNew-l.retractableSWA) > swaB {
				reason = BlockSWA
				break
			}
		}
		pOK, sOK := l.fitsPages(fill)
		if !pOK {
			reason = BlockTokens
			break
		}
		if !sOK {
			if l.swaMode == swaTail {
				reason = BlockSWA
			} else {
				reason = BlockTokens
			}
			break
		}
		if out == nil {
			out = make([]Admission, 0, l.admitBound())
		}
		l.ready.pop()
		l.preAlloc(r, fill, origin)
		r.metaSlot = l.meta.pop()
		l.setState(r, RoomAdmitted)
		if l.claimTimeout > 0 {
			if deadline.IsZero() {
				deadline = l.clock.Now().Add(l.claimTimeout)
			}
			r.deadline = deadline
			l.deadlines.push(r)
		}
		out = append(out, Admission{Room: r.id, Alloc: l.admissionView(r)})
		// Recompute from the actual pool state (page rounding included),
		// with this room now counted as active.
		budget = l.fullBudget(true, true)
		swaB -= swaReq
	}
	l.lastFull = budget
	l.lastSWABudget = swaB
	return out, reason
}
