package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/transfer"
)

// Transfer moves one chunk with the transfer engine and returns when it
// landed. (room, rank, index) is the idempotency key: a retry of a landed
// chunk returns its result with duplicate = true; a retry of a chunk in
// flight waits for it.
func (m *Manager) Transfer(ctx context.Context, req ChunkRequest) (transfer.ChunkResult, bool, error) {
	if cc, ok := m.engine.(transfer.ChunkChecker); ok {
		if err := cc.CheckChunk(transfer.ChunkSource{NumPages: req.NumPages, Buffer: req.SrcBuffer, Pages: req.SrcPages}); err != nil {
			return transfer.ChunkResult{}, false, err // a field error is an InvalidError already
		}
	}
	sh, e := m.shards.lock(req.Room)
	if e == nil {
		return transfer.ChunkResult{}, false, errNoChunkRoom(req)
	}
	ef := sh.exec(e, room.ChunkBegin{Now: m.clock.Now(), Req: req, Via: room.ViaEngine})
	if ef.Err != nil {
		sh.unlock()
		return transfer.ChunkResult{}, false, ef.Err
	}
	k := req.Rank.Key()
	if b := ef.Begin; !b.Fresh {
		if !b.Busy {
			sh.unlock()
			return b.Result, b.Done, b.Err
		}
		w := e.s().waiter(k, req.Index) // under the lock: the chunk's end closes it
		sh.unlock()
		return awaitChunk(ctx, w)
	}
	if e.Phase() == PhaseFailed {
		// Claiming the rank ended the room (its success check found another
		// room's marker): the chunk never runs.
		end := sh.exec(e, room.ChunkEnd{Now: m.clock.Now(), Req: req, Via: room.ViaEngine})
		sh.unlock()
		return transfer.ChunkResult{}, false, end.Err
	}
	op := e.ChunkOp(req)
	// The engine call ends with the caller or when the room fails (its
	// failure cancels every call in flight).
	opCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.s().start(call{rank: k, index: req.Index, cancel: cancel})
	roomSpan := e.logCtx()
	sh.unlock()

	var attrs []attribute.KeyValue
	if m.tracing {
		attrs = []attribute.KeyValue{
			attribute.Int64("decodeplane.room", int64(req.Room)), attribute.Int("decodeplane.chunk", req.Index),
			attribute.String("decodeplane.prefill.rank", req.Rank.String()), attribute.Int("decodeplane.pages", req.NumPages),
			attribute.Bool("decodeplane.last", req.Last)}
	}
	res, terr := m.runRoomOp(opCtx, nil, roomSpan, "chunk", attrs, func(ctx context.Context) (transfer.ChunkResult, error) { return m.engine.Transfer(ctx, op) })

	sh.mu.Lock() // the room stays on its shard while a transfer is in flight (its release waits for it)
	defer sh.unlock()
	end := sh.exec(e, room.ChunkEnd{Now: m.clock.Now(), Req: req, Via: room.ViaEngine, Result: res, Err: terr,
		Retryable:   terr != nil && (errors.Is(terr, transfer.ErrEngineUnavailable) || ctx.Err() != nil),
		WritesUntil: writesUntil(terr), SelfWriter: m.selfWriters.known(e.Addr())})
	e.s().ended(k, req.Index, res, end.Err)
	return res, false, end.Err
}

// writesUntil is how long an engine failure may still write into the
// room's pages (transfer.WritesMayContinueError; zero: nothing may).
func writesUntil(err error) (until time.Time) {
	if err == nil {
		return until
	}
	var wmc *transfer.WritesMayContinueError
	if errors.As(err, &wmc) {
		until = wmc.Until
	}
	return until
}

// start records an engine call in flight.
func (s *subscribers) start(c call) {
	if s.calls == nil {
		s.calls = s.inline[:0]
	}
	s.calls = append(s.calls, c)
}

// waiter is what a retry of rank k's chunk index waits on while the chunk
// is in flight (nil when it is not).
func (s *subscribers) waiter(k rankKey, index int) *callWait {
	for i := range s.calls {
		if c := &s.calls[i]; c.rank == k && c.index == index {
			if c.wait == nil {
				c.wait = &callWait{done: make(chan struct{})}
			}
			return c.wait
		}
	}
	return nil
}

// ended records the outcome of rank k's chunk index for the retries that
// wait for it, wakes them and forgets the call.
func (s *subscribers) ended(k rankKey, index int, res transfer.ChunkResult, err error) {
	for i := range s.calls {
		if c := s.calls[i]; c.rank == k && c.index == index {
			if w := c.wait; w != nil {
				w.res, w.err = res, err
				close(w.done)
			}
			s.calls = slices.Delete(s.calls, i, i+1)
			return
		}
	}
}

// awaitChunk answers a retry of a chunk in flight once its first attempt
// ended, with that attempt's outcome (a landed chunk is a duplicate).
func awaitChunk(ctx context.Context, w *callWait) (transfer.ChunkResult, bool, error) {
	if w == nil {
		return transfer.ChunkResult{}, false, nil
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return transfer.ChunkResult{}, false, ctx.Err()
	}
	if w.err != nil {
		return transfer.ChunkResult{}, false, w.err
	}
	return w.res, true, nil
}

// runRoomOp runs an engine operation of a room under a span named name
// (linked to the room's span), with a context that ends when parent or the
// room's transfer context (the room failed) ends; with no xctx, parent is
// already cancelled with the room. Without tracing no span is started
// (attrs is then nil).
func (m *Manager) runRoomOp(parent, xctx, roomSpan context.Context, name string, attrs []attribute.KeyValue, op func(context.Context) (transfer.ChunkResult, error)) (transfer.ChunkResult, error) {
	ctx := parent
	if xctx != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(parent)
		defer cancel()
		stop := context.AfterFunc(xctx, cancel)
		defer stop()
	}
	if !m.tracing {
		return op(ctx)
	}
	ctx, span := m.tracer.Start(ctx, name, trace.WithLinks(trace.LinkFromContext(roomSpan)), trace.WithAttributes(attrs...))
	defer span.End()
	res, err := op(ctx)
	span.SetAttributes(attribute.Int64("decodeplane.bytes", res.Bytes))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return res, err
}

// errNoChunkRoom is a chunk's (or a failure report's) unknown room.
func errNoChunkRoom(req ChunkRequest) error {
	return fmt.Errorf("chunk %d of room %d: %w", req.Index, req.Room, ErrRoomNotFound)
}

// ReportTransfer records a chunk the prefill moved itself. A failure fails
// the room with the prefill's reason (SGLang T13).
func (m *Manager) ReportTransfer(req ChunkRequest) (KVPoll, bool, error) {
	sh, e := m.shards.lock(req.Room)
	if e == nil {
		return PollFailed, false, errNoChunkRoom(req)
	}
	defer sh.unlock()
	if req.Failed {
		// A failure fails the room whatever the chunk's pages or index
		// (SGLang T13): nothing of it is to be kept.
		if err := e.CheckSource(req); err != nil {
			return PollFailed, false, err
		}
		reason := req.Reason
		if reason == "" {
			reason = "Failed to get kvcache from prefill instance, it might be dead"
		}
		m.obs.ChunkDone(req.Bytes, -1, false)
		sh.fail(e, Failure{Code: FailureTransferFailed, FromAnotherRank: true, Message: fmt.Sprintf(
			"KVTransferError(bootstrap_room=%d): %s (reported by %s, chunk %d)", e.ID(), reason, req.Rank, req.Index)})
		return PollFailed, false, nil
	}
	ef := sh.exec(e, room.ChunkBegin{Now: m.clock.Now(), Req: req, Via: room.ViaReport})
	if ef.Err != nil {
		return PollFailed, false, ef.Err
	}
	if b := ef.Begin; !b.Fresh {
		if b.Busy {
			return e.Phase().Poll(), false, fmt.Errorf("chunk %d of room %d: %w: the chunk is being moved by Transfer", req.Index, e.ID(), ErrWrongState)
		}
		return e.Phase().Poll(), true, b.Err
	}
	// The instance writes by itself: deferred release (drain.go).
	m.selfWriters.note(e.Addr())
	end := sh.exec(e, room.ChunkEnd{Now: m.clock.Now(), Req: req, Via: room.ViaReport,
		Result: transfer.ChunkResult{Bytes: req.Bytes, Duration: -1, MarkerWritten: req.Marker}}) // duration unknown: the prefill moved it
	if end.Err != nil {
		return PollFailed, false, end.Err
	}
	return e.Phase().Poll(), false, nil
}

// AckRoomEnd records that rank will write nothing more into the
// destination of the room's attempt. Idempotent per rank and attempt: a
// rank that owes nothing (never received the destination, its last chunk
// landed, it acked already, or the room is still live) is accepted as a
// no-op (Owed false). An attempt other than the room's current one is
// ErrStaleAttempt and changes nothing. When the last owing rank acked the
// room's pages and staging regions go back at once and its shard admits.
func (m *Manager) AckRoomEnd(id uint64, rank RankID, attempt uint32) (AckResult, error) {
	sh, e := m.shards.lock(id) // a draining room is not forgotten: its release is pending
	if e == nil {
		return AckResult{}, fmt.Errorf("ack end of room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	ef := sh.exec(e, room.Ack{Now: m.clock.Now(), Rank: rank, Attempt: attempt})
	return ef.AckResult, ef.Err
}
