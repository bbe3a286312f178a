package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
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

// prefillMux is a Prefill's shared session: the Client holds it (in its
// rankSessions) from its first open until the rank stops using it, and
// Client.Close ends it.
type prefillMux struct {
	p      *Prefill
	ctx    context.Context // ends with Client.Close
	cancel context.CancelFunc
	open   chan struct{} // one open at a time; the others wait for it

	mu         sync.Mutex
	cur        *prefillSession
	curCancel  context.CancelFunc // ends cur's context
	closed     bool
	registered bool // in the Client's rankSessions (Client.Close closes it)
	// users are the hand-offs in flight and the running RunHeartbeat: the
	// session is closed when the last one is done.
	users int
	// failed is when the last open failed (after its retries), err why:
	// the callers that waited for that open get its error instead of
	// trying again at once (a daemon that is gone fails each of its
	// hand-offs after one series of opens, not after one per hand-off).
	failed time.Time
	err    error
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

// release ends a use; the last one closes the session (an idle rank does
// not beat: stopping RunHeartbeat stops the beats once the hand-offs in
// flight are done, as on the unary path) and takes the mux out of the
// Client's rankSessions until its next use.
func (m *prefillMux) release() {
	m.mu.Lock()
	m.users--
	var s *prefillSession
	var cancel context.CancelFunc
	if m.users == 0 && m.cur != nil {
		s, cancel = m.cur, m.curCancel
		m.cur, m.curCancel = nil, nil
	}
	if m.users == 0 && m.registered {
		m.p.c.rankSessions.remove(m)
		m.registered = false
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

// errMuxClosed is the error of the shared session's users once the Client
// was closed.
func errMuxClosed() *Error {
	return localError(muxOp, codes.Canceled, "the client is closed")
}

// live returns the current session while it lives.
func (m *prefillMux) live() *prefillSession {
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
func (m *prefillMux) get(ctx context.Context) (*prefillSession, error) {
	if s := m.live(); s != nil {
		return s, nil
	}
	asked := time.Now()
	select {
	case m.open <- struct{}{}:
	case <-ctx.Done():
		return nil, toError(muxOp, ctx.Err())
	}
	defer func() { <-m.open }()
	if err := m.failedSince(asked); err != nil {
		return nil, err
	}
	s, err := m.openRetried(ctx)
	m.mu.Lock()
	switch {
	case err == nil:
		m.err = nil
	case ctx.Err() == nil:
		m.failed, m.err = time.Now(), err
	}
	m.mu.Unlock()
	return s, err
}

// down reports that the mux has no live session and its last open failed
// at least d ago (and none was opened since).
func (m *prefillMux) down(d time.Duration) bool {
	if m.live() != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err != nil && time.Since(m.failed) >= d
}

// failedSince returns the error of an open that failed after asked (the
// caller waited for it), nil if none did.
func (m *prefillMux) failedSince(asked time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil && m.failed.After(asked) {
		return m.err
	}
	return nil
}

// openRetried opens a session under the Client's RetryPolicy (the caller
// holds the open slot).
func (m *prefillMux) openRetried(ctx context.Context) (*prefillSession, error) {
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
func (m *prefillMux) getHandOff(ctx context.Context) (*prefillSession, error) {
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

// usable refuses opens once the Client was closed, and enters the mux in
// the Client's rankSessions before its session is opened.
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
		if !m.p.c.rankSessions.add(m) {
			return localError(muxOp, codes.Canceled, "the client is closed")
		}
		m.registered = true
	}
	return nil
}

// dial opens one session. The open ends with ctx; the session lives until
// the mux closes or the stream ends.
func (m *prefillMux) dial(ctx context.Context) (*prefillSession, error) {
	sctx, scancel := context.WithCancel(m.ctx)
	stop := context.AfterFunc(ctx, scancel)
	s, err := m.p.openSession(sctx)
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

// close ends the session for good (Client.Close) and waits for its
// goroutines.
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
		m.p.c.rankSessions.remove(m)
	}
}

// rankSessions are a Client's prefill ranks' shared sessions in use,
// closed by Client.Close.
type rankSessions struct {
	mu     sync.Mutex
	closed bool
	set    map[*prefillMux]struct{}
}

// add enters m; false once the client is closed.
func (ms *rankSessions) add(m *prefillMux) bool {
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

func (ms *rankSessions) remove(m *prefillMux) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.set, m)
}

// closeAll closes every shared session, and every later one at once.
func (ms *rankSessions) closeAll() {
	ms.mu.Lock()
	ms.closed = true
	set := ms.set
	ms.set = nil
	ms.mu.Unlock()
	for m := range set {
		m.close()
	}
}
