package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/kvmanager/staging"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// The Manager's side of staging (the handler itself, its rings and regions,
// is package staging). A prefill rank allocates a chunk's region per decode
// rank (AllocateStaging, deduplicated across the rank's peers), writes it
// once the watermark allows, and reports it (StagingChunkReady); the report
// counts as the rank's chunk for the room's progress. When every writer of
// a region has reported, the Manager has the region scattered into the
// room's pages by the transfer engine (transfer.Scatterer), outside its lock, and
// the handler frees it and advances the watermark. A staged room holds a
// success gate from admission until every allocated region is scattered; if
// the scatters are not done timeouts.waiting after every prefill rank
// reported, the room fails (FailureStagingFailed) — that timeout is an
// entry of the manager's deadline heap. Every exit path frees every region
// of the room (an OnRoomEnd hook), after any scatter in flight returned.

// The staging types and errors are the staging package's; kvmanager
// re-exports them under their historical names so that its callers (the
// server, the engines) need not know where the handler lives.
type (
	StagingWriter = staging.Writer
	// StagingHeadSlice has HeadSlice's fields; staging keeps its own type
	// because it may not import the registry's.
	StagingHeadSlice = staging.HeadSlice
	StagingTarget    = staging.Target
	HeadSlicePair    = staging.Pair
	Watermark        = staging.Watermark
	StagingRingInfo  = staging.RingInfo
	StagingPlan      = staging.Plan
	StagingRegion    = staging.Region
	RingRegion       = staging.RingRegion
	StagingError     = staging.UnavailableError
	WatermarkWatch   = staging.Watch
)

// Staging errors (the server maps them with errors.Is; see the staging
// package for what each means).
var (
	ErrStagingUnavailable = staging.ErrUnavailable
	ErrStagingTooLarge    = staging.ErrTooLarge
	ErrStagingNotWritable = staging.ErrNotWritable
)

// StagingHint is SGLang's advice when a chunk does not fit the decode ring.
const StagingHint = staging.Hint

// StagingChunkResult is ChunkReady's answer.
type StagingChunkResult struct {
	Poll       KVPoll
	Duplicate  bool
	Arrived    int
	NumWriters int
	Scattered  bool
}

// stagingState is the manager's side of staging: the handler (its own leaf
// lock, taken under a shard's). Per staged room, the handler's state and the
// room's completion timeout are its shard's (shard.staged), guarded by the
// shard's lock.
type stagingState struct {
	s      *staging.Stager
	layout kvlayout.Layout
	engine transfer.Engine
}

// stagedRoom is the staging handler's state of one room (its completion
// timeout is the room's own deadline).
type stagedRoom struct {
	st *staging.Room
}

// StagingRingBytes is the staging ring of each decode rank for a decode
// configuration: staging.pool_size_mb MiB when staging is enabled on a
// non-MLA pool, else 0. The delegated path registers it as
// "decode/dp{d}/tp{e}/staging".
func StagingRingBytes(dec kvlayout.Config) int64 {
	if !dec.Staging.Enabled || dec.Pool.Kind.IsMLA() {
		return 0
	}
	return int64(dec.Staging.PoolSizeMB) << 20
}

func (g *stagingState) ringBytes() int64 { return g.s.RingBytes() }

// totalKVHeads is SGLang's resolve_total_kv_heads: the model's total, else
// per-rank heads × decode TP.
func (g *stagingState) totalKVHeads() (int, error) {
	if g.layout.TotalKVHeads > 0 {
		return g.layout.TotalKVHeads, nil
	}
	if g.layout.HeadsPerRank > 0 {
		return g.layout.HeadsPerRank * g.layout.AttnTP, nil
	}
	return 0, &StagingError{Msg: "Cannot resolve total_kv_heads: the decode KV layout has neither a total KV head count nor per-rank KV heads (SGLang's kv_args has neither total_kv_head_num nor kv_head_num). Set kv_pool.kv_heads to the model's number of KV heads."}
}

// usable applies SGLang's staging setup checks in its order: MLA,
// allocator present, total KV heads, and the engine's scatter capability.
func (g *stagingState) usable() (int, error) {
	if g.layout.IsMLA {
		return 0, &StagingError{Msg: kvlayout.MsgStagingMLA}
	}
	if !g.layout.Staging || g.ringBytes() <= 0 {
		return 0, &StagingError{Msg: "Staging is enabled on the prefill side but this decode instance has no staging allocator (SGLang: \"Staging is enabled but kv_manager._staging_ctx.allocator is None\"): start decodeplane with staging.enabled: true (SGLANG_DISAGG_STAGING_BUFFER=1) and staging.pool_size_mb > 0 on transfer.backend mooncake or nixl, or send the KV with Rooms.Transfer / ReportTransfer."}
	}
	heads, err := g.totalKVHeads()
	if err != nil {
		return 0, err
	}
	if _, ok := g.engine.(transfer.Scatterer); !ok {
		return 0, &StagingError{Msg: fmt.Sprintf("Staging is enabled but the transfer engine (%T) cannot scatter staged chunks into the KV pool. Use transfer.path sim or delegate.", g.engine)}
	}
	return heads, nil
}

// SetupStaging validates staging against this decode instance and returns
// the plan of one prefill rank (setup, sizing, layout and head slices). Errors: *StagingError
// (ErrStagingUnavailable) with SGLang's messages; ErrPrefillNotFound.
func (m *Manager) SetupStaging(rank RankID) (StagingPlan, error) {
	heads, err := m.stg.usable()
	if err != nil {
		return StagingPlan{}, err
	}
	inst, ok := m.reg.Instance(rank.Addr)
	if !ok {
		return StagingPlan{}, fmt.Errorf("setup staging for %s: %w (register it first)", rank, ErrPrefillNotFound)
	}
	topo := inst.Topology
	if rank.TP >= topo.AttnTP || rank.PP >= topo.PP || rank.DP >= topo.DP || rank.CP >= topo.AttnCP {
		return StagingPlan{}, invalid("rank", "%s is outside %s's layout (attn_tp %d, pp %d, dp %d, attn_cp %d)", rank, rank.Addr, topo.AttnTP, topo.PP, topo.DP, topo.AttnCP)
	}
	l := m.layout
	plan := StagingPlan{
		Required: inst.Plan.Staging(), PrefillTP: topo.AttnTP, DecodeTP: l.AttnTP, PrefillPP: topo.PP, DecodePP: l.PP,
		TotalKVHeads: heads, PageSize: l.PageSize, NumLayers: l.NumLayers, HeadBytes: l.HeadBytes(),
		CompletionTimeout: m.cfg.Timeouts.Waiting,
	}
	seen := map[[2]int]bool{}
	mapping, _ := m.reg.Mapping(topo) // accepted at registration: cannot fail now
	for _, dm := range mapping {
		for _, t := range dm.TargetTPRanks {
			if slices.Contains(dm.DummyTPRanks, t) || seen[[2]int{t, dm.DecodeTP}] {
				continue
			}
			seen[[2]int{t, dm.DecodeTP}] = true
			plan.Pairs = append(plan.Pairs, HeadSlicePair{PrefillTP: t, DecodeTP: dm.DecodeTP, Slice: staging.HeadSlice(ComputeHeadSliceParams(topo.AttnTP, l.AttnTP, t, dm.DecodeTP, heads))})
		}
	}
	sort.Slice(plan.Pairs, func(i, j int) bool {
		a, b := plan.Pairs[i], plan.Pairs[j]
		if a.PrefillTP != b.PrefillTP {
			return a.PrefillTP < b.PrefillTP
		}
		return a.DecodeTP < b.DecodeTP
	})
	q := m.stg.s.Stage(topo.PP, rank.PP)
	if rp := inst.Plan.Rank(rank.Key()); rp != nil {
		for _, tg := range rp.Targets() {
			if tg.Dummy {
				continue
			}
			ws := m.stg.s.Writers(topo.AttnTP, topo.PP, heads, tg.DecodeTP, q)
			st := StagingTarget{DecodeTP: tg.DecodeTP, Slice: staging.HeadSlice{SrcHeadStart: tg.SrcHeadStart, DstHeadStart: tg.DstHeadStart, NumHeads: tg.NumHeads}, Writers: ws}
			for _, w := range ws {
				st.RegionBytesPerToken += w.BytesPerToken
				if w.PrefillTP == rank.TP && w.PrefillPP == rank.PP {
					st.Writer = w
				}
			}
			plan.Targets = append(plan.Targets, st)
			for dp := range l.DP {
				plan.Rings = append(plan.Rings, m.stg.s.RingInfo(dp, tg.DecodeTP))
			}
		}
	}
	return plan, nil
}

// stagingOpen registers a staged room when it is admitted, before its
// destination is offered (SGLang's register_decode_req before
// send_metadata); its regions are freed when the room's resources go back
// (released).
func (sh *shard) stagingOpen(e *entry) {
	m := sh.m
	if sh.staged == nil {
		sh.staged = map[uint64]*stagedRoom{}
	}
	if old := sh.staged[e.ID()]; old != nil {
		sh.stagingRelease(e.ID())
	}
	topo := m.reg.Topology(e.Addr())
	sh.staged[e.ID()] = &stagedRoom{st: m.stg.s.Open(e.ID(), e.Attempt(), topo.AttnTP, topo.PP)}
}

// stagingRelease frees every region of a room (SGLang's
// unregister_decode_req) and forgets its staging state. It runs when no
// scatter of the room is in flight.
func (sh *shard) stagingRelease(id uint64) {
	sr := sh.staged[id]
	if sr == nil {
		return
	}
	delete(sh.staged, id)
	for _, f := range sh.m.stg.s.Release(sr.st) {
		sh.m.log.Debug("releasing unscattered staging allocation", "room", id, "chunk", f.Chunk, "decode_tp", f.DecodeTP,
			"offset", f.Region.Offset, "size", f.Region.Size, "round", f.Region.Round)
	}
}

// scattersPending reports whether staged regions of the room's current
// attempt are still to be scattered (its success waits for them).
func (sh *shard) scattersPending(e *entry) bool {
	if !e.HasGate(room.StagingGate) {
		return false
	}
	sr := sh.staged[e.ID()]
	return sr != nil && sr.st.Attempt() == e.Attempt() && sh.m.stg.s.Pending(sr.st) > 0 && sh.m.stg.s.ScattersDue(sr.st)
}

// scatterMissing names the regions a staged room still waits for.
func (sh *shard) scatterMissing(e *entry) []string {
	if sr := sh.staged[e.ID()]; sr != nil {
		return sh.m.stg.s.Missing(sr.st)
	}
	return nil
}

// stagingWrite checks that rank may write the room through staging now
// (the room's prefill, DP rank, a required rank that claimed the
// destination, a room being handed off, a staged room) and records its
// claim; it returns the room's staging state (mu held).
func (sh *shard) stagingWrite(e *entry, rank RankID, what string) (*stagedRoom, error) {
	sr := sh.staged[e.ID()]
	ef := sh.exec(e, room.StagingWrite{Now: sh.m.clock.Now(), Rank: rank, What: what, Staged: sr != nil && sr.st.Attempt() == e.Attempt()})
	if ef.Err != nil {
		return nil, ef.Err
	}
	if f := e.Failure(); f != nil { // the claim's success check failed the room
		return nil, fmt.Errorf("%s of room %d: %w: the room failed: %s", what, e.ID(), ErrWrongState, f.Message)
	}
	return sr, nil
}

// AllocateStaging allocates the regions of one chunk of a staged room, one
// per decode rank the prefill rank writes to, each shared by all its writers
// (SGLang's handle_staging_req). A chunk larger than the ring fails the room
// and returns ErrStagingTooLarge with SGLang's hint.
func (m *Manager) AllocateStaging(id uint64, rank RankID, chunk, numPages int) ([]StagingRegion, error) {
	heads, err := m.stg.usable()
	if err != nil {
		return nil, err
	}
	sh, e := m.shards.lock(id)
	if e == nil {
		return nil, fmt.Errorf("allocate staging for chunk %d of room %d: %w", chunk, id, ErrRoomNotFound)
	}
	defer sh.unlock()
	sr, err := sh.stagingWrite(e, rank, fmt.Sprintf("allocate staging for chunk %d", chunk))
	if err != nil {
		return nil, err
	}
	if numPages <= 0 {
		return nil, invalid("num_pages", "must be > 0")
	}
	if numPages > len(e.Pages()) {
		return nil, invalid("num_pages", "%d is more than the destination's %d pages", numPages, len(e.Pages()))
	}
	q := sr.st.Stage(m.stg.s, rank.PP)
	var out []StagingRegion
	for _, tg := range e.TargetsOf(rank.Key()) {
		if tg.Dummy {
			continue
		}
		reg, err := m.stg.s.Allocate(sr.st, staging.Alloc{DecodeDP: e.DecodeDP(), DecodeTP: tg.DecodeTP, Stage: q, Chunk: chunk, NumPages: numPages,
			Heads: heads, WriterTP: rank.TP, WriterPP: rank.PP})
		if err != nil {
			var tl *staging.TooLargeError
			if errors.As(err, &tl) {
				sh.fail(e, Failure{Code: FailureStagingFailed, Message: tl.Msg})
			}
			return nil, err
		}
		out = append(out, reg)
	}
	if len(out) > 0 {
		e.Apply(room.StagingAllocated{Rank: rank.Key()}) // the rank writes into these regions (deferred release)
	}
	return out, nil
}

// stagingTargets lists the decode TP ranks rank writes to in the room
// (dummy targets included: they have no region).
func stagingTargets(e *entry, rank RankID) []int {
	tgs := e.TargetsOf(rank.Key())
	if tgs == nil {
		return nil
	}
	tps := make([]int, 0, len(tgs))
	for _, tg := range tgs {
		tps = append(tps, tg.DecodeTP)
	}
	return tps
}

// StagingChunkReady records that a prefill rank wrote its part of a chunk's
// regions (SGLang's CHUNK_READY, handle_chunk_arrived). It counts as the
// rank's chunk for the room's progress; when it completes a region's writer
// set the region is scattered before it returns. A region the watermark has
// not released is ErrStagingNotWritable and nothing is recorded. A retry of
// a reported chunk is a duplicate; it resubmits a scatter that failed with
// transfer.ErrEngineUnavailable.
func (m *Manager) StagingChunkReady(ctx context.Context, req ChunkRequest) (StagingChunkResult, error) {
	if _, err := m.stg.usable(); err != nil {
		return StagingChunkResult{}, err
	}
	sh, e := m.shards.lock(req.Room)
	if e == nil {
		return StagingChunkResult{}, fmt.Errorf("chunk %d of room %d: %w", req.Index, req.Room, ErrRoomNotFound)
	}
	if e.ChunkSent(req.Rank, req.Index) {
		if err := e.SameChunk(req); err != nil {
			sh.unlock()
			return StagingChunkResult{}, err
		}
		// A retry: resubmit the regions whose scatter did not happen.
		sr := sh.staged[e.ID()]
		todo := sh.readyRegions(e, sr, req.Rank, req.Index)
		sh.unlock()
		res, err := sh.runScatters(ctx, e, sr, todo)
		res.Duplicate = true
		return res, err
	}
	scs, writerIdx, err := sh.stagedChunk(e, req)
	if err != nil {
		sh.unlock()
		return StagingChunkResult{}, err
	}
	creq := ChunkRequest{Room: req.Room, Rank: req.Rank, Index: req.Index, PageOffset: req.PageOffset, NumPages: req.NumPages, Last: req.Last, Marker: req.Marker}
	ef := sh.exec(e, room.ChunkBegin{Now: m.clock.Now(), Req: creq, Via: room.ViaStaging})
	if ef.Err != nil || !ef.Begin.Fresh {
		sh.unlock()
		if ef.Err == nil {
			ef.Err = fmt.Errorf("chunk %d of room %d: %w: already reported", req.Index, e.ID(), ErrWrongState)
		}
		return StagingChunkResult{}, ef.Err
	}
	res := transfer.ChunkResult{Duration: -1} // the prefill moved it into the ring
	for i, sc := range scs {
		res.Bytes += m.stg.s.Arrive(sc, writerIdx[i], req.PageOffset, req.Marker, req.OutputIDs)
	}
	sh.exec(e, room.ChunkEnd{Now: m.clock.Now(), Req: creq, Via: room.ViaStaging, Result: res})
	sr := sh.staged[e.ID()]
	todo := sh.readyRegions(e, sr, req.Rank, req.Index)
	sh.unlock()
	out, err := sh.runScatters(ctx, e, sr, todo)
	for i, sc := range scs {
		if n, w := m.stg.s.Arrived(sc); i == 0 || n < out.Arrived {
			out.Arrived, out.NumWriters = n, w
		}
	}
	return out, err
}

// stagedChunk checks a staged chunk's report against the rank's right to
// write and its regions: the region of every decode rank the prefill rank
// writes to, and its writer index there (mu held; nothing is recorded).
func (sh *shard) stagedChunk(e *entry, req ChunkRequest) ([]*staging.Staged, []int, error) {
	m := sh.m
	sr, err := sh.stagingWrite(e, req.Rank, fmt.Sprintf("chunk %d", req.Index))
	if err != nil {
		return nil, nil, err
	}
	if req.Marker != 0 || len(req.OutputIDs) > 0 {
		if !req.Last {
			return nil, nil, invalid("aux", "only the last chunk carries the metadata (aux)")
		}
		if len(req.OutputIDs) > kvcopy.MaxOutputIDs {
			return nil, nil, invalid("aux.output_ids", "has %d ids; a metadata slot holds at most %d", len(req.OutputIDs), kvcopy.MaxOutputIDs)
		}
	}
	q := sr.st.Stage(m.stg.s, req.Rank.PP)
	var scs []*staging.Staged
	var writerIdx []int
	rep := staging.Report{DecodeDP: e.DecodeDP(), NumPages: req.NumPages, PageOffset: req.PageOffset, WriterTP: req.Rank.TP, WriterPP: req.Rank.PP}
	for _, tg := range e.TargetsOf(req.Rank.Key()) {
		if tg.Dummy {
			continue
		}
		sc := m.stg.s.Lookup(sr.st, req.Index, tg.DecodeTP, q)
		if sc == nil {
			return nil, nil, fmt.Errorf("chunk %d of room %d for decode rank %d: %w: no staging region is allocated (call AllocateStaging first)", req.Index, e.ID(), tg.DecodeTP, ErrWrongState)
		}
		wi, err := m.stg.s.Check(sr.st, sc, rep)
		if err != nil {
			return nil, nil, err
		}
		if wi < 0 {
			return nil, nil, invalid("rank", "%s is not a writer of chunk %d's region on decode rank %d", req.Rank, req.Index, tg.DecodeTP)
		}
		scs = append(scs, sc)
		writerIdx = append(writerIdx, wi)
	}
	return scs, writerIdx, nil
}

// readyRegions lists the regions of rank's chunk whose writers have all
// reported and whose scatter has not landed.
func (sh *shard) readyRegions(e *entry, sr *stagedRoom, rank RankID, chunk int) []*staging.Staged {
	if sr == nil || sr.st.Attempt() != e.Attempt() {
		return nil
	}
	tps := stagingTargets(e, rank)
	if tps == nil {
		return nil
	}
	return sh.m.stg.s.Ready(sr.st, chunk, sr.st.Stage(sh.m.stg.s, rank.PP), tps)
}

// runScatters scatters the regions (one after the other) and returns once
// they landed or failed. It is called without the lock.
func (sh *shard) runScatters(ctx context.Context, e *entry, sr *stagedRoom, scs []*staging.Staged) (StagingChunkResult, error) {
	m := sh.m
	out := StagingChunkResult{Scattered: len(scs) > 0}
	eng, _ := m.engine.(transfer.Scatterer)
	for _, sc := range scs {
		sh.mu.Lock()
		wait, done := m.stg.s.Scattering(sc)
		for wait != nil {
			sh.unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return out, ctx.Err()
			}
			sh.mu.Lock()
			wait, done = m.stg.s.Scattering(sc)
		}
		if done {
			sh.unlock()
			continue
		}
		err := e.ScatterWritable(sc.Chunk())
		if err == nil && sh.staged[e.ID()] != sr {
			err = fmt.Errorf("scatter chunk %d of room %d: %w: the room ended", sc.Chunk(), e.ID(), ErrWrongState)
		}
		if err != nil {
			sh.unlock()
			return out, err
		}
		// A scatter writes the pages before every rank claimed: the claim
		// timeout must not end the room under it (as Transfer does).
		sh.exec(e, room.ScatterBegin{})
		op := sh.scatterOp(e, m.stg.s.StartScatter(sc))
		xctx, roomSpan := e.xferCtx(), e.logCtx()
		sh.unlock()

		// The scatter outlives the caller's RPC (every writer already
		// reported) but not the room.
		var attrs []attribute.KeyValue
		if m.tracing {
			attrs = []attribute.KeyValue{
				attribute.Int64("decodeplane.room", int64(op.Room)), attribute.Int("decodeplane.chunk", op.ChunkIndex),
				attribute.Int("decodeplane.decode_tp_rank", op.DecodeTP), attribute.Int("decodeplane.pages", len(op.DestPages)),
				attribute.Int("decodeplane.staging.writers", len(op.Writers))}
		}
		res, err := runRoomOp(m, context.WithoutCancel(ctx), xctx, roomSpan, "staging.scatter", attrs,
			func(ctx context.Context) (transfer.ChunkResult, error) { return eng.Scatter(ctx, op) })

		sh.mu.Lock()
		unavailable := err != nil && !e.Phase().Terminal() && errors.Is(err, transfer.ErrEngineUnavailable)
		m.stg.s.EndScatter(sr.st, sc, !unavailable) // the region is freed unless nothing landed (a retried ChunkReady resubmits it)
		ef := sh.exec(e, room.ScatterEnd{Now: m.clock.Now(), Chunk: op.ChunkIndex, DecodeTP: op.DecodeTP, Err: err, Unavailable: unavailable,
			Marker: res.MarkerWritten, WritesUntil: writesUntil(err), SelfWriter: m.selfWriters.known(e.Addr())})
		out.Poll = e.Phase().Poll()
		sh.unlock()
		if ef.Err != nil {
			out.Scattered = false
			return out, ef.Err
		}
	}
	sh.mu.Lock()
	out.Poll = e.Phase().Poll()
	sh.unlock()
	return out, nil
}

// scatterOp is the engine's operation for one region of the room.
func (sh *shard) scatterOp(e *entry, sc staging.Scatter) transfer.ScatterOp {
	pages := e.Pages()
	op := transfer.ScatterOp{
		Room: e.ID(), RID: e.Request().RID, Attempt: e.Attempt(), ChunkIndex: sc.Chunk, DecodeDP: e.DecodeDP(), DecodeTP: sc.DecodeTP,
		Layout: sh.m.layout, RingOffset: sc.Region.Offset, Tokens: sc.Tokens,
		DestPages: slices.Clone(pages[sc.PageOffset : sc.PageOffset+sc.NumPages]),
		Writers:   make([]transfer.ScatterWriter, len(sc.Writers)), MetadataSlot: e.MetadataSlot(), Marker: sc.Marker, OutputIDs: sc.OutputIDs,
	}
	for i, w := range sc.Writers {
		op.Writers[i] = transfer.ScatterWriter{NumHeads: w.Slice.NumHeads, DstHeadStart: w.Slice.DstHeadStart, LayerBegin: w.LayerBegin, LayerEnd: w.LayerEnd,
			BytesPerToken: w.BytesPerToken, OffsetPerToken: w.OffsetPerToken}
	}
	return op
}

// WatchWatermark watches the rings of decode DP shard dp (tps empty: every
// TP rank). The first Next returns every ring's current state.
func (m *Manager) WatchWatermark(dp int, tps []int) (*WatermarkWatch, error) {
	if _, err := m.stg.usable(); err != nil {
		return nil, err
	}
	if dp < 0 || dp >= m.layout.DP {
		return nil, invalid("decode_dp_rank", "%d is out of range (allowed 0..%d)", dp, m.layout.DP-1)
	}
	if len(tps) == 0 {
		for tp := range m.layout.AttnTP {
			tps = append(tps, tp)
		}
	}
	for _, tp := range tps {
		if tp < 0 || tp >= m.layout.AttnTP {
			return nil, invalid("decode_tp_ranks", "%d is out of range (allowed 0..%d)", tp, m.layout.AttnTP-1)
		}
	}
	return m.stg.s.Watch(dp, tps), nil
}

// StagingWatermarks returns the state of every decode rank's ring (for
// status and metrics), ordered by (DP, TP): rings not used yet are reported
// empty. None when staging is off.
func (m *Manager) StagingWatermarks() []Watermark { return m.stg.s.Watermarks() }

// runRoomOp runs an engine operation of a room under a span named name
// (linked to the room's span), with a context that ends when parent or the
// room's transfer context (the room failed) ends. Without tracing no span
// is started (attrs is then nil).
func runRoomOp(m *Manager, parent, xctx, roomSpan context.Context, name string, attrs []attribute.KeyValue, op func(context.Context) (transfer.ChunkResult, error)) (transfer.ChunkResult, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	stop := context.AfterFunc(xctx, cancel)
	defer stop()
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
