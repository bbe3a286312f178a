package kvmanager

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/prealloc"
)

// room is one request's KV hand-off. Every field is guarded by Manager.mu.
type room struct {
	id       uint64
	rid      string
	addr     string
	idemKey  string
	req      prealloc.Request
	decodeDP int
	led      Ledger

	hintDP    int // -1: no hint
	prefillDP int // -1: unresolved
	dpRule    DPRule

	phase      Phase
	failure    *Failure
	openedAt   time.Time
	updatedAt  time.Time
	admittedAt time.Time
	claimedAt  time.Time
	// finishedAt is updatedAt once the room is terminal (no transition
	// follows the terminal one).
	transitions []transition // compact; rendered by timeline

	// Deadlines, zero when not armed.
	bootstrapAt time.Time
	dpAt        time.Time
	waitingAt   time.Time
	dl          deadline // the earliest of them, on the manager's deadline heap

	// Admission results (copies, safe to hand out).
	pages   []int32
	fillLen int
	state   []prealloc.StateIndices

	plan   *roomPlan
	ranks  map[rankKey]*rankProgress // required ranks seen this attempt (room.progress)
	claims claimSet
	// claimedN, doneN count required ranks claimed / done this attempt.
	claimedN, doneN int

	watchers map[*Watcher]struct{}

	// Transfers in flight; the ledger is released only when none remain, so
	// that nothing writes into pages another room may get. xferCtx (made by
	// the first staged scatter) ends when the room fails; an engine Transfer
	// has its own cancel in its chunkState.
	xferCtx    context.Context
	xferCancel context.CancelFunc
	inflight   int
	onEnd      []func()
	// quarantine is made when an engine failure could not rule out writes
	// into the pages until a time: the release waits for it.
	quarantine *quarantine

	gates      map[string]bool // conditions success waits for (e.g. staged scatters)
	marker     uint64
	bytes      uint64
	chunksDone int

	span      trace.Span
	spanCtx   context.Context
	phaseSpan trace.Span

	// Small fields together (no padding between them).
	attempt        uint32
	metaSlot       int32
	inLedger       bool // the ledger holds this room (any ledger state)
	releasePending bool
	staging        bool
}

// quarantine holds a room's release until writes that may continue after
// an engine failure (WritesMayContinueError) can no longer happen.
type quarantine struct {
	until time.Time
	dl    deadline
}

// writesUntil is when writes into the room's pages may have stopped (zero:
// nothing may still write).
func (r *room) writesUntil() time.Time {
	if r.quarantine == nil {
		return time.Time{}
	}
	return r.quarantine.until
}

// rankProgress is one required prefill rank's transfer of one attempt.
type rankProgress struct {
	claimed bool
	chunks  map[int]*chunkState
	cov     coverage
	bytes   uint64
	last    int // index of the last chunk sent (landed or in flight), -1 until seen
	// lastLanded: the last chunk landed.
	lastLanded bool
	// done: every page of the destination landed from this rank and its
	// last chunk (with the metadata) landed; counted once in room.doneN.
	done bool
}

// settle ends the chunk's attempt in flight and wakes the retries waiting
// for it; lock held.
func (cs *chunkState) settle() {
	cs.busy, cs.cancel = false, nil
	if cs.waiters != nil {
		close(cs.waiters)
		cs.waiters = nil
	}
}

type chunkState struct {
	done bool
	busy bool // an attempt is in flight
	// waiters is made by a retry that waits for the attempt in flight and
	// closed when it ends; cancel ends the engine call (the room failed).
	waiters chan struct{}
	cancel  context.CancelFunc
	result  ChunkResult
	err     error
	// The chunk's identity beyond its index: a retry must match it.
	off, n int
	last   bool
}

func (r *room) handingOff() bool {
	return !r.phase.Terminal() && r.phase.Poll() != PollSuccess
}

// snapshot renders the room; the caller holds the lock.
func (r *room) snapshot(withTransitions, withPages bool) RoomSnapshot {
	s := RoomSnapshot{
		Room: r.id, RID: r.rid, Addr: r.addr, DecodeDP: r.decodeDP,
		PrefillDP: r.prefillDP, DPRule: r.dpRule, Poll: r.phase.Poll(), Phase: r.phase,
		PromptLen: r.req.PromptLen, MaxNewTokens: r.req.MaxNewTokens, Priority: r.req.Priority,
		NumPages: len(r.pages), MetadataSlot: r.metaSlot, BytesTransferred: r.bytes,
		ChunksDone: r.chunksDone, OpenedAt: r.openedAt, UpdatedAt: r.updatedAt,
		Attempt: r.attempt, Staging: r.staging,
	}
	if r.failure != nil {
		f := *r.failure
		s.Failure = &f
	}
	if withTransitions {
		s.Transitions = r.timeline()
	}
	if withPages {
		s.Pages = slices.Clone(r.pages)
	}
	if r.span != nil {
		if sc := r.span.SpanContext(); sc.IsValid() {
			s.TraceID = sc.TraceID().String()
		}
	}
	return s
}

// phaseSpanName names the child span of each phase.
var phaseSpanName = map[Phase]string{
	PhaseWaitingPrefill: "room.bootstrap",
	PhaseResolvingDP:    "room.dp_rank",
	PhaseQueued:         "room.admission",
	PhaseAdmitted:       "room.claim",
	PhaseClaimed:        "room.transfer",
	PhaseRetracted:      "room.retracted",
}

// transitionLocked moves the room to phase, records the transition, ends
// and starts phase spans, and tells watchers, claims and the observer.
func (m *Manager) transitionLocked(r *room, to Phase, sglang string, note note) {
	now := m.clock.Now()
	from := r.phase
	r.phase = to
	r.updatedAt = now
	t := newTransition(now, to, sglang, note, r.attempt)
	if r.transitions == nil {
		r.transitions = make([]transition, 0, roomTransitions)
	}
	r.transitions = append(r.transitions, t)
	m.countTransitionLocked(r, from, to)
	m.obs.RoomPhase(from, to)
	m.phaseSpanLocked(r, from, to, note)
	if m.progress != nil && from.Poll() != PollSuccess && !from.Terminal() && (to.Poll() == PollSuccess || to.Terminal()) {
		close(m.progress)
		m.progress = nil
	}
	if len(r.watchers) > 0 { // the snapshot is only for watchers: not on the hot path without them
		ev := RoomEvent{Room: r.snapshot(false, false), Transition: t.public(r.addr), Terminal: to.Terminal()}
		for w := range r.watchers {
			if !w.send(ev) {
				delete(r.watchers, w)
			}
		}
	}
	if to.Terminal() {
		for w := range r.watchers {
			w.close(nil)
		}
		r.watchers = nil
	}
	if m.log.Enabled(r.spanCtx, levelDebug) {
		m.log.DebugContext(r.spanCtx, "room transition", "room", r.id, "rid", r.rid, "from", from.String(), "to", to.String(), "sglang", sglang, "note", note.render(r.addr))
	}
	m.armTimerLocked(r)
}

const levelDebug = -4

// roomTransitions is the timeline's first capacity: a queued room's
// transitions (opened, queued, admitted, claimed) fit, a whole hand-off
// takes one more allocation.
const roomTransitions = 4

// phaseSpanLocked keeps one child span per phase under the room span, which
// covers the hand-off from OpenRoom to success or failure.
func (m *Manager) phaseSpanLocked(r *room, from, to Phase, note note) {
	if r.span == nil {
		return
	}
	if !r.span.IsRecording() { // sampled out: nothing to build
		if to == PhaseFailed || to == PhaseReleased {
			r.span = nil
		}
		return
	}
	if r.phaseSpan != nil && from != to {
		if s := note.render(r.addr); s != "" {
			r.phaseSpan.AddEvent(s)
		}
		r.phaseSpan.End()
		r.phaseSpan = nil
	}
	r.span.AddEvent("phase", trace.WithAttributes(attribute.String("phase", to.String()), attribute.Int("kvpoll", int(to.Poll()))))
	switch {
	case to == PhaseSucceeded && from != PhaseRetracted:
		r.span.SetAttributes(attribute.Int("kvpoll", int(PollSuccess)), attribute.Int64("bytes", int64(r.bytes)), attribute.Int("pages", len(r.pages)))
		r.span.SetStatus(codes.Ok, "")
		r.span.End()
	case to == PhaseFailed:
		if r.failure != nil {
			r.span.SetAttributes(attribute.String("failure.code", r.failure.Code.String()), attribute.String("failure.reason", r.failure.Message))
			r.span.SetStatus(codes.Error, r.failure.Message)
		}
		r.span.SetAttributes(attribute.Int("kvpoll", int(PollFailed)))
		r.span.End()
		r.span = nil
	case to == PhaseReleased:
		r.span = nil
	default:
		if name, ok := phaseSpanName[to]; ok {
			_, r.phaseSpan = m.tracer.Start(r.spanCtx, name, trace.WithAttributes(attribute.Int64("room", int64(r.id))))
		}
	}
}

// armTimerLocked keeps the room's entry on the deadline heap at its
// earliest deadline (none once it is terminal).
func (m *Manager) armTimerLocked(r *room) {
	if r.phase.Terminal() || m.closed {
		m.clearDeadlineLocked(&r.dl)
		return
	}
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	switch r.phase {
	case PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted:
		consider(r.bootstrapAt)
	case PhaseResolvingDP:
		consider(r.bootstrapAt)
		consider(r.dpAt)
	case PhaseClaimed, PhaseTransferring:
		consider(r.waitingAt)
	}
	if next.IsZero() {
		m.clearDeadlineLocked(&r.dl)
		return
	}
	m.setDeadlineLocked(&r.dl, dlRoom, next, r.id, r.attempt, r)
}

// roomDeadlineLocked fails a room whose current phase's deadline passed
// (the heap's dlRoom entry, armed for attempt).
func (m *Manager) roomDeadlineLocked(r *room, attempt uint32) {
	if m.rooms[r.id] != r || r.attempt != attempt || r.phase.Terminal() {
		return
	}
	now := m.clock.Now()
	elapsed := func(since time.Time) float64 { return now.Sub(since).Seconds() }
	switch r.phase {
	case PhaseResolvingDP:
		if !r.dpAt.IsZero() && !now.Before(r.dpAt) {
			m.failLocked(r, Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf(
				"Request %d timed out after %.1fs in KVPoll.Bootstrapping: no rule resolved its prefill DP rank at %s within timeouts.dp_rank_resolution (no router hint, prefill dp_size %d, follow_bootstrap_room %v, no BindRoom received)",
				r.id, elapsed(r.openedAt), r.addr, m.topoLocked(r.addr).DP, m.topoLocked(r.addr).FollowBootstrapRoom)})
			return
		}
		fallthrough
	case PhaseWaitingPrefill, PhaseQueued, PhaseAdmitted:
		if !r.bootstrapAt.IsZero() && !now.Before(r.bootstrapAt) {
			m.failLocked(r, Failure{Code: FailureBootstrapTimeout, Message: fmt.Sprintf(
				"Request %d timed out after %.1fs in KVPoll.%s: the destination was not claimed within timeouts.bootstrap (phase %s%s)",
				r.id, elapsed(r.openedAt), r.phase.Poll(), r.phase, r.unclaimedNote())})
			return
		}
	case PhaseClaimed, PhaseTransferring:
		if !r.waitingAt.IsZero() && !now.Before(r.waitingAt) {
			m.failLocked(r, Failure{Code: FailureWaitingTimeout, Message: fmt.Sprintf(
				"Request %d timed out after %.1fs in KVPoll.WaitingForInput%s",
				r.id, elapsed(r.claimedAt), r.waitingNote())})
			return
		}
	}
	m.armTimerLocked(r)
}

func (m *Manager) topoLocked(addr string) PrefillTopology {
	if p := m.prefills[addr]; p != nil {
		return p.topo
	}
	return PrefillTopology{}
}

func (r *room) unclaimedRanks() string {
	if r.plan == nil {
		return "none known"
	}
	return r.pendingRanks(func(rp *rankProgress) bool { return rp.claimed })
}

// pendingRanks lists (at most maxListedRanks) the required ranks not ok yet.
func (r *room) pendingRanks(ok func(*rankProgress) bool) string {
	var out []rankKey
	more := 0
	for _, k := range r.plan.required {
		if rp := r.ranks[k]; rp == nil || !ok(rp) {
			if len(out) < maxListedRanks {
				out = append(out, k)
			} else {
				more++
			}
		}
	}
	return listRanks(out, more)
}

func (r *room) unclaimedNote() string {
	if r.phase != PhaseAdmitted {
		return ""
	}
	return "; unclaimed prefill ranks: " + r.unclaimedRanks()
}

func (r *room) waitingNote() string {
	if r.plan == nil {
		return ""
	}
	if r.doneN >= len(r.plan.required) {
		if r.marker == 0 {
			return " (every chunk landed but the metadata slot never received the room marker)"
		}
		return " (every chunk landed; waiting for staged chunks to be scattered)"
	}
	return " (prefill ranks still sending: " + r.pendingRanks(func(rp *rankProgress) bool { return rp.done }) + ")"
}

// coverageOf renders each required rank's progress on the current attempt.
func (r *room) coverageOf() []RankCoverage {
	if r.plan == nil || len(r.plan.required) == 0 {
		return nil
	}
	out := make([]RankCoverage, 0, len(r.plan.required))
	for _, k := range r.plan.required {
		c := RankCoverage{CP: k.CP, TP: k.TP, PP: k.PP, PagesRequired: len(r.pages)}
		if rp := r.ranks[k]; rp != nil {
			c.Claimed, c.PagesLanded, c.LastLanded, c.Bytes = rp.claimed, rp.cov.landed, rp.lastLanded, rp.bytes
		}
		out = append(out, c)
	}
	return out
}

// waitingForLocked says what a room that has not ended waits for, who must
// act, and which bound ends the wait.
func (m *Manager) waitingForLocked(r *room) string {
	at := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return " until " + t.UTC().Format(time.RFC3339)
	}
	switch r.phase {
	case PhaseWaitingPrefill:
		n, want := 0, 0
		if inst := m.prefills[r.addr]; inst != nil {
			n, want = len(inst.ranks), inst.expected
		}
		return fmt.Sprintf("the registration of prefill instance %s (%d of %d ranks registered); bounded by SGLang's registration retries and timeouts.bootstrap%s", r.addr, n, want, at(r.bootstrapAt))
	case PhaseResolvingDP:
		return fmt.Sprintf("the prefill DP rank of the room: a BindRoom from %s (or a router hint); bounded by timeouts.dp_rank_resolution%s", r.addr, at(r.dpAt))
	case PhaseQueued:
		reason := "the rooms ahead of it"
		if r.decodeDP < len(m.shards) {
			if b := m.shards[r.decodeDP].Stats().LastBlocked; b != prealloc.BlockNone {
				reason = "blocked by " + b.String()
			}
		}
		return fmt.Sprintf("KV admission on decode DP shard %d (%s); bounded by timeouts.bootstrap%s", r.decodeDP, reason, at(r.bootstrapAt))
	case PhaseAdmitted:
		return fmt.Sprintf("the destination's claim (AwaitDestination) by prefill ranks %s of %s; bounded by admission.claim_timeout and timeouts.bootstrap%s", r.unclaimedRanks(), r.addr, at(r.bootstrapAt))
	case PhaseClaimed, PhaseTransferring:
		var pending []string
		if r.plan != nil {
			for _, k := range r.plan.required {
				rp := r.ranks[k]
				if rp == nil || rp.done {
					continue
				}
				last := "last chunk not landed"
				if rp.lastLanded {
					last = "last chunk landed"
				}
				if len(pending) == maxListedRanks {
					pending = append(pending, fmt.Sprintf("and %d more", len(r.plan.required)-r.doneN-maxListedRanks))
					break
				}
				pending = append(pending, fmt.Sprintf("cp %d tp %d pp %d (%d of %d pages landed, %s)", k.CP, k.TP, k.PP, rp.cov.landed, len(r.pages), last))
			}
		}
		what := ""
		switch {
		case len(pending) > 0:
			what = "KV pages from prefill ranks " + strings.Join(pending, "; ") + " of " + r.addr
		case len(r.gates) > 0:
			what = "the scatter of staged regions into the room's pages"
		case r.marker == 0:
			what = "the room marker in the metadata slot (aux with the last chunk)"
		default:
			what = "the success check"
		}
		return what + "; bounded by timeouts.waiting" + at(r.waitingAt)
	case PhaseSucceeded:
		return "ReleaseRoom from the decode engine (it owns the pages until then)"
	case PhaseRetracted:
		return fmt.Sprintf("resumption on decode DP shard %d: its pages come back before any new admission", r.decodeDP)
	case PhaseHeld:
		return "ContinueGeneration (rebootstrap: the room re-enters bootstrap and its prefill recomputes)"
	}
	return ""
}
