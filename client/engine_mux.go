package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

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
	s      *engineSession
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
	res  sessionResult
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
	s, err := m.c.openEngineSession(sctx, sessionEvents(pb.EngineEvents_ENGINE_EVENTS_OUTCOME))
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

// live returns the shared session when one is up, without opening one.
func (m *engineMux) live() *muxSession {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.cur; cur != nil && !cur.ended() {
		return cur
	}
	return nil
}
