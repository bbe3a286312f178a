package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/internal/ops"
)

// The prefill session (prefill_session.proto): one bidirectional stream per
// prefill rank carrying its claims, chunks, reports and acknowledgements,
// over the table's AwaitDestination, Transfer, ReportTransfer, AckRoomEnd
// and Heartbeat. A PrefillRequest has no Validate method, so the
// interceptor never ends a session over one bad op: the op's result says
// what is wrong.

// Queue bounds a session's outgoing queue (results and room events); a
// client that lets it fill is cut RESOURCE_EXHAUSTED "slow consumer".
const Queue = 4096

// maxChunks bounds the chunks in flight on one session.
const maxChunks = Queue

// PrefillMetrics counts the ops of prefill sessions by op ("hello",
// "ping", "claim", "chunk", "report", "ack") and result code
// (metrics.Metrics: decodeplane_prefill_session_ops_total).
type PrefillMetrics interface {
	PrefillSessionOp(op string, code codes.Code)
}

// Prefill is PrefillSession.Session.
type Prefill struct {
	pb.UnimplementedPrefillSessionServer
	cfg Config
	t   *ops.Table
}

var _ pb.PrefillSessionServer = (*Prefill)(nil)

// NewPrefill serves PrefillSession over cfg.Ops.
func NewPrefill(cfg Config) *Prefill { return &Prefill{cfg: cfg, t: cfg.Ops} }

// prefillItem is one queued message and what to do once it was sent.
type prefillItem struct {
	ev    *pb.PrefillEvent
	after func()
}

// prefillSession is one stream's state.
type prefillSession struct {
	h      *Prefill
	t      *ops.Table
	stream grpc.BidiStreamingServer[pb.PrefillRequest, pb.PrefillEvent]
	ctx    context.Context
	cancel context.CancelCauseFunc
	// pack: the client reads packed events (negotiatePack).
	pack bool

	// The receiving goroutine's alone.
	rank     *pb.PrefillRank
	instance string
	seq      uint64
	lastBeat time.Time
	interval time.Duration

	// recvDone is closed when the receiving goroutine stops, with recvErr
	// (the stream's Recv error) or violation (a protocol violation, or a
	// refused heartbeat) set.
	recvDone  chan struct{}
	recvErr   error
	violation error
	// flush asks the sender to send what is queued and stop; sent is
	// closed when the sender stopped.
	flush chan struct{}
	sent  chan struct{}
	// chunks counts the chunks in flight; idle is signalled when it drops
	// to 0.
	chunks atomic.Int64
	idle   chan struct{}
	wake   chan struct{} // the sender's signal: something queued

	mu sync.Mutex
	// queue is what the sender sends next, at most Queue messages.
	queue []prefillItem
	// closed: nothing more is queued (the stream ended, or a violation
	// stops it after what is queued).
	closed bool
	claims map[uint64]*prefillClaim
	// offers are the claims the room manager made for the session
	// (hello.offers), by room; scanning: the hello's offers are being
	// queued, burst: how many of them are still queued (neither counts
	// toward the queue's bound).
	offers   map[uint64]*prefillClaim
	scanning bool
	burst    int
	// stopOffers ends the session's subscription to its rank's rooms
	// (hello.offers; prefill_offers.go); nil without one.
	stopOffers func()
}

// Session serves one stream: one goroutine receives and runs the ops, one
// sends (package comment), and this one decides when the stream ends. On
// every end but a violation and shutdown it returns without waiting for
// the sender, which may be blocked on a client that does not read: the
// stream's end unblocks it.
func (h *Prefill) Session(stream grpc.BidiStreamingServer[pb.PrefillRequest, pb.PrefillEvent]) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	ss := &prefillSession{h: h, t: h.t, stream: stream, ctx: ctx, cancel: cancel, recvDone: make(chan struct{}),
		flush: make(chan struct{}), sent: make(chan struct{}),
		idle: make(chan struct{}, 1), wake: make(chan struct{}, 1), claims: map[uint64]*prefillClaim{},
		offers: map[uint64]*prefillClaim{}}
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
	go ss.receive()
	go ss.send()
	err = ss.wait()
	ss.close()
	return err
}

// count records one op's result.
func (h *Prefill) count(op string, err error) {
	if h.cfg.Prefill != nil {
		h.cfg.Prefill.PrefillSessionOp(op, status.Code(err))
	}
}

// hello checks the first message and records the rank's heartbeat.
func (ss *prefillSession) hello(m *pb.PrefillRequest) error {
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
	if err := ss.t.PrefillSession.CheckIncarnation(hello); err != nil {
		return err
	}
	ss.rank, ss.instance = hello.GetRank(), hello.GetInstanceId()
	hb, err := ss.heartbeat()
	if err != nil {
		return err
	}
	if err := ss.stream.Send(&pb.PrefillEvent{Event: &pb.PrefillEvent_Welcome{Welcome: &pb.PrefillWelcome{
		Incarnation: ss.t.Incarnation(), HeartbeatInterval: durationpb.New(ss.interval),
		HeartbeatMaxFailures: hb.GetMaxFailures(), MaxQueued: Queue, Offers: hello.GetOffers(),
	}}}); err != nil {
		return err
	}
	if hello.GetOffers() {
		ss.subscribe() // prefill_offers.go: queued before anything else
	}
	return nil
}

// heartbeat is the table's Heartbeat for the session's rank.
func (ss *prefillSession) heartbeat() (*pb.HeartbeatResponse, error) {
	hb, err := ss.t.Heartbeat.Call(ss.ctx, &pb.HeartbeatRequest{Rank: ss.rank, InstanceId: ss.instance})
	if err != nil {
		return nil, err
	}
	ss.lastBeat, ss.interval = time.Now(), hb.GetInterval().AsDuration()
	return hb, nil
}

// beat records a heartbeat when a quarter interval passed since the last.
func (ss *prefillSession) beat() error {
	if time.Since(ss.lastBeat) < ss.interval/4 {
		return nil
	}
	_, err := ss.heartbeat()
	return err
}

// receive reads the messages and runs their ops in order until the stream
// ends or a violation ends it.
func (ss *prefillSession) receive() {
	defer close(ss.recvDone)
	for {
		m, err := ss.stream.Recv()
		if err != nil {
			ss.recvErr = err
			return
		}
		if ss.ctx.Err() != nil {
			return // the session was cut: nothing more runs
		}
		if err := ss.handleAll(m); err != nil {
			// A protocol violation: nothing more is queued; the results of
			// the ops before it (queued) are sent first.
			ss.mu.Lock()
			ss.closed = true
			ss.mu.Unlock()
			ss.violation = err
			return
		}
	}
}

// handleAll runs a message and the messages packed in its more, in order;
// an error ends the stream.
func (ss *prefillSession) handleAll(m *pb.PrefillRequest) error {
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
func (ss *prefillSession) handle(m *pb.PrefillRequest) error {
	if err := ss.beat(); err != nil {
		return err
	}
	switch m.GetOp().(type) {
	case *pb.PrefillRequest_Hello:
		return status.Error(codes.InvalidArgument, "hello: a session has one hello, the first message")
	case *pb.PrefillRequest_Ping:
		ss.h.count("ping", nil)
		ss.push(prefillItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Pong{Pong: &pb.PrefillPong{}}}})
		return nil
	}
	seq := m.GetSeq()
	if seq == 0 || seq <= ss.seq {
		return status.Errorf(codes.InvalidArgument, "seq: %d must be > 0 and above the previous op's %d", seq, ss.seq)
	}
	if seq <= math.MaxInt64 { // a seq out of its bound (CheckEnvelope refuses it) does not move the sequence
		ss.seq = seq
	}
	name := prefillOpName(m)
	if err := m.CheckEnvelope(); err != nil {
		ss.result(seq, name, status.Error(codes.InvalidArgument, err.Error()), nil)
		return nil
	}
	ss.run(ss.opContext(m), seq, name, m)
	return nil
}

// run runs one op; a panic is the op's INTERNAL result (its span, when
// started, ended: a second End is a no-op).
func (ss *prefillSession) run(ctx context.Context, seq uint64, name string, m *pb.PrefillRequest) {
	end := func() {}
	defer func() {
		if p := recover(); p != nil {
			end()
			ss.result(seq, name, ss.t.Recovered(ctx, p), nil)
		}
	}()
	switch op := m.GetOp().(type) {
	case *pb.PrefillRequest_Claim:
		ctx, end = ss.span(ctx, name)
		ss.claim(ctx, seq, op.Claim, end)
	case *pb.PrefillRequest_Chunk:
		ss.chunk(ctx, seq, op.Chunk, &end)
	case *pb.PrefillRequest_Report:
		ctx, end = ss.span(ctx, name)
		req := op.Report
		resp, err := runUnary(ss, ctx, &ss.t.ReportTransfer, name, &req.Rank, req)
		end()
		ss.result(seq, name, err, func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Report{Report: resp} })
	case *pb.PrefillRequest_Ack:
		ctx, end = ss.span(ctx, name)
		req := op.Ack
		resp, err := runUnary(ss, ctx, &ss.t.AckRoomEnd, name, &req.Rank, req)
		end()
		ss.result(seq, name, err, func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Ack{Ack: resp} })
	default:
		ss.result(seq, name, status.Error(codes.InvalidArgument, "op: is required (claim, chunk, report, ack or ping)"), nil)
	}
}

// runUnary is a unary op on the session: the rank, the op's checks with
// its name as the fields' prefix, then its call.
func runUnary[Req, Resp any](ss *prefillSession, ctx context.Context, op *ops.Unary[Req, Resp], name string, rank **pb.PrefillRank, req *Req) (*Resp, error) {
	if err := ss.check(name, op, rank, req); err != nil {
		return nil, err
	}
	resp, err := op.Call(ctx, req)
	return resp, prefixInvalid(name+".", err)
}

// checker is a table op's check for a session op (ops.Unary, ops.Stream).
type checker interface {
	CheckAs(prefix string, req any) error
}

// check is an op's rank (unset: the session's) and its table op's checks,
// the fields prefixed with the op's name.
func (ss *prefillSession) check(name string, op checker, rank **pb.PrefillRank, req any) error {
	if *rank == nil {
		*rank = ss.rank
	} else if !proto.Equal(*rank, ss.rank) {
		return status.Errorf(codes.InvalidArgument, "%s.rank: must be the session's rank (%s) or unset", name, rankText(ss.rank))
	}
	return op.CheckAs(name+".", req)
}

// opContext is the session's context with the message's trace context.
func (ss *prefillSession) opContext(m *pb.PrefillRequest) context.Context {
	if m.GetTraceparent() == "" || len(m.GetTraceparent()) > pb.MaxPrefillTraceparentLen || len(m.GetTracestate()) > pb.MaxPrefillTracestateLen {
		return ss.ctx
	}
	c := propagation.MapCarrier{"traceparent": m.GetTraceparent()}
	if ts := m.GetTracestate(); ts != "" {
		c["tracestate"] = ts
	}
	return ss.h.cfg.Propagator.Extract(ss.ctx, c)
}

// span starts the op's span (with tracing on) in the message's trace,
// named as otelgrpc names a unary call's: the session's method, then the
// op ("decodeplane.v1.PrefillSession/Session/chunk"). The returned end may
// be called more than once.
func (ss *prefillSession) span(ctx context.Context, op string) (context.Context, func()) {
	tr := ss.h.cfg.Tracer
	if tr == nil {
		return ctx, func() {}
	}
	ctx, sp := tr.Start(ctx, ss.t.PrefillSession.SpanName()+"/"+op, trace.WithSpanKind(trace.SpanKindServer))
	return ctx, func() { sp.End() }
}

// result queues an op's result: err's status, or set's answer.
func (ss *prefillSession) result(seq uint64, op string, err error, set func(*pb.PrefillResult)) {
	ss.h.count(op, err)
	r := &pb.PrefillResult{Seq: seq}
	if err != nil {
		r.Error = prefillError(err)
	} else if set != nil {
		set(r)
	}
	ss.push(prefillItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Result{Result: r}}})
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

// prefillClaim is a claim of the session. Its room's events (the claim
// sink, called by the room manager under a lock) wait in pending until
// the claim's result is queued, then go to the queue as they come.
type prefillClaim struct {
	ss    *prefillSession
	room  uint64
	seq   uint64
	c     *kvmanager.Claim // set under ss.mu once the claim is made
	ready bool
	// pending are the events before the claim's result (a refusal at
	// once, or a superseded claim's end, are among them).
	pending []prefillItem
}

// claim is AwaitDestination on the session: the claim's result, then its
// room's events, in order.
func (ss *prefillSession) claim(ctx context.Context, seq uint64, req *pb.AwaitDestinationRequest, end func()) {
	if err := ss.check("claim", &ss.t.AwaitDestination, &req.Rank, req); err != nil {
		end()
		ss.result(seq, "claim", err, nil)
		return
	}
	room := req.GetRoom()
	sc := &prefillClaim{ss: ss, room: room, seq: seq}
	// A second claim of a room supersedes the first, as a second
	// AwaitDestination does: the room manager ends the first one (its end
	// is queued now, under its seq) and delivers to this one.
	c, err := ss.t.AwaitDestinationFunc(ctx, req, sc.event)
	end()
	if err != nil {
		ss.result(seq, "claim", prefixInvalid("claim.", err), nil)
		return
	}
	ss.h.count("claim", nil)
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		c.Close()
		return
	}
	sc.c = c
	ss.claims[room] = sc
	res := &pb.PrefillResult{Seq: seq, Result: &pb.PrefillResult_Claim{Claim: &pb.PrefillClaimed{Room: room}}}
	ss.pushLocked(prefillItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Result{Result: res}}})
	for _, it := range sc.pending {
		ss.pushLocked(it)
	}
	sc.pending, sc.ready = nil, true
	ss.mu.Unlock()
}

// event is the claim's kvmanager.ClaimSink: the destination counts as
// delivered once sent (as AwaitDestination's); the claim is closed once
// its end was sent, or when the session ends.
func (sc *prefillClaim) event(ev kvmanager.DestinationEvent) {
	ss := sc.ss
	it := prefillItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Room{Room: &pb.PrefillRoomEvent{
		Room: sc.room, ClaimSeq: sc.seq, Event: ss.t.DestinationEventProto(ev)}}}}
	switch {
	case ev.Destination != nil:
		d := ev.Destination
		it.after = func() { sc.c.Delivered(d) }
	case ev.Failure != nil || ev.Done != nil:
		it.after = func() { ss.endClaim(sc) }
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !sc.ready {
		sc.pending = append(sc.pending, it)
		return
	}
	ss.pushLocked(it)
}

// endClaim closes a claim whose end was sent and forgets it.
func (ss *prefillSession) endClaim(sc *prefillClaim) {
	ss.mu.Lock()
	cs := ss.claims
	if sc.seq == 0 {
		cs = ss.offers
	}
	if cs[sc.room] == sc {
		delete(cs, sc.room)
	}
	ss.mu.Unlock()
	sc.c.Close()
}

// chunk is Transfer on the session. The chunk is checked and registered
// with its room here, on the receiving goroutine, in the order the ops
// arrive (a last chunk is checked against the chunks before it, landed or
// in flight); its transfer runs without a goroutine of the session's, and
// its result is queued when it lands, so that one session moves many
// chunks at once.
func (ss *prefillSession) chunk(ctx context.Context, seq uint64, req *pb.TransferRequest, end *func()) {
	if err := ss.check("chunk", &ss.t.Transfer, &req.Rank, req); err != nil {
		ss.result(seq, "chunk", err, nil)
		return
	}
	if ss.chunks.Load() >= maxChunks {
		ss.result(seq, "chunk", status.Errorf(codes.ResourceExhausted, "chunk: %d chunks already in flight on this session", maxChunks), nil)
		return
	}
	ctx, *end = ss.span(ctx, "chunk")
	landed := *end
	ss.chunks.Add(1)
	var once sync.Once
	release := func() {
		once.Do(func() {
			if ss.chunks.Add(-1) == 0 {
				signal(ss.idle)
			}
		})
	}
	defer func() {
		if p := recover(); p != nil {
			release() // the chunk is not in flight: its result is the panic's (run)
			panic(p)
		}
	}()
	ss.t.TransferAsync(ctx, req, func(resp *pb.TransferResponse, err error) {
		defer release()
		defer func() {
			if p := recover(); p != nil {
				ss.result(seq, "chunk", ss.t.Recovered(ctx, p), nil)
			}
		}()
		landed()
		ss.result(seq, "chunk", prefixInvalid("chunk.", err), func(r *pb.PrefillResult) { r.Result = &pb.PrefillResult_Chunk{Chunk: resp} })
	})
}

// close ends the session's claims and stops its queue: as for a dropped
// AwaitDestination stream, a delivered destination stays claimed.
func (ss *prefillSession) close() {
	if ss.stopOffers != nil {
		ss.stopOffers() // no claim is offered to the session any more
	}
	ss.mu.Lock()
	ss.closed = true
	cs, offers := ss.claims, ss.offers
	ss.claims, ss.offers = map[uint64]*prefillClaim{}, map[uint64]*prefillClaim{}
	ss.queue = nil
	ss.mu.Unlock()
	for _, sc := range cs {
		sc.c.Close()
	}
	for _, sc := range offers {
		sc.c.Close()
	}
}

// wait returns the stream's status once it ends.
func (ss *prefillSession) wait() error {
	select {
	case <-ss.ctx.Done():
		return ss.ended()
	case <-ss.recvDone:
		return ss.received()
	case <-ss.h.cfg.Stop.Done():
		return ss.stopping()
	}
}

// ended is why the stream ends when its context did: the cut's cause (a
// slow consumer, a failed send), else the client's cancellation.
func (ss *prefillSession) ended() error {
	if err := context.Cause(ss.ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ops.ContextStatus(ss.stream.Context().Err())
}

// received is how the stream ends when the receiving goroutine stopped:
// the client closed its side (OK at once: what was queued is not sent), a
// receive error, or a violation (after what is queued).
func (ss *prefillSession) received() error {
	switch {
	case ss.violation != nil:
		if !ss.drain() {
			return ss.ended()
		}
		return ss.violation
	case errors.Is(ss.recvErr, io.EOF):
		return nil
	}
	return ss.recvErr
}

// stopping is how the stream ends when the server stops: every claim's
// room ended (Shutdown's beforeStop) and its end is queued; the chunks in
// flight end (their rooms' failure cancels them) and their results are
// queued; all of it is sent, then the stream ends OK.
func (ss *prefillSession) stopping() error {
	for ss.chunks.Load() > 0 {
		select {
		case <-ss.idle:
		case <-ss.ctx.Done():
			return ss.ended()
		}
	}
	if !ss.drain() {
		return ss.ended()
	}
	if err := context.Cause(ss.ctx); err != nil {
		return err
	}
	return nil
}

// drain has the sender send what is queued and waits for it; false when
// the session was cut meanwhile.
func (ss *prefillSession) drain() bool {
	close(ss.flush)
	<-ss.sent
	return ss.ctx.Err() == nil
}
