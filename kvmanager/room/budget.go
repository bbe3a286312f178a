package room

import (
	"fmt"
	"strings"
	"time"
)

// The request's deadline. OpenRoom may carry the request's time budget
// (Open.Timeout): the room's hand-off must succeed within it. It does not
// replace the configured bounds, it caps them: each phase's bound is the
// earlier of its own setting (timeouts.bootstrap, the DP-rank bound,
// admission.claim_timeout, timeouts.waiting, the scatters' completion) and
// what is left of the budget, so a room never waits longer than either. A
// room whose budget ends before its hand-off succeeded fails with
// FailureDeadlineExceeded, naming the phase it was in, the phase that used
// most of the budget and the time each phase took. The deadline bounds the
// first attempt only: a rebootstrap (ContinueGeneration) starts a new
// hand-off of a request already decoded, bounded by the settings alone.

// MaxTimeout bounds Open.Timeout (longer budgets are cut to it).
const MaxTimeout = 24 * time.Hour

// requestDeadline is the end of the request's budget while it bounds the
// room (its first attempt's hand-off); zero otherwise.
func (r *Room) requestDeadline() stamp {
	if r.timeoutMS == 0 || r.attempt != 1 || !r.HandingOff() {
		return 0
	}
	return r.openedAt + stamp(time.Duration(r.timeoutMS)*time.Millisecond)
}

// phaseBound is the earliest of the current phase's own bounds (the
// settings, not the request's deadline); zero when it has none.
func (r *Room) phaseBound() stamp {
	var next stamp
	consider := func(s stamp) {
		if s != 0 && (next == 0 || s < next) {
			next = s
		}
	}
	switch r.phase {
	case PhaseWaitingPrefill, PhaseQueued:
		consider(r.bootstrapAt)
	case PhaseResolvingDP:
		consider(r.bootstrapAt)
		consider(r.dpBound())
	case PhaseAdmitted:
		consider(r.bootstrapAt)
		consider(r.claimBy)
	case PhaseClaimed, PhaseTransferring:
		consider(r.waitingAt)
		consider(r.stagingBy)
	case PhaseRetracted, PhaseHeld:
		consider(r.parkedAt)
	}
	return next
}

// deadlineExceeded is the failure of a room whose budget ended at now
// before its hand-off succeeded.
func (r *Room) deadlineExceeded(now time.Time) Failure {
	times := r.PhaseTimes(now)
	most := PhaseTime{Phase: r.phase}
	for _, pt := range times {
		if pt.Spent > most.Spent {
			most = pt
		}
	}
	budget := time.Duration(r.timeoutMS) * time.Millisecond
	return Failure{Code: FailureDeadlineExceeded, Message: fmt.Sprintf(
		"Request %d exceeded its deadline (timeout %s from OpenRoom) in KVPoll.%s, phase %s: %s; phase %s used most of the budget (%s); time per phase: %s",
		r.id, budget, r.phase.Poll(), r.phase, r.waitedFor(), most.Phase, ms(most.Spent), PhaseTimesString(times))}
}

// waitedFor says briefly what the room was waiting for when its deadline
// passed.
func (r *Room) waitedFor() string {
	switch r.phase {
	case PhaseWaitingPrefill:
		return "prefill instance " + r.addr + " had not completed its registration"
	case PhaseResolvingDP:
		return "no rule resolved its prefill DP rank at " + r.addr + " (no BindRoom received)"
	case PhaseQueued:
		if r.owner == OwnerEngine {
			return fmt.Sprintf("the decode engine had not declared its destination on decode DP shard %d", r.decodeDP)
		}
		return fmt.Sprintf("it was not admitted on decode DP shard %d", r.decodeDP)
	case PhaseAdmitted:
		return "the destination was not claimed by prefill ranks " + r.unclaimedRanks() + " of " + r.addr
	}
	if w := strings.TrimPrefix(r.waitingNote(), " "); w != "" {
		return strings.TrimSuffix(strings.TrimPrefix(w, "("), ")")
	}
	return "its KV had not landed"
}

// PhaseTimes is the time the current attempt's hand-off spent in each of
// its phases up to now (or until it ended), in the order entered: at most
// one entry per hand-off phase (waiting_prefill through transferring). A
// zero now leaves the phase a live room is in out: the times are then
// those its timeline records, the same whenever they are read.
func (r *Room) PhaseTimes(now time.Time) []PhaseTime {
	steps := r.transitions
	start, startAt := -1, int64(r.openedAt) // -1: OpenRoom's derived step
	for i, t := range steps {
		if t.attempt == r.attempt && Phase(t.phase) == PhaseWaitingPrefill && t.attempt > 1 {
			start, startAt = i, t.at // the rebootstrap that began this attempt
			break
		}
	}
	var out []PhaseTime
	cur, from := PhaseWaitingPrefill, startAt
	add := func(p Phase, d time.Duration) {
		for i := range out {
			if out[i].Phase == p {
				out[i].Spent += d
				return
			}
		}
		out = append(out, PhaseTime{Phase: p, Spent: d})
	}
	for _, t := range steps[start+1:] {
		add(cur, time.Duration(t.at-from))
		cur, from = Phase(t.phase), t.at
		if !handOffPhase(cur) {
			return out
		}
	}
	if !now.IsZero() {
		add(cur, max(time.Duration(now.UnixNano()-from), 0))
	}
	return out
}

// handOffPhase reports whether p is a phase of a hand-off on its way.
func handOffPhase(p Phase) bool { return !p.Terminal() && p.Poll() != PollSuccess }

// PhaseTimesString renders phase times: "waiting_prefill 0s, queued 12ms".
func PhaseTimesString(times []PhaseTime) string {
	parts := make([]string, len(times))
	for i, pt := range times {
		parts[i] = pt.Phase.String() + " " + ms(pt.Spent).String()
	}
	return strings.Join(parts, ", ")
}

// ms rounds d to the millisecond.
func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// deadlineNote is what WaitingFor adds for a room its request's deadline
// bounds ("" for one it does not).
func (r *Room) deadlineNote() string {
	dl := r.requestDeadline()
	if dl == 0 {
		return ""
	}
	return fmt.Sprintf("; the request's deadline (timeout %s) until %s", time.Duration(r.timeoutMS)*time.Millisecond, dl.time().UTC().Format(time.RFC3339Nano))
}

// Timeout is the request's time budget (0: none).
func (r *Room) Timeout() time.Duration { return time.Duration(r.timeoutMS) * time.Millisecond }

// Deadline is when the request's budget ends while it bounds the room (the
// first attempt's hand-off); zero otherwise.
func (r *Room) Deadline() time.Time { return r.requestDeadline().time() }
