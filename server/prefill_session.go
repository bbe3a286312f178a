package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The prefill session (prefill_session.proto): one bidirectional stream per
// prefill rank carrying its claims, chunks, reports and acknowledgements.
// It is a second transport over the same state machine: every op is
// validated with its unary request's Validate, checked for its incarnation
// with checkIncarnation, and handled by the unary handler (roomsService) or
// the Manager call the unary handler makes (AwaitDestination). The stream
// interceptor still authenticates the stream and counts its messages; a
// PrefillRequest has no Validate method, so the interceptor's validation
// never ends a session over one bad op (the handler answers it instead).

// SessionQueue bounds a session's outgoing queue (results and room
// events); a client that lets it fill is cut RESOURCE_EXHAUSTED "slow
// consumer".
const SessionQueue = 4096

// sessionChunks bounds the chunks in flight on one session (each waits for
// its transfer in its own goroutine).
const sessionChunks = SessionQueue

// PrefillSessionMetrics counts the ops of prefill sessions by op ("hello",
// "ping", "claim", "chunk", "report", "ack") and result code
// (metrics.Metrics: decodeplane_prefill_session_ops_total); nil counts
// nothing.
type PrefillSessionMetrics interface {
	PrefillSessionOp(op string, code codes.Code)
}

type prefillSessionService struct {
	pb.UnimplementedPrefillSessionServer
	s     *Server
	rooms *roomsService
	reg   Registrar
}

var _ pb.PrefillSessionServer = (*prefillSessionService)(nil)

// sessionItem is one queued message and what to do once it was sent.
type sessionItem struct {
	ev    *pb.PrefillEvent
	after func()
}

// sessionClaim is a claim of the session and its pump.
type sessionClaim struct {
	c *kvmanager.Claim
	// pumped is closed when the pump returned: the claim's end is queued
	// (or the session ended).
	pumped chan struct{}
}

// session is one stream's state.
type session struct {
	h        *prefillSessionService
	stream   grpc.BidiStreamingServer[pb.PrefillRequest, pb.PrefillEvent]
	ctx      context.Context
	cancel   context.CancelCauseFunc
	rank     *pb.PrefillRank
	instance string
	queue    chan sessionItem
	// pack: the client reads packed events (negotiatePack).
	pack bool
	// violated: a protocol violation ends the session; nothing more is
	// queued, what is queued is sent first.
	violated atomic.Bool
	chunks   chan struct{} // semaphore of chunks in flight

	seq      uint64
	lastBeat time.Time
	interval time.Duration

	pumps sync.WaitGroup // claim pumps and chunk goroutines

	mu     sync.Mutex
	claims map[uint64]*sessionClaim
}

func (h *prefillSessionService) Session(stream grpc.BidiStreamingServer[pb.PrefillRequest, pb.PrefillEvent]) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	ss := &session{h: h, stream: stream, ctx: ctx, cancel: cancel, queue: make(chan sessionItem, SessionQueue),
		chunks: make(chan struct{}, sessionChunks), claims: map[uint64]*sessionClaim{}}
	ss.pack = negotiatePack(stream)
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := ss.hello(first); err != nil {
		h.count("hello", err)
		return err
	}
	h.count("hello", nil)

	// Messages received, from a goroutine of their own so that shutdown
	// and a cut consumer end the handler while Recv blocks.
	recv := make(chan *pb.PrefillRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	flush := make(chan struct{})
	sent := make(chan struct{})
	go ss.send(flush, sent)
	defer ss.closeClaims()
	// On every end but shutdown the handler returns without waiting for
	// the sender, which may be blocked on a client that does not read: the
	// stream's end unblocks it.
	for {
		select {
		case m := <-recv:
			if err := ss.handleAll(m); err != nil {
				// A protocol violation: the results of the ops before it
				// (queued) are sent first, then the stream ends with it.
				ss.violated.Store(true)
				close(flush)
				<-sent
				cancel(err)
				ss.pumps.Wait()
				return err
			}
		case err := <-recvErr:
			cancel(nil)
			ss.pumps.Wait()
			if errors.Is(err, io.EOF) {
				return nil // the client closed its side
			}
			return err
		case <-ctx.Done():
			ss.pumps.Wait()
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return contextStatus(stream.Context().Err())
		case <-h.s.stopCtx.Done():
			// Shutdown: every claim's room ended (beforeStop) and its
			// pump forwards the end; send what is queued, then end OK.
			ss.pumps.Wait()
			close(flush)
			<-sent
			if err := context.Cause(ctx); err != nil {
				return err
			}
			return nil
		}
	}
}

// count records one op's result.
func (h *prefillSessionService) count(op string, err error) {
	if h.s.deps.PrefillSessions != nil {
		h.s.deps.PrefillSessions.PrefillSessionOp(op, status.Code(err))
	}
}

// hello checks the first message and records the rank's heartbeat.
func (ss *session) hello(m *pb.PrefillRequest) error {
	hello := m.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "hello: the first message of a session must be hello")
	}
	if m.GetSeq() != 0 {
		return status.Errorf(codes.InvalidArgument, "seq: hello carries seq 0, got %d", m.GetSeq())
	}
	if len(m.GetMore()) > 0 {
		return status.Error(codes.InvalidArgument, "more: the hello is sent alone (no more)")
	}
	if err := errors.Join(m.CheckEnvelope(), hello.Validate()); err != nil {
		return status.Error(codes.InvalidArgument, pb.PrefixFields("hello.", err).Error())
	}
	if err := ss.h.s.checkIncarnation(pb.PrefillSession_Session_FullMethodName, hello); err != nil {
		return err
	}
	ss.rank, ss.instance = hello.GetRank(), hello.GetInstanceId()
	iv, mf, err := ss.h.reg.Heartbeat(ss.ctx, rankFromProto(ss.rank), ss.instance)
	if err != nil {
		return toStatus(ss.ctx, ss.h.s.log, err)
	}
	ss.lastBeat, ss.interval = time.Now(), iv
	return ss.stream.Send(&pb.PrefillEvent{Event: &pb.PrefillEvent_Welcome{Welcome: &pb.PrefillWelcome{
		Incarnation: ss.h.s.deps.Incarnation, HeartbeatInterval: durationpb.New(iv),
		HeartbeatMaxFailures: uint32(mf), MaxQueued: SessionQueue,
	}}})
}

// beat records a heartbeat when a quarter interval passed since the last.
func (ss *session) beat() error {
	if time.Since(ss.lastBeat) < ss.interval/4 {
		return nil
	}
	iv, _, err := ss.h.reg.Heartbeat(ss.ctx, rankFromProto(ss.rank), ss.instance)
	if err != nil {
		return toStatus(ss.ctx, ss.h.s.log, err)
	}
	ss.lastBeat, ss.interval = time.Now(), iv
	return nil
}

// handleAll runs a message and the messages packed in its more, in order;
// an error ends the stream.
func (ss *session) handleAll(m *pb.PrefillRequest) error {
	if err := m.CheckBatch(); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	more := m.More
	m.More = nil
	if err := ss.handle(m); err != nil {
		return err
	}
	for _, x := range more {
		if err := ss.handle(x); err != nil {
			return err
		}
	}
	return nil
}

// handle runs one message after hello; an error ends the stream.
func (ss *session) handle(m *pb.PrefillRequest) error {
	if err := ss.beat(); err != nil {
		return err
	}
	switch m.GetOp().(type) {
	case *pb.PrefillRequest_Hello:
		return status.Error(codes.InvalidArgument, "hello: a session has one hello, the first message")
	case *pb.PrefillRequest_Ping:
		ss.h.count("ping", nil)
		ss.push(sessionItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Pong{Pong: &pb.PrefillPong{}}}})
		return nil
	}
	seq := m.GetSeq()
	if seq == 0 || seq <= ss.seq {
		return status.Errorf(codes.InvalidArgument, "seq: %d must be > 0 and above the previous op's %d", seq, ss.seq)
	}
	if seq <= math.MaxInt64 { // a seq out of its bound (CheckEnvelope refuses it) does not move the sequence
		ss.seq = seq
	}
	if err := m.CheckEnvelope(); err != nil {
		ss.result(seq, prefillOpName(m), status.Error(codes.InvalidArgument, err.Error()), nil)
		return nil
	}
	ctx := ss.opContext(m)
	switch op := m.GetOp().(type) {
	case *pb.PrefillRequest_Claim:
		ss.claim(ctx, seq, op.Claim)
	case *pb.PrefillRequest_Chunk:
		ss.chunk(ctx, seq, op.Chunk)
	case *pb.PrefillRequest_Report:
		req := op.Report
		ctx, end := ss.span(ctx, "report")
		defer end() // on a panic too (a second End is a no-op); ended before the result otherwise
		if err := ss.check("report", pb.Rooms_ReportTransfer_FullMethodName, &req.Rank, req); err != nil {
			end()
			ss.result(seq, "report", err, nil)
			return nil
		}
		resp, err := ss.h.rooms.ReportTransfer(ctx, req)
		end()
		ss.result(seq, "report", prefixInvalid("report.", err), func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Report{Report: resp} })
	case *pb.PrefillRequest_Ack:
		req := op.Ack
		ctx, end := ss.span(ctx, "ack")
		defer end() // on a panic too (a second End is a no-op); ended before the result otherwise
		if err := ss.check("ack", pb.Rooms_AckRoomEnd_FullMethodName, &req.Rank, req); err != nil {
			end()
			ss.result(seq, "ack", err, nil)
			return nil
		}
		resp, err := ss.h.rooms.AckRoomEnd(ctx, req)
		end()
		ss.result(seq, "ack", prefixInvalid("ack.", err), func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Ack{Ack: resp} })
	default:
		ss.result(seq, "unknown", status.Error(codes.InvalidArgument, "op: is required (claim, chunk, report, ack or ping)"), nil)
	}
	return nil
}

// opContext is the session's context with the message's trace context.
func (ss *session) opContext(m *pb.PrefillRequest) context.Context {
	if m.GetTraceparent() == "" || len(m.GetTraceparent()) > pb.MaxPrefillTraceparentLen || len(m.GetTracestate()) > pb.MaxPrefillTracestateLen {
		return ss.ctx
	}
	c := propagation.MapCarrier{"traceparent": m.GetTraceparent()}
	if ts := m.GetTracestate(); ts != "" {
		c["tracestate"] = ts
	}
	return ss.h.s.deps.Propagator.Extract(ss.ctx, c)
}

// prefillOpSpanPrefix names a session op's span as otelgrpc names a unary
// call's ("decodeplane.v1.Rooms/Transfer"): the method without its leading
// slash, then the op: "decodeplane.v1.PrefillSession/Session/chunk".
var prefillOpSpanPrefix = strings.TrimPrefix(pb.PrefillSession_Session_FullMethodName, "/") + "/"

// span starts the op's span (with tracing on) in the message's trace.
func (ss *session) span(ctx context.Context, op string) (context.Context, func()) {
	if !ss.h.s.tracing {
		return ctx, func() {}
	}
	ctx, sp := ss.h.s.deps.TracerProvider.Tracer("github.com/decodeplane/decodeplane/server").Start(ctx,
		prefillOpSpanPrefix+op, trace.WithSpanKind(trace.SpanKindServer))
	return ctx, func() { sp.End() }
}

// check is what the interceptor does to a unary request, for an op: the
// rank (unset: the session's), the request's Validate (field names
// prefixed with the op) and the incarnation check.
func (ss *session) check(op, method string, rank **pb.PrefillRank, req any) error {
	if *rank == nil {
		*rank = ss.rank
	} else if !proto.Equal(*rank, ss.rank) {
		return status.Errorf(codes.InvalidArgument, "%s.rank: must be the session's rank (%s) or unset", op, rankText(ss.rank))
	}
	if err := validateMessage(req); err != nil {
		return status.Error(codes.InvalidArgument, pb.PrefixFields(op+".", errors.New(status.Convert(err).Message())).Error())
	}
	return ss.h.s.checkIncarnation(method, req)
}

// claim is AwaitDestination on the session.
func (ss *session) claim(ctx context.Context, seq uint64, req *pb.AwaitDestinationRequest) {
	ctx, end := ss.span(ctx, "claim")
	defer end() // on a panic too (a second End is a no-op); ended before the result otherwise
	if err := ss.check("claim", pb.Rooms_AwaitDestination_FullMethodName, &req.Rank, req); err != nil {
		end()
		ss.result(seq, "claim", err, nil)
		return
	}
	room := req.GetRoom()
	// A second claim of a room supersedes the first, as a second
	// AwaitDestination does: the manager ends the first one (its pump
	// sends that end, under the first claim's seq) and delivers to this one.
	c, err := ss.h.rooms.m.AwaitDestination(room, rankFromProto(req.GetRank()))
	if err != nil {
		end()
		ss.result(seq, "claim", prefixInvalid("claim.", ss.h.rooms.err(ctx, err)), nil)
		return
	}
	sc := &sessionClaim{c: c, pumped: make(chan struct{})}
	ss.mu.Lock()
	prev := ss.claims[room] // superseded by c: its end comes first
	ss.claims[room] = sc
	ss.mu.Unlock()
	end()
	ss.result(seq, "claim", nil, func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Claim{Claim: &pb.PrefillClaimed{Room: room}} })
	ss.pumps.Add(1)
	go ss.pump(seq, room, sc, prev)
}

// pump forwards one claim's events to the session's queue, in order. The
// destination counts as delivered once sent (as AwaitDestination's);
// the claim is closed once its end was sent, or when the session ends.
//
// A claim that superseded an earlier claim of the session on the same room
// (prev) forwards nothing before prev's end was queued: the room's events
// on the session keep their order (the first claim's "superseded" end,
// then the second's destination). prev's end is already decided (the
// manager ended it when this claim attached, or ends it when the room
// opens and attaches both in order), so the wait is short.
func (ss *session) pump(seq, room uint64, sc, prev *sessionClaim) {
	defer ss.pumps.Done()
	defer close(sc.pumped)
	c := sc.c
	if prev != nil {
		select {
		case <-prev.pumped:
		case <-ss.ctx.Done():
			return
		}
	}
	inc := ss.h.s.deps.Incarnation
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return
			}
			it := sessionItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Room{Room: &pb.PrefillRoomEvent{
				Room: room, ClaimSeq: seq, Event: destinationEventToProto(ev, inc)}}}}
			terminal := ev.Failure != nil || ev.Done != nil
			switch {
			case ev.Destination != nil:
				d := ev.Destination
				it.after = func() { c.Delivered(d) }
			case terminal:
				it.after = func() { ss.endClaim(room, sc) }
			}
			ss.push(it)
			if terminal {
				return
			}
		case <-ss.ctx.Done():
			return
		}
	}
}

// endClaim closes a claim whose end was sent and forgets it.
func (ss *session) endClaim(room uint64, sc *sessionClaim) {
	ss.mu.Lock()
	if ss.claims[room] == sc {
		delete(ss.claims, room)
	}
	ss.mu.Unlock()
	sc.c.Close()
}

// closeClaims closes every claim still open when the session ends: as for
// a dropped AwaitDestination stream, a delivered destination stays claimed.
func (ss *session) closeClaims() {
	ss.mu.Lock()
	cs := ss.claims
	ss.claims = map[uint64]*sessionClaim{}
	ss.mu.Unlock()
	for _, sc := range cs {
		sc.c.Close()
	}
}

// chunk is Transfer on the session. The chunk is registered with its room
// here, on the receiving goroutine, in the order the ops arrive (a last
// chunk is checked against the chunks before it, landed or in flight);
// its transfer runs without a goroutine of the session's, and its result
// is queued when it lands, so that one session moves many chunks at once.
func (ss *session) chunk(ctx context.Context, seq uint64, req *pb.TransferRequest) {
	if err := ss.check("chunk", pb.Rooms_Transfer_FullMethodName, &req.Rank, req); err != nil {
		ss.result(seq, "chunk", err, nil)
		return
	}
	select {
	case ss.chunks <- struct{}{}:
	default:
		ss.result(seq, "chunk", status.Errorf(codes.ResourceExhausted, "chunk: %d chunks already in flight on this session", sessionChunks), nil)
		return
	}
	ss.pumps.Add(1)
	ctx, end := ss.span(ctx, "chunk")
	landed := func(resp *pb.TransferResponse, err error) {
		defer ss.pumps.Done()
		defer func() { <-ss.chunks }()
		defer func() {
			if p := recover(); p != nil {
				end()
				ss.result(seq, "chunk", ss.h.s.recoverPanic(ctx, p), nil)
			}
		}()
		end()
		ss.result(seq, "chunk", prefixInvalid("chunk.", err), func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Chunk{Chunk: resp} })
	}
	ss.h.rooms.transferAsync(ctx, req, landed)
}

// result queues an op's result: err's status, or set's answer.
func (ss *session) result(seq uint64, op string, err error, set func(*pb.PrefillResult)) {
	ss.h.count(op, err)
	r := &pb.PrefillResult{Seq: seq}
	if err != nil {
		r.Error = prefillError(err)
	} else if set != nil {
		set(r)
	}
	ss.push(sessionItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Result{Result: r}}})
}

// prefillEventSize is a message's size for the packing budget: a
// destination (which grows with the room's pages) or a failure measured,
// anything else bounded from above.
func prefillEventSize(ev *pb.PrefillEvent) int {
	if re := ev.GetRoom().GetEvent(); re.GetDestination() != nil || re.GetFailure() != nil {
		return proto.Size(ev)
	}
	if r := ev.GetResult(); r != nil && r.GetError() != nil {
		return proto.Size(ev) // an error's message and metadata
	}
	return prefillEventSizeBound
}

// prefillEventSizeBound bounds from above the size of a session message
// that carries no destination and no error.
const prefillEventSizeBound = 1 << 10

// errSlowConsumer ends a session whose queue filled.
var errSlowConsumer = status.Errorf(codes.ResourceExhausted,
	"slow consumer: the session's queue of %d messages is full; its claims stand as after a dropped AwaitDestination stream, reconnect and claim again", SessionQueue)

// push queues a message without blocking; a full queue cuts the session.
func (ss *session) push(it sessionItem) {
	if ss.ctx.Err() != nil || ss.violated.Load() {
		return
	}
	select {
	case ss.queue <- it:
	default:
		ss.cancel(errSlowConsumer)
	}
}

// send is the session's one sender: it sends the queue in order until the
// session ends, or, after flush, until the queue is empty.
func (ss *session) send(flush <-chan struct{}, sent chan<- struct{}) {
	defer close(sent)
	// out sends it and whatever else is queued as one message
	// (PrefillEvent.more: at most MaxPrefillEventsPerMessage and about
	// MaxSessionMessageBytes), then runs their afters in order; an item
	// taken beyond the budget starts the next message.
	limit := 1 // for a client that does not read packed events
	if ss.pack {
		limit = pb.MaxPrefillEventsPerMessage
	}
	batch := make([]sessionItem, 0, limit)
	out := func(it sessionItem) bool {
		for {
			batch = append(batch[:0], it)
			bytes := prefillEventSize(it.ev)
			var carry *sessionItem
		fill:
			for len(batch) < limit {
				select {
				case next := <-ss.queue:
					b := prefillEventSize(next.ev)
					if bytes+b > pb.MaxSessionMessageBytes {
						carry = &next
						break fill
					}
					batch, bytes = append(batch, next), bytes+b
				default:
					break fill
				}
			}
			ev := it.ev
			if len(batch) > 1 {
				ev.More = make([]*pb.PrefillEvent, len(batch)-1)
				for i, b := range batch[1:] {
					ev.More[i] = b.ev
				}
			}
			if err := ss.stream.Send(ev); err != nil {
				ss.cancel(err)
				return false
			}
			for _, b := range batch {
				if b.after != nil {
					b.after()
				}
			}
			clear(batch)
			if carry == nil {
				return true
			}
			it = *carry
		}
	}
	for {
		select {
		case it := <-ss.queue:
			if !out(it) {
				return
			}
		case <-ss.ctx.Done():
			return
		case <-flush:
			for {
				select {
				case it := <-ss.queue:
					if !out(it) {
						return
					}
				default:
					return
				}
			}
		}
	}
}

// prefillError is an op's refusal: its code, message and ErrorInfo.
func prefillError(err error) *pb.PrefillError {
	st := status.Convert(err)
	e := &pb.PrefillError{Code: uint32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			e.Reason, e.Metadata = info.GetReason(), info.GetMetadata()
		}
	}
	return e
}

// prefillOpName is a message's op, as the metrics label it.
func prefillOpName(m *pb.PrefillRequest) string {
	switch m.GetOp().(type) {
	case *pb.PrefillRequest_Claim:
		return "claim"
	case *pb.PrefillRequest_Chunk:
		return "chunk"
	case *pb.PrefillRequest_Report:
		return "report"
	case *pb.PrefillRequest_Ack:
		return "ack"
	}
	return "unknown"
}

func rankText(r *pb.PrefillRank) string {
	return fmt.Sprintf("%s dp %d cp %d tp %d pp %d", r.GetBootstrapAddr(), r.GetDpRank(), r.GetCpRank(), r.GetTpRank(), r.GetPpRank())
}
