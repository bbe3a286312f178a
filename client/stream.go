package client

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// serverStream is the receiving half of a generated server-streaming call.
type serverStream[Ev any] interface {
	Recv() (*Ev, error)
}

// resumable is a server stream that is re-opened, under the client's retry
// policy, when it breaks with a retryable code (or ends early). It belongs to
// one goroutine (the one calling Next); cancel may be called from any.
type resumable[Ev any] struct {
	c      *Client
	op     string
	again  bool // the RPC may be re-opened (retryTable)
	ctx    context.Context
	cancel context.CancelFunc
	// open starts the call; reopen is false the first time.
	open      func(ctx context.Context, reopen bool) (serverStream[Ev], error)
	cur       serverStream[Ev]
	curCancel context.CancelFunc // ends cur's call
	opened    bool
	failures  int   // consecutive failed (re-)opens since the last new event
	err       error // sticky: io.EOF after a normal end, else the failure
}

// openResumable starts the stream. The context bounds the whole stream,
// re-opens included.
func openResumable[Ev any, Req any](ctx context.Context, c *Client, method string, req Req,
	open func(ctx context.Context, reopen bool) (serverStream[Ev], error)) (*resumable[Ev], error) {
	op := opName(method)
	if err := c.errIfClosed(op); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &resumable[Ev]{c: c, op: op, again: retryable(method, req), ctx: sctx, cancel: cancel, open: open}
	if err := s.connect(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

// connect (re-)opens the call, retrying as the policy allows.
func (s *resumable[Ev]) connect() error {
	for {
		if err := s.c.errIfClosed(s.op); err != nil {
			return s.end(err)
		}
		ctx, cancel := context.WithCancel(s.ctx)
		st, err := s.open(ctx, s.opened)
		s.opened = true
		if err == nil {
			s.cur, s.curCancel = st, cancel
			return nil
		}
		cancel()
		if !s.backoff(toError(s.op, err)) {
			return s.err
		}
	}
}

// recv returns the next message.
func (s *resumable[Ev]) recv() (*Ev, error) {
	for {
		if s.err != nil {
			return nil, s.err
		}
		if s.cur == nil {
			if err := s.connect(); err != nil {
				return nil, err
			}
		}
		ev, err := s.cur.Recv()
		if err == nil {
			return ev, nil
		}
		s.cur = nil
		s.curCancel() // the call is over, or must be: release it before re-opening
		var e *Error
		if err == io.EOF {
			// The daemon always ends these streams with a final event; an
			// end without one means the stream was cut: open it again.
			e = localError(s.op, codes.Unavailable, "the stream ended before the room's end")
		} else {
			e = toError(s.op, err)
		}
		if !s.backoff(e) {
			return nil, s.err
		}
	}
}

// progressed resets the retry budget: the caller got an event it had not
// seen. (A replay after a re-open is not progress: a connection that breaks
// after every replay must not be re-opened forever.)
func (s *resumable[Ev]) progressed() { s.failures = 0 }

// backoff decides on a failed (re-)open or receive: it waits and reports
// true to try again, or ends the stream with the error and reports false.
func (s *resumable[Ev]) backoff(e *Error) bool {
	s.failures++
	if !s.again || s.failures >= s.c.retry.MaxAttempts {
		s.end(e)
		return false
	}
	d, ok := s.c.retry.retryDelay(e.st, s.failures)
	if !ok {
		s.end(e)
		return false
	}
	if werr := wait(s.ctx, s.op, d, e); werr != nil {
		s.end(werr)
		return false
	}
	return true
}

// replaceErr makes err the stream's final answer in place of the one it
// ended with (a refusal the caller reads as something more precise).
func (s *resumable[Ev]) replaceErr(err error) error {
	s.err = err
	s.cancel()
	return err
}

// end makes err the stream's final answer and releases the call.
func (s *resumable[Ev]) end(err error) error {
	if s.err == nil {
		s.err = err
	}
	s.cancel()
	return s.err
}

// Event is one event of an AwaitDestination stream: the destination, or the
// room's successful end. Exactly one field is set. The room's failure is not
// an event: Next returns it as a *RoomFailedError.
type Event struct {
	// Destination is where this rank writes the room's KV. A dummy
	// destination (Dummy set, MLA's extra prefill ranks) has no pages: the
	// rank sends nothing and waits for the end.
	Destination *pb.Destination
	// Done is the room's successful end; nothing follows it.
	Done *pb.RoomDone
}

// DestinationStream is an AwaitDestination stream (see
// Prefill.AwaitDestination). Next must be called from one goroutine at a
// time; Close may be called from any.
type DestinationStream struct {
	s       *resumable[pb.DestinationEvent]
	room    uint64
	seen    bool
	attempt uint32 // attempt of the last destination returned
	// inc is the daemon incarnation the stream is bound to: the request's,
	// else the first destination's (0 until known).
	inc uint64
}

// Next returns the next event: a destination, then Done. The room's failure
// is a *RoomFailedError (errors.Is(err, ErrRoomFailed)); after Done or an
// error every call returns io.EOF or that error again. A stream cut by the
// network is re-opened (the daemon re-delivers the destination, which Next
// does not return twice).
//
// The stream is bound to one daemon incarnation: the request's Incarnation,
// else the first destination's. A destination of another incarnation (the
// daemon restarted and the re-opened stream reached the new one), or the
// daemon's STALE_INCARNATION refusal of the claim, ends the stream with an
// *IncarnationChangedError (errors.Is(err, ErrIncarnationChanged)).
func (d *DestinationStream) Next() (*Event, error) {
	for {
		ev, err := d.s.recv()
		if err != nil {
			if named, daemon, ok := StaleIncarnation(err); ok {
				var ic *IncarnationChangedError
				if !errors.As(err, &ic) {
					old := d.inc
					if old == 0 {
						old = named
					}
					err = d.s.replaceErr(&IncarnationChangedError{Room: d.room, Old: old, New: daemon, Err: err})
				}
			}
			return nil, err
		}
		switch {
		case ev.GetDestination() != nil:
			dst := ev.GetDestination()
			if inc := dst.GetIncarnation(); inc != 0 {
				if d.inc == 0 {
					d.inc = inc
				} else if inc != d.inc {
					return nil, d.s.end(&IncarnationChangedError{Room: d.room, Old: d.inc, New: inc})
				}
			}
			if d.seen && dst.GetAttempt() == d.attempt {
				continue // re-delivered after a re-open
			}
			d.seen, d.attempt = true, dst.GetAttempt()
			d.s.progressed()
			return &Event{Destination: dst}, nil
		case ev.GetDone() != nil:
			d.s.end(io.EOF)
			return &Event{Done: ev.GetDone()}, nil
		case ev.GetFailure() != nil:
			rf := roomFailed(d.room, ev.GetFailure())
			rf.AckRequired = ev.GetAckRequired()
			return nil, d.s.end(rf)
		}
		// An event this client does not know (a newer daemon): skip it.
	}
}

// Close ends the stream. The daemon keeps a claim the rank already made
// (the destination was delivered); closing before that withdraws it.
func (d *DestinationStream) Close() { d.s.cancel() }

// RoomWatch is a WatchRoom stream (see Engine.WatchRoom). Next must be
// called from one goroutine at a time; Close may be called from any.
type RoomWatch struct {
	s *resumable[pb.RoomEvent]
	// c and ctx ask the daemon's incarnation (GetStatus) when a re-opened
	// watch finds the room gone; room names it in the error.
	c    *Client
	ctx  context.Context
	room uint64
	// inc is the daemon incarnation of the first event (0 until known, or
	// from a daemon older than RoomEvent.incarnation).
	inc uint64
	// last is the newest transition returned; atLast are the transitions
	// returned with its time (to skip them after a re-open).
	last   *pb.Transition
	atLast []*pb.Transition
}

// Next returns the room's next event. The terminal event has Terminal set
// (the room was released or failed: a failure is an event here, with
// Room.Failure, not an error). The last event has PagesReusable set: the
// terminal event itself, or, for a room that failed while a prefill rank
// could still write into its pages, one more event once they are reusable
// (its drain ended); after it Next returns io.EOF. An engine that owns its
// pages reuses a failed room's pages only then.
//
// Read the phase from Transition: events the daemon replays (History, and
// the transitions missed while a cut stream was re-opened) carry the room's
// current state in Room, not its state after that transition.
//
// The watch is bound to the daemon incarnation of its first event. When the
// daemon restarted (a re-opened watch gets an event of another incarnation,
// or the room is not found and GetStatus gives another incarnation), the
// room died with the old process: Next returns an *IncarnationChangedError
// (errors.Is(err, ErrIncarnationChanged), Watch set) naming the room, not
// the new daemon's NOT_FOUND.
func (w *RoomWatch) Next() (*pb.RoomEvent, error) {
	for {
		ev, err := w.s.recv()
		if err != nil {
			if w.inc != 0 && errors.Is(err, ErrNotFound) {
				// Only on this rare path: one GetStatus, bounded by the
				// watch's context and the client's retry policy.
				if st, serr := w.c.status(w.ctx); serr == nil && st.GetIncarnation() != 0 && st.GetIncarnation() != w.inc {
					err = w.s.replaceErr(&IncarnationChangedError{Room: w.room, Old: w.inc, New: st.GetIncarnation(), Watch: true, Err: err})
				}
			}
			return nil, err
		}
		if inc := ev.GetIncarnation(); inc != 0 {
			if w.inc == 0 {
				w.inc = inc
			} else if inc != w.inc {
				return nil, w.s.end(&IncarnationChangedError{Room: w.room, Old: w.inc, New: inc, Watch: true})
			}
		}
		if !w.fresh(ev.GetTransition()) {
			continue
		}
		w.s.progressed()
		if ev.GetPagesReusable() {
			w.s.end(io.EOF)
		}
		return ev, nil
	}
}

// fresh reports whether t has not been returned yet, and records it.
// Transitions are returned in time order, so after a re-open (which replays
// the timeline) everything older than the newest returned is skipped.
func (w *RoomWatch) fresh(t *pb.Transition) bool {
	if t.GetAt() == nil {
		return true
	}
	if w.last == nil {
		w.last, w.atLast = t, []*pb.Transition{t}
		return true
	}
	at, last := t.GetAt().AsTime(), w.last.GetAt().AsTime()
	switch {
	case at.Before(last):
		return false
	case at.Equal(last):
		for _, s := range w.atLast {
			if proto.Equal(s, t) {
				return false
			}
		}
		w.atLast = append(w.atLast, t)
		return true
	}
	w.last, w.atLast = t, []*pb.Transition{t}
	return true
}

// Close ends the stream.
func (w *RoomWatch) Close() { w.s.cancel() }
