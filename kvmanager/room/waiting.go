package room

import (
	"fmt"
	"strings"
	"time"
)

// WaitView is what WaitingFor reads beyond the room: the registration of
// its prefill instance (ranks registered of those expected), its shard's
// last admission block ("" or "none" when not blocked), the engine resync
// wait admission is held for (ResyncUntil zero: none), and a rebootstrapped
// room's prefill /generate.
type WaitView struct {
	Registered, Expected int
	Blocked              string
	ResyncUntil          time.Time
	GenerateURL          string
}

// WaitingFor says what a room that has not ended waits for, who must act,
// and which bound ends the wait ("" for an ended room that holds nothing;
// a draining room says which acknowledgements it waits for).
func (r *Room) WaitingFor(v WaitView) string {
	if s := r.waitingFor(v); s != "" {
		return s + r.deadlineNote()
	}
	return ""
}

func (r *Room) waitingFor(v WaitView) string {
	if s := r.DrainWaiting(); s != "" {
		return s
	}
	at := func(s stamp) string {
		if s == 0 {
			return ""
		}
		return " until " + s.time().UTC().Format(time.RFC3339)
	}
	switch r.phase {
	case PhaseWaitingPrefill:
		return fmt.Sprintf("the registration of prefill instance %s (%d of %d ranks registered); bounded by SGLang's registration retries and timeouts.bootstrap%s", r.addr, v.Registered, v.Expected, at(r.bootstrapAt))
	case PhaseResolvingDP:
		return fmt.Sprintf("the prefill DP rank of the room: a BindRoom from %s (or a router hint); bounded by timeouts.dp_rank_resolution%s", r.addr, at(r.dpBound()))
	case PhaseQueued:
		if !v.ResyncUntil.IsZero() {
			return fmt.Sprintf("the decode engine's resync (admission is held until the engine re-declared the rooms it still runs); bounded by engine.resync_timeout%s, then KV admission on decode DP shard %d; the room itself by timeouts.bootstrap%s",
				at(stampOf(v.ResyncUntil)), r.decodeDP, at(r.bootstrapAt))
		}
		if r.owner == OwnerEngine {
			return fmt.Sprintf("the decode engine's declaration of the destination it allocated (DeclareDestination) on decode DP shard %d; bounded by timeouts.bootstrap%s", r.decodeDP, at(r.bootstrapAt))
		}
		reason := "the rooms ahead of it"
		if v.Blocked != "" && v.Blocked != "none" {
			reason = "blocked by " + v.Blocked
		}
		return fmt.Sprintf("KV admission on decode DP shard %d (%s); bounded by timeouts.bootstrap%s", r.decodeDP, reason, at(r.bootstrapAt))
	case PhaseAdmitted:
		return fmt.Sprintf("the destination's claim (AwaitDestination) by prefill ranks %s of %s; bounded by admission.claim_timeout and timeouts.bootstrap%s%s", r.unclaimedRanks(), r.addr, at(r.bootstrapAt), r.recomputeNote(v.GenerateURL))
	case PhaseClaimed, PhaseTransferring:
		var pending []string
		if r.plan != nil {
			for _, k := range r.plan.Required() {
				rp := r.ranksOf(k)
				if rp == nil || rp.done {
					continue
				}
				last := "last chunk not landed"
				if rp.lastLanded {
					last = "last chunk landed"
				}
				if len(pending) == MaxListedRanks {
					pending = append(pending, fmt.Sprintf("and %d more", len(r.plan.Required())-r.doneN-MaxListedRanks))
					break
				}
				pending = append(pending, fmt.Sprintf("cp %d tp %d pp %d (%d of %d pages landed, %s)", k.CP, k.TP, k.PP, rp.cov.landed, len(r.pages), last))
			}
		}
		what := ""
		switch {
		case len(pending) > 0:
			what = "KV pages from prefill ranks " + strings.Join(pending, "; ") + " of " + r.addr
		case r.gated():
			what = "the scatter of staged regions into the room's pages"
		case r.marker == 0:
			what = "the room marker in the metadata slot (aux with the last chunk)"
		default:
			what = "the success check"
		}
		until := r.waitingAt
		if r.stagingBy != 0 { // the scatters' completion timeout replaced it
			until = r.stagingBy
		}
		return what + "; bounded by timeouts.waiting" + at(until)
	case PhaseSucceeded:
		return "ReleaseRoom from the decode engine (it owns the pages until then)"
	case PhaseRetracted:
		return fmt.Sprintf("resumption on decode DP shard %d: its pages come back before any new admission; bounded by timeouts.retracted%s", r.decodeDP, at(r.parkedAt))
	case PhaseHeld:
		return "ContinueGeneration (rebootstrap: the room re-enters bootstrap on its pinned prefill DP rank, then the decode engine POSTs the recompute to the prefill's /generate named in ContinueGeneration's answer); bounded by timeouts.held" + at(r.parkedAt)
	}
	return ""
}
