package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// engineMux carries OpenAndWait under TransportStreams: one EngineSession
// shared by every OpenAndWait of the Client, opened at the first one (and
// again after it ended), and a demultiplexer handing each room's events to
// the call waiting on it.
//
// Opens are a group commit: one opener goroutine per session sends every
// open queued while its previous batch was in flight, in one EngineOpen (at
// most pb.MaxEngineOpenRooms), each room with its caller's trace context
// (EngineOpen.traceparents): a lone room waits for nothing, under load a
// batch carries many rooms, and each room's span still joins its own
// caller's trace.
//
// When the session ends (slow consumer, daemon restart, network), each
// waiting call backs off under the Client's RetryPolicy and asks for a
// session again; the first one opens a new session and resumes every room
// still waited on (EngineSession.Resume with each room's last seq: nothing
// twice, nothing missed). The mux's goroutines are the open session's
// demultiplexer and opener, and a session being opened; Close ends them
// and waits for them.
//
// The daemon subscribes a stream to at most pb.MaxEngineSessionRooms
// (16,384) rooms, each until its end (a room whose caller left stays
// subscribed, its events dropped here). The mux opens no second session
// past it: the open gets the daemon's RESOURCE_EXHAUSTED, as OpenRoom's
// refusal. That is far beyond a decode engine's running batch, and one
// stream per Client keeps the resume and the ordering simple.
type engineMux struct {
	c      *Client
	ctx    context.Context // the sessions' lifetime: Client.Close ends it
	cancel context.CancelFunc

	mu sync.Mutex
	// cur is the session in use (nil: none yet, or Close); it may have
	// ended: acquire replaces it then.
	cur *muxSession
	// dialing is the session being opened, when one is.
	dialing *muxDial
	// rooms are the rooms waited on, across sessions: an entry lives from
	// its call's open to its return.
	rooms map[uint64]*muxWaiter
	wg    sync.WaitGroup // dials, demultiplexers, openers
	// queued, when set (tests, before the first use), is told how many
	// opens wait for their batch after each open is queued.
	queued func(n int)
	// unaryUntil (unix nanoseconds): the daemon does not serve
	// EngineSession (an older one answered UNIMPLEMENTED): OpenAndWait
	// takes the unary path until then, and tries the session again after
	// (a rolling upgrade, or one old replica behind a load balancer).
	unaryUntil atomic.Int64
}

// unaryFallback is how long OpenAndWait stays on the unary path after an
// UNIMPLEMENTED EngineSession.
const unaryFallback = time.Minute

func newEngineMux(c *Client) *engineMux {
	ctx, cancel := context.WithCancel(context.Background())
	return &engineMux{c: c, ctx: ctx, cancel: cancel, rooms: map[uint64]*muxWaiter{}}
}

// muxDial is one opening of a session; done is closed when it is over.
type muxDial struct {
	done chan struct{}
	s    *muxSession
	err  error
}

// muxSession is one EngineSession of the mux.
type muxSession struct {
	m      *engineMux
	s      *EngineSession
	cancel context.CancelFunc // the stream's context
	quit   chan struct{}      // closed once the session ended (err set)
	kick   chan struct{}      // cap 1: an open was queued

	mu    sync.Mutex
	err   error      // why it ended: an *Error, or io.EOF (the daemon ended it OK); nil while live
	queue []*muxOpen // opens not yet sent
}

// muxOpen is a room's open waiting for its batch.
type muxOpen struct {
	ctx  context.Context // the caller's: its trace context; an open whose caller left is not sent
	req  *pb.OpenRoomRequest
	done chan muxOpenResult // cap 1
}

// muxOpenResult is an open's fate: the daemon's answer (res), or the
// session's end or the caller's (err), with whether the open was sent.
type muxOpenResult struct {
	res  SessionResult
	err  error
	sent bool
}

// muxWaiter is one OpenAndWait's room: the events the demultiplexer handed
// over, and which session it is subscribed on.
type muxWaiter struct {
	room uint64
	sig  chan struct{} // cap 1: something changed

	mu sync.Mutex
	// sess is the session the room's events come on; nil before the open
	// and after that session ended (detached: to resume).
	sess *muxSession
	// opened: the daemon answered the open OK; only an opened room is
	// resumed on a new session.
	opened bool
	// inc is the daemon incarnation that answered the open.
	inc uint64
	// seq is the last event seq handed over (the resume cursor).
	seq uint32
	evs []*pb.EngineRoomEvent
	// lost is the end of the session the room was detached from.
	lost error
	// failed: the room could not be resumed (the Resume's result).
	failed error
}

func (w *muxWaiter) signal() {
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// push hands over an event of session s, dropping one already handed over
// (a room re-subscribed from its start by a keyed re-open).
func (w *muxWaiter) push(s *muxSession, ev *pb.EngineRoomEvent) {
	w.mu.Lock()
	if w.sess != s || ev.GetSeq() <= w.seq {
		w.mu.Unlock()
		return
	}
	w.seq = ev.GetSeq()
	w.evs = append(w.evs, ev)
	w.mu.Unlock()
	w.signal()
}

// acquire returns the session in use, opening one (and resuming the rooms
// waited on) when there is none or it ended. It waits at most until ctx's
// end; the opening itself runs under the mux's context.
func (m *engineMux) acquire(ctx context.Context) (*muxSession, error) {
	m.mu.Lock()
	if m.ctx.Err() != nil {
		m.mu.Unlock()
		return nil, localError("EngineSession", codes.Canceled, "the client is closed")
	}
	if cur := m.cur; cur != nil && !cur.ended() {
		m.mu.Unlock()
		return cur, nil
	}
	d := m.dialing
	if d == nil {
		d = &muxDial{done: make(chan struct{})}
		m.dialing = d
		m.wg.Go(func() { m.dial(d) })
	}
	m.mu.Unlock()
	select {
	case <-d.done:
		return d.s, d.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dial opens a session, resumes on it every opened room whose session
// ended, and makes it the one in use.
func (m *engineMux) dial(d *muxDial) {
	defer close(d.done)
	sctx, cancel := context.WithCancel(m.ctx)
	// One event per room, its outcome: what OpenAndWait waits for.
	s, err := m.c.EngineSession(sctx, SessionEvents(pb.EngineEvents_ENGINE_EVENTS_OUTCOME))
	if err != nil {
		cancel()
		m.mu.Lock()
		m.dialing = nil
		m.mu.Unlock()
		d.err = err
		return
	}
	ms := &muxSession{m: m, s: s, cancel: cancel, quit: make(chan struct{}), kick: make(chan struct{}, 1)}
	m.wg.Go(ms.demux)
	m.wg.Go(ms.opener)

	// The rooms to resume are attached before the Resume is sent: their
	// events may follow its reply at once.
	m.mu.Lock()
	cursors := map[uint64]uint32{}
	if !ms.ended() {
		for room, w := range m.rooms {
			w.mu.Lock()
			if w.opened && w.sess == nil && w.failed == nil {
				w.sess, w.lost = ms, nil
				cursors[room] = w.seq
			}
			w.mu.Unlock()
		}
	}
	m.mu.Unlock()
	if len(cursors) > 0 {
		m.resume(m.ctx, ms, cursors)
	}

	m.mu.Lock()
	m.dialing = nil
	if m.ctx.Err() != nil { // Close came meanwhile
		m.mu.Unlock()
		s.Close()
		d.err = localError("EngineSession", codes.Canceled, "the client is closed")
		return
	}
	m.cur = ms
	m.mu.Unlock()
	d.s = ms
}

// resume re-subscribes on ms the rooms attached to it, from their cursors.
// A room the daemon refuses (NOT_FOUND after a restart, the stream's room
// bound) fails its wait with the refusal. An op refused as a whole
// (INVALID_ARGUMENT) fails the rooms it carried; the session's end detaches
// them again (the demultiplexer).
func (m *engineMux) resume(ctx context.Context, ms *muxSession, cursors map[uint64]uint32) {
	res, err := ms.s.Resume(ctx, cursors)
	got := make(map[uint64]bool, len(res))
	for _, r := range res {
		got[r.Room] = true
		if r.Err != nil {
			m.fail(r.Room, ms, reop("WatchRoom", r.Err))
		}
	}
	if errors.Is(err, ErrInvalidArgument) {
		for room := range cursors {
			if !got[room] {
				m.fail(room, ms, reop("WatchRoom", err))
			}
		}
	}
}

// attach subscribes w's events to ms unless ms ended.
func (m *engineMux) attach(w *muxWaiter, ms *muxSession) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ms.ended() {
		return false
	}
	w.mu.Lock()
	w.sess, w.lost = ms, nil
	w.mu.Unlock()
	return true
}

// fail ends the wait of room (resumed on ms) with err.
func (m *engineMux) fail(room uint64, ms *muxSession, err error) {
	m.mu.Lock()
	w := m.rooms[room]
	m.mu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.sess == ms {
		w.failed = err
	}
	w.mu.Unlock()
	w.signal()
}

// close ends the session in use and waits for every goroutine of the mux.
func (m *engineMux) close() {
	m.cancel()
	m.mu.Lock()
	cur := m.cur
	m.cur = nil
	m.mu.Unlock()
	if cur != nil {
		cur.s.Close()
	}
	m.wg.Wait()
}

// join registers room's waiter; false when the room is already waited on
// by another call of this Client.
func (m *engineMux) join(room uint64) (*muxWaiter, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.rooms[room]; dup {
		return nil, false
	}
	w := &muxWaiter{room: room, sig: make(chan struct{}, 1)}
	m.rooms[room] = w
	return w, true
}

// leave forgets the waiter: the room's later events are dropped (the
// session stays subscribed to it until its end, as the daemon decides).
func (m *engineMux) leave(w *muxWaiter) {
	m.mu.Lock()
	if m.rooms[w.room] == w {
		delete(m.rooms, w.room)
	}
	m.mu.Unlock()
}

func (ms *muxSession) ended() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.err != nil
}

// demux hands every event to its room's waiter until the session ends,
// then detaches the rooms waiting on it and answers the opens never sent.
func (ms *muxSession) demux() {
	m := ms.m
	for {
		ev, err := ms.s.Next()
		if err == nil {
			m.mu.Lock()
			w := m.rooms[ev.GetRoom()]
			m.mu.Unlock()
			if w != nil {
				w.push(ms, ev)
			}
			continue
		}
		ms.s.Close()
		ms.cancel()
		// Ended and detached at once under m.mu: a room is never left
		// attached to a session that ended (attach and dial check under it).
		m.mu.Lock()
		ms.mu.Lock()
		ms.err = err
		queued := ms.queue
		ms.queue = nil
		ms.mu.Unlock()
		close(ms.quit)
		for _, o := range queued {
			o.done <- muxOpenResult{err: err}
		}
		for _, w := range m.rooms {
			w.mu.Lock()
			detached := w.sess == ms
			if detached {
				w.sess, w.lost = nil, err
			}
			w.mu.Unlock()
			if detached {
				w.signal()
			}
		}
		m.mu.Unlock()
		return
	}
}

// open queues an open for the next batch and waits for its fate.
func (ms *muxSession) open(ctx context.Context, req *pb.OpenRoomRequest) muxOpenResult {
	o := &muxOpen{ctx: ctx, req: req, done: make(chan muxOpenResult, 1)}
	ms.mu.Lock()
	if err := ms.err; err != nil {
		ms.mu.Unlock()
		return muxOpenResult{err: err}
	}
	ms.queue = append(ms.queue, o)
	n := len(ms.queue)
	ms.mu.Unlock()
	if h := ms.m.queued; h != nil {
		h(n)
	}
	select {
	case ms.kick <- struct{}{}:
	default:
	}
	select {
	case r := <-o.done:
		return r
	case <-ctx.Done():
		// The opener may send it still (the room is then left open, as a
		// cancelled OpenRoom may leave it).
		return muxOpenResult{err: ctx.Err(), sent: true}
	}
}

// opener sends the queued opens, every one queued while the previous batch
// was in flight (at most pb.MaxEngineOpenRooms a batch), until the session
// ends.
func (ms *muxSession) opener() {
	for {
		select {
		case <-ms.kick:
		case <-ms.quit:
			return
		}
		for {
			ms.mu.Lock()
			if ms.err != nil {
				ms.mu.Unlock()
				return // the demultiplexer answered what was queued
			}
			batch := ms.queue
			if len(batch) > pb.MaxEngineOpenRooms {
				batch = append([]*muxOpen(nil), batch[:pb.MaxEngineOpenRooms]...)
				ms.queue = ms.queue[pb.MaxEngineOpenRooms:]
			} else {
				ms.queue = nil
			}
			ms.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			ms.send(batch)
		}
	}
}

// send opens one batch and answers each of its opens.
func (ms *muxSession) send(batch []*muxOpen) {
	live := batch[:0:0]
	for _, o := range batch {
		if err := o.ctx.Err(); err != nil {
			o.done <- muxOpenResult{err: err} // its caller left: not sent
			continue
		}
		live = append(live, o)
	}
	if len(live) == 0 {
		return
	}
	reqs := make([]*pb.OpenRoomRequest, len(live))
	ctxs := make([]context.Context, len(live))
	for i, o := range live {
		reqs[i], ctxs[i] = o.req, o.ctx
	}
	res, err := ms.s.OpenEach(ms.m.ctx, reqs, ctxs)
	if err != nil && !errors.Is(err, ErrInvalidArgument) {
		// Not the op's refusal (INVALID_ARGUMENT, the only one): the
		// stream ended, or could not carry the op (every request was
		// checked to marshal, so this is not expected). The session is
		// ended in either case, and its status, the demultiplexer's to
		// read, is the batch's (an end the op saw as "the session ended"
		// may be the daemon's OK end, which a new session may follow).
		ms.cancel()
		<-ms.quit
		if end := ms.endErr(); !errors.Is(end, ErrCanceled) || ms.m.ctx.Err() != nil {
			err = end
		}
	}
	if err == nil && len(res) != len(live) {
		err = localError("EngineSession.Open", codes.Internal, "the daemon answered %d results for %d rooms", len(res), len(live))
	}
	for i, o := range live {
		if err != nil {
			o.done <- muxOpenResult{err: err, sent: true}
			continue
		}
		r := res[i]
		if r.Err != nil {
			r.Err = unprefix(r.Err, fmt.Sprintf("open.rooms[%d].", i))
		}
		o.done <- muxOpenResult{res: r, sent: true}
	}
}

// unprefix rebuilds an open's refusal as OpenRoom gives it: the batch's
// field prefix (open.rooms[i].) removed from each line of the message.
func unprefix(err error, prefix string) error {
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Message(), prefix) {
		return err
	}
	lines := strings.Split(e.Message(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, prefix)
	}
	sp := e.Status().Proto() // a copy: the details (RetryInfo) stay
	sp.Message = strings.Join(lines, "\n")
	return newError(e.Op(), status.FromProto(sp))
}

// reop is err as the unary RPC op returns it: the same status (code,
// message, details) under op's name.
func reop(op string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return newError(op, e.Status())
	}
	return toError(op, err)
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

// ctxEnd is the *Error of op for ctx's end.
func ctxEnd(op string, err error) *Error {
	return newError(op, status.FromContextError(err))
}

// openAndWaitStream is OpenAndWait on the shared session.
func (c *Client) openAndWaitStream(ctx context.Context, req *pb.OpenRoomRequest) (*pb.Room, error) {
	const op = "OpenRoom"
	if err := c.errIfClosed(op); err != nil {
		return nil, err
	}
	// A copy: the opener may still be sending it after a call that ended
	// early returned its request to the caller.
	if req == nil {
		req = &pb.OpenRoomRequest{}
	} else {
		req = proto.CloneOf(req)
	}
	if c.autoKey && req.GetIdempotencyKey() == "" {
		req.IdempotencyKey = "auto-" + rand.Text()
	}
	// A request that cannot be marshalled (a string field that is not
	// UTF-8) fails here as the unary call fails, not its whole batch.
	if _, err := proto.Marshal(req); err != nil {
		return nil, newError(op, status.New(codes.Internal, "grpc: error while marshaling: "+err.Error()))
	}
	m := c.engine
	if time.Now().UnixNano() < m.unaryUntil.Load() {
		return c.openAndWaitUnary(ctx, req)
	}
	w, ok := m.join(req.GetRoom())
	if !ok {
		// Another call of this Client waits on this room (a caller's retry
		// with the same key, or a mistake the daemon refuses): the unary
		// path answers it exactly.
		return c.openAndWaitUnary(ctx, req)
	}
	defer m.leave(w)
	keyed := req.GetIdempotencyKey() != ""
	var room *pb.Room
	for attempt := 1; ; attempt++ {
		ms, err := m.acquire(ctx)
		if err != nil { // nothing was sent
			if ctx.Err() != nil {
				return nil, ctxEnd(op, ctx.Err())
			}
			e := reop(op, err).(*Error)
			if errors.Is(e, ErrUnimplemented) {
				return c.openAndWaitOlder(ctx, req, w)
			}
			if !transientEnd(e) || attempt >= c.retry.MaxAttempts || c.closed.Load() {
				return nil, e
			}
			if werr := wait(ctx, op, c.retry.backoff(attempt), e); werr != nil {
				return nil, werr
			}
			continue
		}
		// Attached before the open: its events may follow its reply at
		// once. A session that ended meanwhile refuses the open unsent.
		m.attach(w, ms)
		r := ms.open(ctx, req)
		if r.err == nil && r.res.Err == nil {
			w.mu.Lock()
			w.opened, w.inc = true, r.res.Incarnation
			w.mu.Unlock()
			room = r.res.Open.GetRoom()
			break
		}
		w.mu.Lock()
		if w.sess == ms {
			w.sess = nil
		}
		w.mu.Unlock()
		if r.err == nil {
			// The daemon's answer: retried as the unary OpenRoom would be.
			e := reop(op, r.res.Err).(*Error)
			if !keyed || attempt >= c.retry.MaxAttempts {
				return nil, e
			}
			d, ok := c.retry.retryDelay(e.st, attempt)
			if !ok {
				return nil, e
			}
			if werr := wait(ctx, op, d, e); werr != nil {
				return nil, werr
			}
			continue
		}
		if ctx.Err() != nil {
			return nil, ctxEnd(op, ctx.Err())
		}
		// The session ended under the open.
		e := sessionEnd(op, r.err)
		if c.closed.Load() {
			return nil, localError(op, codes.Canceled, "the client is closed")
		}
		if errors.Is(e, ErrUnimplemented) {
			// An older daemon: the stream was refused before any op ran
			// (whether or not the open was written), so the room was not
			// opened by it.
			return c.openAndWaitOlder(ctx, req, w)
		}
		if !transientEnd(e) {
			return nil, e
		}
		if r.sent && !keyed {
			return nil, localError(op, codes.Unavailable, "the engine session ended before the open's answer (%s): room %d may be open; OpenAndWait retries only an open with an idempotency key (or WithAutoIdempotencyKey)", e.Message(), req.GetRoom())
		}
		if attempt >= c.retry.MaxAttempts {
			return nil, e
		}
		if werr := wait(ctx, op, c.retry.backoff(attempt), e); werr != nil {
			return nil, werr
		}
	}
	if room.GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		return room, nil
	}
	return c.waitStream(ctx, w)
}

// succeeded is what OpenAndWait waits for.
var succeeded = []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_SUCCEEDED}

// openAndWaitOlder is OpenAndWait toward a daemon that does not serve
// EngineSession (older than the sessions): w leaves the mux (its room was
// not opened on a stream), and this call and those of the Client's next
// unaryFallback take the unary path.
func (c *Client) openAndWaitOlder(ctx context.Context, req *pb.OpenRoomRequest, w *muxWaiter) (*pb.Room, error) {
	c.engine.unaryUntil.Store(time.Now().Add(unaryFallback).UnixNano())
	c.engine.leave(w)
	return c.openAndWaitUnary(ctx, req)
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
				if st, serr := c.Status(ctx); serr == nil && st.GetIncarnation() != 0 && st.GetIncarnation() != inc {
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
		m := c.engine
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

// endErr is why the session ended (nil while live).
func (ms *muxSession) endErr() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.err
}
