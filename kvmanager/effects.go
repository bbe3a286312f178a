package kvmanager

import (
	"context"
	"slices"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/prealloc"

	"github.com/decodeplane/decodeplane/transfer"
)

// The room is the state machine: its methods below apply one event (a
// transition, a failure, a release, a rank's claim, a chunk landed, a
// rebootstrap) to the room alone — no clock, no lock, no ledger, no channel
// — and return the effects the caller must apply after the state change
// (Manager.applyLocked, the room's shard lock held): events for watchers and
// claims, the deadline to re-arm, transfers to cancel, resources to free,
// the admission to mark due, observer calls, spans and log lines. Effects
// are a value with no slice of their own, so that applying an event
// allocates nothing the room did not allocate before.

// effects is what one event applied to a room asks of its caller.
type effects struct {
	// moved: the room changed phase (from → to), recorded as t; the caller
	// tells the observer, the spans, the watchers and a waiting Shutdown,
	// and re-arms the room's deadline.
	moved    bool
	from, to Phase
	t        transition
	sglang   string
	note     note

	// unwait: take the room off its address's waiting rooms.
	unwait bool
	// cancel: end the transfers in flight (the room failed).
	cancel bool
	// claims, moved out of the room, end with claimEv.
	claims  *claimSet
	claimEv DestinationEvent
	// failure: the room failed with it (a warning is logged naming the
	// phase it failed in, from).
	failure *Failure
	// finished: the hand-off's outcome for the observer (RoomFinished).
	finished bool
	outcome  Phase
	code     FailureCode
	// transferred: the time from admission to success (TransferLatency).
	transferred time.Duration
	sinceOpen   time.Duration
	// chunk: a chunk landed (the observer's ChunkDone), and the marker it
	// wrote into the metadata slot, for the ledger (0: none).
	chunk      bool
	chunkRes   transfer.ChunkResult
	markerSet  uint64
	checkAfter bool // the room may have succeeded: run the success check
	// end: the room ended; it is retained and its resources go back once
	// nothing is in flight (room.release).
	end bool
	// admission: the room was admitted (the observer's DestinationLatency,
	// from OpenRoom); cancelPrev ends the previous attempt's transfer
	// context (a rebootstrap), nil when none.
	admission     bool
	admittedAfter time.Duration
	cancelPrev    context.CancelFunc
	// resolved: the room's prefill DP rank was resolved to dp by rule (the
	// observer's DPRankResolved, the room span's attributes).
	resolved bool
	rule     DPRule
	dp       int
}

// newRoom is a room as OpenRoom makes it, before its first transition: on
// decode shard shard, in its ledger, attempt 1, bounded by
// timeouts.bootstrap (bootstrap) from now; hintDP is the router's prefill DP
// rank hint (-1: none).
func newRoom(id uint64, addr string, shard, hintDP int, now time.Time, bootstrap time.Duration) *room {
	return &room{
		id: id, addr: addr,
		decodeDP: shard, inLedger: true, hintDP: hintDP, prefillDP: -1,
		attempt: 1, openedAt: stampOf(now), updatedAt: stampOf(now), metaSlot: -1,
		bootstrapAt: stampOf(now.Add(bootstrap)),
	}
}

// transition moves the room to phase to and records the step.
func (r *room) transition(now time.Time, to Phase, sglang string, n note) effects {
	from := r.phase
	r.phase = to
	r.updatedAt = stampOf(now)
	var texts *[]string
	if needsText(sglang, n) {
		texts = &r.x().texts
	}
	t := newTransition(now, to, sglang, n, r.attempt, texts)
	if sglang != "T1" { // OpenRoom's transition is not kept: timeline derives it (room.opened)
		r.keep(t)
	}
	return effects{moved: true, from: from, to: to, t: t, sglang: sglang, note: n}
}

// fail ends a room with a failure: it is Failed, its claims end with the
// failure, its transfers in flight are to be cancelled and its resources
// go back once nothing is in flight. A terminal room does not change (the
// effects are empty).
func (r *room) fail(now time.Time, f Failure) effects {
	if r.phase.Terminal() {
		return effects{}
	}
	fc := f
	r.failure = &fc
	e := r.transition(now, PhaseFailed, sglangFor[f.Code], textNote(fc.Message))
	e.unwait, e.cancel, e.failure = true, true, &fc
	e.claims, r.claims = r.claims, nil
	e.claimEv = DestinationEvent{Failure: &fc}
	e.finished, e.outcome, e.code, e.sinceOpen = true, PhaseFailed, f.Code, now.Sub(r.openedAt.time())
	r.releasePending, e.end = true, true
	return e
}

// released ends a room the decode engine is done with (or Shutdown): it is
// Released and its resources go back once nothing is in flight. A terminal
// room does not change.
func (r *room) released(now time.Time, why string) effects {
	if r.phase.Terminal() {
		return effects{}
	}
	e := r.transition(now, PhaseReleased, "", textNote(why))
	r.releasePending, e.end = true, true
	return e
}

// succeeded is the hand-off's success (T12/T17): every claim ends with it.
func (r *room) succeeded(now time.Time) effects {
	e := r.transition(now, PhaseSucceeded, "T12/T17", numNote(noteSucceeded, int64(r.chunksDone), int64(r.bytes)))
	p := PhaseSucceeded
	e.claims, r.claims = r.claims, nil
	e.claimEv = DestinationEvent{Done: &p}
	e.finished, e.outcome, e.code = true, PhaseSucceeded, FailureUnspecified
	e.sinceOpen, e.transferred = now.Sub(r.openedAt.time()), now.Sub(r.admittedAt)
	return e
}

// prefillKnown gives the room its prefill instance's rank plan once the
// instance is fully registered; a rebootstrap's new attempt starts its rank
// progress empty (made per rank on first use, room.progress).
func (r *room) prefillKnown(plan *registry.Plan) {
	r.plan = plan
	r.staging = plan.Staging()
	if r.handoff != nil {
		r.ranks, r.claimedN, r.doneN = nil, 0, 0
	}
}

// resolvingDP: no rule resolves the room's prefill DP rank yet (dp_size
// dpSize, follow_bootstrap_room follow); it waits for a BindRoom, bounded
// by timeouts.dp_rank_resolution (bound) from now.
func (r *room) resolvingDP(now time.Time, bound time.Duration, dpSize int, follow bool) effects {
	r.dpAt = stampOf(now.Add(bound))
	return r.transition(now, PhaseResolvingDP, "", numNote(noteResolvingDP, int64(dpSize), b2i(follow)))
}

// dpResolved: the room's prefill DP rank is dp (by rule); the handshake is
// done and the room is Queued for admission (T2/T4/T8).
func (r *room) dpResolved(now time.Time, dp int, rule DPRule) effects {
	r.prefillDP, r.dpRule, r.dpAt = dp, rule, 0
	e := r.transition(now, PhaseQueued, "T2/T4/T8", numNote(noteDPResolved, int64(dp), int64(rule)))
	e.resolved, e.rule, e.dp = true, rule, dp
	return e
}

// allocated gives the room the destination an admission pass allocated
// (copies: the room hands them out).
func (r *room) allocated(al prealloc.Allocation) {
	r.admittedOnce()
	r.pages = slices.Clone(al.Pages)
	r.fillLen = al.FillLen
	r.metaSlot = al.MetadataSlot
	r.state = cloneState(al.State)
}

// resumed: a retracted room got its pages back and runs again (T20).
func (r *room) resumed(now time.Time) effects {
	return r.transition(now, PhaseSucceeded, "T20", numNote(noteResumed, int64(len(r.pages)), 0))
}

// admitted: the room's destination is allocated (T11); the previous
// attempt's transfer context, if any, is to be cancelled (nothing of it
// runs any more).
func (r *room) admitted(now time.Time) effects {
	r.admittedAt = now
	cancel := r.xferCancel
	r.xferCtx, r.xferCancel = nil, nil
	e := r.transition(now, PhaseAdmitted, "T11", numNote(noteAdmitted, int64(len(r.pages)), int64(r.metaSlot)))
	e.admission, e.admittedAfter, e.cancelPrev = true, now.Sub(r.openedAt.time()), cancel
	return e
}

// successCheck is the first part of the success proof (T12/T17): checkWait
// while the room is not Transferring or a required rank is not done,
// checkCorrupt when the metadata slot holds another room's marker (T19),
// else checkRanksDone: every page landed from every required rank, and
// what is left (the staging gate, the marker; successReady) decides.
func (r *room) successCheck() successCheck {
	switch {
	case r.phase != PhaseTransferring:
		return checkWait
	case r.marker != 0 && r.marker != r.id:
		return checkCorrupt
	case r.doneN < len(r.plan.Required()):
		return checkWait
	}
	return checkRanksDone
}

type successCheck uint8

const (
	checkWait successCheck = iota
	checkCorrupt
	checkRanksDone
)

// successReady: no gate holds the room's success back and the metadata
// slot holds its marker.
func (r *room) successReady() bool { return !r.gated() && r.marker != 0 }

// retracted: a running room gave its pages back (RETRACT, T20); it resumes
// at a later admission pass.
func (r *room) retracted(now time.Time) effects {
	r.pages = nil
	return r.transition(now, PhaseRetracted, "T20", textNote("retracted: pages returned; resumes after the next ReportRunning, before new admissions"))
}

// held: a running room gave its pages back until ContinueGeneration
// (REBOOTSTRAP, T21).
func (r *room) held(now time.Time) effects {
	r.pages = nil
	return r.transition(now, PhaseHeld, "T21", textNote("held for rebootstrap until ContinueGeneration"))
}

// claimRank records one required rank's claim on this attempt; all is true
// when it was the last one missing (the room is then claimed, see claimed).
func (r *room) claimRank(rp *rankProgress) (all bool) {
	if rp.claimed {
		return false
	}
	rp.claimed = true
	r.claimedN++
	return r.claimedN >= len(r.plan.Required())
}

// claimed starts the waiting timeout (SGLang's, from the claim) and moves
// the room to Claimed (T11).
func (r *room) claimed(now time.Time, waiting time.Duration) effects {
	r.claimedAt = now
	r.waitingAt = now.Add(waiting)
	return r.transition(now, PhaseClaimed, "T11", numNote(noteClaimed, int64(len(r.plan.Required())), int64(waiting)))
}

// chunkLanded advances the room after one of rank rp's chunks landed (moved
// by the engine, reported by the prefill, or staged): its bytes and pages,
// the rank's completion, the room marker; a claimed room is then
// Transferring, and the success check is due.
func (r *room) chunkLanded(now time.Time, rp *rankProgress, req ChunkRequest, res transfer.ChunkResult) effects {
	r.bytes += uint64(max(res.Bytes, 0))
	rp.bytes += uint64(max(res.Bytes, 0))
	r.chunksDone++
	rp.cov.landed += req.NumPages
	if req.Last {
		rp.lastLanded = true
	}
	if !rp.done && rp.lastLanded && rp.cov.sent != nil && rp.cov.landed == rp.cov.need {
		rp.done = true
		r.doneN++
	}
	var e effects
	if r.phase == PhaseClaimed {
		e = r.transition(now, PhaseTransferring, "", chunkLandedNote(req.Index, req.Rank))
	}
	e.chunk, e.chunkRes = true, res
	e.markerSet = r.markerLanded(res.MarkerWritten)
	e.checkAfter = true
	return e
}

// markerLanded records a room marker written into the metadata slot and
// returns the marker the ledger must record (0: none). A wrong marker
// sticks (the room fails as metadata corruption at the next success check,
// whatever other ranks wrote after it).
func (r *room) markerLanded(marker uint64) uint64 {
	if marker == 0 || (r.marker != 0 && r.marker != r.id) {
		return 0
	}
	r.marker = marker
	return marker
}

// rebootstrap starts the room's next attempt (SGLang T22): a held room
// forgets its destination, its claims and its per-attempt progress and
// bootstraps again, bounded by timeouts.bootstrap from now.
func (r *room) rebootstrap(now time.Time, bootstrap time.Duration) effects {
	r.attempt++
	if r.handoff != nil {
		r.pages, r.state, r.fillLen, r.marker = nil, nil, 0, 0
		r.chunksDone, r.bytes = 0, 0
		r.ranks = nil
		r.waitingAt, r.claimedAt, r.admittedAt = time.Time{}, time.Time{}, time.Time{}
	}
	r.metaSlot = -1
	r.claims = nil
	r.plan = nil // set again once the prefill is known
	r.clearGates()
	r.bootstrapAt = stampOf(now.Add(bootstrap))
	return r.transition(now, PhaseWaitingPrefill, "T22", numNote(noteRebootstrap, int64(r.attempt), 0))
}

// nextDeadline is the earliest deadline of the room's phase (zero: none):
// timeouts.bootstrap until the destination is claimed, the DP-rank
// resolution bound while resolving, the waiting timeout once claimed,
// timeouts.retracted / timeouts.held while retracted / held.
func (r *room) nextDeadline() time.Time {
	if r.phase.Terminal() {
		return time.Time{}
	}
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	switch r.phase {
	case PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted:
		consider(r.bootstrapAt.time())
	case PhaseResolvingDP:
		consider(r.bootstrapAt.time())
		consider(r.dpAt.time())
	case PhaseClaimed, PhaseTransferring:
		consider(r.waitingAt)
	case PhaseRetracted, PhaseHeld:
		consider(r.parkedAt.time())
	}
	return next
}

// expired says which of the room's deadlines passed at now, as the failure
// code it ends the room with (FailureUnspecified: none has): the DP-rank
// resolution bound first, then timeouts.bootstrap, then the waiting
// timeout, then the retracted/held bound, each only in the phases it bounds.
func (r *room) expired(now time.Time) FailureCode {
	switch r.phase {
	case PhaseResolvingDP:
		if r.dpAt != 0 && !now.Before(r.dpAt.time()) {
			return FailureDPRankUnresolved
		}
		fallthrough
	case PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted:
		if r.bootstrapAt != 0 && !now.Before(r.bootstrapAt.time()) {
			return FailureBootstrapTimeout
		}
	case PhaseClaimed, PhaseTransferring:
		if !r.waitingAt.IsZero() && !now.Before(r.waitingAt) {
			return FailureWaitingTimeout
		}
	case PhaseRetracted, PhaseHeld:
		if r.parkedAt != 0 && !now.Before(r.parkedAt.time()) {
			return FailureRetractTimeout
		}
	}
	return FailureUnspecified
}

// releasing is what room.release hands back: the resources to free now, or
// the quarantine to wait out first.
type releasing struct {
	// wait: writes may continue until until; the quarantine's deadline (q)
	// is to be armed, and nothing is freed yet.
	wait  bool
	until time.Time
	q     *deadline
	// done: the resources go back now (exactly once): the ledger's record
	// when ledger, the end hooks, a cleared quarantine deadline (q).
	done   bool
	ledger bool
	onEnd  []func()
}

// release gives a terminal room's resources back once no transfer is in
// flight and no write may still land (closed: the process is going away,
// nothing is waited for), exactly once: only the first call after the room
// ended hands them back.
func (r *room) release(now time.Time, closed bool) releasing {
	if !r.releasePending || (r.handoff != nil && r.inflight > 0) {
		return releasing{}
	}
	if r.writesUntil().After(now) && !closed {
		return releasing{wait: true, until: r.quarantine.until, q: &r.quarantine.dl}
	}
	var rel releasing
	if r.handoff != nil && r.quarantine != nil {
		rel.q = &r.quarantine.dl
		r.quarantine = nil
	}
	r.releasePending = false
	rel.done = true
	if r.inLedger {
		r.inLedger, rel.ledger = false, true
	}
	if x := r.extra; x != nil {
		rel.onEnd = x.onEnd
		x.onEnd, x.gates = nil, nil
	}
	return rel
}
