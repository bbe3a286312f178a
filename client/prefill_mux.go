package client

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The rank's shared prefill session (TransportStreams, the default): every
// SendRoom and ReportRoom of a Prefill, and its RunHeartbeat, go through
// one lazily opened Session, re-opened after it ended, and closed when
// none of them uses it any more (an idle rank does not beat).
//
// A session that ends under a hand-off in flight is replaced, and the
// hand-off goes on, as the unary path goes on after a lost answer (a
// re-opened AwaitDestination stream, a retried Transfer): the claim is made
// again on the new session (the daemon re-delivers the destination, which
// is not returned twice), and the op whose answer was lost is sent again.
// That is safe by the daemon's rules: a claim supersedes the rank's earlier
// claim, and (room, rank, chunk_index) is the key of Transfer and
// ReportTransfer: a chunk that landed answers duplicate, one still in
// flight is waited for, one the session's end cancelled landed nothing and
// is moved again; ReportRoom's Move is not run again (only its report is
// re-sent), and an ack is idempotent per rank and generation. The retries
// are bounded: each (re-)open by the Client's RetryPolicy (MaxAttempts
// opens, its backoff, only on Unavailable or ResourceExhausted with a
// RetryInfo), and an op or claim by MaxAttempts consecutive sessions that
// ended under it; past that the hand-off fails with the session's end (an
// *Error, ErrUnavailable when the stream was cut). A re-open the daemon
// refuses as of another incarnation (it restarted) is an
// *IncarnationChangedError, as on the unary path.

// prefillMux is a Prefill's shared session.
type prefillMux struct {
	p      *Prefill
	ctx    context.Context // ends with Prefill.Close or Client.Close
	cancel context.CancelFunc
	open   chan struct{} // one open at a time; the others wait for it

	mu         sync.Mutex
	cur        *Session
	curCancel  context.CancelFunc // ends cur's context
	closed     bool
	registered bool // in the Client's set (Client.Close closes it)
	// users are the hand-offs in flight and the running RunHeartbeat: the
	// session is closed when the last one is done.
	users int
}

// acquire counts a user of the session (a hand-off, RunHeartbeat) until
// its release.
func (m *prefillMux) acquire() func() {
	m.mu.Lock()
	m.users++
	m.mu.Unlock()
	var once sync.Once
	return func() { once.Do(m.release) }
}

// release ends a use; the last one closes the session: an idle rank does
// not beat (stopping RunHeartbeat stops the beats once the hand-offs in
// flight are done, as on the unary path).
func (m *prefillMux) release() {
	m.mu.Lock()
	m.users--
	var s *Session
	var cancel context.CancelFunc
	if m.users == 0 && m.cur != nil {
		s, cancel = m.cur, m.curCancel
		m.cur, m.curCancel = nil, nil
	}
	m.mu.Unlock()
	if s != nil {
		s.Close()
		cancel()
	}
}

func newPrefillMux(p *Prefill) *prefillMux {
	ctx, cancel := context.WithCancel(context.Background())
	return &prefillMux{p: p, ctx: ctx, cancel: cancel, open: make(chan struct{}, 1)}
}

const muxOp = "PrefillSession"

// errMuxClosed is the error of the shared session's users once the
// Prefill (or its Client) was closed.
func errMuxClosed() *Error {
	return localError(muxOp, codes.Canceled, "the Prefill is closed")
}

// live returns the current session while it lives.
func (m *prefillMux) live() *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil {
		return nil
	}
	if m.cur.Err() != nil { // ended (Err is set before Done is closed)
		m.curCancel()
		m.cur, m.curCancel = nil, nil
		return nil
	}
	return m.cur
}

// get returns the live session, opening one if there is none: one open at
// a time, retried under the Client's RetryPolicy. ctx bounds the wait and
// the open, not the session.
func (m *prefillMux) get(ctx context.Context) (*Session, error) {
	if s := m.live(); s != nil {
		return s, nil
	}
	select {
	case m.open <- struct{}{}:
	case <-ctx.Done():
		return nil, toError(muxOp, ctx.Err())
	}
	defer func() { <-m.open }()
	c := m.p.c
	for attempt := 1; ; attempt++ {
		if s := m.live(); s != nil {
			return s, nil // opened by another caller meanwhile
		}
		if err := m.usable(); err != nil {
			return nil, err
		}
		s, err := m.dial(ctx)
		if err == nil {
			return s, nil
		}
		var e *Error
		if ctx.Err() != nil || m.isClosed() || attempt >= c.retry.MaxAttempts || !errors.As(err, &e) {
			return nil, err
		}
		var ic *IncarnationChangedError
		if errors.As(err, &ic) {
			return nil, err
		}
		d, ok := c.retry.retryDelay(e.st, attempt)
		if !ok {
			return nil, err
		}
		if werr := wait(ctx, muxOp, d, e); werr != nil {
			return nil, werr
		}
	}
}

// getHandOff is get for a hand-off. A session the daemon refuses because
// it does not know the rank (NOT_FOUND: it restarted, or declared the rank
// dead) while a RunHeartbeat of this Prefill runs is opened again once that
// RunHeartbeat registered the rank anew (at most two heartbeat intervals
// later): a hand-off made in the window between a daemon's restart and the
// rank's new registration goes through instead of failing. Without a
// RunHeartbeat, or when ctx ends first, the refusal stands.
func (m *prefillMux) getHandOff(ctx context.Context) (*Session, error) {
	reg, beating := m.p.registeredSignal()
	s, err := m.get(ctx)
	if err == nil || !errors.Is(err, ErrNotFound) || !beating {
		return s, err
	}
	t := time.NewTimer(2 * m.p.heartbeatInterval())
	defer t.Stop()
	select {
	case <-reg:
		return m.get(ctx)
	case <-ctx.Done():
		return nil, toError(muxOp, ctx.Err())
	case <-t.C:
		return nil, err
	}
}

// usable refuses opens once the Prefill or the Client was closed, and
// enters the mux in the Client's set before its first session.
func (m *prefillMux) usable() error {
	if err := m.p.c.errIfClosed(muxOp); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errMuxClosed()
	}
	if !m.registered {
		if !m.p.c.pmux.add(m) {
			return localError(muxOp, codes.Canceled, "the client is closed")
		}
		m.registered = true
	}
	return nil
}

// dial opens one session. The open ends with ctx; the session lives until
// the mux closes or the stream ends.
func (m *prefillMux) dial(ctx context.Context) (*Session, error) {
	sctx, scancel := context.WithCancel(m.ctx)
	stop := context.AfterFunc(ctx, scancel)
	s, err := m.p.Session(sctx)
	if !stop() { // ctx ended during the open
		if s != nil {
			s.Close()
		}
		scancel()
		return nil, toError(muxOp, ctx.Err())
	}
	if err != nil {
		scancel()
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		s.Close()
		scancel()
		return nil, errMuxClosed()
	}
	m.cur, m.curCancel = s, scancel
	return s, nil
}

func (m *prefillMux) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// close ends the session for good (Prefill.Close, Client.Close) and waits
// for its goroutines.
func (m *prefillMux) close() {
	m.mu.Lock()
	m.closed = true
	s := m.cur
	m.cur, m.curCancel = nil, nil
	registered := m.registered
	m.mu.Unlock()
	m.cancel()
	if s != nil {
		s.Close()
	}
	if registered {
		m.p.c.pmux.remove(m)
	}
}

// endedUnder reports that err is s's end, not an answer: s ended and err
// carries its status (or io.EOF, a claim cut by an OK end), while the
// caller's ctx lives. A refusal the daemon sent just before the end would
// be taken for it and sent again, which the daemon's idempotency rules
// make harmless.
func endedUnder(ctx context.Context, s *Session, err error) bool {
	if err == nil || ctx.Err() != nil || s.Err() == nil { // Err: set once the session ended
		return false
	}
	var rf *RoomFailedError
	var ic *IncarnationChangedError
	if errors.As(err, &rf) || errors.As(err, &ic) {
		return false
	}
	if errors.Is(err, io.EOF) {
		return true
	}
	var got, end *Error
	if !errors.As(err, &got) || !errors.As(sessionEnded(muxOp, s.Err()), &end) {
		return false
	}
	return got.Code() == end.Code()
}

// muxDo runs call on the shared session, on a new one when the session
// ended under it (at most MaxAttempts sessions).
func muxDo[R any](ctx context.Context, m *prefillMux, call func(*Session) (R, error)) (R, error) {
	for n := 1; ; n++ {
		s, err := m.get(ctx)
		if err != nil {
			var zero R
			return zero, err
		}
		r, err := call(s)
		if err == nil || n >= m.p.c.retry.MaxAttempts || !endedUnder(ctx, s, err) {
			return r, err
		}
	}
}

// chunk is Transfer on the shared session.
func (m *prefillMux) chunk(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	return muxDo(ctx, m, func(s *Session) (*pb.TransferResponse, error) { return s.Chunk(ctx, req) })
}

// report is ReportTransfer on the shared session.
func (m *prefillMux) report(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	return muxDo(ctx, m, func(s *Session) (*pb.ReportTransferResponse, error) { return s.Report(ctx, req) })
}

// transport is the hand-off's claim and acknowledgement on the shared
// session.
func (m *prefillMux) transport() handTransport {
	p := m.p
	return handTransport{
		claim: func(ctx context.Context, req *pb.AwaitDestinationRequest) (claimStream, error) {
			cctx, cancel := context.WithCancel(ctx)
			c := &muxClaim{m: m, ctx: cctx, cancel: cancel, req: req}
			if err := c.attach(); err != nil {
				cancel()
				return nil, err
			}
			return c, nil
		},
		ack: func(ctx context.Context, room uint64, dest *pb.Destination) error {
			req := &pb.AckRoomEndRequest{Room: room, Rank: p.rank, Attempt: dest.GetAttempt(), Incarnation: dest.GetIncarnation()}
			_, err := muxDo(ctx, m, func(s *Session) (*pb.AckRoomEndResponse, error) { return s.Ack(ctx, req) })
			return err
		},
	}
}

// muxClaim is a hand-off's claim on the shared session, made again on the
// next session when the one it was on ended. Next is called from one
// goroutine at a time; Close from any.
type muxClaim struct {
	m      *prefillMux
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	req    *pb.AwaitDestinationRequest

	mu     sync.Mutex
	cur    *SessionClaim
	sess   *Session
	closed bool

	// Next's own state.
	seen    bool
	attempt uint32 // of the last destination returned
	fails   int    // consecutive sessions that ended under the claim
}

// attach claims on the live session (a new one if needed).
func (c *muxClaim) attach() error {
	for {
		s, err := c.m.getHandOff(c.ctx)
		if err != nil {
			return err
		}
		sc, err := s.Claim(c.ctx, c.req)
		if err != nil {
			if c.fails+1 < c.m.p.c.retry.MaxAttempts && endedUnder(c.ctx, s, err) {
				c.fails++
				continue
			}
			return err
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			sc.Close()
			return io.EOF
		}
		c.cur, c.sess = sc, s
		c.mu.Unlock()
		return nil
	}
}

// Next returns the claim's next event, as SessionClaim.Next does; a
// destination re-delivered after a re-claim (same attempt) is not returned
// twice.
func (c *muxClaim) Next() (*Event, error) {
	for {
		c.mu.Lock()
		cur, s := c.cur, c.sess
		c.mu.Unlock()
		ev, err := cur.Next()
		if err == nil {
			if d := ev.Destination; d != nil {
				if c.seen && d.GetAttempt() == c.attempt {
					continue // re-delivered after a re-claim
				}
				c.seen, c.attempt = true, d.GetAttempt()
			}
			c.fails = 0
			return ev, nil
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed || c.fails+1 >= c.m.p.c.retry.MaxAttempts || !endedUnder(c.ctx, s, err) {
			return nil, err
		}
		c.fails++
		if aerr := c.attach(); aerr != nil {
			if errors.Is(aerr, io.EOF) {
				return nil, io.EOF
			}
			return nil, aerr
		}
	}
}

// Close withdraws the claim from the session (the daemon keeps a delivered
// destination claimed) and ends a re-claim in progress.
func (c *muxClaim) Close() {
	c.mu.Lock()
	c.closed = true
	cur := c.cur
	c.mu.Unlock()
	c.cancel()
	if cur != nil {
		cur.Close()
	}
}

// prefillMuxes is a Client's set of shared sessions, closed by
// Client.Close.
type prefillMuxes struct {
	mu     sync.Mutex
	closed bool
	set    map[*prefillMux]struct{}
}

// add enters m; false once the client is closed.
func (ms *prefillMuxes) add(m *prefillMux) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return false
	}
	if ms.set == nil {
		ms.set = map[*prefillMux]struct{}{}
	}
	ms.set[m] = struct{}{}
	return true
}

func (ms *prefillMuxes) remove(m *prefillMux) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.set, m)
}

// closeAll closes every shared session, and every later one at once.
func (ms *prefillMuxes) closeAll() {
	ms.mu.Lock()
	ms.closed = true
	set := ms.set
	ms.set = nil
	ms.mu.Unlock()
	for m := range set {
		m.close()
	}
}

// Close ends the rank's shared prefill session (TransportStreams), and
// with it the heartbeat the session carries, and waits for its
// goroutines. Later SendRoom, ReportRoom and RunHeartbeat calls on the
// streams transport fail with ErrCanceled; the unary methods (Register,
// AckRoomEnd, a Session opened by the caller, SendRoom under
// TransportUnary) are not affected. Client.Close closes every Prefill's
// session. Idempotent.
func (p *Prefill) Close() { p.mux.close() }

// streams reports whether the hand-offs go on the shared session: the
// Client's transport is TransportStreams and the daemon serves
// PrefillSession (an older daemon's ErrUnimplemented falls back to the
// unary API, for this call).
// The session's open error, if any, is the hand-off's (handOffFailed):
// the claim would only open it again.
func (p *Prefill) streams(ctx context.Context) (bool, func(), error) {
	if p.c.transport != TransportStreams {
		return false, func() {}, nil
	}
	release := p.mux.acquire()
	_, err := p.mux.getHandOff(ctx)
	if errors.Is(err, ErrUnimplemented) {
		release()
		return false, func() {}, nil
	}
	return true, release, err
}

// handOffFailed is a hand-off whose session could not be opened: the
// errors handOffOver would return first, else err (an incarnation change
// learned from the refused open, for room).
func (p *Prefill) handOffFailed(op string, room uint64, o SendOptions, err error) (*pb.Destination, error) {
	if o.ChunkPages < 0 {
		return nil, localError(op, codes.InvalidArgument, "SendOptions.ChunkPages: %d must be >= 0 (0 sends every page in one chunk)", o.ChunkPages)
	}
	g := p.generation()
	if cerr := p.check(g, room); cerr != nil {
		return nil, cerr
	}
	return nil, p.voided(g, room, err)
}

// runHeartbeatStreams is RunHeartbeat under TransportStreams: the shared
// session is the heartbeat while it is open (its pings are the beats);
// RunHeartbeat (re-)registers when needed and re-opens the session after
// it ended, and beats unary while none can be opened.
func (p *Prefill) runHeartbeatStreams(ctx context.Context) error {
	m := p.mux
	defer m.acquire()()
	p.mu.Lock()
	p.beating++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.beating--
		p.mu.Unlock()
	}()
	quick := 0      // consecutive sessions that ended within a cadence
	refused := 0    // consecutive opens refused NOT_FOUND or as of another incarnation
	unimpl := false // ErrUnimplemented reported (once: an older daemon stays one)
	sleep := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	report := func(err error) {
		if p.onErr != nil {
			p.onErr(err)
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if m.isClosed() {
			return errMuxClosed()
		}
		if p.Registration() == nil || p.mustReregister() {
			if err := p.beat(ctx); err != nil { // registers
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if permanent(err) {
					return err
				}
				report(err)
				if err := sleep(p.cadence()); err != nil {
					return err
				}
				continue
			}
		}
		// The open is bounded as a beat is (a daemon that never welcomes
		// the session does not stall the loop).
		octx, cancel := context.WithTimeout(ctx, p.heartbeatInterval())
		s, err := m.get(octx)
		cancel()
		if err != nil && (errors.Is(err, ErrIncarnationChanged) || errors.Is(err, ErrNotFound)) {
			// Registered again next round; a daemon that keeps refusing
			// the new registration's session is not asked in a tight loop.
			if refused++; refused > 1 {
				if err := sleep(p.c.retry.backoff(refused - 1)); err != nil {
					return err
				}
			}
		} else {
			refused = 0
		}
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case m.isClosed() || p.c.errIfClosed(muxOp) != nil:
				return err
			case errors.Is(err, ErrIncarnationChanged):
				report(err) // learned: the next round registers again
				continue
			case errors.Is(err, ErrNotFound):
				report(err) // the daemon does not know the rank (any more)
				p.markReregister()
				continue
			case permanent(err) && !errors.Is(err, ErrUnimplemented):
				return err
			}
			if !errors.Is(err, ErrUnimplemented) || !unimpl {
				report(err)
			}
			unimpl = unimpl || errors.Is(err, ErrUnimplemented)
			// No session: a unary beat keeps the rank alive meanwhile
			// (an older daemon, a proxy that cuts streams); the session
			// is tried again on the next round.
			if berr := p.beat(ctx); berr != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if permanent(berr) {
					return berr
				}
				report(berr)
			}
			if err := sleep(p.cadence()); err != nil {
				return err
			}
			continue
		}
		opened := time.Now()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.Done():
		}
		end := s.Err()
		switch {
		case m.isClosed():
			return errMuxClosed()
		case errors.Is(end, ErrNotFound):
			p.markReregister()
		}
		report(sessionEnded(muxOp, end))
		// A session that keeps ending at once is not re-opened in a
		// tight loop.
		if time.Since(opened) < p.cadence() {
			quick++
			if err := sleep(p.c.retry.backoff(quick)); err != nil {
				return err
			}
		} else {
			quick = 0
		}
	}
}

// markReregister makes the next round register again.
func (p *Prefill) markReregister() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reregister = true
}
