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

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// room is one request's KV hand-off. Every field is guarded by its shard's
// lock (shard.mu); id and decodeDP never change once it is opened.
// A room that was never admitted is only what it needs while it waits
// (identity, request, DP rank, phase, deadlines, timeline); what admission
// and the transfer add lives in *handoff, made at its first admission and
// kept until the room is forgotten, so that a queued room stays small.
// Code reading a handoff field checks r.handoff first unless the room's
// phase implies an admission (admitted, claimed, transferring, succeeded,
// retracted, held; see hasHandoff).
type room struct {
	id       uint64
	addr     string
	entry    prealloc.Entry // the ledger's record of the room (its request, queue position, allocation)
	decodeDP int

	hintDP    int // -1: no hint
	prefillDP int // -1: unresolved

	failure   *Failure
	openedAt  stamp
	updatedAt stamp
	// finishedAt is updatedAt once the room is terminal (no transition
	// follows the terminal one).
	transitions []transition // compact; rendered by timeline

	// Deadlines, zero when not armed (waitingAt is the handoff's).
	bootstrapAt stamp
	dpAt        stamp
	parkedAt    stamp    // a retracted or held room's bound (timeouts.retracted / timeouts.held)
	dl          deadline // the earliest of them, on the manager's deadline heap

	plan   *registry.Plan
	claims *claimSet // made by the first claim

	extra *roomExtra // what few rooms have: watchers, end hooks, success gates, an idempotency key

	tr *roomTrace // nil unless the room's span is built (a tracer, see startSpanLocked)

	*handoff

	// Small fields together (no padding between them).
	attempt        uint32
	metaSlot       int32
	phase          Phase
	dpRule         DPRule
	inLedger       bool // the ledger holds this room (any ledger state)
	releasePending bool
	staging        bool
	parked         bool // among its address's waiting rooms (Manager.wait)
}

// handoff is what a room holds from its first admission on: its
// destination, its transfer's progress and what its release waits for.
type handoff struct {
	admittedAt time.Time
	claimedAt  time.Time
	waitingAt  time.Time

	// Admission results (copies, safe to hand out).
	pages   []int32
	fillLen int
	state   []kvlayout.StateIndices

	ranks *rankSet // required ranks seen this attempt (room.progress), made on first use
	// claimedN, doneN count required ranks claimed / done this attempt.
	claimedN, doneN int

	// Transfers in flight; the ledger is released only when none remain, so
	// that nothing writes into pages another room may get. xferCtx (made by
	// the first staged scatter) ends when the room fails; an engine Transfer
	// has its own cancel in its chunkState.
	xferCtx    context.Context
	xferCancel context.CancelFunc
	inflight   int
	// quarantine is made when an engine failure could not rule out writes
	// into the pages until a time: the release waits for it.
	quarantine *quarantine
	// drain: the acknowledgements a failed room's prefill ranks owe (drain.go).
	drain *drainState

	marker     uint64
	bytes      uint64
	chunksDone int
}

// ranksOf is rank k's progress on this attempt, nil if none (or never
// admitted).
func (r *room) ranksOf(k rankKey) *rankProgress {
	if r.handoff == nil {
		return nil
	}
	return r.ranks.get(k)
}

// admittedOnce gives the room its handoff state at its first admission.
func (r *room) admittedOnce() {
	if r.handoff == nil {
		r.handoff = &handoff{}
	}
}

// stamp is a time as Unix nanoseconds, 0 for none: a room keeps its times
// in 8 bytes each instead of time.Time's 24 (the deadline heap keys by the
// same numbers).
type stamp int64

func stampOf(t time.Time) stamp {
	if t.IsZero() {
		return 0
	}
	return stamp(t.UnixNano())
}

// time is the stamp as a time.Time (the zero time for none).
func (s stamp) time() time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s))
}

// roomExtra is what most rooms never have, made on first use.
type roomExtra struct {
	idemKey  string
	watchers map[*Watcher]struct{}
	onEnd    []func()
	gates    map[string]bool // conditions success waits for (e.g. staged scatters)
	texts    []string        // the timeline's notes of text of their own (transition.a indexes them)
}

// rid is the request's id (SGLang's rid), as the ledger's record holds it.
func (r *room) rid() string { return r.entry.Request().RID }

// x is the room's roomExtra, made on first use (to write to it).
func (r *room) x() *roomExtra {
	if r.extra == nil {
		r.extra = &roomExtra{}
	}
	return r.extra
}

// gated reports whether a condition holds the room's success back.
func (r *room) gated() bool { return r.extra != nil && len(r.extra.gates) > 0 }

// gate reports whether the named condition holds the room's success back.
func (r *room) gate(name string) bool { return r.extra != nil && r.extra.gates[name] }

// hold makes the named condition hold the room's success back.
func (r *room) hold(name string) {
	x := r.x()
	if x.gates == nil {
		x.gates = map[string]bool{}
	}
	x.gates[name] = true
}

// unhold lifts the named condition.
func (r *room) unhold(name string) {
	if r.extra != nil {
		delete(r.extra.gates, name)
	}
}

// clearGates lifts every condition.
func (r *room) clearGates() {
	if r.extra != nil {
		r.extra.gates = nil
	}
}

// watching is the room's watchers (nil when none).
// addWatcher registers w for the room's next transitions.
func (r *room) addWatcher(w *Watcher) {
	if x := r.x(); x.watchers == nil {
		x.watchers = make(map[*Watcher]struct{}, 1)
	}
	r.extra.watchers[w] = struct{}{}
}

func (r *room) watching() map[*Watcher]struct{} {
	if r.extra == nil {
		return nil
	}
	return r.extra.watchers
}

// roomTrace is a traced room's spans: the room span from OpenRoom to
// success or failure, its context, and the current phase's child span.
type roomTrace struct {
	span      trace.Span
	spanCtx   context.Context
	phaseSpan trace.Span
}

// logCtx is the context a room's log lines and engine calls carry: its
// span's when it has one.
func (r *room) logCtx() context.Context {
	if r.tr == nil {
		return context.Background()
	}
	return r.tr.spanCtx
}

// quarantine holds a room's release until writes that may continue after
// an engine failure (transfer.WritesMayContinueError) can no longer happen.
type quarantine struct {
	until time.Time
	dl    deadline
}

// writesUntil is when writes into the room's pages may have stopped (zero:
// nothing may still write).
func (r *room) writesUntil() time.Time {
	if r.handoff == nil || r.quarantine == nil {
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
	// engine: the daemon's engine moved this rank's chunks (Transfer).
	engine bool
	// stagingOpen: staging allocations this rank has not reported ready
	// (it may be writing into those regions; drain.go).
	stagingOpen int32
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
	result  transfer.ChunkResult
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
	req := r.entry.Request()
	s := RoomSnapshot{
		Room: r.id, RID: r.rid(), Addr: r.addr, DecodeDP: r.decodeDP,
		PrefillDP: r.prefillDP, DPRule: r.dpRule, Poll: r.phase.Poll(), Phase: r.phase,
		PromptLen: req.PromptLen, MaxNewTokens: req.MaxNewTokens, Priority: req.Priority,
		MetadataSlot: r.metaSlot, OpenedAt: r.openedAt.time(), UpdatedAt: r.updatedAt.time(),
		Attempt: r.attempt, Staging: r.staging,
	}
	if h := r.handoff; h != nil {
		s.NumPages, s.BytesTransferred, s.ChunksDone = len(h.pages), h.bytes, h.chunksDone
	}
	if r.failure != nil {
		f := *r.failure
		s.Failure = &f
	}
	if withTransitions {
		s.Transitions = r.timeline()
	}
	if withPages && r.handoff != nil {
		s.Pages = slices.Clone(r.pages)
	}
	if r.tr != nil && r.tr.span != nil {
		if sc := r.tr.span.SpanContext(); sc.IsValid() {
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

// transitionLocked moves the room to phase (room.transition) and applies
// the step's effects.
func (m *Manager) transitionLocked(r *room, to Phase, sglang string, note note) {
	m.applyLocked(r, r.transition(m.clock.Now(), to, sglang, note))
}

// applyLocked applies the effects of one event the room applied to itself,
// in this order: off the waiting rooms, transfers cancelled, claims ended,
// the outcome observed and logged; then the phase change (observer, spans,
// a waiting Shutdown, watchers, debug log, the room's deadline); then the
// chunk's observation and marker; then the end (retention, resources).
// The room's shard lock is held.
func (m *Manager) applyLocked(r *room, e effects) {
	if e.unwait {
		m.unwait(r)
	}
	if e.cancelPrev != nil {
		e.cancelPrev()
	}
	if e.admission {
		m.obs.DestinationLatency(e.admittedAfter)
	}
	if e.resolved {
		m.obs.DPRankResolved(e.rule)
		if r.tr != nil && r.tr.span != nil {
			r.tr.span.SetAttributes(attribute.Int("decodeplane.prefill_dp_rank", e.dp), attribute.String("decodeplane.dp_rank_rule", e.rule.String()))
		}
	}
	if e.cancel {
		if h := r.handoff; h != nil {
			if h.xferCancel != nil {
				h.xferCancel()
			}
			h.ranks.each(func(rp *rankProgress) {
				for _, cs := range rp.chunks {
					if cs.cancel != nil {
						cs.cancel() // the engine call in flight ends; its chunkEndLocked sees the failure
					}
				}
			})
		}
	}
	if e.claimEv != (DestinationEvent{}) {
		m.finishClaimsLocked(r, e)
	}
	if e.finished {
		if e.outcome == PhaseSucceeded {
			m.obs.TransferLatency(e.transferred)
		}
		m.obs.RoomFinished(e.outcome, e.code, e.sinceOpen)
	}
	if f := e.failure; f != nil {
		m.log.WarnContext(r.logCtx(), "room failed", "room", r.id, "rid", r.rid(), "bootstrap_addr", r.addr, "code", f.Code.String(), "phase", e.from.String(), "reason", f.Message)
	}
	if e.moved {
		m.movedLocked(r, e)
	}
	if e.chunk {
		m.obs.ChunkDone(e.chunkRes.Bytes, e.chunkRes.Duration, true)
	}
	if e.markerSet != 0 {
		if err := m.shardOf(r).led.SetMetadataMarker(r.id, e.markerSet); err != nil {
			m.log.Error("ledger refused the metadata marker", "room", r.id, "err", err)
		}
	}
	if e.end {
		m.endLocked(r)
	}
}

// movedLocked applies a phase change: the observer, the phase spans, a
// waiting Shutdown, the watchers (closed after a terminal step), the debug
// log and the room's deadline.
func (m *Manager) movedLocked(r *room, e effects) {
	from, to := e.from, e.to
	m.shardOf(r).count(r, from, to)
	m.obs.RoomPhase(from, to)
	m.phaseSpanLocked(r, from, to, e.note)
	if m.prog.waiting.Load() && from.Poll() != PollSuccess && !from.Terminal() && (to.Poll() == PollSuccess || to.Terminal()) {
		m.signalProgress()
	}
	if ws := r.watching(); len(ws) > 0 { // the snapshot is only for watchers: not on the hot path without them
		// The event is built once, when a watcher wants it (an outcome
		// watcher wants only the outcome, and ends with it).
		outcome := to == PhaseSucceeded || to.Terminal()
		var ev RoomEvent
		built := false
		for w := range ws {
			if w.outcome && !outcome {
				continue
			}
			if !built {
				ev = RoomEvent{Room: r.snapshot(false, false), Transition: e.t.public(r.addr, r.texts()), Terminal: to.Terminal(), Seq: uint32(1 + len(r.transitions))}
				built = true
			}
			if !w.send(ev) {
				delete(ws, w)
				continue
			}
			if w.outcome {
				w.close(nil)
				delete(ws, w)
			}
		}
	}
	if to.Terminal() {
		for w := range r.watching() {
			w.close(nil)
		}
		if r.extra != nil {
			r.extra.watchers = nil
		}
	}
	if ctx := r.logCtx(); m.log.Enabled(ctx, levelDebug) {
		m.log.DebugContext(ctx, "room transition", "room", r.id, "rid", r.rid(), "from", from.String(), "to", to.String(), "sglang", e.sglang, "note", e.note.render(r.addr))
	}
	m.armTimerLocked(r)
}

const levelDebug = -4

// A room keeps its timeline after OpenRoom's transition, which timeline
// derives from the room (opened): a queued room keeps one transition
// (queued, 32 bytes); the second grows the timeline straight to
// roomTransitions, which holds a whole hand-off (queued, admitted, claimed,
// transferring, succeeded, released), then append doubles it.
const roomTransitions = 8

// keep appends t to the room's timeline.
func (r *room) keep(t transition) {
	switch {
	case r.transitions == nil:
		r.transitions = make([]transition, 0, 1)
	case len(r.transitions) == cap(r.transitions) && cap(r.transitions) < roomTransitions:
		grown := make([]transition, len(r.transitions), roomTransitions)
		copy(grown, r.transitions)
		r.transitions = grown
	}
	r.transitions = append(r.transitions, t)
}

// signalProgress wakes a waiting Shutdown: a room stopped handing off.
func (m *Manager) signalProgress() {
	m.prog.mu.Lock()
	if m.prog.ch != nil {
		close(m.prog.ch)
		m.prog.ch = nil
		m.prog.waiting.Store(false)
	}
	m.prog.mu.Unlock()
}

// phaseSpanLocked keeps one child span per phase under the room span, which
// covers the hand-off from OpenRoom to success or failure.
func (m *Manager) phaseSpanLocked(r *room, from, to Phase, note note) {
	if r.tr == nil || r.tr.span == nil {
		return
	}
	t := r.tr
	if !t.span.IsRecording() { // sampled out: nothing to build
		if to == PhaseFailed || to == PhaseReleased {
			t.span = nil
		}
		return
	}
	if t.phaseSpan != nil && from != to {
		if s := note.render(r.addr); s != "" {
			t.phaseSpan.AddEvent(s)
		}
		t.phaseSpan.End()
		t.phaseSpan = nil
	}
	t.span.AddEvent("phase", trace.WithAttributes(attribute.String("phase", to.String()), attribute.Int("kvpoll", int(to.Poll()))))
	switch {
	case to == PhaseSucceeded && from != PhaseRetracted:
		t.span.SetAttributes(attribute.Int("kvpoll", int(PollSuccess)), attribute.Int64("bytes", int64(r.bytes)), attribute.Int("pages", len(r.pages)))
		t.span.SetStatus(codes.Ok, "")
		t.span.End()
	case to == PhaseFailed:
		if r.failure != nil {
			t.span.SetAttributes(attribute.String("failure.code", r.failure.Code.String()), attribute.String("failure.reason", r.failure.Message))
			t.span.SetStatus(codes.Error, r.failure.Message)
		}
		t.span.SetAttributes(attribute.Int("kvpoll", int(PollFailed)))
		t.span.End()
		t.span = nil
	case to == PhaseReleased:
		t.span = nil
	default:
		if name, ok := phaseSpanName[to]; ok {
			_, t.phaseSpan = m.tracer.Start(t.spanCtx, name, trace.WithAttributes(attribute.Int64("room", int64(r.id))))
		}
	}
}

// armTimerLocked keeps the room's entry on the deadline heap at its
// earliest deadline (room.nextDeadline; none once it is terminal).
func (m *Manager) armTimerLocked(r *room) {
	next := r.nextDeadline()
	if next.IsZero() || m.closed.Load() {
		m.clearDeadlineLocked(&r.dl)
		return
	}
	m.setDeadlineLocked(&r.dl, dlRoom, next, r.id, r.attempt, r)
}

// roomDeadlineLocked fails a room whose current phase's deadline passed
// (the heap's dlRoom entry, armed for attempt; room.expired decides which).
func (m *Manager) roomDeadlineLocked(r *room, attempt uint32) {
	if m.shardOf(r).rooms[r.id] != r || r.attempt != attempt || r.phase.Terminal() {
		return
	}
	now := m.clock.Now()
	elapsed := func(since time.Time) float64 { return now.Sub(since).Seconds() }
	switch r.expired(now) {
	case FailureDPRankUnresolved:
		m.failLocked(r, Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.Bootstrapping: no rule resolved its prefill DP rank at %s within timeouts.dp_rank_resolution (no router hint, prefill dp_size %d, follow_bootstrap_room %v, no BindRoom received)",
			r.id, elapsed(r.openedAt.time()), r.addr, m.topoLocked(r.addr).DP, m.topoLocked(r.addr).FollowBootstrapRoom)})
	case FailureBootstrapTimeout:
		m.failLocked(r, Failure{Code: FailureBootstrapTimeout, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.%s: the destination was not claimed within timeouts.bootstrap (phase %s%s)%s",
			r.id, elapsed(r.openedAt.time()), r.phase.Poll(), r.phase, r.unclaimedNote(), m.recomputeNoteLocked(r))})
	case FailureWaitingTimeout:
		m.failLocked(r, Failure{Code: FailureWaitingTimeout, Message: fmt.Sprintf(
			"Request %d timed out after %.1fs in KVPoll.WaitingForInput%s",
			r.id, elapsed(r.claimedAt), r.waitingNote())})
	case FailureRetractTimeout:
		m.parkedTimeoutLocked(r, now)
	default:
		m.armTimerLocked(r)
	}
}

func (m *Manager) topoLocked(addr string) PrefillTopology {
	return m.reg.Topology(addr)
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
	for _, k := range r.plan.Required() {
		if rp := r.ranks.get(k); rp == nil || !ok(rp) {
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
	if r.doneN >= len(r.plan.Required()) {
		if r.marker == 0 {
			return " (every chunk landed but the metadata slot never received the room marker)"
		}
		return " (every chunk landed; waiting for staged chunks to be scattered)"
	}
	return " (prefill ranks still sending: " + r.pendingRanks(func(rp *rankProgress) bool { return rp.done }) + ")"
}

// coverageOf renders each required rank's progress on the current attempt.
func (r *room) coverageOf() []RankCoverage {
	if r.plan == nil || len(r.plan.Required()) == 0 || r.handoff == nil {
		return nil
	}
	out := make([]RankCoverage, 0, len(r.plan.Required()))
	for _, k := range r.plan.Required() {
		c := RankCoverage{CP: k.CP, TP: k.TP, PP: k.PP, PagesRequired: len(r.pages)}
		if rp := r.ranks.get(k); rp != nil {
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
		if inst, ok := m.reg.Instance(r.addr); ok {
			n, want = inst.Registered, inst.Expected
		}
		return fmt.Sprintf("the registration of prefill instance %s (%d of %d ranks registered); bounded by SGLang's registration retries and timeouts.bootstrap%s", r.addr, n, want, at(r.bootstrapAt.time()))
	case PhaseResolvingDP:
		return fmt.Sprintf("the prefill DP rank of the room: a BindRoom from %s (or a router hint); bounded by timeouts.dp_rank_resolution%s", r.addr, at(r.dpAt.time()))
	case PhaseQueued:
		reason := "the rooms ahead of it"
		if r.decodeDP < len(m.shards) {
			if b := m.shards[r.decodeDP].led.Stats().LastBlocked; b != prealloc.BlockNone {
				reason = "blocked by " + b.String()
			}
		}
		return fmt.Sprintf("KV admission on decode DP shard %d (%s); bounded by timeouts.bootstrap%s", r.decodeDP, reason, at(r.bootstrapAt.time()))
	case PhaseAdmitted:
		return fmt.Sprintf("the destination's claim (AwaitDestination) by prefill ranks %s of %s; bounded by admission.claim_timeout and timeouts.bootstrap%s%s", r.unclaimedRanks(), r.addr, at(r.bootstrapAt.time()), m.recomputeNoteLocked(r))
	case PhaseClaimed, PhaseTransferring:
		var pending []string
		if r.plan != nil {
			for _, k := range r.plan.Required() {
				rp := r.ranks.get(k)
				if rp == nil || rp.done {
					continue
				}
				last := "last chunk not landed"
				if rp.lastLanded {
					last = "last chunk landed"
				}
				if len(pending) == maxListedRanks {
					pending = append(pending, fmt.Sprintf("and %d more", len(r.plan.Required())-r.doneN-maxListedRanks))
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
		return what + "; bounded by timeouts.waiting" + at(r.waitingAt)
	case PhaseSucceeded:
		return "ReleaseRoom from the decode engine (it owns the pages until then)"
	case PhaseRetracted:
		return fmt.Sprintf("resumption on decode DP shard %d: its pages come back before any new admission; bounded by timeouts.retracted%s", r.decodeDP, at(r.parkedAt.time()))
	case PhaseHeld:
		return "ContinueGeneration (rebootstrap: the room re-enters bootstrap on its pinned prefill DP rank, then the decode engine POSTs the recompute to the prefill's /generate named in ContinueGeneration's answer); bounded by timeouts.held" + at(r.parkedAt.time())
	}
	return ""
}
