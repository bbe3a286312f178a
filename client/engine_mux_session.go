package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The shared engine session's own goroutines: its demultiplexer (demux),
// which hands each room's events to the call waiting on it, and its opener,
// which sends the queued opens in batches (a group commit).

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

// endErr is why the session ended (nil while live).
func (ms *muxSession) endErr() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.err
}
