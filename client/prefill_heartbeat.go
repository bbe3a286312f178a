package client

import (
	"context"
	"errors"
	"time"
)

// RunHeartbeat under TransportStreams: the rank's shared session is the
// heartbeat while it is open (its pings are the beats, no unary Heartbeat
// is sent); the loop (re-)registers when needed, re-opens the session after
// it ended, and beats unary while none can be opened.

// runHeartbeatStreams is RunHeartbeat under TransportStreams.
func (p *Prefill) runHeartbeatStreams(ctx context.Context) error {
	defer p.mux.acquire()()
	p.mu.Lock()
	p.beating++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.beating--
		p.mu.Unlock()
	}()
	h := &sessionBeats{p: p, m: p.mux}
	for {
		if err := h.round(ctx); err != nil {
			return err
		}
	}
}

// sessionBeats is one runHeartbeatStreams loop's state.
type sessionBeats struct {
	p       *Prefill
	m       *prefillMux
	quick   int  // consecutive sessions that ended within a cadence
	refused int  // consecutive opens refused NOT_FOUND or as of another incarnation
	unimpl  bool // ErrUnimplemented reported (once: an older daemon stays one)
}

// round is one round of the loop: register when needed, then hold a
// session open until it ends, or beat unary when none opens. An error
// ends the loop and is RunHeartbeat's.
func (h *sessionBeats) round(ctx context.Context) error {
	p := h.p
	if err := ctx.Err(); err != nil {
		return err
	}
	if h.m.isClosed() {
		if p.closed.Load() {
			return errRankClosed(muxOp)
		}
		return errMuxClosed()
	}
	if p.Registration() == nil || p.mustReregister() {
		if err := p.beat(ctx); err != nil { // registers
			if stop := h.failed(ctx, err); stop != nil {
				return stop
			}
			return h.sleep(ctx, p.cadence())
		}
	}
	s, err := h.open(ctx)
	if err != nil {
		return h.noSession(ctx, err)
	}
	return h.hold(ctx, s)
}

// open gets the shared session, bounded as a beat is (a daemon that never
// welcomes the session does not stall the loop). A daemon that keeps
// refusing the new registration's session is not asked in a tight loop.
func (h *sessionBeats) open(ctx context.Context) (*prefillSession, error) {
	octx, cancel := context.WithTimeout(ctx, h.p.heartbeatInterval())
	s, err := h.m.get(octx)
	cancel()
	if err == nil || !(errors.Is(err, ErrIncarnationChanged) || errors.Is(err, ErrNotFound)) {
		h.refused = 0
		return s, err
	}
	// Registered again next round.
	if h.refused++; h.refused > 1 {
		if serr := h.sleep(ctx, h.p.c.retry.backoff(h.refused-1)); serr != nil {
			return nil, serr
		}
	}
	return nil, err
}

// noSession is a round whose session could not be opened (err).
func (h *sessionBeats) noSession(ctx context.Context, err error) error {
	p := h.p
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case h.m.isClosed() || p.c.errIfClosed(muxOp) != nil:
		return err
	case errors.Is(err, ErrIncarnationChanged):
		h.report(err) // learned: the next round registers again
		return nil
	case errors.Is(err, ErrNotFound):
		h.report(err) // the daemon does not know the rank (any more)
		p.markReregister()
		return nil
	case permanent(err) && !errors.Is(err, ErrUnimplemented):
		return err
	}
	if !errors.Is(err, ErrUnimplemented) || !h.unimpl {
		h.report(err)
	}
	h.unimpl = h.unimpl || errors.Is(err, ErrUnimplemented)
	// No session: a unary beat keeps the rank alive meanwhile (an older
	// daemon, a proxy that cuts streams); the session is tried again on the
	// next round.
	if berr := p.beat(ctx); berr != nil {
		if stop := h.failed(ctx, berr); stop != nil {
			return stop
		}
	}
	return h.sleep(ctx, p.cadence())
}

// hold waits for the session's end (or ctx's), and registers again next
// round when the daemon ended it NOT_FOUND. A session that keeps ending at
// once is not re-opened in a tight loop.
func (h *sessionBeats) hold(ctx context.Context, s *prefillSession) error {
	p := h.p
	opened := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.Done():
	}
	end := s.Err()
	switch {
	case h.m.isClosed():
		return errMuxClosed()
	case errors.Is(end, ErrNotFound):
		p.markReregister()
	}
	h.report(sessionEnded(muxOp, end))
	if time.Since(opened) < p.cadence() {
		h.quick++
		return h.sleep(ctx, p.c.retry.backoff(h.quick))
	}
	h.quick = 0
	return nil
}

// failed is a failed beat or registration: the error that ends the loop
// (ctx's end, or an error repeating cannot fix), or nil once the error was
// reported.
func (h *sessionBeats) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if permanent(err) {
		return err
	}
	h.report(err)
	return nil
}

// sleep waits d, or returns ctx's error.
func (h *sessionBeats) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// report passes an error the loop recovers from to OnHeartbeatError.
func (h *sessionBeats) report(err error) {
	if h.p.onErr != nil {
		h.p.onErr(err)
	}
}
