package room

import (
	"fmt"
	"strings"
	"time"
)

// A room has one deadline at a time: the earliest of the bounds of its
// current state. A live room is bounded by timeouts.bootstrap until every
// required rank claimed its destination, by the DP-rank resolution bound
// while resolving, by admission.claim_timeout while its destination waits
// for its claims, by the waiting timeout once claimed (or, for a staged
// room whose ranks are done, by the scatters' completion timeout), and
// while retracted or held by timeouts.retracted or timeouts.held. An ended
// room waiting to give its resources back is bounded by its drain
// (release.deferred_timeout) or its quarantine. Its caller keeps one entry
// on its deadline heap at NextDeadline and applies Deadline when it fires.

// Deadline: the room's deadline (NextDeadline) may have passed at Now.
// GenerateURL is the rebootstrapped room's prefill /generate (its
// recompute note; "" on a first attempt or when the prefill gave no HTTP
// port). ScattersPending and ScatterMissing describe a staged room's
// regions still to scatter.
type Deadline struct {
	Now             time.Time
	GenerateURL     string
	ScattersPending bool
	ScatterMissing  []string
	SelfWriter      bool
}

// NextDeadline is the room's earliest deadline (zero: none).
func (r *Room) NextDeadline() time.Time {
	if s := r.nextDeadline(); s != 0 {
		return s.time()
	}
	return time.Time{}
}

func (r *Room) nextDeadline() stamp {
	if r.phase.Terminal() {
		if !r.releasePending || r.handoff == nil || r.inflight > 0 || r.closed {
			return 0
		}
		if d := r.drain; d != nil && d.started && len(d.owing) > 0 {
			return d.until
		}
		return r.quarantine
	}
	next := r.phaseBound()
	if dl := r.requestDeadline(); dl != 0 && (next == 0 || dl < next) {
		next = dl // what is left of the request's budget caps the phase's bound
	}
	return next
}

func (r *Room) deadline(d Deadline, e *Effects) {
	now := stamp(d.Now.UnixNano())
	due := func(s stamp) bool { return s != 0 && now >= s }
	if r.phase.Terminal() {
		if dr := r.drainOf(); dr != nil && dr.started && len(dr.owing) > 0 && due(dr.until) {
			// The bound expired before every rank acknowledged: the pages
			// go back with a warning naming those ranks.
			e.DrainExpired, e.Drain = true, DrainNote{Attempt: dr.attempt, Ranks: dr.owing}
			dr.owing = nil
		}
		r.maybeRelease(d.Now, e)
		return
	}
	elapsed := func(since stamp) float64 { return d.Now.Sub(since.time()).Seconds() }
	recompute := r.recomputeNote(d.GenerateURL)
	f := Fail{Now: d.Now, SelfWriter: d.SelfWriter}
	if dl := r.requestDeadline(); due(dl) {
		if pb := r.phaseBound(); pb == 0 || dl <= pb {
			// The request's budget ended no later than the phase's own
			// bounds: it decides.
			f.Failure = r.deadlineExceeded(d.Now)
			r.fail(f, e)
			return
		}
	}
	// The earliest bound that passed decides (each only in the phases it
	// bounds; the DP-rank bound before timeouts.bootstrap).
	switch {
	case r.phase == PhaseResolvingDP && due(r.dpBound()):
		f.Failure = Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.Bootstrapping: no rule resolved its prefill DP rank at %s within timeouts.dp_rank_resolution (no router hint, prefill dp_size %d, follow_bootstrap_room %v, no BindRoom received)",
			r.id, elapsed(r.openedAt), r.addr, r.topo.dp, r.topo.follow)}
	case r.phase == PhaseAdmitted && due(r.claimBy) && !(due(r.bootstrapAt) && r.bootstrapAt < r.claimBy):
		f.Failure = Failure{Code: FailureClaimTimeout, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (%s) within admission.claim_timeout%s",
			r.id, elapsed(r.admittedAt), r.unclaimedRanks(), recompute)}
	case (r.phase == PhaseWaitingPrefill || r.phase == PhaseResolvingDP || r.phase == PhaseQueued || r.phase == PhaseAdmitted) && due(r.bootstrapAt):
		f.Failure = Failure{Code: FailureBootstrapTimeout, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.%s: the destination was not claimed within timeouts.bootstrap (phase %s%s)%s",
			r.id, elapsed(r.openedAt), r.phase.Poll(), r.phase, r.unclaimedNote(), recompute)}
	case (r.phase == PhaseClaimed || r.phase == PhaseTransferring) && due(r.stagingBy):
		if !d.ScattersPending {
			// Nothing left to scatter: the waiting bound applies again.
			r.waitingAt, r.stagingBy = r.stagingBy, 0
			e.Then = ThenCheckSuccess
			return
		}
		f.Failure = Failure{Code: FailureStagingFailed, Message: fmt.Sprintf(
			"Request %d: staged KV was not scattered within %.1fs after every prefill rank reported (a scatter never arrived): %s",
			r.id, r.cfg.Waiting.Seconds(), strings.Join(d.ScatterMissing, "; "))}
	case (r.phase == PhaseClaimed || r.phase == PhaseTransferring) && due(r.waitingAt):
		f.Failure = Failure{Code: FailureWaitingTimeout, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.WaitingForInput%s",
			r.id, elapsed(r.claimedAt), r.waitingNote())}
	case (r.phase == PhaseRetracted || r.phase == PhaseHeld) && due(r.parkedAt):
		key, what := "timeouts.retracted", "retracted (RETRACT) and not resumed: its shard never had room for it again"
		if r.phase == PhaseHeld {
			key, what = "timeouts.held", "held for rebootstrap (REBOOTSTRAP) and no ContinueGeneration came"
		}
		f.Failure = Failure{Code: FailureRetractTimeout, Message: fmt.Sprintf(
			"Request %d was %s within %s (%s): it failed and its request slot went back to the pool",
			r.id, what, key, d.Now.Sub(r.updatedAt.time()).Round(time.Millisecond))}
	default:
		return // not due (yet): the caller re-arms at NextDeadline
	}
	r.fail(f, e)
}

// recomputeNote says how a rebootstrapped room's prefill is asked to
// recompute (the engine's POST to /generate, pinned to its DP rank); "" on
// a first attempt.
func (r *Room) recomputeNote(url string) string {
	if r.attempt <= 1 {
		return ""
	}
	if url == "" {
		url = "the prefill's /generate (" + r.addr + " registered no prefill_http_port)"
	}
	return fmt.Sprintf("; rebootstrap attempt %d: the prefill sends only after the decode engine's recompute request (POST %s, pinned to prefill DP rank %d, from ContinueGeneration's answer)", r.attempt, url, r.prefillDP)
}

func (r *Room) unclaimedRanks() string {
	if r.plan == nil {
		return "none known"
	}
	return r.pendingRanks(func(rp *rankProgress) bool { return rp.claimed })
}

// pendingRanks lists (at most MaxListedRanks) the required ranks not ok yet.
func (r *Room) pendingRanks(ok func(*rankProgress) bool) string {
	var b strings.Builder
	n, more := 0, 0
	for _, k := range r.plan.Required() {
		if rp := r.ranksOf(k); rp == nil || !ok(rp) {
			if n == MaxListedRanks {
				more++
				continue
			}
			if n > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "cp %d tp %d pp %d", k.CP, k.TP, k.PP)
			n++
		}
	}
	if more > 0 {
		fmt.Fprintf(&b, "; and %d more", more)
	}
	return b.String()
}

func (r *Room) unclaimedNote() string {
	if r.phase != PhaseAdmitted {
		return ""
	}
	return "; unclaimed prefill ranks: " + r.unclaimedRanks()
}

func (r *Room) waitingNote() string {
	if r.plan == nil {
		return ""
	}
	if r.doneN >= len(r.plan.Required()) {
		if r.marker == 0 {
			return " (every chunk landed but the metadata slot never received the room marker)"
		}
		return " (every chunk landed; waiting for staged chunks to be scattered)"
	}
	return " (prefill ranks still sending: " + r.pendingRanks(func(rp *rankProgress) bool { return rp.done }) + ")"
}
