package sessiontest

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Prefill is a prefill rank's PrefillSession stream: its claims, chunks,
// reports and acknowledgements, and the rank's heartbeat while it lives (it
// pings every half heartbeat interval). It is safe for concurrent use.
type Prefill struct {
	st      pb.PrefillSession_SessionClient
	cancel  context.CancelFunc
	welcome *pb.PrefillWelcome

	sendMu sync.Mutex // orders the writes by seq
	seq    uint64     // under sendMu

	mu      sync.Mutex
	waiting map[uint64]chan *pb.PrefillResult
	claims  map[uint64]*Claim // by room
	err     error             // the stream's end
	done    chan struct{}     // closed at the stream's end
}

// OpenPrefill opens a PrefillSession on conn with hello (the rank must be
// registered) and returns once the daemon welcomed it; a refused hello is
// the stream's status (NOT_FOUND for a rank the daemon does not know).
// opts are the call's (a token: grpc.PerRPCCredentials). ctx bounds the
// stream; Close ends it.
func OpenPrefill(ctx context.Context, conn grpc.ClientConnInterface, hello *pb.PrefillHello, opts ...grpc.CallOption) (*Prefill, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := pb.NewPrefillSessionClient(conn).Session(sctx, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	_ = st.Send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: hello}}) // a failed send: Recv gets the status
	first, err := st.Recv()
	if err != nil {
		cancel()
		return nil, err
	}
	w := first.GetWelcome()
	if w == nil {
		cancel()
		return nil, status.Errorf(codes.Internal, "the daemon's first session message is not a welcome: %v", first)
	}
	p := &Prefill{st: st, cancel: cancel, welcome: w, waiting: map[uint64]chan *pb.PrefillResult{},
		claims: map[uint64]*Claim{}, done: make(chan struct{})}
	go p.read()
	go p.ping(sctx, w.GetHeartbeatInterval().AsDuration()/2)
	return p, nil
}

// Welcome is the daemon's answer to the hello.
func (p *Prefill) Welcome() *pb.PrefillWelcome { return p.welcome }

// Done is closed when the stream ended; Err then says why.
func (p *Prefill) Done() <-chan struct{} { return p.done }

// Err is the stream's end (nil while it lives): its status, or io.EOF.
func (p *Prefill) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close ends the stream. Claims whose destination was delivered stand, as
// after a dropped AwaitDestination stream.
func (p *Prefill) Close() {
	p.cancel()
	<-p.done
}

// ping keeps the session (and the rank) alive.
func (p *Prefill) ping(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.sendMu.Lock()
			_ = p.st.Send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Ping{Ping: &pb.PrefillPing{}}})
			p.sendMu.Unlock()
		}
	}
}

// read hands each result to its op and each room event to its claim until
// the stream ends; then every op and claim gets the end.
func (p *Prefill) read() {
	var end error
	for {
		ev, err := p.st.Recv()
		if err != nil {
			end = err
			break
		}
		switch {
		case ev.GetResult() != nil:
			r := ev.GetResult()
			p.mu.Lock()
			ch := p.waiting[r.GetSeq()]
			delete(p.waiting, r.GetSeq())
			p.mu.Unlock()
			if ch != nil {
				ch <- r
			}
		case ev.GetRoom() != nil:
			re := ev.GetRoom()
			p.mu.Lock()
			c := p.claims[re.GetRoom()]
			p.mu.Unlock()
			if c != nil && c.seq == re.GetClaimSeq() {
				c.deliver(re.GetEvent())
			}
		}
	}
	p.mu.Lock()
	p.err = end
	for seq, ch := range p.waiting {
		close(ch)
		delete(p.waiting, seq)
	}
	claims := p.claims
	p.claims = map[uint64]*Claim{}
	p.mu.Unlock()
	for _, c := range claims {
		c.fail(end)
	}
	p.cancel()
	close(p.done)
}

// Chunk is Transfer on the stream (req.Rank unset: the session's).
func (p *Prefill) Chunk(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	r, err := p.do(ctx, &pb.PrefillRequest{Op: &pb.PrefillRequest_Chunk{Chunk: req}}, nil)
	return r.GetChunk(), err
}

// Report is ReportTransfer on the stream.
func (p *Prefill) Report(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	r, err := p.do(ctx, &pb.PrefillRequest{Op: &pb.PrefillRequest_Report{Report: req}}, nil)
	return r.GetReport(), err
}

// Ack is AckRoomEnd on the stream.
func (p *Prefill) Ack(ctx context.Context, req *pb.AckRoomEndRequest) (*pb.AckRoomEndResponse, error) {
	r, err := p.do(ctx, &pb.PrefillRequest{Op: &pb.PrefillRequest_Ack{Ack: req}}, nil)
	return r.GetAck(), err
}

// Claim is AwaitDestination on the stream: once the claim is made, the
// room's events come on the returned Claim. Its events end with ctx.
func (p *Prefill) Claim(ctx context.Context, req *pb.AwaitDestinationRequest) (*Claim, error) {
	c := &Claim{p: p, room: req.GetRoom(), events: make(chan *pb.DestinationEvent, 4), closed: make(chan struct{})}
	_, err := p.do(ctx, &pb.PrefillRequest{Op: &pb.PrefillRequest_Claim{Claim: req}}, func(seq uint64) {
		c.seq = seq
		p.claims[c.room] = c // before the result: the events follow it
	})
	if err != nil {
		c.forget()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.fail(status.FromContextError(ctx.Err()).Err()) })
	c.mu.Lock()
	c.stop = stop
	c.mu.Unlock()
	select {
	case <-c.closed: // ended meanwhile: Close found no stop
		stop()
	default:
	}
	return c, nil
}

// do sends an op, with ctx's trace context, and waits for its result;
// sent, when set, runs under the stream's lock once the op has its seq.
func (p *Prefill) do(ctx context.Context, m *pb.PrefillRequest, sent func(seq uint64)) (*pb.PrefillResult, error) {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	m.Traceparent, m.Tracestate = carrier["traceparent"], carrier["tracestate"]
	ch := make(chan *pb.PrefillResult, 1)
	p.sendMu.Lock()
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		p.sendMu.Unlock()
		return nil, sessionEnded(p.err)
	}
	p.seq++
	m.Seq = p.seq
	p.waiting[m.Seq] = ch
	if sent != nil {
		sent(m.Seq)
	}
	p.mu.Unlock()
	_ = p.st.Send(m) // a failed send: read gets the stream's status
	p.sendMu.Unlock()
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, sessionEnded(p.Err())
		}
		if e := r.GetError(); e != nil {
			return nil, opError(e)
		}
		return r, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// sessionEnded is an op's error once the stream ended with err.
func sessionEnded(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return status.Error(codes.Unavailable, "the prefill session ended")
	}
	return err
}

// opError is a refused op as the unary call's status: its code, message
// and ErrorInfo.
func opError(e *pb.PrefillError) error {
	st := status.New(codes.Code(e.GetCode()), e.GetMessage())
	if e.GetReason() != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: e.GetReason(), Domain: "decodeplane.v1", Metadata: e.GetMetadata()}); err == nil {
			st = d
		}
	}
	return st.Err()
}

// Claim is one room's claim on a Prefill session: the destination, then the
// room's end, as an AwaitDestination stream sends them.
type Claim struct {
	p      *Prefill
	room   uint64
	seq    uint64
	events chan *pb.DestinationEvent // a room sends at most a destination and its end

	once   sync.Once
	closed chan struct{}
	mu     sync.Mutex
	stop   func() bool // stops the watch of the Claim's ctx
	end    error
}

func (c *Claim) deliver(ev *pb.DestinationEvent) {
	select {
	case c.events <- ev:
	default: // more than a room sends: a newer daemon's extra events
	}
}

func (c *Claim) fail(err error) {
	c.mu.Lock()
	if c.end == nil {
		c.end = err
	}
	c.mu.Unlock()
	c.Close()
}

// Next returns the claim's next event: the destination, then the room's
// end (done or failure, after which the claim is over). After the claim
// ended it returns the end: the stream's status, ctx's end, or io.EOF
// (after the room's end or Close).
func (c *Claim) Next() (*pb.DestinationEvent, error) {
	select {
	case ev := <-c.events:
		return c.event(ev), nil
	default:
	}
	select {
	case ev := <-c.events:
		return c.event(ev), nil
	case <-c.closed:
		select {
		case ev := <-c.events:
			return c.event(ev), nil
		default:
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.end != nil && !errors.Is(c.end, io.EOF) {
			return nil, c.end
		}
		return nil, io.EOF
	}
}

// event returns ev, closing the claim at the room's end.
func (c *Claim) event(ev *pb.DestinationEvent) *pb.DestinationEvent {
	if ev.GetDone() != nil || ev.GetFailure() != nil {
		c.Close()
	}
	return ev
}

// forget takes the claim off its session.
func (c *Claim) forget() {
	c.p.mu.Lock()
	if c.p.claims[c.room] == c {
		delete(c.p.claims, c.room)
	}
	c.p.mu.Unlock()
}

// Close stops delivering the claim's events (Next returns io.EOF). The
// daemon keeps the claim until the room ends or the session does.
func (c *Claim) Close() {
	c.once.Do(func() {
		c.forget()
		close(c.closed)
		c.mu.Lock()
		stop := c.stop
		c.mu.Unlock()
		if stop != nil {
			stop()
		}
	})
}
