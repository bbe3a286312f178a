package client

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// prefillSession is a prefill rank's PrefillSession stream: one
// long-lived stream carrying the rank's claims, chunks, reports and
// acknowledgements, which is also the rank's heartbeat (it pings every half
// heartbeat interval). The rank's shared session (prefill_mux.go) is one,
// re-opened by the mux when it ended; a session does not re-open itself:
// once it ended (Err), another one claims again (the daemon re-delivers).
// It is safe for concurrent use. Messages sent while another is being
// written go out packed in its next one (PrefillRequest.more).
type prefillSession struct {
	p       *Prefill
	cancel  context.CancelFunc
	welcome *pb.PrefillWelcome

	// out writes the messages, packing those queued meanwhile
	// (PrefillRequest.more); seq is under its lock.
	out *sendQueue[*pb.PrefillRequest]
	seq uint64

	mu      sync.Mutex
	waiting map[uint64]chan *pb.PrefillResult
	claims  map[uint64]*sessionClaim
	// offered are the claims the daemon made for the session (offers: a
	// FleetPrefill's member), by room (prefill_offers.go).
	offered map[uint64]*sessionClaim
	err     error // the stream's end, once ended
	done    chan struct{}
}

// openSession opens a prefill session of the rank: the rank must be
// registered (Register or RunHeartbeat). The session is the rank's
// heartbeat while it lives. It ends with ctx or Close.
func (p *Prefill) openSession(ctx context.Context) (*prefillSession, error) {
	const op = "PrefillSession"
	if err := p.c.errIfClosed(op); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := p.c.session.Session(withPack(sctx), p.c.callOpts...)
	if err != nil {
		cancel()
		return nil, toError(op, err)
	}
	hello := &pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{
		Rank: p.rank, InstanceId: p.reg.GetInstanceId(), Incarnation: p.Incarnation(), Offers: p.offers != nil}}}
	_ = st.Send(hello) // a failed send: Recv gives the stream's status
	first, err := st.Recv()
	if err != nil {
		cancel()
		return nil, p.voided(p.generation(), 0, toError(op, err))
	}
	w := first.GetWelcome()
	if w == nil {
		cancel()
		return nil, localError(op, codes.Internal, "the daemon's first session message is not a welcome: %v", first)
	}
	p.learn(w.GetIncarnation(), false)
	if iv := w.GetHeartbeatInterval().AsDuration(); iv > 0 {
		p.mu.Lock()
		p.interval = iv
		p.mu.Unlock()
	}
	s := &prefillSession{p: p, cancel: cancel, welcome: w,
		waiting: map[uint64]chan *pb.PrefillResult{}, claims: map[uint64]*sessionClaim{},
		offered: map[uint64]*sessionClaim{}, done: make(chan struct{})}
	// Packed requests only to a daemon that reads them: its header (which
	// came before the welcome) says so.
	perMessage := 1
	if md, err := st.Header(); err == nil && packs(md) {
		perMessage = 1 + pb.MaxPrefillRequestsPerMessage
	}
	s.out = newSendQueue(perMessage, pb.MaxSessionMessageBytes, prefillRequestSize, func(first *pb.PrefillRequest, more []*pb.PrefillRequest) {
		first.More = more
		_ = st.Send(first) // a failed send: read gets the stream's status
	})
	go s.read(st.Recv)
	go s.ping(sctx)
	return s, nil
}

// prefillRequestSize is a message's size for the packing budget: a chunk
// with a source or many output ids, or a report (they grow), measured;
// anything else bounded from above.
func prefillRequestSize(r *pb.PrefillRequest) int {
	if c := r.GetChunk(); c != nil && (c.GetSource() != nil || len(c.GetAux().GetOutputIds()) > 64) {
		return proto.Size(r)
	}
	if r.GetReport() != nil {
		return proto.Size(r)
	}
	return 1 << 10 // a claim, an ack, a ping, a chunk without a source (its rank's address is at most 256 bytes)
}

// Welcome is the daemon's answer to the session's hello.
func (s *prefillSession) Welcome() *pb.PrefillWelcome { return s.welcome }

// Close ends the session. Claims whose destination was delivered stand (as
// after a dropped AwaitDestination stream).
func (s *prefillSession) Close() {
	s.cancel()
	<-s.done
}

// Done is closed when the session ended; Err then says why.
func (s *prefillSession) Done() <-chan struct{} { return s.done }

// Err is the session's end (nil while it lives): the stream's status, or
// io.EOF after an OK end.
func (s *prefillSession) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// ping keeps the session (and the rank) alive: a ping every half
// heartbeat interval.
func (s *prefillSession) ping(ctx context.Context) {
	every := s.p.cadence()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case <-t.C:
			s.out.push(&pb.PrefillRequest{Op: &pb.PrefillRequest_Ping{Ping: &pb.PrefillPing{}}}, nil)
		}
	}
}

// read dispatches the daemon's messages until the stream ends.
func (s *prefillSession) read(recv func() (*pb.PrefillEvent, error)) {
	var end error
	for {
		ev, err := recv()
		if err != nil {
			end = err
			break
		}
		s.dispatch(ev)
		for _, m := range ev.GetMore() {
			s.dispatch(m)
		}
	}
	if errors.Is(end, io.EOF) {
		end = io.EOF
	} else {
		end = toError("PrefillSession", end)
	}
	s.mu.Lock()
	s.err = end
	for seq, ch := range s.waiting {
		close(ch)
		delete(s.waiting, seq)
	}
	cs, offered := s.claims, s.offered
	s.claims, s.offered = map[uint64]*sessionClaim{}, map[uint64]*sessionClaim{}
	s.mu.Unlock()
	for _, c := range cs {
		c.fail(end)
	}
	if len(offered) > 0 {
		s.p.offers.lost(s, offered) // prefill_offers.go
	}
	for _, c := range offered {
		c.fail(end)
	}
	s.cancel()
	close(s.done)
}

// dispatch hands one message to its op (a result) or its claim (a room's
// event).
func (s *prefillSession) dispatch(ev *pb.PrefillEvent) {
	switch {
	case ev.GetResult() != nil:
		r := ev.GetResult()
		s.mu.Lock()
		ch := s.waiting[r.GetSeq()]
		delete(s.waiting, r.GetSeq())
		s.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	case ev.GetRoom().GetClaimSeq() == 0 && ev.GetRoom() != nil:
		s.offer(ev.GetRoom()) // prefill_offers.go
	case ev.GetRoom() != nil:
		re := ev.GetRoom()
		s.mu.Lock()
		c := s.claims[re.GetRoom()]
		s.mu.Unlock()
		if c != nil && c.seq == re.GetClaimSeq() {
			c.deliver(re.GetEvent())
		}
	}
}

// do sends an op and waits for its result.
func (s *prefillSession) do(ctx context.Context, op string, m *pb.PrefillRequest, onSent func(seq uint64)) (*pb.PrefillResult, error) {
	ch := make(chan *pb.PrefillResult, 1)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	m.Traceparent, m.Tracestate = carrier["traceparent"], carrier["tracestate"]
	var ended error
	queued := s.out.push(m, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.err != nil {
			ended = s.err
			return false
		}
		s.seq++
		m.Seq = s.seq
		s.waiting[m.Seq] = ch
		if onSent != nil {
			onSent(m.Seq)
		}
		return true
	})
	if !queued {
		return nil, sessionEnded(op, ended)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, sessionEnded(op, s.Err())
		}
		if e := r.GetError(); e != nil {
			// As the unary call's: the session's op prefix ("chunk.")
			// off the field names.
			err := opError(op, e)
			if p := prefillOpPrefix(m); p != "" {
				err = unprefix(err, p)
			}
			return nil, err
		}
		return r, nil
	case <-ctx.Done():
		return nil, toError(op, ctx.Err())
	}
}

// prefillOpPrefix is the prefix the daemon puts on the field names of an
// op's errors ("chunk.page_offset").
func prefillOpPrefix(m *pb.PrefillRequest) string {
	switch m.GetOp().(type) {
	case *pb.PrefillRequest_Claim:
		return "claim."
	case *pb.PrefillRequest_Chunk:
		return "chunk."
	case *pb.PrefillRequest_Report:
		return "report."
	case *pb.PrefillRequest_Ack:
		return "ack."
	}
	return "" // none
}

// sessionEnded is an op's error once the session ended.
func sessionEnded(op string, err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return localError(op, codes.Unavailable, "the prefill session ended")
	}
	var e *Error
	if errors.As(err, &e) {
		return newError(op, e.st)
	}
	return toError(op, err)
}

// opError is a refused op as the unary call's error (the same code,
// message and ErrorInfo: StaleIncarnation reads it).
func opError(op string, e *pb.PrefillError) error {
	st := status.New(codes.Code(e.GetCode()), e.GetMessage())
	if e.GetReason() != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: e.GetReason(), Domain: "decodeplane.v1", Metadata: e.GetMetadata()}); err == nil {
			st = d
		}
	}
	return newError(op, st)
}

// Chunk is Transfer over the session (req.Rank unset: the session's).
func (s *prefillSession) Chunk(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	r, err := s.do(ctx, "Transfer", &pb.PrefillRequest{Op: &pb.PrefillRequest_Chunk{Chunk: req}}, nil)
	if err != nil {
		return nil, err
	}
	return r.GetChunk(), nil
}

// Report is ReportTransfer over the session.
func (s *prefillSession) Report(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	r, err := s.do(ctx, "ReportTransfer", &pb.PrefillRequest{Op: &pb.PrefillRequest_Report{Report: req}}, nil)
	if err != nil {
		return nil, err
	}
	return r.GetReport(), nil
}

// Ack is AckRoomEnd over the session.
func (s *prefillSession) Ack(ctx context.Context, req *pb.AckRoomEndRequest) (*pb.AckRoomEndResponse, error) {
	r, err := s.do(ctx, "AckRoomEnd", &pb.PrefillRequest{Op: &pb.PrefillRequest_Ack{Ack: req}}, nil)
	if err != nil {
		return nil, err
	}
	return r.GetAck(), nil
}

// Claim is AwaitDestination over the session: once the claim is made, the
// room's events come on the returned sessionClaim (its Events, or Next).
func (s *prefillSession) Claim(ctx context.Context, req *pb.AwaitDestinationRequest) (*sessionClaim, error) {
	c := &sessionClaim{s: s, room: req.GetRoom(), inc: req.GetIncarnation(), events: make(chan *pb.DestinationEvent, 4), closed: make(chan struct{})}
	_, err := s.do(ctx, "AwaitDestination", &pb.PrefillRequest{Op: &pb.PrefillRequest_Claim{Claim: req}}, func(seq uint64) {
		c.seq = seq
		s.claims[c.room] = c // before the result: the events follow it
	})
	if err != nil {
		s.mu.Lock()
		if s.claims[c.room] == c {
			delete(s.claims, c.room)
		}
		s.mu.Unlock()
		return nil, err
	}
	c.endWith(ctx)
	return c, nil
}

// endWith ends the claim's events with ctx, as a DestinationStream's;
// Close stops the watch.
func (c *sessionClaim) endWith(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { c.fail(toError("AwaitDestination", ctx.Err())) })
	c.endMu.Lock()
	c.stop = stop
	c.endMu.Unlock()
	select {
	case <-c.closed: // ended meanwhile (the session's end): Close found no stop
		stop()
	default:
	}
}

// sessionClaim is one room's claim on a prefillSession: the destination, then the
// room's end, as a DestinationStream gives them.
type sessionClaim struct {
	s      *prefillSession
	room   uint64
	seq    uint64
	inc    uint64
	events chan *pb.DestinationEvent // a room sends at most a destination and its end

	once   sync.Once
	closed chan struct{}
	endMu  sync.Mutex
	stop   func() bool // stops the watch of the Claim's ctx; under endMu
	end    error
}

func (c *sessionClaim) deliver(ev *pb.DestinationEvent) {
	select {
	case c.events <- ev:
	default: // more than a room sends: a newer daemon's extra events
	}
}

func (c *sessionClaim) fail(err error) {
	c.endMu.Lock()
	if c.end == nil {
		c.end = err
	}
	c.endMu.Unlock()
	c.Close()
}

// Next returns the next event: a destination, then Done; the room's
// failure is a *RoomFailedError (AckRequired as the daemon said). The
// session's end is its error; after Close, io.EOF.
func (c *sessionClaim) Next() (*Event, error) {
	select {
	case ev := <-c.events:
		return c.event(ev)
	default:
	}
	select {
	case ev := <-c.events:
		return c.event(ev)
	case <-c.closed:
		select {
		case ev := <-c.events:
			return c.event(ev)
		default:
		}
		c.endMu.Lock()
		defer c.endMu.Unlock()
		if c.end != nil && !errors.Is(c.end, io.EOF) {
			if named, daemon, ok := StaleIncarnation(c.end); ok {
				return nil, &IncarnationChangedError{Room: c.room, Old: named, New: daemon, Err: c.end}
			}
			return nil, c.end
		}
		return nil, io.EOF
	}
}

func (c *sessionClaim) event(ev *pb.DestinationEvent) (*Event, error) {
	switch {
	case ev.GetDestination() != nil:
		d := ev.GetDestination()
		if inc := d.GetIncarnation(); inc != 0 && c.inc != 0 && inc != c.inc {
			c.Close()
			return nil, &IncarnationChangedError{Room: c.room, Old: c.inc, New: inc}
		}
		return &Event{Destination: d}, nil
	case ev.GetDone() != nil:
		c.Close()
		return &Event{Done: ev.GetDone()}, nil
	case ev.GetFailure() != nil:
		c.Close()
		rf := roomFailed(c.room, ev.GetFailure())
		rf.AckRequired = ev.GetAckRequired()
		return nil, rf
	}
	return c.Next()
}

// forget takes the ended claim off the session (the room may be claimed
// again).
func (c *sessionClaim) forget() {
	c.s.mu.Lock()
	cs := c.s.claims
	if c.seq == 0 {
		cs = c.s.offered
	}
	if cs[c.room] == c {
		delete(cs, c.room)
	}
	c.s.mu.Unlock()
}

// Close stops delivering this claim's events (Next returns io.EOF). The
// daemon keeps the claim until the room ends or the session does.
func (c *sessionClaim) Close() {
	c.once.Do(func() {
		c.forget()
		close(c.closed)
		c.endMu.Lock()
		stop := c.stop
		c.endMu.Unlock()
		if stop != nil { // nil: Claim has not set it yet, and stops it itself
			stop()
		}
	})
}

// transport is the hand-off's claim and acknowledgement over the session.
func (sess *prefillSession) transport() handTransport {
	p := sess.p
	return handTransport{
		claim: func(ctx context.Context, req *pb.AwaitDestinationRequest) (claimStream, error) {
			c, err := sess.Claim(ctx, req)
			if err != nil {
				return nil, err
			}
			return c, nil
		},
		ack: func(ctx context.Context, room uint64, dest *pb.Destination) error {
			_, err := sess.Ack(ctx, &pb.AckRoomEndRequest{Room: room, Rank: p.rank, Attempt: dest.GetAttempt(), Incarnation: dest.GetIncarnation()})
			return err
		},
	}
}
