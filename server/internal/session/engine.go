package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/internal/ops"
)

// EngineMetrics counts the ops of EngineSession streams
// (metrics.Metrics: decodeplane_engine_session_ops_total{op, code}). op is
// "open", "release", "abort" or "watch", counted once per room of the op
// (once for an op refused as a whole), or "protocol" for a violation that
// ended a stream. The streams themselves are counted by the interceptor.
type EngineMetrics interface {
	EngineSessionOp(op string, code codes.Code)
}

// Engine is EngineSession.Session, over the table's OpenRoom, ReleaseRoom,
// AbortRoom and WatchRoom; the stream adds only its framing (seq,
// replies), the multiplexing of the rooms' events and their per-room
// sequence.
type Engine struct {
	pb.UnimplementedEngineSessionServer
	cfg Config
	t   *ops.Table
}

var _ pb.EngineSessionServer = (*Engine)(nil)

// NewEngine serves EngineSession over cfg.Ops.
func NewEngine(cfg Config) *Engine { return &Engine{cfg: cfg, t: cfg.Ops} }

// Session serves one engine stream (engine_session.proto: the contract):
// one goroutine reads the ops and runs them in order, one writes the
// stream's queue, the rooms' watches queue their events through their
// sinks, and this goroutine decides when the stream ends. It does not wait
// for a Send blocked by a client that stopped reading: a full queue ends
// the stream at once (its end unblocks the Send).
func (h *Engine) Session(stream pb.EngineSession_SessionServer) error {
	es := &engineSession{h: h, t: h.t, stream: stream, ctx: stream.Context(), wakeSend: make(chan struct{}, 1), wake: make(chan struct{}, 1), subs: map[uint64]*engineSub{}}
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
	h        *Engine
	t        *ops.Table
	stream   pb.EngineSession_SessionServer
	ctx      context.Context
	wakeSend chan struct{} // the sender's signal: something queued (capacity 1)
	wake     chan struct{} // the handler's signal: the state changed (capacity 1)
	// pack: the client reads packed events (negotiatePack).
	pack bool
	// opStart is when the op being run started (its failures' log line);
	// the receiver's alone.
	opStart time.Time

	mu sync.Mutex
	// queue holds the events and replies not yet sent, at most
	// pb.MaxEngineSessionQueue live ones; inflight: the sender is writing
	// one more.
	queue    []*pb.EngineEvent
	inflight bool
	// raw[i] is queue[i]'s room event as the room manager gave it: the
	// sender converts it (the sink only queues it, under the room's lock).
	raw []kvmanager.RoomEvent
	// replay[i]: queue[i] re-delivers an event from before its room's
	// subscription by a Watch (a resume); replayQueued counts them. They
	// do not count toward the slow-consumer bound: a resume of many rooms
	// re-delivers more than the bound at once. Instead the receiver runs
	// no op after a Watch until its replays are written.
	replay       []bool
	replayQueued int
	// drained is broadcast when replayQueued reaches 0 and when the stream
	// ends (under mu).
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
	subs map[uint64]*engineSub
}

// wait returns the stream's status: the early end, or nil once the client
// half-closed (or the server stops) and every subscribed room's terminal
// event was written.
func (es *engineSession) wait() error {
	stop := es.h.cfg.Stop.Done()
	stopping := false
	for {
		es.mu.Lock()
		idle := len(es.queue) == 0 && !es.inflight
		switch {
		case es.end != nil:
			err := es.end
			es.mu.Unlock()
			return err
		case es.violation != nil && (idle || stopping):
			err := es.violation
			es.mu.Unlock()
			return err
		case (es.halfClosed || stopping) && len(es.subs) == 0 && idle:
			es.mu.Unlock()
			return nil
		}
		es.mu.Unlock()
		select {
		case <-es.wake:
		case <-stop:
			stopping, stop = true, nil
		case <-es.ctx.Done():
			return ops.ContextStatus(es.ctx.Err())
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
		batch, raw := es.takeLocked()
		es.inflight = true
		es.mu.Unlock()
		for i, ev := range batch {
			if re := ev.GetRoom(); re != nil {
				re.Event = es.t.RoomEventProto(raw[i])
			}
		}
		ev := batch[0]
		if len(batch) > 1 {
			ev.More = batch[1:]
		}
		err := es.stream.Send(ev)
		es.mu.Lock()
		es.inflight = false
		es.mu.Unlock()
		if err != nil {
			es.fail(err)
			return
		}
		signal(es.wake)
	}
}

// takeLocked takes the next message's events off the queue, and their raw
// room events: what is queued, packed into one message (EngineEvent.more),
// at most MaxEngineEventsPerMessage and about MaxSessionMessageBytes, for
// a client that reads them.
func (es *engineSession) takeLocked() ([]*pb.EngineEvent, []kvmanager.RoomEvent) {
	n := 1
	if es.pack {
		n = packCount(es.queue)
	}
	batch := slices.Clone(es.queue[:n])
	raw := slices.Clone(es.raw[:n])
	for _, r := range es.replay[:n] {
		if r {
			es.replayQueued--
		}
	}
	if es.replayQueued == 0 {
		es.drained.Broadcast()
	}
	clear(es.queue[:n])
	clear(es.raw[:n])
	es.queue, es.raw, es.replay = es.queue[n:], es.raw[n:], es.replay[n:]
	return batch, raw
}

// violate ends the stream with a protocol violation, after what is queued.
func (es *engineSession) violate(err error) {
	es.count("protocol", codes.InvalidArgument)
	es.mu.Lock()
	if es.violation == nil {
		es.violation = status.Error(codes.InvalidArgument, err.Error())
	}
	es.mu.Unlock()
	signal(es.wake)
}

// fail ends the stream with err (the first reason wins).
func (es *engineSession) fail(err error) {
	es.mu.Lock()
	es.failLocked(err)
	es.mu.Unlock()
}

func (es *engineSession) failLocked(err error) {
	if es.end == nil && !es.closed {
		es.end = err
	}
	es.drained.Broadcast()
	signal(es.wake)
}

// push queues a reply; false when the stream ended (or ends now: a full
// queue is a slow consumer, cut with RESOURCE_EXHAUSTED while its rooms go
// on).
func (es *engineSession) push(ev *pb.EngineEvent) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.pushLocked(ev, kvmanager.RoomEvent{}, false)
}

// pushLocked queues ev (with raw, a room event's, for the sender to
// convert); a replayed event (see engineSession.replay) is queued whatever
// the queue holds.
func (es *engineSession) pushLocked(ev *pb.EngineEvent, raw kvmanager.RoomEvent, replay bool) bool {
	if es.end != nil || es.closed || es.violation != nil {
		return false
	}
	if live := len(es.queue) - es.replayQueued; !replay && live >= pb.MaxEngineSessionQueue {
		es.failLocked(status.Errorf(codes.ResourceExhausted, "slow consumer: %d events queued", live))
		return false
	}
	es.queue = append(es.queue, ev)
	es.raw = append(es.raw, raw)
	es.replay = append(es.replay, replay)
	if replay {
		es.replayQueued++
	}
	signal(es.wakeSend)
	return true
}

// close stops every subscription: nothing more is queued.
func (es *engineSession) close() {
	es.mu.Lock()
	es.closed = true
	subs := es.subs
	es.subs = map[uint64]*engineSub{}
	es.queue, es.raw, es.replay, es.replayQueued = nil, nil, nil, 0
	es.drained.Broadcast()
	es.mu.Unlock()
	for _, sb := range subs {
		sb.w.Close()
	}
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
			signal(es.wake)
			return
		}
		if err != nil {
			es.fail(err) // a message the interceptor refused (undecodable), or the stream's end
			return
		}
		if es.stopped() {
			return // the stream ended: nothing more runs
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

// stopped reports whether the stream ended or ends after what is queued.
func (es *engineSession) stopped() bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.end != nil || es.closed || es.violation != nil
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
	ok := es.push(&pb.EngineEvent{Event: &pb.EngineEvent_Reply{Reply: reply}})
	// The subscriptions' events go to the queue from now on, after the
	// reply (or the watches end, when the stream did).
	for _, sb := range subs {
		es.activate(sb)
	}
	if !ok {
		return false
	}
	if req.GetWatch() != nil {
		// A resume: its replays are written before the next op runs.
		es.mu.Lock()
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

// run answers one op; subs are the rooms it subscribed, to activate once
// its reply is queued. A panic is the op's INTERNAL reply.
func (es *engineSession) run(req *pb.EngineRequest) (reply *pb.EngineReply, subs []*engineSub) {
	reply = &pb.EngineReply{Seq: req.GetSeq(), Incarnation: es.t.Incarnation()}
	op := opName(req)
	es.opStart = time.Now()
	if err := req.CheckOp(); err != nil {
		reply.Code, reply.Message = int32(codes.InvalidArgument), err.Error()
		es.count(op, codes.InvalidArgument)
		return reply, nil
	}
	base := es.opContext(req.GetTraceparent())
	defer func() {
		if p := recover(); p != nil {
			st := status.Convert(es.t.Recovered(base, p))
			reply = &pb.EngineReply{Seq: req.GetSeq(), Incarnation: es.t.Incarnation(), Code: int32(st.Code()), Message: st.Message()}
			es.count(op, st.Code())
			for _, sb := range subs {
				sb.w.Close()
			}
			subs = nil
		}
	}()
	switch o := req.GetOp().(type) {
	case *pb.EngineRequest_Open:
		return reply, es.open(base, reply, o.Open)
	case *pb.EngineRequest_Release:
		reply.Results = []*pb.EngineResult{single(es, base, op, o.Release.GetRoom(), es.t.ReleaseRoom, o.Release,
			func(r *pb.EngineResult, resp *pb.ReleaseRoomResponse) {
				r.Answer = &pb.EngineResult_Release{Release: resp}
			})}
	case *pb.EngineRequest_Abort:
		reply.Results = []*pb.EngineResult{single(es, base, op, o.Abort.GetRoom(), es.t.AbortRoom, o.Abort,
			func(r *pb.EngineResult, resp *pb.AbortRoomResponse) { r.Answer = &pb.EngineResult_Abort{Abort: resp} })}
	case *pb.EngineRequest_Declare:
		reply.Results = []*pb.EngineResult{single(es, base, op, o.Declare.GetRoom(), es.t.DeclareDestination, o.Declare,
			func(r *pb.EngineResult, resp *pb.DeclareDestinationResponse) {
				r.Answer = &pb.EngineResult_Declare{Declare: resp}
			})}
	case *pb.EngineRequest_Capacity:
		reply.Results = []*pb.EngineResult{single(es, base, op, 0, es.t.ReportCapacity, o.Capacity,
			func(r *pb.EngineResult, resp *pb.ReportCapacityResponse) {
				r.Answer = &pb.EngineResult_Capacity{Capacity: resp}
			})}
	case *pb.EngineRequest_Watch:
		return reply, es.watch(base, reply, o.Watch)
	}
	return reply, nil
}

// single runs an op of one result (release, abort, declare, capacity) as
// its unary RPC: the same checks, with the field named under the op's
// name ("declare.page_indices"), the same call and answer.
func single[Req, Resp any](es *engineSession, base context.Context, op string, room uint64, u ops.Unary[Req, Resp], req *Req, set func(*pb.EngineResult, *Resp)) *pb.EngineResult {
	res := &pb.EngineResult{Room: room}
	prefix := op + "."
	if err := u.CheckAs(prefix, req); err != nil {
		es.refuse(res, op, err)
	} else if resp, err := u.Call(base, req); err != nil {
		es.answer(base, res, op, prefixInvalid(prefix, err))
	} else {
		es.answer(base, res, op, nil)
		set(res, resp)
	}
	return res
}

// open runs each room of a batch as OpenRoom, in order, and subscribes the
// rooms it opened (or found open with the same idempotency key).
func (es *engineSession) open(base context.Context, reply *pb.EngineReply, o *pb.EngineOpen) []*engineSub {
	var subs []*engineSub
	tps := o.GetTraceparents()
	for i, req := range o.GetRooms() {
		res := &pb.EngineResult{Room: req.GetRoom()}
		reply.Results = append(reply.Results, res)
		prefix := fmt.Sprintf("open.rooms[%d].", i)
		if err := es.t.OpenRoom.CheckAs(prefix, req); err != nil {
			es.refuse(res, "open", err)
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
		resp, err := es.t.OpenRoom.Call(ctx, req)
		es.answer(ctx, res, "open", prefixInvalid(prefix, err))
		if err != nil {
			continue
		}
		res.Answer = &pb.EngineResult_Open{Open: resp}
		if already {
			continue
		}
		sb, err := es.subscribe(ctx, req.GetRoom(), o.GetEvents(), 0, false)
		if err != nil { // the room went away at once (retention): say so
			es.answer(ctx, res, "watch", err)
			continue
		}
		subs = append(subs, sb)
	}
	return subs
}

// watch subscribes rooms from the event after the last one the client saw,
// as WatchRoom with history.
func (es *engineSession) watch(base context.Context, reply *pb.EngineReply, o *pb.EngineWatch) []*engineSub {
	var subs []*engineSub
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
		sb, err := es.subscribe(base, wr.GetRoom(), o.GetEvents(), wr.GetAfter(), true)
		es.answer(base, res, "watch", err)
		if err == nil {
			subs = append(subs, sb)
		}
	}
	return subs
}

// subscribed reports whether room is subscribed on the stream, and how
// many rooms are.
func (es *engineSession) subscribed(room uint64) (bool, int) {
	es.mu.Lock()
	defer es.mu.Unlock()
	_, ok := es.subs[room]
	return ok, len(es.subs)
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

// answer records a room's answer from its table op's error (a status):
// the code, the message, a RetryInfo's delay and an ErrorInfo's reason and
// metadata; failures are logged as a failed unary call would be.
func (es *engineSession) answer(ctx context.Context, res *pb.EngineResult, op string, err error) {
	if err == nil {
		es.count(op, codes.OK) // res is OK as made
		return
	}
	st := status.Convert(err)
	res.Code, res.Message = int32(st.Code()), st.Message()
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			res.RetryAfter = d.GetRetryDelay()
		case *errdetails.ErrorInfo: // a held page's PAGE_HELD, as the unary RPC carries it
			res.Reason, res.Metadata = d.GetReason(), d.GetMetadata()
		}
	}
	es.count(op, st.Code())
	es.t.LogFailed(ctx, es.t.EngineSession.Method()+"/"+op, "bidi_stream", es.opStart, err)
}

func (es *engineSession) count(op string, code codes.Code) {
	if m := es.h.cfg.Engine; m != nil {
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
	return es.h.cfg.Propagator.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
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
	case *pb.EngineRequest_Declare:
		return "declare"
	case *pb.EngineRequest_Capacity:
		return "capacity"
	}
	return "protocol"
}
