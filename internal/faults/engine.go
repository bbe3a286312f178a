package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Engine is the simulated decode engine: one EngineSession stream to a
// daemon (packed both ways, as the Go client's), on which it opens rooms in
// batches, aborts and releases them, and records every event of every room
// with the time it came. With autoRelease it releases each room as soon as
// it succeeds (the engine decoded in no time).
type Engine struct {
	s           *Stage
	name        string
	d           *Daemon
	autoRelease bool
	// conn, when set, is the engine's own connection (a slow consumer's,
	// with small flow-control windows); else the daemon client's.
	conn *grpc.ClientConn

	mu      sync.Mutex
	rooms   map[uint64]*Room
	changed chan struct{} // closed (and replaced) on every change of a room
	pending map[uint64]func(*pb.EngineReply)
	inc     uint64 // the daemon incarnation of the current stream

	sendMu sync.Mutex
	seq    uint64
	stream pb.EngineSession_SessionClient
	cancel context.CancelFunc
	packed bool
	ended  chan struct{} // closed when the current stream's receiver stops
	endErr error

	pauseMu sync.Mutex
	paused  chan struct{} // while reading is paused: closed to resume

	releases chan uint64
	stop     chan struct{}
	// onReusable, when set, is told each room whose pages became reusable
	// (outside the engine's lock): an engine that owns its pages frees
	// them then.
	onReusable func(id uint64)
}

// Room is the engine's record of one room: when each step came.
type Room struct {
	ID                                             uint64
	Opened, Admitted, Succeeded, Aborted, Terminal time.Time
	Reusable                                       time.Time
	Gone                                           time.Time // the daemon restarted: the room died with it
	Phase                                          pb.RoomPhase
	Failure                                        *pb.Failure
	LastSeq                                        uint32
	Gaps, Dups                                     int
	OpenErr, ReleaseErr                            error
	events                                         int
}

// end is when the room ended: its terminal event, or the restart that took
// it; zero while it lives.
func (r *Room) end() time.Time {
	if !r.Terminal.IsZero() {
		return r.Terminal
	}
	return r.Gone
}

// settled: the room ended and its pages are reusable (or it died with its
// daemon), or it was never opened.
func (r *Room) settled() bool {
	return r.OpenErr != nil || !r.Gone.IsZero() || (!r.Terminal.IsZero() && !r.Reusable.IsZero())
}

// newEngine opens an engine's stream to d, on conn when given (else the
// daemon client's connection).
func (s *Stage) newEngine(ctx context.Context, name string, d *Daemon, autoRelease bool, conn ...*grpc.ClientConn) (*Engine, error) {
	e := &Engine{s: s, name: name, d: d, autoRelease: autoRelease, rooms: map[uint64]*Room{}, changed: make(chan struct{}),
		pending: map[uint64]func(*pb.EngineReply){}, releases: make(chan uint64, 1<<16), stop: make(chan struct{})}
	if len(conn) > 0 {
		e.conn = conn[0]
	}
	if err := e.connect(ctx); err != nil {
		return nil, err
	}
	go e.releaser()
	s.mu.Lock()
	s.engines = append(s.engines, e)
	s.mu.Unlock()
	return e, nil
}

// connect opens a new stream and starts its receiver.
func (e *Engine) connect(ctx context.Context) error {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sctx = metadata.AppendToOutgoingContext(sctx, "decodeplane-pack", "more")
	conn := e.conn
	if conn == nil {
		conn = e.d.C.Conn()
	}
	st, err := pb.NewEngineSessionClient(conn).Session(sctx)
	if err != nil {
		cancel()
		return fmt.Errorf("%s: EngineSession: %w", e.name, err)
	}
	hdr, err := st.Header()
	if err != nil {
		cancel()
		return fmt.Errorf("%s: EngineSession header: %w", e.name, err)
	}
	e.sendMu.Lock()
	e.stream, e.cancel, e.seq = st, cancel, 0
	e.packed = slices.Contains(hdr.Get("decodeplane-pack"), "more")
	e.ended, e.endErr = make(chan struct{}), nil
	e.sendMu.Unlock()
	go e.receive(st, e.ended)
	return nil
}

// receive reads the stream until it ends.
func (e *Engine) receive(st pb.EngineSession_SessionClient, ended chan struct{}) {
	for {
		e.pauseMu.Lock()
		p := e.paused
		e.pauseMu.Unlock()
		if p != nil {
			<-p
		}
		ev, err := st.Recv()
		if err != nil {
			e.mu.Lock()
			e.endErr = err
			pend := e.pending
			e.pending = map[uint64]func(*pb.EngineReply){}
			e.mu.Unlock()
			for _, cb := range pend {
				cb(nil)
			}
			close(ended)
			return
		}
		e.handle(ev)
		for _, m := range ev.GetMore() {
			e.handle(m)
		}
	}
}

func (e *Engine) handle(ev *pb.EngineEvent) {
	if rep := ev.GetReply(); rep != nil {
		e.mu.Lock()
		cb := e.pending[rep.GetSeq()]
		delete(e.pending, rep.GetSeq())
		if rep.GetIncarnation() != 0 {
			e.inc = rep.GetIncarnation()
		}
		e.mu.Unlock()
		if cb != nil {
			cb(rep)
		}
		return
	}
	if re := ev.GetRoom(); re != nil {
		e.onRoom(re)
	}
}

// onRoom records one event of a room.
func (e *Engine) onRoom(ev *pb.EngineRoomEvent) {
	now := time.Now()
	e.mu.Lock()
	r := e.rooms[ev.GetRoom()]
	if r == nil {
		r = &Room{ID: ev.GetRoom(), Opened: now}
		e.rooms[r.ID] = r
	}
	switch seq := ev.GetSeq(); {
	case seq <= r.LastSeq:
		r.Dups++
	case seq != r.LastSeq+1:
		r.Gaps++
	}
	r.LastSeq = max(r.LastSeq, ev.GetSeq())
	r.events++
	re := ev.GetEvent()
	r.Phase = re.GetRoom().GetPhase()
	switch re.GetTransition().GetPhase() {
	case pb.RoomPhase_ROOM_PHASE_ADMITTED:
		if r.Admitted.IsZero() {
			r.Admitted = now
		}
	case pb.RoomPhase_ROOM_PHASE_SUCCEEDED:
		if r.Succeeded.IsZero() {
			r.Succeeded = now
			if e.autoRelease {
				select {
				case e.releases <- r.ID:
				default:
				}
			}
		}
	}
	if re.GetTerminal() && r.Terminal.IsZero() {
		r.Terminal, r.Failure = now, re.GetRoom().GetFailure()
	}
	reusable := re.GetPagesReusable() && r.Reusable.IsZero()
	if reusable {
		r.Reusable = now
	}
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	if reusable && e.onReusable != nil {
		e.onReusable(ev.GetRoom())
	}
}

// send sends reqs (packed up to 64 a message when the daemon reads packed
// requests), each with its own seq; cb gets each op's reply, or nil when
// the stream ended first.
func (e *Engine) send(reqs []*pb.EngineRequest, cb func(*pb.EngineRequest, *pb.EngineReply)) error {
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	per := 1
	if e.packed {
		per = 64
	}
	for len(reqs) > 0 {
		n := min(per, len(reqs))
		batch := reqs[:n]
		reqs = reqs[n:]
		e.mu.Lock()
		for _, r := range batch {
			e.seq++
			r.Seq, r.More = e.seq, nil
			req := r
			e.pending[r.Seq] = func(rep *pb.EngineReply) { cb(req, rep) }
		}
		e.mu.Unlock()
		msg := batch[0]
		if n > 1 {
			msg = &pb.EngineRequest{Seq: batch[0].Seq, Op: batch[0].Op, More: batch[1:]}
		}
		if err := e.stream.Send(msg); err != nil {
			return fmt.Errorf("%s: send: %w", e.name, err)
		}
	}
	return nil
}

// Open opens the rooms (batches of at most 256), every event subscribed,
// and waits for the replies; a room the daemon refused keeps its refusal
// (Room.OpenErr). It fails only when the stream fails.
func (e *Engine) Open(ctx context.Context, reqs []*pb.OpenRoomRequest) error {
	now := time.Now()
	e.mu.Lock()
	for _, q := range reqs {
		e.rooms[q.GetRoom()] = &Room{ID: q.GetRoom(), Opened: now}
	}
	e.mu.Unlock()
	var ops []*pb.EngineRequest
	for batch := range slices.Chunk(reqs, 256) {
		ops = append(ops, &pb.EngineRequest{Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: batch}}})
	}
	return e.do(ctx, ops, func(rep *pb.EngineReply) {
		for _, res := range rep.GetResults() {
			if res.GetCode() != 0 {
				e.setOpenErr(res.GetRoom(), fmt.Errorf("%s: %s", codes.Code(res.GetCode()), res.GetMessage()))
			}
		}
	})
}

// do sends ops and waits for every reply (or the stream's end).
func (e *Engine) do(ctx context.Context, ops []*pb.EngineRequest, each func(*pb.EngineReply)) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	wg.Add(len(ops))
	err := e.send(ops, func(_ *pb.EngineRequest, rep *pb.EngineReply) {
		defer wg.Done()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case rep == nil:
			errs = append(errs, fmt.Errorf("%s: the stream ended before the reply", e.name))
		case rep.GetCode() != 0:
			errs = append(errs, fmt.Errorf("%s: op refused: %s: %s", e.name, codes.Code(rep.GetCode()), rep.GetMessage()))
		default:
			each(rep)
		}
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("%s: waiting for replies: %w", e.name, ctx.Err())
	}
	return errors.Join(errs...)
}

func (e *Engine) setOpenErr(id uint64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.rooms[id]; r != nil {
		r.OpenErr = err
	}
	close(e.changed)
	e.changed = make(chan struct{})
}

// Abort aborts the rooms, recording when each abort was sent, and waits
// for the replies.
func (e *Engine) Abort(ctx context.Context, ids []uint64) error {
	var ops []*pb.EngineRequest
	now := time.Now()
	e.mu.Lock()
	for _, id := range ids {
		if r := e.rooms[id]; r != nil && r.Aborted.IsZero() && r.Terminal.IsZero() {
			r.Aborted = now // an abort of a room that already ended measures nothing
		}
		ops = append(ops, &pb.EngineRequest{Op: &pb.EngineRequest_Abort{Abort: &pb.AbortRoomRequest{Room: id, Reason: "aborted by the fault scenario"}}})
	}
	e.mu.Unlock()
	return e.do(ctx, ops, func(*pb.EngineReply) {})
}

// Release releases the rooms and waits for the replies; a refusal is
// the room's ReleaseErr.
func (e *Engine) Release(ctx context.Context, ids []uint64) error {
	ops := make([]*pb.EngineRequest, len(ids))
	for i, id := range ids {
		ops[i] = &pb.EngineRequest{Op: &pb.EngineRequest_Release{Release: &pb.ReleaseRoomRequest{Room: id}}}
	}
	return e.do(ctx, ops, func(rep *pb.EngineReply) {
		for _, res := range rep.GetResults() {
			if res.GetCode() != 0 {
				e.setReleaseErr(res.GetRoom(), fmt.Errorf("%s: %s", codes.Code(res.GetCode()), res.GetMessage()))
			}
		}
	})
}

// releaser releases the rooms autoRelease queues.
func (e *Engine) releaser() {
	for {
		select {
		case <-e.stop:
			return
		case id := <-e.releases:
			req := &pb.EngineRequest{Op: &pb.EngineRequest_Release{Release: &pb.ReleaseRoomRequest{Room: id}}}
			err := e.send([]*pb.EngineRequest{req}, func(_ *pb.EngineRequest, rep *pb.EngineReply) {
				if rep == nil {
					return // the stream ended: the room is watched again after a reconnect
				}
				for _, res := range rep.GetResults() {
					if res.GetCode() != 0 && res.GetCode() != int32(codes.FailedPrecondition) {
						e.setReleaseErr(id, fmt.Errorf("%s: %s", codes.Code(res.GetCode()), res.GetMessage()))
					}
				}
			})
			_ = err // a broken stream: Reconnect re-watches the room, whose release is sent again then
		}
	}
}

func (e *Engine) setReleaseErr(id uint64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.rooms[id]; r != nil {
		r.ReleaseErr = err
	}
}

// PauseReading stops reading the stream (a slow consumer); ResumeReading
// goes on.
func (e *Engine) PauseReading() {
	e.pauseMu.Lock()
	defer e.pauseMu.Unlock()
	if e.paused == nil {
		e.paused = make(chan struct{})
	}
}

func (e *Engine) ResumeReading() {
	e.pauseMu.Lock()
	defer e.pauseMu.Unlock()
	if e.paused != nil {
		close(e.paused)
		e.paused = nil
	}
}

// streamEnd waits until the current stream ended (at once when it has,
// even with ctx done) or ctx ends, and returns how it ended.
func (e *Engine) streamEnd(ctx context.Context) (error, bool) {
	e.sendMu.Lock()
	ended := e.ended
	e.sendMu.Unlock()
	select {
	case <-ended:
	default:
		select {
		case <-ended:
		case <-ctx.Done():
			return nil, false
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.endErr, true
}

// whileStreamUp is ctx, ended too when the current stream ends: a wait for
// events that only this stream can bring ends with it.
func (e *Engine) whileStreamUp(ctx context.Context) (context.Context, context.CancelFunc) {
	e.sendMu.Lock()
	ended := e.ended
	e.sendMu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-ended:
			cancel(fmt.Errorf("%s: its stream ended", e.name))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}
