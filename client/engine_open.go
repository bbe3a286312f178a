package client

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// OpenAndWait on the shared engine session (TransportStreams): the open,
// retried as OpenRoom is, then the wait for the room's outcome, resumed on
// a new session when the one it was on ended.

// openAndWaitStream is OpenAndWait on the shared session (and
// OpenDeclareAndWait with declare).
func (c *Client) openAndWaitStream(ctx context.Context, req *pb.OpenRoomRequest, declare DeclareFunc) (*pb.Room, error) {
	const op = "OpenRoom"
	if err := c.errIfClosed(op); err != nil {
		return nil, err
	}
	req, err := c.sessionOpenRequest(req)
	if err != nil {
		return nil, err
	}
	m := c.engineMux
	if time.Now().UnixNano() < m.unaryUntil.Load() {
		return c.openAndWaitUnary(ctx, req, declare)
	}
	w, ok := m.join(req.GetRoom())
	if !ok {
		// Another call of this Client waits on this room (a caller's retry
		// with the same key, or a mistake the daemon refuses): the unary
		// path answers it exactly.
		return c.openAndWaitUnary(ctx, req, declare)
	}
	defer m.leave(w)
	for attempt := 1; ; attempt++ {
		next := c.openAttempt(ctx, req, w, attempt)
		switch {
		case next.older:
			return c.openAndWaitOlder(ctx, req, w, declare)
		case next.err != nil:
			return nil, next.err
		case next.opened:
			if next.room.GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				return next.room, nil
			}
			if err := c.declareOpened(ctx, next.room, declare); err != nil {
				return nil, err
			}
			return c.waitStream(ctx, w)
		}
		if werr := wait(ctx, op, next.delay, next.last); werr != nil {
			return nil, werr
		}
	}
}

// sessionOpenRequest is the request OpenAndWait sends on the shared
// session: a copy (the opener may still be sending it after a call that
// ended early returned its request to the caller), with an automatic
// idempotency key when the Client adds them. A request that cannot be
// marshalled (a string field that is not UTF-8) fails here as the unary
// call fails, not its whole batch.
func (c *Client) sessionOpenRequest(req *pb.OpenRoomRequest) (*pb.OpenRoomRequest, error) {
	if req == nil {
		req = &pb.OpenRoomRequest{}
	} else {
		req = proto.CloneOf(req)
	}
	if c.autoKey && req.GetIdempotencyKey() == "" {
		req.IdempotencyKey = "auto-" + rand.Text()
	}
	if _, err := proto.Marshal(req); err != nil {
		return nil, newError("OpenRoom", status.New(codes.Internal, "grpc: error while marshaling: "+err.Error()))
	}
	return req, nil
}

// openNext is what follows one attempt of OpenAndWait's open on the
// shared session: the room, opened (its first state); the call's error;
// the unary path (older: the daemon does not serve EngineSession); or,
// when none is set, another attempt after delay (last: this attempt's
// error, returned if the wait cannot end before ctx's deadline).
type openNext struct {
	opened bool
	room   *pb.Room
	err    error
	older  bool
	delay  time.Duration
	last   *Error
}

// openAttempt gets a session and sends the open on it.
func (c *Client) openAttempt(ctx context.Context, req *pb.OpenRoomRequest, w *muxWaiter, attempt int) openNext {
	const op = "OpenRoom"
	m := c.engineMux
	ms, err := m.acquire(ctx)
	if err != nil { // nothing was sent
		if ctx.Err() != nil {
			return openNext{err: ctxEnd(op, ctx.Err())}
		}
		e := reop(op, err).(*Error)
		if errors.Is(e, ErrUnimplemented) {
			return openNext{older: true}
		}
		if !transientEnd(e) || attempt >= c.retry.MaxAttempts || c.closed.Load() {
			return openNext{err: e}
		}
		return openNext{delay: c.retry.backoff(attempt), last: e}
	}
	// Attached before the open: its events may follow its reply at once. A
	// session that ended meanwhile refuses the open unsent.
	m.attach(w, ms)
	r := ms.open(ctx, withDeadline(ctx, req)) // what the deadline leaves at each attempt
	if r.err == nil && r.res.Err == nil {
		w.mu.Lock()
		w.opened, w.inc = true, r.res.Incarnation
		w.mu.Unlock()
		return openNext{opened: true, room: r.res.Open.GetRoom()}
	}
	w.mu.Lock()
	if w.sess == ms {
		w.sess = nil
	}
	w.mu.Unlock()
	keyed := req.GetIdempotencyKey() != ""
	if r.err == nil {
		// The daemon's answer: retried as the unary OpenRoom would be.
		e := reop(op, r.res.Err).(*Error)
		if !keyed || attempt >= c.retry.MaxAttempts {
			return openNext{err: e}
		}
		d, ok := c.retry.retryDelay(e.st, attempt)
		if !ok {
			return openNext{err: e}
		}
		return openNext{delay: d, last: e}
	}
	return c.openLost(ctx, req, r, keyed, attempt)
}

// openLost is what follows an open the session's end took (r.err): the
// open is sent again on a new session only when its answer cannot have
// been lost or the request is keyed.
func (c *Client) openLost(ctx context.Context, req *pb.OpenRoomRequest, r muxOpenResult, keyed bool, attempt int) openNext {
	const op = "OpenRoom"
	if ctx.Err() != nil {
		return openNext{err: ctxEnd(op, ctx.Err())}
	}
	e := sessionEnd(op, r.err)
	if c.closed.Load() {
		return openNext{err: localError(op, codes.Canceled, "the client is closed")}
	}
	if errors.Is(e, ErrUnimplemented) {
		// An older daemon: the stream was refused before any op ran
		// (whether or not the open was written), so the room was not
		// opened by it.
		return openNext{older: true}
	}
	if !transientEnd(e) {
		return openNext{err: e}
	}
	if r.sent && !keyed {
		return openNext{err: localError(op, codes.Unavailable, "the engine session ended before the open's answer (%s): room %d may be open; OpenAndWait retries only an open with an idempotency key (or WithAutoIdempotencyKey)", e.Message(), req.GetRoom())}
	}
	if attempt >= c.retry.MaxAttempts {
		return openNext{err: e}
	}
	return openNext{delay: c.retry.backoff(attempt), last: e}
}

// sessionEnd is the *Error for a session's end: io.EOF (the daemon ended
// it OK, e.g. on shutdown) reads as Unavailable.
func sessionEnd(op string, err error) *Error {
	if errors.Is(err, io.EOF) {
		return localError(op, codes.Unavailable, "the engine session ended")
	}
	return toError(op, reop(op, err))
}

// transientEnd reports whether a session that ended with e may be opened
// again: the daemon or the network went away (Unavailable), the session
// was cut as a slow consumer (ResourceExhausted) or aborted. Every other
// code (Unauthenticated, PermissionDenied, Unimplemented, InvalidArgument,
// ...) is permanent: a new session would end the same way.
func transientEnd(e *Error) bool {
	switch e.Code() {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// succeeded is what OpenAndWait waits for.
var succeeded = []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_SUCCEEDED}

// openAndWaitOlder is OpenAndWait toward a daemon that does not serve
// EngineSession (older than the sessions): w leaves the mux (its room was
// not opened on a stream), and this call and those of the Client's next
// unaryFallback take the unary path.
func (c *Client) openAndWaitOlder(ctx context.Context, req *pb.OpenRoomRequest, w *muxWaiter, declare DeclareFunc) (*pb.Room, error) {
	c.engineMux.unaryUntil.Store(time.Now().Add(unaryFallback).UnixNano())
	c.engineMux.leave(w)
	return c.openAndWaitUnary(ctx, req, declare)
}

// waitStream waits for the room's SUCCEEDED transition on the shared
// session, as WaitRoom does on a WatchRoom stream, resuming the room on a
// new session when its session ends.
func (c *Client) waitStream(ctx context.Context, w *muxWaiter) (*pb.Room, error) {
	const op = "WatchRoom"
	room := w.room
	w.mu.Lock()
	inc := w.inc // the daemon incarnation that opened the room (0: unknown)
	w.mu.Unlock()
	failures := 0 // consecutive failed attempts to get a session since the last event
	for {
		w.mu.Lock()
		evs, sess, lost, failed := w.evs, w.sess, w.lost, w.failed
		w.evs = nil
		w.mu.Unlock()
		for _, ev := range evs {
			e := ev.GetEvent()
			if i := e.GetIncarnation(); i != 0 {
				if inc == 0 {
					inc = i
				} else if i != inc {
					return nil, &IncarnationChangedError{Room: room, Old: inc, New: i, Watch: true}
				}
			}
			failures = 0
			if r, done, err := waitStep(room, e, succeeded); done {
				return r, err
			}
		}
		if failed != nil {
			// As RoomWatch: a room the daemon does not know after a
			// restart is the restart's loss.
			if inc != 0 && errors.Is(failed, ErrNotFound) {
				if st, serr := c.status(ctx); serr == nil && st.GetIncarnation() != 0 && st.GetIncarnation() != inc {
					return nil, &IncarnationChangedError{Room: room, Old: inc, New: st.GetIncarnation(), Watch: true, Err: failed}
				}
			}
			return nil, failed
		}
		if sess == nil && lost != nil {
			if err := c.reattach(ctx, w, lost, &failures); err != nil {
				return nil, err
			}
			continue
		}
		select {
		case <-w.sig:
		case <-ctx.Done():
			return nil, ctxEnd(op, ctx.Err())
		}
	}
}

// reattach gets a session again for a room whose session ended with lost:
// after a backoff, acquire (whose dial resumes the room). It returns the
// error that ends the wait: a permanent end, the attempts exhausted, ctx's
// end or the client's Close.
func (c *Client) reattach(ctx context.Context, w *muxWaiter, lost error, failures *int) error {
	const op = "WatchRoom"
	for {
		if c.closed.Load() {
			return localError(op, codes.Canceled, "the client is closed")
		}
		if ctx.Err() != nil {
			return ctxEnd(op, ctx.Err())
		}
		e := sessionEnd(op, lost)
		*failures++
		if !transientEnd(e) || *failures >= c.retry.MaxAttempts {
			return e
		}
		d := c.retry.backoff(*failures)
		if ri, ok := retryInfo(e.st); ok {
			d = ri
		}
		if werr := wait(ctx, op, d, e); werr != nil {
			return werr
		}
		m := c.engineMux
		ms, err := m.acquire(ctx)
		if err != nil {
			lost = err
			continue
		}
		w.mu.Lock()
		resumed := w.sess != nil || w.failed != nil
		cursor := w.seq
		w.mu.Unlock()
		if resumed { // the dial (this call's or another's) resumed it
			return nil
		}
		// Detached after the dial collected its rooms: resume it alone.
		if !m.attach(w, ms) {
			lost = ms.endErr()
			continue
		}
		m.resume(ctx, ms, map[uint64]uint32{w.room: cursor})
		return nil
	}
}
