// Package agentservice is the reference transfer agent's gRPC service
// (decodeplane.transfer.v1.TransferAgent) over host memory
// (transfer/hostmem): what cmd/decodeplane-agent serves. The daemon never
// links it; its side of the protocol is transfer/agentclient.
package agentservice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/stormlog"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/agentwire"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// Service is the reference decodeplane.transfer.v1.TransferAgent: every
// buffer lives in host memory (transfer/hostmem): memory the agent
// allocates, or a shared-memory file region an engine created; every copy
// moves real bytes. GPU memory kinds are refused (FAILED_PRECONDITION). Batches run asynchronously; their completions fan out to every
// WatchCompletions stream and are remembered (the last maxRemembered) so a
// resubmitted batch id or a reconnecting watcher gets the outcome again.
type Service struct {
	transferv1.UnimplementedTransferAgentServer
	agent *hostmem.Agent
	log   *slog.Logger
	// storm logs what happens to many batches at once (failed batches,
	// cancellations): one line per cause per interval, the first at once.
	storm    *stormlog.Logger
	instance string

	mu       sync.Mutex
	batches  map[string]*batchRecord
	finished []string // finished batch ids, oldest first
	watches  map[*completionWatch]struct{}
	stopping chan struct{}
	closed   bool
	wg       sync.WaitGroup
}

var _ transferv1.TransferAgentServer = (*Service)(nil)

// maxRemembered bounds the finished batches kept for replay.
const maxRemembered = 65536

// completionBuffer is how far a WatchCompletions stream may fall behind
// before it is dropped (the client reconnects and replays what it waits
// for); watchBuffer adds headroom for a replay.
const completionBuffer = 4096

// watchBuffer is a watch's channel capacity: completionBuffer, plus room
// for what finishes while the replay is sent (it grows with the completions
// replayed, not with the ids asked for: a request may name 2^20 ids), at
// most completionBuffer more. A watch that falls further behind is dropped
// and replays again.
func watchBuffer(replayed int) int { return completionBuffer + min(replayed, completionBuffer) }

type batchRecord struct {
	room       uint64
	completion *transferv1.Completion // nil while in flight
}

type completionWatch struct {
	ch      chan *transferv1.Completion
	dropped chan struct{}
	once    sync.Once
}

func (w *completionWatch) drop() { w.once.Do(func() { close(w.dropped) }) }

// New serves agent's store. Call Close to stop the batches.
func New(agent *hostmem.Agent, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &Service{agent: agent, log: log, storm: stormlog.New(log, stormlog.Options{}), instance: hex.EncodeToString(id[:]), batches: map[string]*batchRecord{},
		watches: map[*completionWatch]struct{}{}, stopping: make(chan struct{})}
}

// Instance identifies this agent process; it changes on restart.
func (a *Service) Instance() string { return a.instance }

// Register adds the service to s.
func (a *Service) Register(s *grpc.Server) { transferv1.RegisterTransferAgentServer(s, a) }

// Close cancels every batch in flight, waits for them and ends the watches.
func (a *Service) Close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.stopping)
	}
	a.mu.Unlock()
	a.wg.Wait()
	a.storm.Close() // the pending summaries of the batches' failures
}

func agentStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, hostmem.ErrUnknownBuffer):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, hostmem.ErrOutOfRange), errors.Is(err, hostmem.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, hostmem.ErrLengthMismatch), errors.Is(err, hostmem.ErrBusy), errors.Is(err, hostmem.ErrMemoryMismatch),
		errors.Is(err, hostmem.ErrUnsupportedMemory), errors.Is(err, hostmem.ErrSharedMemory):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, hostmem.ErrClosed):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, hostmem.ErrTooLarge):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// RegisterBuffers implements TransferAgent.
func (a *Service) RegisterBuffers(_ context.Context, req *transferv1.RegisterBuffersRequest) (*transferv1.RegisterBuffersResponse, error) {
	regs, err := registrations(req.GetBuffers())
	if err != nil {
		return nil, err
	}
	specs, err := a.agent.Store().RegisterMemory(regs)
	if err != nil {
		return nil, agentStatus(err)
	}
	out := agentwire.BuffersToProto(specs)
	for i, b := range out {
		b.Memory = req.GetBuffers()[i].GetMemory()
	}
	return &transferv1.RegisterBuffersResponse{Buffers: out, AgentInstance: a.instance}, nil
}

// DeregisterBuffers implements TransferAgent.
func (a *Service) DeregisterBuffers(_ context.Context, req *transferv1.DeregisterBuffersRequest) (*transferv1.DeregisterBuffersResponse, error) {
	if err := a.agent.Store().Deregister(req.GetNames()); err != nil {
		return nil, agentStatus(err)
	}
	return &transferv1.DeregisterBuffersResponse{}, nil
}

// SubmitBatch implements TransferAgent.
func (a *Service) SubmitBatch(_ context.Context, req *transferv1.SubmitBatchRequest) (*transferv1.SubmitBatchResponse, error) {
	b := agentwire.BatchFromProto(req)
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.batches[b.ID]; rec != nil {
		if rec.completion != nil {
			a.broadcastLocked(rec.completion)
		}
		return &transferv1.SubmitBatchResponse{Duplicate: true, AgentInstance: a.instance}, nil
	}
	if a.closed {
		return nil, status.Error(codes.Unavailable, "the transfer agent is shutting down")
	}
	// Accepted, the batch's buffers are busy (DeregisterBuffers refuses
	// them) until it completes.
	unpin, err := a.agent.Store().Pin(b)
	if err != nil {
		return nil, agentStatus(err)
	}
	rec := &batchRecord{room: b.Room}
	a.batches[b.ID] = rec
	a.wg.Add(1)
	go a.run(b, rec, unpin)
	return &transferv1.SubmitBatchResponse{AgentInstance: a.instance}, nil
}

// run executes one batch and publishes its completion.
func (a *Service) run(b kvcopy.Batch, rec *batchRecord, unpin func()) {
	defer a.wg.Done()
	defer unpin()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := a.agent.Execute(ctx, b)
	unpin() // before the completion: whoever sees it may deregister the buffers
	c := &transferv1.Completion{BatchId: b.ID, Room: b.Room, Ok: err == nil, AgentInstance: a.instance}
	if err != nil {
		c.Error = err.Error()
		a.storm.Log(context.Background(), slog.LevelWarn, "batch failed", nil, strconv.FormatUint(b.Room, 10),
			slog.String("batch", b.ID), slog.Uint64("room", b.Room), slog.Any("err", err))
	} else {
		c.Bytes = uint64(b.Bytes())
		a.log.Debug("batch done", "batch", b.ID, "room", b.Room, "copies", len(b.Copies), "bytes", c.Bytes)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec.completion = c
	a.finished = append(a.finished, b.ID)
	for len(a.finished) > maxRemembered {
		delete(a.batches, a.finished[0])
		a.finished = a.finished[1:]
	}
	a.broadcastLocked(c)
}

func (a *Service) broadcastLocked(c *transferv1.Completion) {
	for w := range a.watches {
		select {
		case w.ch <- c:
		default: // too far behind: drop it; it reconnects and replays
			delete(a.watches, w)
			w.drop()
		}
	}
}

// WatchCompletions implements TransferAgent.
func (a *Service) WatchCompletions(req *transferv1.WatchCompletionsRequest, stream grpc.ServerStreamingServer[transferv1.Completion]) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return status.Error(codes.Unavailable, "the transfer agent is shutting down")
	}
	var replay []*transferv1.Completion
	for _, id := range req.GetReplayBatchIds() {
		if rec := a.batches[id]; rec != nil && rec.completion != nil {
			replay = append(replay, rec.completion)
		}
	}
	w := &completionWatch{ch: make(chan *transferv1.Completion, watchBuffer(len(replay))), dropped: make(chan struct{})}
	a.watches[w] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.watches, w)
		a.mu.Unlock()
	}()
	if err := stream.Send(&transferv1.Completion{AgentInstance: a.instance}); err != nil {
		return err
	}
	for _, c := range replay {
		if err := stream.Send(c); err != nil {
			return err
		}
	}
	ctx := stream.Context()
	for {
		select {
		case c := <-w.ch:
			if err := stream.Send(c); err != nil {
				return err
			}
		case <-w.dropped:
			return status.Error(codes.ResourceExhausted, "completion stream fell behind; watch again with replay_batch_ids")
		case <-a.stopping:
			return status.Error(codes.Unavailable, "the transfer agent is shutting down")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// CancelRoom implements TransferAgent.
func (a *Service) CancelRoom(ctx context.Context, req *transferv1.CancelRoomRequest) (*transferv1.CancelRoomResponse, error) {
	n, err := a.agent.CancelBatches(ctx, req.GetRoom(), req.GetBatchIds()...)
	if err != nil {
		return nil, agentStatus(err)
	}
	if n > 0 {
		a.storm.Log(ctx, slog.LevelInfo, "cancelled batches", nil, strconv.FormatUint(req.GetRoom(), 10), slog.Uint64("room", req.GetRoom()), slog.Int("batches", n))
	}
	return &transferv1.CancelRoomResponse{Cancelled: uint32(n)}, nil
}

// ReadBuffer implements TransferAgent.
func (a *Service) ReadBuffer(_ context.Context, req *transferv1.ReadBufferRequest) (*transferv1.ReadBufferResponse, error) {
	data, err := a.agent.Store().Read(req.GetName(), int64(req.GetOffset()), int64(req.GetLength()))
	if err != nil {
		return nil, agentStatus(err)
	}
	return &transferv1.ReadBufferResponse{Data: data}, nil
}

// WriteBuffer implements TransferAgent.
func (a *Service) WriteBuffer(_ context.Context, req *transferv1.WriteBufferRequest) (*transferv1.WriteBufferResponse, error) {
	if err := a.agent.Store().Write(req.GetName(), int64(req.GetOffset()), req.GetData()); err != nil {
		return nil, agentStatus(err)
	}
	return &transferv1.WriteBufferResponse{}, nil
}
