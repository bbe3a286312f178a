package room

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// The ends of a room: failed, released, drained, and its resources back
// exactly once.
//
// Deferred release. A prefill rank that received a room's destination and
// writes into its pages by itself (ReportTransfer, or its own writes into a
// staging region) may still be writing when the room ends: the daemon
// cannot see those writes. When a room fails from a phase with a
// destination, the ranks that owe an acknowledgement are recorded for its
// attempt: every required rank that received the destination (claimed it,
// or holds a claim stream it was offered on) and that may still write by
// itself — it holds a staging region it has not reported ready, or its
// last chunk has not landed, the daemon's engine does not move its chunks
// and its instance is known to write by itself (Fail.SelfWriter). Their
// claim streams end with AckRequired. Once nothing is in flight the room's
// allocator record drains (its pages, slots and metadata slot stay held,
// not free) until every owing rank called AckRoomEnd for the attempt, or
// Params.DeferredTimeout passes (with a warning naming the ranks); then its
// resources go back through the one release. A zero DeferredTimeout
// disables it; Close (the process is going away) waits for nothing.

// Fail ends a room with a failure: it is Failed, its claims end with it,
// its engine calls are cancelled and its resources go back once nothing is
// in flight (after its drain). A terminal room does not change.
// SelfWriter: the room's prefill instance is known to write by itself.
type Fail struct {
	Now        time.Time
	Failure    Failure
	SelfWriter bool
	// LedgerGone: the allocator no longer holds the room's record (it
	// refused to re-queue a held room).
	LedgerGone bool
}

// Release ends a room the decode engine is done with (ReleaseRoom; Why
// "released by the decode engine") or Shutdown; its resources go back once
// nothing is in flight.
type Release struct {
	Now time.Time
	Why string
}

// Ack: rank will write nothing more into the destination of Attempt
// (AckRoomEnd).
type Ack struct {
	Now     time.Time
	Rank    ranks.RankID
	Attempt uint32
}

// AckResult is what an Ack did.
type AckResult struct {
	// Owed: the rank owed an acknowledgement for this attempt (false: a
	// no-op, accepted).
	Owed bool
	// Remaining is how many ranks still owe one; Released: this ack was the
	// last, and the room's resources went back.
	Remaining int
	Released  bool
}

// Close: the process is going away; nothing is waited for any more (no
// drain, no quarantine): a room that ended gives its resources back once
// nothing is in flight.
type Close struct{ Now time.Time }

// drainState is a failed room's acknowledgements still owed, for its
// attempt.
type drainState struct {
	attempt uint32
	owing   []ranks.RankID
	acked   int
	until   stamp // zero until the room's record drains
	started bool  // the record is draining
}

// sglangFor names the SGLang transition a failure code corresponds to.
var sglangFor = map[FailureCode]string{
	FailureAborted:            "T16",
	FailurePrefillUnavailable: "T3",
	FailurePrefillLost:        "T15",
	FailureWaitingTimeout:     "T14",
	FailureTransferFailed:     "T13/T18",
	FailureMetadataCorruption: "T19",
	FailureStagingFailed:      "T18",
}

func (r *Room) fail(f Fail, e *Effects) {
	if r.phase.Terminal() {
		return
	}
	if f.LedgerGone {
		r.inLedger = false
	}
	fc := f.Failure
	r.x().failure = &fc
	from := r.phase
	owing := r.owingRanks(from, f.SelfWriter)
	r.move(f.Now, PhaseFailed, sglangFor[fc.Code], textNote(fc.Message), e)
	e.Unwait, e.Cancel, e.Failure = true, true, &fc
	e.EndClaims, e.ClaimEnd, e.Owing = true, DestinationEvent{Failure: &fc}, owing
	r.attached.clear()
	if len(owing) > 0 && r.inLedger {
		r.drain = &drainState{attempt: r.attempt, owing: owing}
	}
	e.Finished, e.Outcome, e.Code, e.SinceOpen = true, PhaseFailed, fc.Code, f.Now.Sub(r.openedAt.time())
	r.end(f.Now, e)
}

// owingRanks are the ranks of the room (failing from phase from) that owe
// an acknowledgement, sorted; none when deferral is off, at Close, or for a
// room with no destination.
func (r *Room) owingRanks(from Phase, selfWriter bool) []ranks.RankID {
	if r.cfg.DeferredTimeout <= 0 || r.closed || r.handoff == nil || r.pages == nil {
		return nil
	}
	switch from {
	case PhaseAdmitted, PhaseClaimed, PhaseTransferring:
	default:
		return nil
	}
	owes := func(rp *rankProgress) bool {
		return rp != nil && ((r.staging && rp.stagingOpen > 0) || (!rp.lastLanded && !rp.engine && selfWriter))
	}
	var owing []ranks.RankID
	seen := map[ranks.RankKey]bool{}
	add := func(k ranks.RankKey, rp *rankProgress) {
		if seen[k] || !owes(rp) {
			return
		}
		seen[k] = true
		owing = append(owing, ranks.RankID{Addr: r.addr, DP: int(r.prefillDP), CP: k.CP, TP: k.TP, PP: k.PP})
	}
	r.ranks.eachKey(func(k ranks.RankKey, rp *rankProgress) {
		if rp.claimed {
			add(k, rp)
		}
	})
	r.attached.each(func(rk ranks.RankID) { // the destination was offered: it may have been sent
		k := rk.Key()
		add(k, r.progress(k))
	})
	slices.SortFunc(owing, func(a, b ranks.RankID) int { return strings.Compare(a.String(), b.String()) })
	return owing
}

// CanRelease is ReleaseRoom's check: already released (already), failed or
// not succeeded (an error naming why), else nil.
func (r *Room) CanRelease() (already bool, err error) {
	switch {
	case r.phase == PhaseReleased:
		return true, nil
	case r.phase == PhaseFailed:
		return false, fmt.Errorf("release room %d: %w: the room failed (its pages are already back): %s", r.id, ErrWrongState, r.Failure().Message)
	case r.phase.Poll() != PollSuccess:
		return false, fmt.Errorf("release room %d: %w: the room has not succeeded (phase %s); abort it instead", r.id, ErrWrongState, r.phase)
	}
	return false, nil
}

func (r *Room) release(rl Release, e *Effects) {
	if r.phase.Terminal() {
		return
	}
	r.move(rl.Now, PhaseReleased, "", textNote(rl.Why), e)
	r.end(rl.Now, e)
}

// end: the room ended; it is retained, and its resources go back once
// nothing is in flight.
func (r *Room) end(now time.Time, e *Effects) {
	r.releasePending, e.End = true, true
	r.maybeRelease(now, e)
}

// maybeRelease gives an ended room's resources back once no transfer is in
// flight and no write may still land, exactly once: only the first call
// after the room ended hands them back. While ranks owe acknowledgements
// the record drains first.
func (r *Room) maybeRelease(now time.Time, e *Effects) {
	if !r.releasePending || (r.handoff != nil && r.inflight > 0) {
		return
	}
	if d := r.drainOf(); d != nil && len(d.owing) > 0 && !r.closed {
		if d.started {
			return
		}
		if r.inLedger {
			e.Ledger |= LedgerDrain
		}
		d.started = true
		d.until = stampOf(now.Add(r.cfg.DeferredTimeout))
		e.DrainStarted, e.Drain = true, DrainNote{Attempt: d.attempt, Ranks: d.owing, Until: d.until.time()}
		return
	}
	if h := r.handoff; h != nil && h.quarantine != 0 {
		if !r.closed && stamp(now.UnixNano()) < h.quarantine {
			return // an engine could not rule out writes into the pages until then
		}
		h.quarantine = 0
	}
	r.releasePending = false
	e.Release = true
	if !e.Move.Moved && !r.closed {
		// The room ended in an earlier event: its last step says its pages
		// are reusable now (at Close nothing is reused: the process goes).
		r.move(now, r.phase, "", textNote(PagesReusableNote), e)
	}
	if r.inLedger {
		r.inLedger = false
		e.Ledger |= LedgerRelease
	}
	if r.extra != nil {
		r.extra.gates = nil
	}
}

func (r *Room) drainOf() *drainState {
	if r.handoff == nil {
		return nil
	}
	return r.drain
}

func (r *Room) ack(a Ack, e *Effects) {
	rank := a.Rank
	if rank.Addr != r.addr {
		e.Err = invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", rank.Addr, r.id, r.addr)
		return
	}
	inherited := r.extra != nil && r.extra.inherited
	if a.Attempt != r.attempt && !inherited {
		e.Err = fmt.Errorf("ack end of room %d: %w: attempt %d, the room's attempt is %d", r.id, ErrStaleAttempt, a.Attempt, r.attempt)
		return
	}
	d := r.drainOf()
	if d == nil || (d.attempt != a.Attempt && !inherited) {
		return
	}
	i := slices.IndexFunc(d.owing, func(o ranks.RankID) bool { return o.DP == rank.DP && o.Key() == rank.Key() })
	if i < 0 {
		e.AckResult = AckResult{Remaining: len(d.owing)}
		return
	}
	d.owing = slices.Delete(d.owing, i, i+1)
	d.acked++
	e.Acked = true
	e.AckResult = AckResult{Owed: true, Remaining: len(d.owing)}
	if len(d.owing) == 0 {
		e.Drain = DrainNote{Attempt: d.attempt, Acks: d.acked}
		r.maybeRelease(a.Now, e)
		// Released only when this ack gave the resources back: the drain had
		// started (nothing in flight) and no quarantine still holds them.
		e.AckResult.Released = e.Release
	}
}

// Draining reports whether the room's resources wait for acknowledgements.
func (r *Room) Draining() bool {
	d := r.drainOf()
	return d != nil && len(d.owing) > 0
}

func (r *Room) close(c Close, e *Effects) {
	r.closed = true
	r.maybeRelease(c.Now, e)
}

// DrainWaiting is a draining room's waiting_for ("" when none).
func (r *Room) DrainWaiting() string {
	d := r.drainOf()
	if d == nil || len(d.owing) == 0 {
		return ""
	}
	until := "once nothing is in flight, then bounded by release.deferred_timeout"
	if d.started {
		until = "bounded by release.deferred_timeout until " + d.until.time().UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("AckRoomEnd (attempt %d) from prefill ranks %s: its pages are draining, not free; %s", d.attempt, RankList(d.owing), until)
}

// RankList renders at most MaxListedRanks ranks and how many more.
func RankList(rs []ranks.RankID) string {
	parts := make([]string, 0, min(len(rs), MaxListedRanks+1))
	for i, k := range rs {
		if i == MaxListedRanks {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("cp %d tp %d pp %d", k.CP, k.TP, k.PP))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// MaxListedRanks bounds every list of ranks in a message or a status.
const MaxListedRanks = ranks.MaxListedRanks
