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
	run, w, ans := startChunk(m, ctx, req, nil)
	switch {
	case run.m != nil:
		return run.finish(run.op(run.ctx))
	case w != nil:
		return awaitChunk(ctx, w)
	}
	return ans.res, ans.dup, ans.err
}

// TransferAsync is Transfer without waiting: done is called exactly once
// with what Transfer would return — before TransferAsync returns when the
// answer is known at once (a refusal, a landed duplicate), else from the
// engine's completion (or, for an engine that only runs chunks
// synchronously, from a goroutine of the call). A retry of a chunk in
// flight is answered when that chunk ends. done must not block.
func (m *Manager) TransferAsync(ctx context.Context, req ChunkRequest, done func(transfer.ChunkResult, bool, error)) {
	r, _, ans := startChunk(m, ctx, req, done)
	if r.m == nil {
		if ans.known {
			done(ans.res, ans.dup, ans.err)
		}
		return
	}
	run := &r
	if ae, ok := m.engine.(transfer.AsyncEngine); ok {
		ctx, end := run.span()
		ae.TransferAsync(ctx, run.chunk, func(res transfer.ChunkResult, err error) {
			end(res, err)
			done(run.finish(res, err))
		})
		return
	}
	go func() { done(run.finish(run.op(run.ctx))) }()
}

// chunkRun is one engine call of a chunk its room registered.
type chunkRun struct {
	m        *Manager
	sh       *shard
	e        *entry
	req      ChunkRequest
	chunk    transfer.ChunkOp
	ctx      context.Context // the caller's, cancelled when the room fails (cancel)
	caller   context.Context
	cancel   context.CancelFunc
	roomSpan context.Context
}

// answer is a chunk's answer known without running it.
type answer struct {
	known bool
	res   transfer.ChunkResult
	dup   bool
	err   error
}

// startChunk begins a chunk: the engine's check of its source, then the
// room's (ChunkBegin). It returns the engine call to run (its m set), or, for a retry
// of a chunk in flight, what to wait on (with onEnd given, onEnd is called
// when that chunk ends instead), or the answer.
func startChunk(m *Manager, ctx context.Context, req ChunkRequest, onEnd func(transfer.ChunkResult, bool, error)) (chunkRun, *callWait, answer) {
	if cc, ok := m.engine.(transfer.ChunkChecker); ok {
		if err := cc.CheckChunk(transfer.ChunkSource{NumPages: req.NumPages, Buffer: req.SrcBuffer, Pages: req.SrcPages}); err != nil {
			return chunkRun{}, nil, answer{known: true, err: err} // a field error is an InvalidError already
		}
	}
	sh, e := m.shards.lock(req.Room)
	if e == nil {
		return chunkRun{}, nil, answer{known: true, err: errNoChunkRoom(req)}
	}
	defer sh.unlock()
	ef := sh.exec(e, room.ChunkBegin{Now: m.clock.Now(), Req: req, Via: room.ViaEngine, Check: m.layouts.check})
	if ef.Err != nil {
		return chunkRun{}, nil, answer{known: true, err: ef.Err}
	}
	k := req.Rank.Key()
	if b := ef.Begin; !b.Fresh {
		if !b.Busy {
			return chunkRun{}, nil, answer{known: true, res: b.Result, dup: b.Done, err: b.Err}
		}
		w := e.s().waiter(k, req.Index) // under the lock: the chunk's end closes it
		if onEnd != nil {
			w.then = append(w.then, onEnd)
			return chunkRun{}, nil, answer{}
		}
		return chunkRun{}, w, answer{}
	}
	if e.Phase() == PhaseFailed {
		// Claiming the rank ended the room (its success check found another
		// room's marker): the chunk never runs.
		end := sh.exec(e, room.ChunkEnd{Now: m.clock.Now(), Req: req, Via: room.ViaEngine})
		return chunkRun{}, nil, answer{known: true, err: end.Err}
	}
	// The engine call ends with the caller or when the room fails (its
	// failure cancels every call in flight).
	opCtx, cancel := context.WithCancel(ctx)
	e.s().start(call{rank: k, index: req.Index, cancel: cancel})
	return chunkRun{m: m, sh: sh, e: e, req: req, chunk: e.ChunkOp(req), ctx: opCtx, caller: ctx, cancel: cancel, roomSpan: e.logCtx()}, nil, answer{}
}

// span starts the chunk's span (linked to its room's) when tracing; end
// records the outcome and ends it.
func (r *chunkRun) span() (context.Context, func(transfer.ChunkResult, error)) {
	m, req := r.m, r.req
	if !m.tracing {
		return r.ctx, func(transfer.ChunkResult, error) {}
	}
	attrs := []attribute.KeyValue{
		attribute.Int64("decodeplane.room", int64(req.Room)), attribute.Int("decodeplane.chunk", req.Index),
		attribute.String("decodeplane.prefill.rank", req.Rank.String()), attribute.Int("decodeplane.pages", req.NumPages),
		attribute.Bool("decodeplane.last", req.Last)}
	ctx, sp := m.tracer.Start(r.ctx, "chunk", trace.WithLinks(trace.LinkFromContext(r.roomSpan)), trace.WithAttributes(attrs...))
	return ctx, func(res transfer.ChunkResult, err error) {
		sp.SetAttributes(attribute.Int64("decodeplane.bytes", res.Bytes))
		if err != nil {
			sp.RecordError(err)
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
	}
}

// op runs the engine call (synchronously).
func (r *chunkRun) op(ctx context.Context) (transfer.ChunkResult, error) {
	ctx, end := r.span()
	res, err := r.m.engine.Transfer(ctx, r.chunk)
	end(res, err)
	return res, err
}

// finish records the engine call's outcome in the room (ChunkEnd) and
// answers the call and the retries waiting for it.
func (r *chunkRun) finish(res transfer.ChunkResult, terr error) (transfer.ChunkResult, bool, error) {
	m, sh, e, req := r.m, r.sh, r.e, r.req
	r.cancel()
	sh.mu.Lock() // the room stays on its shard while a transfer is in flight (its release waits for it)
	end := sh.exec(e, room.ChunkEnd{Now: m.clock.Now(), Req: req, Via: room.ViaEngine, Result: res, Err: terr,
		Retryable:   terr != nil && (errors.Is(terr, transfer.ErrEngineUnavailable) || r.caller.Err() != nil),
		WritesUntil: writesUntil(terr), SelfWriter: m.selfWriters.known(e.Addr())})
	then := e.s().ended(req.Rank.Key(), req.Index, res, end.Err)
	sh.settleReach(e)
	sh.unlock()
	for _, f := range then {
		dup := end.Err == nil
		f(res, dup, end.Err)
	}
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
// wait for it, wakes them, forgets the call and returns the retries' answers
// to call once the lock is released.
func (s *subscribers) ended(k rankKey, index int, res transfer.ChunkResult, err error) []func(transfer.ChunkResult, bool, error) {
	for i := range s.calls {
		if c := s.calls[i]; c.rank == k && c.index == index {
			s.calls = slices.Delete(s.calls, i, i+1)
			if w := c.wait; w != nil {
				w.res, w.err = res, err
				close(w.done)
				return w.then
			}
			return nil
		}
	}
	return nil
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
