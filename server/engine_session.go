package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// SessionMetrics counts the ops of EngineSession streams
// (metrics.Metrics: decodeplane_engine_session_ops_total{op, code}). op is
// "open", "release", "abort" or "watch", counted once per room of the op
// (once for an op refused as a whole), or "protocol" for a violation that
// ended a stream. The streams themselves are counted by the interceptor.
type SessionMetrics interface {
	EngineSessionOp(op string, code codes.Code)
}

// engineSessionService is EngineSession.Session: an adapter over the Rooms
// handlers (one state machine, two transports). Each op runs the unary
// handler (OpenRoom, ReleaseRoom, AbortRoom) or, for Watch, what WatchRoom
// calls (Manager.Watch), after the same Validate methods; the stream adds
// only its framing (seq, replies), the multiplexing of the rooms' events
// and their per-room sequence.
type engineSessionService struct {
	pb.UnimplementedEngineSessionServer
	s  *Server
	rs *roomsService
}

var _ pb.EngineSessionServer = (*engineSessionService)(nil)

// Session serves one engine stream. A sender goroutine writes the stream's
// queue; a receiver goroutine reads the ops and runs them in order; one
// forwarder goroutine per subscribed room moves its watcher's events into
// the queue; the handler's goroutine decides when the stream ends
// (engine_session.proto: the contract). The handler does not wait for a
// Send blocked by a client that stopped reading: a full queue ends the
// stream at once (its end unblocks the Send).
func (h *engineSessionService) Session(stream pb.EngineSession_SessionServer) error {
	es := &engineSession{
		h: h, stream: stream, ctx: stream.Context(),
		wakeSend: make(chan struct{}, 1), wake: make(chan struct{}, 1), subs: map[uint64]*kvmanager.Watcher{},
	}
	es.drained.L = &es.mu
	es.pack = negotiatePack(stream)
	go es.receive()
	go es.send()
	err := es.wait()
	es.close()
	return err
}

// engineSession is one stream's state.
type engineSession struct {
	h        *engineSessionService
	stream   pb.EngineSession_SessionServer
	ctx      context.Context
	wakeSend chan struct{} // the sender's signal: something queued (capacity 1)
	wake     chan struct{} // the handler's signal: the state changed (capacity 1)
	// pack: the client reads packed events (negotiatePack).
	pack bool

	mu sync.Mutex
	// queue holds the events and replies not yet sent, at most
	// pb.MaxEngineSessionQueue; inflight: the sender is writing one more.
	queue    []*pb.EngineEvent
	inflight bool
	// replay[i]: queue[i] re-delivers an event from before its room's
	// subscription by a Watch (a resume); replayQueued counts them. They do not count toward the slow-consumer bound: a resume of
	// many rooms re-delivers more than the bound at once. Instead the
	// receiver runs no op after a Watch until its replays are written
	// (replaying: subscriptions still queueing theirs).
	replay       []bool
	replayQueued int
	replaying    int
	// drained is broadcast when replaying or replayQueued reaches 0 and
	// when the stream ends (under mu).
	drained sync.Cond
	// end is why the stream ends early (a slow consumer, a broken
	// stream); the handler returns it at once.
	end error
	// violation is a protocol violation: nothing more is queued or run,
	// what is queued (the replies of the ops that ran) is sent, then the
	// handler returns it.
	violation error
	// halfClosed: the client sent its last op (CloseSend).
	halfClosed bool
	// closed: the handler is returning; nothing is queued or subscribed.
	closed bool
	// subs are the rooms subscribed, each until its terminal event.
	subs map[uint64]*kvmanager.Watcher
	fwd  sync.WaitGroup
	// opStart is when the op being run started (its failures' log line);
	// the receiver's alone.
	opStart time.Time
}

// wait returns the stream's status: the early end, or nil once the client
// half-closed (or the server stops) and every subscribed room's terminal
// event was written.
func (es *engineSession) wait() error {
	stop := es.h.s.stopCtx.Done()
	stopping := false
	for {
		es.mu.Lock()
		if es.end != nil {
			err := es.end
			es.mu.Unlock()
			return err
		}
		if es.violation != nil && ((len(es.queue) == 0 && !es.inflight) || stopping) {
			err := es.violation
			es.mu.Unlock()
			return err
		}
		if (es.halfClosed || stopping) && len(es.subs) == 0 && len(es.queue) == 0 && !es.inflight {
			es.mu.Unlock()
			return nil
		}
		es.mu.Unlock()
		select {
		case <-es.wake:
		case <-stop:
			stopping, stop = true, nil
		case <-es.ctx.Done():
			return contextStatus(es.ctx.Err())
		}
	}
}

// send is the one writer of the stream: the queue, in order.
func (es *engineSession) send() {
	for {
		es.mu.Lock()
		for len(es.queue) == 0 && es.end == nil && !es.closed {
			es.mu.Unlock()
			select {
			case <-es.wakeSend:
			case <-es.ctx.Done():
				return
			}
			es.mu.Lock()
		}
		if es.end != nil || es.closed {
			es.mu.Unlock()
			return
		}
		// Pack what is queued into one message (EngineEvent.more), at most
		// MaxEngineEventsPerMessage and about MaxSessionMessageBytes, for
		// a client that reads them.
		n := 1
		if es.pack {
			n = packCount(es.queue)
		}
		ev := es.queue[0]
		if n > 1 {
			ev.More = append(make([]*pb.EngineEvent, 0, n-1), es.queue[1:n]...)
		}
		for _, r := range es.replay[:n] {
			if r {
				es.replayQueued--
			}
		}
		if es.replayQueued == 0 {
			es.drained.Broadcast()
		}
		clear(es.queue[:n])
		es.queue = es.queue[n:]
		es.replay = es.replay[n:]
		es.inflight = true
		es.mu.Unlock()
		err := es.stream.Send(ev)
		es.mu.Lock()
		es.inflight = false
		es.mu.Unlock()
		if err != nil {
			es.fail(err)
			return
		}
		es.signal()
	}
}

// packCount is how many of queue's first events go into the next message
// (at least one): at most MaxEngineEventsPerMessage, while their sizes add
// up to at most MaxSessionMessageBytes.
func packCount(queue []*pb.EngineEvent) int {
	n, bytes := 1, engineEventSize(queue[0])
	for n < min(len(queue), pb.MaxEngineEventsPerMessage) {
		b := engineEventSize(queue[n])
		if bytes+b > pb.MaxSessionMessageBytes {
			break
		}
		n, bytes = n+1, bytes+b
	}
	return n
}

// engineEventSize is an event's size for the packing budget: a reply's
// (which grows with its op's rooms) measured, a room event's bounded from
// above (a room's state without its pages and timeline).
func engineEventSize(ev *pb.EngineEvent) int {
	if r := ev.GetReply(); r != nil {
		return proto.Size(r)
	}
	return roomEventSizeBound
}

// roomEventSizeBound bounds an EngineRoomEvent's size on the wire from
// above for the packing budget.
const roomEventSizeBound = 4 << 10

// signal wakes the handler.
func (es *engineSession) signal() {
	select {
	case es.wake <- struct{}{}:
	default:
	}
}

// violate ends the stream with a protocol violation, after what is queued.
func (es *engineSession) violate(err error) {
	es.count("protocol", codes.InvalidArgument)
	es.mu.Lock()
	if es.violation == nil {
		es.violation = status.Error(codes.InvalidArgument, err.Error())
	}
	es.mu.Unlock()
	es.signal()
}

// fail ends the stream with err (the first reason wins).
func (es *engineSession) fail(err error) {
	es.mu.Lock()
	if es.end == nil && !es.closed {
		es.end = err
	}
	es.drained.Broadcast()
	es.mu.Unlock()
	es.signal()
}

// push queues ev; false when the stream ended (or ends now: a full queue
// is a slow consumer, cut with RESOURCE_EXHAUSTED while its rooms go on).
// A replayed event (see engineSession.replay) is queued whatever the
// queue holds.
func (es *engineSession) push(ev *pb.EngineEvent, replay bool) bool {
	return es.pushEvent(ev, replay, false, pendingSub{})
}

// pushEvent is push; with final, sb's subscription ends in the same step.
func (es *engineSession) pushEvent(ev *pb.EngineEvent, replay, final bool, sb pendingSub) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	if final && es.subs[sb.room] == sb.w {
		delete(es.subs, sb.room)
	}
	if es.end != nil || es.closed || es.violation != nil {
		return false
	}
	if live := len(es.queue) - es.replayQueued; !replay && live >= pb.MaxEngineSessionQueue {
		es.end = status.Errorf(codes.ResourceExhausted, "slow consumer: %d events queued", live)
		es.drained.Broadcast()
		es.signal()
		return false
	}
	es.queue = append(es.queue, ev)
	es.replay = append(es.replay, replay)
	if replay {
		es.replayQueued++
	}
	select {
	case es.wakeSend <- struct{}{}:
	default:
	}
	return true
}

// close stops every subscription and waits for the forwarders.
func (es *engineSession) close() {
	es.mu.Lock()
	es.closed = true
	subs := es.subs
	es.subs = map[uint64]*kvmanager.Watcher{}
	es.queue, es.replay, es.replayQueued = nil, nil, 0
	es.drained.Broadcast()
	es.mu.Unlock()
	for _, w := range subs {
		w.Close()
	}
	es.fwd.Wait()
}

// receive reads the ops and runs them in order, until the client
// half-closes, the stream breaks or a protocol violation ends it.
func (es *engineSession) receive() {
	var prev uint64
	for {
		req, err := es.stream.Recv()
		if errors.Is(err, io.EOF) {
			es.mu.Lock()
			es.halfClosed = true
			es.mu.Unlock()
			es.signal()
			return
		}
		if err != nil {
			es.fail(err) // a message the interceptor refused (undecodable), or the stream's end
			return
		}
		if err := req.CheckBatch(); err != nil {
			es.violate(err)
			return
		}
		more := req.More
		req.More = nil
		if !es.handle(req, &prev) {
			return
		}
		for _, m := range more {
			if !es.handle(m, &prev) {
				return
			}
		}
	}
}

// handle runs one request of a message and queues its reply; false when
// the stream ends (a protocol violation, or it ended meanwhile).
func (es *engineSession) handle(req *pb.EngineRequest, prev *uint64) bool {
	if err := req.CheckProtocol(*prev); err != nil {
		es.violate(err) // after the replies of the requests before it
		return false
	}
	*prev = req.GetSeq()
	reply, subs := es.run(req)
	if !es.push(&pb.EngineEvent{Event: &pb.EngineEvent_Reply{Reply: reply}}, false) {
		for _, sb := range subs {
			sb.w.Close()
		}
		return false
	}
	for _, sb := range subs {
		es.start(sb)
	}
	if req.GetWatch() != nil {
		// A resume: its replays are written before the next op runs.
		es.mu.Lock()
		for es.replaying > 0 && es.end == nil && !es.closed {
			es.drained.Wait()
		}
		if h := replayQueuedHook; h != nil {
			h(len(es.queue))
		}
		for es.replayQueued > 0 && es.end == nil && !es.closed {
			es.drained.Wait()
		}
		es.mu.Unlock()
	}
	return true
}

// replayQueuedHook, set by tests only, is called (under the stream's lock)
// when a Watch's subscriptions have queued their replays, with the queue's
// length.
var replayQueuedHook func(queued int)

// pendingSub is a room an op subscribed: its watcher (opened before the
// reply is queued, so nothing is missed) and the last seq the client saw.
type pendingSub struct {
	room  uint64
	w     *kvmanager.Watcher
	after uint32
	// resume: a Watch's subscription, whose replay is exempt from the
	// slow-consumer bound (engineSession.replay).
	resume bool
}

// watcher watches room's whole timeline (ENGINE_EVENTS_ALL, as WatchRoom
// with history) or only its outcome (ENGINE_EVENTS_OUTCOME).
func (es *engineSession) watcher(room uint64, events pb.EngineEvents) (*kvmanager.Watcher, error) {
	if events == pb.EngineEvents_ENGINE_EVENTS_OUTCOME {
		return es.h.rs.m.WatchOutcome(room)
	}
	return es.h.rs.m.Watch(room, true)
}

// subscribed reports whether room is subscribed on the stream, and how
// many rooms are.
func (es *engineSession) subscribed(room uint64) (bool, int) {
	es.mu.Lock()
	defer es.mu.Unlock()
	_, ok := es.subs[room]
	return ok, len(es.subs)
}

// start registers a subscription and starts its forwarder (or drops it when
// the stream ended meanwhile).
func (es *engineSession) start(sb pendingSub) {
	es.mu.Lock()
	if es.closed || es.end != nil || es.violation != nil {
		es.mu.Unlock()
		sb.w.Close()
		return
	}
	if _, dup := es.subs[sb.room]; dup { // cannot happen: ops run in order, each checks subscribed
		es.mu.Unlock()
		sb.w.Close()
		return
	}
	es.subs[sb.room] = sb.w
	es.fwd.Add(1)
	if sb.resume {
		es.replaying++
	}
	es.mu.Unlock()
	go es.forward(sb)
}

// forward moves a room's events into the queue, numbered by their position
// in the room's timeline (RoomEvent.Seq; the watcher replays the timeline
// first), skipping those up to sb.after. An outcome watcher
// (ENGINE_EVENTS_OUTCOME) carries one event and ends. A watcher dropped
// for falling behind loses events, so the stream is cut as a slow consumer
// (the client resumes from the last seq it saw).
func (es *engineSession) forward(sb pendingSub) {
	defer es.fwd.Done()
	inc := es.h.s.deps.Incarnation
	terminal := false
	last := sb.w.Last() // the events up to it are replayed
	// pending: the events the watcher holds already (its replay, and
	// perhaps a live one); once they are queued the subscription is done
	// replaying (an outcome watcher whose outcome is still to come holds
	// none).
	pending := len(sb.w.Events())
	replaying := sb.resume // (an Open's subscription is not counted)
	done := func() {
		if replaying {
			replaying = false
			es.mu.Lock()
			es.replaying--
			if es.replaying == 0 {
				es.drained.Broadcast()
			}
			es.mu.Unlock()
		}
	}
	defer done()
	if pending == 0 {
		done()
	}
	for ev := range sb.w.Events() {
		terminal = ev.Terminal
		if ev.Seq > sb.after {
			out := &pb.EngineEvent{Event: &pb.EngineEvent_Room{Room: &pb.EngineRoomEvent{Room: sb.room, Seq: ev.Seq, Event: roomEventToProto(ev, inc)}}}
			// The room's last event leaves the subscription in the same
			// step as it is queued: an Open of the room right after it
			// subscribes it again (and gets its outcome) instead of
			// finding it still subscribed.
			final := ev.Terminal || sb.w.OutcomeOnly()
			if !es.pushEvent(out, sb.resume && ev.Seq <= last, final, sb) {
				break
			}
		}
		if pending--; pending == 0 {
			done()
		}
	}
	if !terminal && errors.Is(sb.w.Err(), kvmanager.ErrSlowConsumer) {
		es.mu.Lock()
		n := len(es.queue)
		es.mu.Unlock()
		es.fail(status.Errorf(codes.ResourceExhausted, "slow consumer: %d events queued", n))
	}
	sb.w.Close() // after an early stop (the stream ended), the room forgets the watcher
	es.mu.Lock()
	if es.subs[sb.room] == sb.w {
		delete(es.subs, sb.room)
	}
	es.mu.Unlock()
	es.signal()
}

// run answers one op; subs are the rooms it subscribes, to start once its
// reply is queued.
func (es *engineSession) run(req *pb.EngineRequest) (*pb.EngineReply, []pendingSub) {
	reply := &pb.EngineReply{Seq: req.GetSeq(), Incarnation: es.h.s.deps.Incarnation}
	op := opName(req)
	es.opStart = time.Now()
	if err := req.CheckOp(); err != nil {
		reply.Code, reply.Message = int32(codes.InvalidArgument), err.Error()
		es.count(op, codes.InvalidArgument)
		return reply, nil
	}
	base := es.opContext(req.GetTraceparent())
	switch o := req.GetOp().(type) {
	case *pb.EngineRequest_Open:
		return es.open(base, reply, o.Open)
	case *pb.EngineRequest_Release:
		res := &pb.EngineResult{Room: o.Release.GetRoom()}
		if err := o.Release.Validate(); err != nil {
			es.refuse(res, op, pb.PrefixFields("release.", err))
		} else {
			resp, err := es.h.rs.ReleaseRoom(base, o.Release)
			es.answer(base, res, op, prefixInvalid("release.", err))
			if err == nil {
				res.Answer = &pb.EngineResult_Release{Release: resp}
			}
		}
		reply.Results = []*pb.EngineResult{res}
	case *pb.EngineRequest_Abort:
		res := &pb.EngineResult{Room: o.Abort.GetRoom()}
		if err := o.Abort.Validate(); err != nil {
			es.refuse(res, op, pb.PrefixFields("abort.", err))
		} else {
			resp, err := es.h.rs.AbortRoom(base, o.Abort)
			es.answer(base, res, op, prefixInvalid("abort.", err))
			if err == nil {
				res.Answer = &pb.EngineResult_Abort{Abort: resp}
			}
		}
		reply.Results = []*pb.EngineResult{res}
	case *pb.EngineRequest_Watch:
		return es.watch(base, reply, o.Watch)
	}
	return reply, nil
}

// open runs each room of a batch as OpenRoom, in order, and subscribes the
// rooms it opened (or found open with the same idempotency key).
func (es *engineSession) open(base context.Context, reply *pb.EngineReply, o *pb.EngineOpen) (*pb.EngineReply, []pendingSub) {
	var subs []pendingSub
	tps := o.GetTraceparents()
	for i, req := range o.GetRooms() {
		res := &pb.EngineResult{Room: req.GetRoom()}
		reply.Results = append(reply.Results, res)
		if err := req.Validate(); err != nil {
			es.refuse(res, "open", pb.PrefixFields(fmt.Sprintf("open.rooms[%d].", i), err))
			continue
		}
		already, n := es.subscribed(req.GetRoom())
		if !already && n+len(subs) >= pb.MaxEngineSessionRooms {
			es.refuse(res, "open", status.Errorf(codes.ResourceExhausted, "this stream is subscribed to %d rooms (at most %d): nothing was opened; open it on another stream", n+len(subs), pb.MaxEngineSessionRooms))
			continue
		}
		ctx := base
		if len(tps) > 0 && tps[i] != "" {
			ctx = es.opContext(tps[i])
		}
		resp, err := es.h.rs.OpenRoom(ctx, req)
		es.answer(ctx, res, "open", prefixInvalid(fmt.Sprintf("open.rooms[%d].", i), err))
		if err != nil {
			continue
		}
		res.Answer = &pb.EngineResult_Open{Open: resp}
		if already {
			continue
		}
		w, err := es.watcher(req.GetRoom(), o.GetEvents())
		if err != nil { // the room went away at once (retention): say so
			es.answer(ctx, res, "watch", es.h.rs.err(ctx, err))
			continue
		}
		subs = append(subs, pendingSub{room: req.GetRoom(), w: w})
	}
	return reply, subs
}

// watch subscribes rooms from the event after the last one the client saw,
// as WatchRoom with history (what it calls: Manager.Watch).
func (es *engineSession) watch(base context.Context, reply *pb.EngineReply, o *pb.EngineWatch) (*pb.EngineReply, []pendingSub) {
	var subs []pendingSub
	for _, wr := range o.GetRooms() {
		res := &pb.EngineResult{Room: wr.GetRoom()}
		reply.Results = append(reply.Results, res)
		already, n := es.subscribed(wr.GetRoom())
		if already {
			es.answer(base, res, "watch", nil)
			continue
		}
		if n+len(subs) >= pb.MaxEngineSessionRooms {
			es.refuse(res, "watch", status.Errorf(codes.ResourceExhausted, "this stream is subscribed to %d rooms (at most %d): watch it on another stream", n+len(subs), pb.MaxEngineSessionRooms))
			continue
		}
		w, err := es.watcher(wr.GetRoom(), o.GetEvents())
		if err != nil {
			es.answer(base, res, "watch", es.h.rs.err(base, err))
			continue
		}
		es.answer(base, res, "watch", nil)
		// An after beyond the room's last event sends what comes next.
		subs = append(subs, pendingSub{room: wr.GetRoom(), w: w, after: min(wr.GetAfter(), w.Last()), resume: true})
	}
	return reply, subs
}

// refuse records a room's refusal before the domain: a validation error
// (INVALID_ARGUMENT with the field path) or a status.
func (es *engineSession) refuse(res *pb.EngineResult, op string, err error) {
	st, ok := status.FromError(err)
	if !ok {
		st = status.New(codes.InvalidArgument, err.Error())
	}
	res.Code, res.Message = int32(st.Code()), st.Message()
	es.count(op, st.Code())
}

// answer records a room's answer from its unary handler's error (a
// status): the code, the message and a RetryInfo's delay; failures are
// logged as a failed unary call would be.
func (es *engineSession) answer(ctx context.Context, res *pb.EngineResult, op string, err error) {
	if err == nil {
		es.count(op, codes.OK) // res is OK as made
		return
	}
	st := status.Convert(err)
	res.Code, res.Message = int32(st.Code()), st.Message()
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			res.RetryAfter = ri.GetRetryDelay()
		}
	}
	es.count(op, st.Code())
	es.h.s.logFailed(ctx, pb.EngineSession_Session_FullMethodName+"/"+op, "bidi_stream", es.opStart, err)
}

func (es *engineSession) count(op string, code codes.Code) {
	if m := es.h.s.deps.Sessions; m != nil {
		m.EngineSessionOp(op, code)
	}
}

// opContext is the context an op runs in: the stream's (its metadata, its
// cancellation), with the op's W3C trace context as the parent of what it
// starts; without one, no parent (each room's span starts its own trace).
func (es *engineSession) opContext(traceparent string) context.Context {
	ctx := trace.ContextWithSpanContext(es.ctx, trace.SpanContext{})
	if traceparent == "" {
		return ctx
	}
	return es.h.s.deps.Propagator.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// opName is an op's metrics label.
func opName(req *pb.EngineRequest) string {
	switch req.GetOp().(type) {
	case *pb.EngineRequest_Open:
		return "open"
	case *pb.EngineRequest_Release:
		return "release"
	case *pb.EngineRequest_Abort:
		return "abort"
	case *pb.EngineRequest_Watch:
		return "watch"
	}
	return "protocol"
}
