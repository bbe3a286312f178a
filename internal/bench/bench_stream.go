package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// --api stream: the decode engine runs every room on one EngineSession of
// its connection (a demultiplexer hands each room's events to the room;
// the opens are batched as a group commit: one opener per session sends
// every open queued while its previous batch was in flight, so a lone room
// waits for nothing and under load a batch carries many rooms; with
// tracing on each room is opened alone, in its own trace),
// and each prefill rank hands its rooms off on one PrefillSession
// (SendRoomSession). A session that ends (slow consumer, daemon gone)
// fails the rooms it carried, each with errBenchSessionEnded and the
// session's status; the next room opens a new session (reopened lazily, so
// a daemon that is gone fails each room once and the watchdog stops the
// run).

// errBenchSessionEnded marks a room whose engine session ended under it.
var errBenchSessionEnded = errors.New("engine session ended")

// benchEngine is the decode engine's session, re-opened after it ended.
type benchEngine struct {
	c      *client.Client
	ctx    context.Context // the sessions' lifetime
	cancel context.CancelFunc
	now    func() int64
	batch  bool // group the opens (off with tracing: one trace per room)

	mu  sync.Mutex
	cur *benchEngineSession
	wg  sync.WaitGroup // the demultiplexers
}

func newBenchEngine(c *client.Client, now func() int64, batch bool) *benchEngine {
	ctx, cancel := context.WithCancel(context.Background())
	return &benchEngine{c: c, ctx: ctx, cancel: cancel, now: now, batch: batch}
}

// benchEngineSession is one EngineSession and the rooms waiting on it.
type benchEngineSession struct {
	s     *client.EngineSession
	opens chan *benchOpen
	quit  chan struct{} // closed when the session ended

	mu    sync.Mutex
	rooms map[uint64]*benchWaiter
	err   error // set once the session ended
}

// benchWaiter is one room's events, as the demultiplexer hands them over.
type benchWaiter struct {
	mu  sync.Mutex
	evs []*pb.EngineRoomEvent
	err error
	sig chan struct{} // cap 1: something arrived
}

func (w *benchWaiter) push(ev *pb.EngineRoomEvent) {
	w.mu.Lock()
	w.evs = append(w.evs, ev)
	w.mu.Unlock()
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

func (w *benchWaiter) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// waitSucceeded waits for the room's SUCCEEDED transition, as
// client.WaitRoom does on a WatchRoom stream: a terminal event before it is
// the room's failure.
func (w *benchWaiter) waitSucceeded(ctx context.Context, room uint64) error {
	for {
		w.mu.Lock()
		evs, err := w.evs, w.err
		w.evs = nil
		w.mu.Unlock()
		for _, e := range evs {
			ev := e.GetEvent()
			ph := ev.GetTransition().GetPhase()
			if ev.GetTransition() == nil {
				ph = ev.GetRoom().GetPhase()
			}
			if ph == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				return nil
			}
			if !ev.GetTerminal() {
				continue
			}
			if ph == pb.RoomPhase_ROOM_PHASE_FAILED {
				f := ev.GetRoom().GetFailure()
				return &client.RoomFailedError{Room: room, Code: f.GetCode(), Message: f.GetMessage(), FromAnotherRank: f.GetFromAnotherRank()}
			}
			return fmt.Errorf("room %d ended in %s before reaching ROOM_PHASE_SUCCEEDED", room, ph)
		}
		if err != nil {
			return err
		}
		select {
		case <-w.sig:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// session returns the live session, opening one if there is none or the
// last one ended.
func (e *benchEngine) session() (*benchEngineSession, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.cur; cur != nil {
		cur.mu.Lock()
		ended := cur.err != nil
		cur.mu.Unlock()
		if !ended {
			return cur, nil
		}
		cur.s.Close()
		e.cur = nil
	}
	if err := e.ctx.Err(); err != nil {
		return nil, err
	}
	s, err := e.c.EngineSession(e.ctx, client.SessionEvents(pb.EngineEvents_ENGINE_EVENTS_OUTCOME))
	if err != nil {
		return nil, err
	}
	es := &benchEngineSession{s: s, rooms: map[uint64]*benchWaiter{}, opens: make(chan *benchOpen, pb.MaxEngineOpenRooms), quit: make(chan struct{})}
	e.cur = es
	e.wg.Go(func() { es.demux() })
	if e.batch {
		e.wg.Go(func() { es.opener(e.ctx) })
	}
	return es, nil
}

// benchOpen is a room's open waiting for its batch.
type benchOpen struct {
	req  *pb.OpenRoomRequest
	done chan client.SessionResult // cap 1
}

// opener sends the queued opens, as many per batch as were queued (at most
// pb.MaxEngineOpenRooms), until the session ends.
func (es *benchEngineSession) opener(ctx context.Context) {
	batch := make([]*benchOpen, 0, pb.MaxEngineOpenRooms)
	reqs := make([]*pb.OpenRoomRequest, 0, pb.MaxEngineOpenRooms)
	for {
		batch, reqs = batch[:0], reqs[:0]
		select {
		case o := <-es.opens:
			batch = append(batch, o)
		case <-es.quit:
			return
		}
	more:
		for len(batch) < pb.MaxEngineOpenRooms {
			select {
			case o := <-es.opens:
				batch = append(batch, o)
			default:
				break more
			}
		}
		for _, o := range batch {
			reqs = append(reqs, o.req)
		}
		res, err := es.s.Open(ctx, reqs...)
		if err == nil && len(res) != len(batch) {
			err = fmt.Errorf("EngineSession.Open: %d results for %d rooms", len(res), len(batch))
		}
		for i, o := range batch {
			r := client.SessionResult{Room: o.req.GetRoom(), Err: err}
			if err == nil {
				r = res[i]
			}
			o.done <- r
		}
	}
}

// open opens one room, in a batch when batching.
func (e *benchEngine) open(ctx context.Context, es *benchEngineSession, req *pb.OpenRoomRequest) (sent bool, err error) {
	if !e.batch {
		res, err := es.s.Open(ctx, req)
		if err == nil && len(res) != 1 {
			err = fmt.Errorf("EngineSession.Open: %d results for one room", len(res))
		}
		if err == nil {
			err = res[0].Err
		}
		return true, err
	}
	o := &benchOpen{req: req, done: make(chan client.SessionResult, 1)}
	select {
	case es.opens <- o:
	case <-es.quit:
		return false, es.endErr()
	case <-ctx.Done():
		return false, ctx.Err()
	}
	select {
	case r := <-o.done:
		return true, r.Err
	case <-es.quit:
		// The opener may have sent it: the caller aborts it.
		return true, es.endErr()
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

func (es *benchEngineSession) endErr() error {
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.err
}

// demux hands every event to its room's waiter until the session ends, then
// fails the rooms still waiting.
func (es *benchEngineSession) demux() {
	for {
		ev, err := es.s.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the daemon ended it")
			}
			err = fmt.Errorf("%w: %w", errBenchSessionEnded, err)
			es.mu.Lock()
			es.err = err
			ws := es.rooms
			es.rooms = nil
			es.mu.Unlock()
			close(es.quit)
			for _, w := range ws {
				w.fail(err)
			}
			return
		}
		es.mu.Lock()
		w := es.rooms[ev.GetRoom()]
		es.mu.Unlock()
		if w != nil {
			w.push(ev)
		}
	}
}

// subscribe registers the room's waiter before its open: its events may
// follow the open's reply at once.
func (es *benchEngineSession) subscribe(room uint64) (*benchWaiter, error) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.err != nil {
		return nil, es.err
	}
	w := &benchWaiter{sig: make(chan struct{}, 1)}
	es.rooms[room] = w
	return w, nil
}

func (es *benchEngineSession) unsubscribe(room uint64) {
	es.mu.Lock()
	delete(es.rooms, room)
	es.mu.Unlock()
}

// run is the decode engine's part of a room on the session: open, wait for
// Success, release. tSucc is when Success was seen (or the room gave up).
func (e *benchEngine) run(ctx context.Context, req *pb.OpenRoomRequest) (opened bool, tSucc int64, err error) {
	es, err := e.session()
	if err != nil {
		return false, e.now(), err
	}
	room := req.GetRoom()
	w, err := es.subscribe(room)
	if err != nil {
		return false, e.now(), err
	}
	defer es.unsubscribe(room)
	sent, err := e.open(ctx, es, req)
	if err != nil {
		if es.ended() && !errors.Is(err, errBenchSessionEnded) {
			err = fmt.Errorf("%w: %w", errBenchSessionEnded, err)
		}
		// An open that timed out or whose session ended may have been
		// made: aborted as an opened room (an abort of an unknown room is
		// a harmless NotFound).
		var ce *client.Error
		opened := sent && (errors.Is(err, errBenchSessionEnded) || errors.Is(err, context.DeadlineExceeded) ||
			errors.As(err, &ce) && ce.Code() == codes.DeadlineExceeded)
		return opened, e.now(), err
	}
	err = w.waitSucceeded(ctx, room)
	tSucc = e.now()
	if err == nil {
		_, err = es.s.Release(ctx, &pb.ReleaseRoomRequest{Room: room})
		if err != nil && es.ended() {
			err = fmt.Errorf("%w: %w", errBenchSessionEnded, err)
		}
	}
	return true, tSucc, err
}

func (es *benchEngineSession) ended() bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.err != nil
}

// abort aborts a room on the session (on the unary AbortRoom when no
// session can be had).
func (e *benchEngine) abort(ctx context.Context, req *pb.AbortRoomRequest) error {
	es, err := e.session()
	if err == nil {
		if _, err = es.s.Abort(ctx, req); err == nil || !es.ended() {
			return err
		}
	}
	_, err = e.c.AbortRoom(ctx, req)
	return err
}

// close ends the session and waits for its demultiplexer.
func (e *benchEngine) close() {
	e.cancel()
	e.mu.Lock()
	if e.cur != nil {
		e.cur.s.Close()
		e.cur = nil
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// benchPrefillSession is a prefill rank's session, re-opened after it
// ended.
type benchPrefillSession struct {
	p      *client.Prefill
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	s  *client.Session
}

func newBenchPrefillSession(p *client.Prefill) *benchPrefillSession {
	ctx, cancel := context.WithCancel(context.Background())
	return &benchPrefillSession{p: p, ctx: ctx, cancel: cancel}
}

func (ps *benchPrefillSession) get() (*client.Session, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.s != nil {
		select {
		case <-ps.s.Done():
			ps.s.Close()
			ps.s = nil
		default:
			return ps.s, nil
		}
	}
	if err := ps.ctx.Err(); err != nil {
		return nil, err
	}
	s, err := ps.p.Session(ps.ctx)
	if err != nil {
		return nil, err
	}
	ps.s = s
	return s, nil
}

// send is SendRoom over the rank's session.
func (ps *benchPrefillSession) send(ctx context.Context, room uint64, o client.SendOptions) error {
	s, err := ps.get()
	if err != nil {
		return err
	}
	_, err = ps.p.SendRoomSession(ctx, s, room, o)
	return err
}

func (ps *benchPrefillSession) close() {
	ps.cancel()
	ps.mu.Lock()
	if ps.s != nil {
		ps.s.Close()
		ps.s = nil
	}
	ps.mu.Unlock()
}

// benchSessionReason names a room failed by its session's end, with the
// session's code.
func benchSessionReason(err error) string {
	var ce *client.Error
	code := codes.Unknown
	if errors.As(err, &ce) {
		code = ce.Code()
	}
	return "engine session ended: " + code.String()
}
