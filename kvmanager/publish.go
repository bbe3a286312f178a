package kvmanager

import (
	"context"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// What the executor tells the outside about a room's change: its claim
// streams, its watchers, its spans, the observer and the debug log.

// claimEffects ends, refuses or replies to the room's claim streams.
func (sh *shard) claimEffects(e *entry, ef *room.Effects) {
	if e.subs == nil {
		return
	}
	cs := &e.subs.claims
	for _, rf := range ef.Refuse {
		if c := cs.get(rf.Rank); c != nil {
			cs.remove(rf.Rank)
			c.finish(rf.Event)
		}
	}
	if ef.EndClaims {
		cs.each(func(c *Claim) {
			ev := ef.ClaimEnd
			for _, o := range ef.Owing {
				if o.Key() == c.rank.Key() {
					ev.AckRequired = true
					break
				}
			}
			c.finish(ev)
		})
		e.subs.claims = claimSet{}
	}
}

// offer queues the room's destination on the claim streams the effects
// name.
func (sh *shard) offer(e *entry, ef *room.Effects) {
	if e.subs == nil {
		return
	}
	e.subs.claims.each(func(c *Claim) {
		k := c.rank.Key()
		if ef.Offer == room.OfferOne && k != ef.OfferTo {
			return
		}
		d := e.Destination(k)
		if !d.Dummy {
			sh.noteReach(e, d.Pages, d.MetadataSlot, d.State)
		}
		c.queue(DestinationEvent{Destination: d})
	})
}

// cancelCalls ends the engine calls running into the room (it failed):
// their ChunkEnd sees the failure.
func (e *entry) cancelCalls() {
	s := e.subs
	if s == nil {
		return
	}
	if s.xferCancel != nil {
		s.xferCancel()
	}
	for i := range s.calls {
		if c := &s.calls[i]; c.cancel != nil {
			c.cancel()
		}
	}
}

// xferCtx is the room's transfer context (staged scatters), made on first
// use; it ends when the room fails.
func (e *entry) xferCtx() context.Context {
	s := e.s()
	if s.xferCtx == nil {
		s.xferCtx, s.xferCancel = context.WithCancel(context.Background())
		if e.Phase() == PhaseFailed {
			s.xferCancel()
		}
	}
	return s.xferCtx
}

// moved tells everyone who follows a room that it changed phase: the
// counts, the observer, the phase spans, a waiting Shutdown, the watchers
// (closed after a terminal step) and the debug log.
func (sh *shard) moved(e *entry, mv room.Move) {
	m := sh.m
	from, to := mv.From, mv.To
	sh.count(e, from, to)
	m.obs.RoomPhase(from, to)
	sh.phaseSpan(e, mv)
	if m.prog.waiting.Load() && from.Poll() != PollSuccess && !from.Terminal() && (to.Poll() == PollSuccess || to.Terminal()) {
		m.prog.signal()
	}
	if s := e.subs; s != nil && len(s.watchers) > 0 { // the snapshot is only for watchers: not on the hot path without them
		// The event is built once, when a watcher wants it (an outcome
		// watcher wants only the outcome, and ends with it — or, for a room
		// that ended before its pages were reusable, with the step that
		// says they are).
		outcome := to == PhaseSucceeded || to.Terminal()
		// At shutdown nothing is waited for: the ledgers go away with the
		// process, so a room's end is its watchers' last event.
		reusable := to.Terminal() && (!e.ReleasePending() || m.closed.Load())
		var ev RoomEvent
		built := false
		for w := range s.watchers {
			if w.outcome && !outcome {
				continue
			}
			if !built {
				ev = RoomEvent{Room: e.snapshot(false, false), Transition: mv.Step.Public(e.Addr(), e.Texts()), Terminal: to.Terminal() && !from.Terminal(),
					PagesReusable: reusable, Seq: e.Seq()}
				built = true
			}
			if !w.send(ev) {
				delete(s.watchers, w)
				continue
			}
			if w.outcome && (!to.Terminal() || reusable) {
				w.close(nil)
				delete(s.watchers, w)
			}
		}
		if reusable {
			for w := range s.watchers {
				w.close(nil)
			}
			s.watchers = nil
		}
	}
	if ctx := e.logCtx(); m.log.Enabled(ctx, levelDebug) {
		m.log.DebugContext(ctx, "room transition", "room", e.ID(), "rid", e.Request().RID, "from", from.String(), "to", to.String(), "sglang", mv.SGLang, "note", mv.Note(e.Addr()))
	}
}

const levelDebug = -4

// snapshot is the room's snapshot with its trace id.
func (e *entry) snapshot(withTransitions, withPages bool) RoomSnapshot {
	s := e.Snapshot(withTransitions, withPages)
	if tr := e.trace(); tr != nil && tr.span != nil {
		if sc := tr.span.SpanContext(); sc.IsValid() {
			s.TraceID = sc.TraceID().String()
		}
	}
	return s
}

// progress is a waiting Shutdown's signal: made by Shutdown, closed (and
// forgotten) when a room stops handing off. waiting says whether a channel
// is set, so that a transition does not take the lock otherwise.
type progress struct {
	mu      sync.Mutex
	ch      chan struct{}
	waiting atomic.Bool
}

// signal wakes a waiting Shutdown: a room stopped handing off.
func (p *progress) signal() {
	p.mu.Lock()
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
		p.waiting.Store(false)
	}
	p.mu.Unlock()
}

// roomTrace is a traced room's spans: the room span from OpenRoom to
// success or failure, its context, and the current phase's child span.
type roomTrace struct {
	span      trace.Span
	spanCtx   context.Context
	phaseSpan trace.Span
}

// trace is the room's spans (nil unless built).
func (e *entry) trace() *roomTrace {
	if e.subs == nil {
		return nil
	}
	return e.subs.tr
}

// logCtx is the context a room's log lines and engine calls carry: its
// span's when it has one.
func (e *entry) logCtx() context.Context {
	if tr := e.trace(); tr != nil {
		return tr.spanCtx
	}
	return context.Background()
}

// startSpan starts the room's span (OpenRoom, a rebootstrap's new attempt)
// under ctx's; nothing is built without a tracer.
func (sh *shard) startSpan(ctx context.Context, e *entry) {
	m := sh.m
	if !m.tracing {
		if e.subs != nil {
			e.subs.tr = nil
		}
		return
	}
	attrs := []attribute.KeyValue{
		attribute.Int64("decodeplane.room", int64(e.ID())),
		attribute.String("decodeplane.rid", e.Request().RID),
		attribute.String("decodeplane.prefill.addr", e.Addr()),
		attribute.Int("decodeplane.decode_dp_rank", e.DecodeDP()),
		attribute.Int("decodeplane.prompt_len", e.Request().PromptLen),
		attribute.Int("decodeplane.attempt", int(e.Attempt())),
	}
	if d := e.Deadline(); !d.IsZero() {
		attrs = append(attrs, attribute.Int64("decodeplane.timeout_ms", e.Timeout().Milliseconds()))
	}
	_, span := m.tracer.Start(ctx, "room", trace.WithAttributes(attrs...))
	e.s().tr = &roomTrace{span: span, spanCtx: trace.ContextWithSpan(context.Background(), span)}
}

// phaseTimeAttrs records on the room span the time each phase of its
// hand-off took: decodeplane.phase_ms.<phase>, milliseconds.
func phaseTimeAttrs(span trace.Span, times []PhaseTime) {
	for _, pt := range times {
		span.SetAttributes(attribute.Int64("decodeplane.phase_ms."+pt.Phase.String(), pt.Spent.Milliseconds()))
	}
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

// phaseSpan keeps one child span per phase under the room span, which
// covers the hand-off from OpenRoom to success or failure.
func (sh *shard) phaseSpan(e *entry, mv room.Move) {
	t := e.trace()
	if t == nil || t.span == nil {
		return
	}
	from, to := mv.From, mv.To
	if !t.span.IsRecording() { // sampled out: nothing to build
		if to == PhaseFailed || to == PhaseReleased {
			t.span = nil
		}
		return
	}
	if t.phaseSpan != nil && from != to {
		if s := mv.Note(e.Addr()); s != "" {
			t.phaseSpan.AddEvent(s)
		}
		t.phaseSpan.End()
		t.phaseSpan = nil
	}
	at := mv.Step.At()
	if d := e.Deadline(); !d.IsZero() {
		t.span.AddEvent("phase", trace.WithAttributes(attribute.String("phase", to.String()), attribute.Int("kvpoll", int(to.Poll())),
			attribute.Int64("budget_left_ms", d.Sub(at).Milliseconds())))
	} else {
		t.span.AddEvent("phase", trace.WithAttributes(attribute.String("phase", to.String()), attribute.Int("kvpoll", int(to.Poll()))))
	}
	if to == PhaseFailed || (to == PhaseSucceeded && from != PhaseRetracted) {
		phaseTimeAttrs(t.span, e.PhaseTimes(at))
	}
	switch {
	case to == PhaseSucceeded && from != PhaseRetracted:
		snap := e.Snapshot(false, false)
		t.span.SetAttributes(attribute.Int("kvpoll", int(PollSuccess)), attribute.Int64("bytes", int64(snap.BytesTransferred)), attribute.Int("pages", snap.NumPages))
		t.span.SetStatus(codes.Ok, "")
		t.span.End()
	case to == PhaseFailed:
		if f := e.Failure(); f != nil {
			t.span.SetAttributes(attribute.String("failure.code", f.Code.String()), attribute.String("failure.reason", f.Message))
			t.span.SetStatus(codes.Error, f.Message)
		}
		t.span.SetAttributes(attribute.Int("kvpoll", int(PollFailed)))
		t.span.End()
		t.span = nil
	case to == PhaseReleased:
		t.span = nil
	default:
		if name, ok := phaseSpanName[to]; ok {
			_, t.phaseSpan = sh.m.tracer.Start(t.spanCtx, name, trace.WithAttributes(attribute.Int64("room", int64(e.ID()))))
		}
	}
}
