package delegate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// Agent is what DelegateEngine needs of an external transfer agent
// (decodeplane.transfer.v1.TransferAgent; transfer/agentclient.Client implements it
// over gRPC, hostmem.Agent in process).
type Agent interface {
	// RegisterBuffers registers the decode buffers; idempotent by name and
	// length (a known buffer keeps its bytes).
	RegisterBuffers(ctx context.Context, bufs []kvcopy.BufferSpec) error
	// DeregisterBuffers forgets buffers and releases their memory (unknown
	// names are ignored). Buffers with copies in flight are refused (an
	// error with the agent's reason) and nothing is forgotten.
	DeregisterBuffers(ctx context.Context, names []string) error
	// Execute submits a batch and waits for its outcome. nil: every copy
	// landed. An error wrapping ErrAgentUnreachable: the batch was not
	// submitted (the agent is known to be down), nothing was written, it may
	// be resubmitted. An error wrapping ErrAgentLost: the connection broke
	// with the batch in flight, or while submitting it (it may have been
	// accepted): the outcome is unknown. Any other error: the agent failed
	// the batch; the message is its reason. When ctx is done Execute cancels
	// the batch at the agent and returns once none of its copies is in
	// flight.
	Execute(ctx context.Context, b kvcopy.Batch) error
	// CancelRoom cancels the room's batches and returns once none is in flight.
	CancelRoom(ctx context.Context, room uint64) error
	// Check reports whether the agent is reachable and serving.
	Check(ctx context.Context) error
}

// Agent errors, wrapped by Agent implementations.
var (
	// ErrAgentUnreachable: the agent is known to be unreachable; the batch
	// was not submitted, so nothing of it was accepted.
	ErrAgentUnreachable = errors.New("transfer agent unreachable")
	// ErrAgentLost: the agent went away with the batch in flight; its
	// outcome is unknown, so the chunk fails rather than being resent.
	ErrAgentLost = errors.New("transfer agent lost with the batch in flight")
)

// DelegateDeps are the delegated engine's collaborators.
type DelegateDeps struct {
	// Buffers are the decode buffers registered with the agent at start and
	// on every health check (kvcopy.DecodeBuffers).
	Buffers []kvcopy.BufferSpec
	// OnReadiness is told every change of the agent's reachability (the
	// daemon flips its health); nil ignores it. It must not block.
	OnReadiness func(ready bool, reason string)
	// Clock defaults to kvlayout.RealClock.
	Clock kvlayout.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DelegateEngine moves KV through an external transfer agent: it turns each
// chunk into a batch of copies (direct page copies for equal TP, strided
// head-slice copies otherwise, the metadata slot write with the last chunk)
// and each staged region into a scatter batch, applies a per-batch deadline
// (transfer.delegate.batch_timeout), and maps the agent's answers: a failed
// batch fails the chunk with the agent's reason (the room fails); an
// unreachable agent is transfer.ErrEngineUnavailable (nothing was written; the caller
// may retry) and flips readiness until a health check succeeds and the
// decode buffers are registered again. Batches whose submission is known to
// have failed are the only ones resent; a batch id makes resubmission of the
// same batch idempotent at the agent.
type DelegateEngine struct {
	cfg     DelegateConfig
	agent   Agent
	buffers []kvcopy.BufferSpec
	onReady func(bool, string)
	clock   kvlayout.Clock
	log     *slog.Logger
	seq     atomic.Uint64
	wake    chan struct{}

	// reg serializes the registrations of the decode engine's layouts at
	// the agent (RegisterLayout, the health check's): a token, taken with
	// a context.
	reg chan struct{}

	mu      sync.Mutex
	layouts map[[2]int]*rankLayout // the decode engine's buffers per decode rank (dp, tp): RegisterLayout
	up      bool
	reason  string
	probed  bool // a first state has been published
}

var (
	_ transfer.Engine          = (*DelegateEngine)(nil)
	_ transfer.Scatterer       = (*DelegateEngine)(nil)
	_ transfer.ChunkChecker    = (*DelegateEngine)(nil)
	_ transfer.OpChecker       = (*DelegateEngine)(nil)
	_ transfer.LayoutRegistrar = (*DelegateEngine)(nil)
)

// NewDelegateEngine builds the engine; it is not ready until Run's first
// health check registered the buffers.
func NewDelegateEngine(cfg DelegateConfig, agent Agent, deps DelegateDeps) *DelegateEngine {
	if deps.Clock == nil {
		deps.Clock = kvlayout.RealClock{}
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if deps.OnReadiness == nil {
		deps.OnReadiness = func(bool, string) {}
	}
	return &DelegateEngine{cfg: cfg, agent: agent, buffers: deps.Buffers, onReady: deps.OnReadiness, clock: deps.Clock,
		log: deps.Logger, wake: make(chan struct{}, 1), reg: make(chan struct{}, 1), reason: "transfer agent not checked yet", layouts: map[[2]int]*rankLayout{}}
}

// Ready reports whether the agent is reachable, and why not.
func (e *DelegateEngine) Ready() (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.up, e.reason
}

// Run checks the agent at once and then every delegate.health_interval (and
// right after a batch found it unreachable) until ctx is done: a successful
// check registers the decode buffers again (idempotent; needed when the
// agent restarted) and makes the engine ready, then registers each decode
// engine layout again on its own: a layout the agent refuses is dropped
// (the engine's memory is gone), which does not make the engine unready.
func (e *DelegateEngine) Run(ctx context.Context) error {
	e.probe(ctx)
	t := kvlayout.NewTicker(e.clock, e.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-e.wake:
		}
		e.probe(ctx)
	}
}

func (e *DelegateEngine) probe(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, max(e.cfg.HealthInterval, time.Second))
	defer cancel()
	err := e.agent.Check(cctx)
	if err == nil {
		if rerr := e.agent.RegisterBuffers(cctx, e.buffers); rerr != nil {
			err = fmt.Errorf("register the decode buffers: %w", rerr)
		}
	}
	if err == nil {
		err = e.probeLayouts(cctx)
	}
	if ctx.Err() != nil {
		return // shutting down: keep the last state
	}
	if err != nil {
		e.down(err)
		return
	}
	e.setState(true, "serving via transfer agent "+e.cfg.Target)
}

func (e *DelegateEngine) setState(up bool, reason string) {
	e.mu.Lock()
	changed := e.up != up || !e.probed // the first probe is always told, up or down
	e.up, e.reason, e.probed = up, reason, true
	e.mu.Unlock()
	if !changed {
		return
	}
	if up {
		e.log.Info("transfer agent reachable; decode buffers registered", "target", e.cfg.Target)
	} else {
		e.log.Warn("transfer agent unreachable", "target", e.cfg.Target, "reason", reason)
	}
	e.onReady(up, reason)
}

// down records an unreachable agent.
func (e *DelegateEngine) down(err error) {
	reason := err.Error()
	if !strings.Contains(reason, "transfer agent") {
		reason = "transfer agent unreachable: " + reason
	}
	e.setState(false, fmt.Sprintf("%s (transfer.delegate.target %s)", reason, e.cfg.Target))
}

// markDown records an unreachable agent and wakes the health loop.
func (e *DelegateEngine) markDown(err error) {
	e.down(err)
	select {
	case e.wake <- struct{}{}:
	default: // a check is already due
	}
}

// execute runs one batch under the per-batch deadline and maps the outcome.
func (e *DelegateEngine) execute(ctx context.Context, b kvcopy.Batch) error {
	if len(b.Copies) == 0 && len(b.Writes) == 0 {
		return nil // nothing to move (an empty last chunk without metadata)
	}
	if up, reason := e.Ready(); !up {
		return fmt.Errorf("%w: %s", transfer.ErrEngineUnavailable, reason)
	}
	b.ID = fmt.Sprintf("%s#%d", b.ID, e.seq.Add(1))
	b.Deadline = e.clock.Now().Add(e.cfg.BatchTimeout)
	// The agent enforces the deadline and reports it; the local bound adds a
	// grace period so that its report, not the cancellation, usually wins.
	bctx, cancel := context.WithTimeout(ctx, e.cfg.BatchTimeout+batchGrace(e.cfg.BatchTimeout))
	defer cancel()
	err := e.agent.Execute(bctx, b)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrAgentLost):
		// The agent may have accepted the batch: it can write until the
		// batch's deadline, after which it must stop.
		e.markDown(err)
		return &transfer.WritesMayContinueError{Err: fmt.Errorf("%w: batch %s: %v", transfer.ErrTransferFailed, b.ID, err), Until: b.Deadline}
	case ctx.Err() != nil:
		return ctx.Err()
	case bctx.Err() != nil:
		return fmt.Errorf("%w: batch %s of room %d did not complete within transfer.delegate.batch_timeout (%s); it was cancelled at the agent", transfer.ErrTransferFailed, b.ID, b.Room, e.cfg.BatchTimeout)
	case errors.Is(err, ErrAgentUnreachable):
		e.markDown(err)
		return fmt.Errorf("%w: batch %s: %v", transfer.ErrEngineUnavailable, b.ID, err)
	}
	return fmt.Errorf("%w: transfer agent failed batch %s: %v", transfer.ErrTransferFailed, b.ID, err)
}

func batchGrace(d time.Duration) time.Duration {
	return min(max(d/10, 100*time.Millisecond), 2*time.Second)
}

// Transfer implements transfer.Engine on the agent.
func (e *DelegateEngine) Transfer(ctx context.Context, op transfer.ChunkOp) (transfer.ChunkResult, error) {
	if len(op.Engine) > 0 {
		done, err := e.useLayouts(op)
		if err != nil {
			return transfer.ChunkResult{}, err
		}
		defer done()
	}
	b, err := TransferBatch(op)
	res, err := e.run(ctx, b, err)
	if err == nil && op.Last && op.Marker != 0 {
		res.MarkerWritten = op.Marker
	}
	return res, err
}

// Scatter implements transfer.Scatterer on the agent.
func (e *DelegateEngine) Scatter(ctx context.Context, op transfer.ScatterOp) (transfer.ChunkResult, error) {
	b, err := ScatterBatch(op)
	res, err := e.run(ctx, b, err)
	if err == nil {
		res.MarkerWritten = op.Marker
	}
	return res, err
}

// run executes a batch built with buildErr and times it.
func (e *DelegateEngine) run(ctx context.Context, b kvcopy.Batch, buildErr error) (transfer.ChunkResult, error) {
	if buildErr != nil {
		return transfer.ChunkResult{}, fmt.Errorf("%w: %v", transfer.ErrTransferFailed, buildErr)
	}
	start := e.clock.Now()
	if err := e.execute(ctx, b); err != nil {
		return transfer.ChunkResult{}, err
	}
	return transfer.ChunkResult{Bytes: b.Bytes(), Duration: e.clock.Now().Sub(start)}, nil
}

// metadataWrite is the inline write of a room's metadata slot.
func metadataWrite(dp int, slot int32, marker uint64, ids []int32) (kvcopy.InlineWrite, error) {
	if slot < 0 {
		return kvcopy.InlineWrite{}, fmt.Errorf("the room has no metadata slot")
	}
	data, err := kvcopy.EncodeMetadata(marker, ids)
	if err != nil {
		return kvcopy.InlineWrite{}, err
	}
	return kvcopy.InlineWrite{DstBuffer: kvcopy.MetadataName(dp), DstOffset: int64(slot) * kvcopy.MetadataSlotBytes, Data: data}, nil
}

// TransferBatch is the copy batch of one chunk (see kvcopy for the layouts):
// per destination page and non-dummy target, one contiguous copy when the
// prefill rank's heads are exactly the decode rank's (equal TP, and MLA),
// else one strided copy of the head slice over every (layer, K/V, token) row
// of the page; with the last chunk, the metadata slot.
func TransferBatch(op transfer.ChunkOp) (kvcopy.Batch, error) {
	l := op.Layout
	b := kvcopy.Batch{ID: fmt.Sprintf("t/%d/%d/%d.%d.%d.%d/%d", op.Room, op.Attempt, op.Rank.DP, op.Rank.CP, op.Rank.TP, op.Rank.PP, op.ChunkIndex), Room: op.Room}
	if len(op.Engine) > 0 {
		return layoutBatch(op, b)
	}
	if len(op.DestPages) > 0 {
		if op.SrcBuffer == "" {
			return b, fmt.Errorf("chunk %d of room %d: the delegated path needs source.buffer (the prefill rank's KV buffer at the transfer agent)", op.ChunkIndex, op.Room)
		}
		if strings.HasPrefix(op.SrcBuffer, "decode/") {
			return b, fmt.Errorf("chunk %d of room %d: source.buffer %q is one of the decode side's own buffers: a chunk is copied from the prefill rank's KV buffer", op.ChunkIndex, op.Room, op.SrcBuffer)
		}
		if len(op.SrcPages) != len(op.DestPages) {
			return b, fmt.Errorf("chunk %d of room %d: source.page_indices has %d entries for %d pages", op.ChunkIndex, op.Room, len(op.SrcPages), len(op.DestPages))
		}
	}
	dec := kvcopy.DecodeKV(l)
	pre := kvcopy.PrefillKV(l, max(1, op.PrefillTP), max(1, op.PrefillPP), op.Rank.PP)
	lb, _ := transfer.StageLayers(l.NumLayers, max(1, op.PrefillPP), op.Rank.PP)
	for _, t := range op.Targets {
		if t.Dummy {
			continue
		}
		dst := kvcopy.DecodeKVName(op.DecodeDP, t.DecodeTP)
		whole := l.IsMLA || (t.NumHeads == pre.Heads && pre.Heads == dec.Heads && t.SrcHeadStart == 0 && t.DstHeadStart == 0)
		for i, dp := range op.DestPages {
			sp := int(op.SrcPages[i])
			c := kvcopy.Copy{SrcBuffer: op.SrcBuffer, DstBuffer: dst}
			switch {
			case l.IsMLA:
				c.SrcOffset, c.DstOffset = pre.RowOffset(sp, 0, 0), dec.RowOffset(int(dp), lb, 0)
				c.Length = int64(pre.Layers) * int64(pre.PageSize) * pre.RowBytes
			case whole:
				c.SrcOffset, c.DstOffset = pre.Offset(sp, 0, 0, 0, 0), dec.Offset(int(dp), lb, 0, 0, 0)
				c.Length = pre.PageBytes()
			default:
				c.SrcOffset = pre.Offset(sp, 0, 0, 0, t.SrcHeadStart)
				c.DstOffset = dec.Offset(int(dp), lb, 0, 0, t.DstHeadStart)
				c.Length = int64(t.NumHeads) * pre.HeadBytes
				c.Count = pre.Layers * 2 * pre.PageSize
				c.SrcStride, c.DstStride = pre.TokenRowBytes(), dec.TokenRowBytes()
			}
			b.Copies = append(b.Copies, c)
		}
	}
	if op.Last && (op.Marker != 0 || len(op.OutputIDs) > 0) {
		w, err := metadataWrite(op.DecodeDP, op.MetadataSlot, op.Marker, op.OutputIDs)
		if err != nil {
			return b, fmt.Errorf("metadata of room %d: %w", op.Room, err)
		}
		b.Writes = append(b.Writes, w)
	}
	return b, nil
}

// ScatterBatch is the copy batch of one staged region: for every writer,
// K/V, layer and destination page, one strided copy of page_size token rows
// from the writer's block in the ring (token-major, heads × head_dim) into
// the writer's head range of the page; the metadata slot when the op carries
// the marker.
func ScatterBatch(op transfer.ScatterOp) (kvcopy.Batch, error) {
	l := op.Layout
	b := kvcopy.Batch{ID: fmt.Sprintf("s/%d/%d/%d.%d/%d", op.Room, op.Attempt, op.DecodeDP, op.DecodeTP, op.ChunkIndex), Room: op.Room}
	if l.IsMLA {
		return b, errors.New("staging does not apply to MLA pools")
	}
	if want := op.Tokens; want != len(op.DestPages)*l.PageSize {
		return b, fmt.Errorf("scatter of chunk %d: %d tokens for %d pages of %d", op.ChunkIndex, want, len(op.DestPages), l.PageSize)
	}
	dec := kvcopy.DecodeKV(l)
	hb := l.HeadBytes()
	ring, dst := kvcopy.StagingName(op.DecodeDP, op.DecodeTP), kvcopy.DecodeKVName(op.DecodeDP, op.DecodeTP)
	tokens := int64(op.Tokens)
	for _, w := range op.Writers {
		base := op.RingOffset + tokens*w.OffsetPerToken
		nh := int64(w.NumHeads)
		nl := w.LayerEnd - w.LayerBegin
		row := nh * hb
		block := tokens * row
		for kv := range 2 {
			for li := range nl {
				src := base + int64(kv*nl+li)*block
				for pi, page := range op.DestPages {
					b.Copies = append(b.Copies, kvcopy.Copy{
						SrcBuffer: ring, SrcOffset: src + int64(pi*l.PageSize)*row,
						DstBuffer: dst, DstOffset: dec.Offset(int(page), w.LayerBegin+li, kv, 0, w.DstHeadStart),
						Length: row, Count: l.PageSize, SrcStride: row, DstStride: dec.TokenRowBytes(),
					})
				}
			}
		}
	}
	if op.Marker != 0 {
		mw, err := metadataWrite(op.DecodeDP, op.MetadataSlot, op.Marker, op.OutputIDs)
		if err != nil {
			return b, fmt.Errorf("metadata of room %d: %w", op.Room, err)
		}
		b.Writes = append(b.Writes, mw)
	}
	return b, nil
}

// CheckChunk implements transfer.ChunkChecker: on the delegated path a
// chunk with pages names its source (a prefill-side buffer at the agent, one
// page per destination page). A request without it is refused before
// anything changes, instead of failing the room when the batch is built.
func (e *DelegateEngine) CheckChunk(src transfer.ChunkSource) error {
	if src.NumPages <= 0 {
		return nil
	}
	switch {
	case src.Buffer == "":
		return invalid("source.buffer", "is required on the delegated transfer path: the prefill rank's KV buffer at the transfer agent")
	case strings.HasPrefix(src.Buffer, "decode/"):
		return invalid("source.buffer", "%q is one of the decode side's own buffers: a chunk is copied from the prefill rank's KV buffer", src.Buffer)
	case len(src.Pages) != src.NumPages:
		return invalid("source.page_indices", "has %d entries for num_pages %d: the delegated path needs one prefill page per destination page", len(src.Pages), src.NumPages)
	}
	for i, p := range src.Pages {
		if p < 0 {
			return invalid("source.page_indices", "[%d] = %d is negative", i, p)
		}
	}
	return nil
}

func isUnreachable(err error) bool { return errors.Is(err, ErrAgentUnreachable) }

func invalid(field, format string, args ...any) error {
	return &transfer.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}
