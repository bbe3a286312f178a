package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/decodeplane/decodeplane/kvmanager/staging"
	"github.com/decodeplane/decodeplane/prealloc"
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

// stagingGate is the success gate of a staged room.
const stagingGate = "staging"

// stagingState is the manager's side of staging: the handler (its own leaf
// lock, taken under a shard's). Per staged room, the handler's state and the
// room's completion timeout are its shard's (shard.staged), guarded by the
// shard's lock.
type stagingState struct {
	s *staging.Stager
}

type stagedRoom struct {
	st    *staging.Room
	timer deadline // the completion timeout, on the manager's deadline heap
	// deadline is when timer fires: once every region is scattered it
	// becomes the room's waiting deadline again, so that a room still not
	// successful (no metadata marker, another gate) stays bounded.
	deadline time.Time
}

// StagingRingBytes is the staging ring of each decode rank for a decode
// configuration: staging.pool_size_mb MiB when staging is enabled on a
// non-MLA pool, else 0. The delegated path registers it as
// "decode/dp{d}/tp{e}/staging".
func StagingRingBytes(dec prealloc.Config) int64 {
	if !dec.Staging.Enabled || dec.Pool.Kind.IsMLA() {
		return 0
	}
	return int64(dec.Staging.PoolSizeMB) << 20
}

func (m *Manager) ringBytes() int64 { return m.stg.s.RingBytes() }

// totalKVHeads is SGLang's resolve_total_kv_heads: the model's total, else
// per-rank heads × decode TP.
func (m *Manager) totalKVHeads() (int, error) {
	if m.layout.TotalKVHeads > 0 {
		return m.layout.TotalKVHeads, nil
	}
	if m.layout.HeadsPerRank > 0 {
		return m.layout.HeadsPerRank * m.layout.AttnTP, nil
	}
	return 0, &StagingError{Msg: "Cannot resolve total_kv_heads: the decode KV layout has neither a total KV head count nor per-rank KV heads (SGLang's kv_args has neither total_kv_head_num nor kv_head_num). Set kv_pool.kv_heads to the model's number of KV heads."}
}

// stagingUsable applies SGLang's staging setup checks in its order: MLA,
// allocator present, total KV heads, and the engine's scatter capability.
func (m *Manager) stagingUsable() (int, error) {
	if m.layout.IsMLA {
		return 0, &StagingError{Msg: prealloc.MsgStagingMLA}
	}
	if !m.layout.Staging || m.ringBytes() <= 0 {
		return 0, &StagingError{Msg: "Staging is enabled on the prefill side but this decode instance has no staging allocator (SGLang: \"Staging is enabled but kv_manager._staging_ctx.allocator is None\"): start decodeplane with staging.enabled: true (SGLANG_DISAGG_STAGING_BUFFER=1) and staging.pool_size_mb > 0 on transfer.backend mooncake or nixl, or send the KV with Rooms.Transfer / ReportTransfer."}
	}
	heads, err := m.totalKVHeads()
	if err != nil {
		return 0, err
	}
	if _, ok := m.engine.(transfer.Scatterer); !ok {
		return 0, &StagingError{Msg: fmt.Sprintf("Staging is enabled but the transfer engine (%T) cannot scatter staged chunks into the KV pool. Use transfer.path sim or delegate.", m.engine)}
	}
	return heads, nil
}

// SetupStaging validates staging against this decode instance and returns
// the plan of one prefill rank (setup, sizing, layout and head slices). Errors: *StagingError
// (ErrStagingUnavailable) with SGLang's messages; ErrPrefillNotFound.
func (m *Manager) SetupStaging(rank RankID) (StagingPlan, error) {
	heads, err := m.stagingUsable()
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

// stagingAdmittedLocked registers a staged room when it is admitted, before
// its destination is offered (SGLang's register_decode_req before
// send_metadata): it holds the staging success gate and arranges that every
// region is freed when the room ends.
func (m *Manager) stagingAdmittedLocked(r *room) {
	if !r.staging || m.ringBytes() <= 0 {
		return
	}
	sh := m.shardOf(r)
	if sh.staged == nil {
		sh.staged = map[uint64]*stagedRoom{}
	}
	if old := sh.staged[r.id]; old != nil {
		m.stagingReleaseLocked(sh, r.id)
	}
	topo := m.topoLocked(r.addr)
	sh.staged[r.id] = &stagedRoom{st: m.stg.s.Open(r.id, r.attempt, topo.AttnTP, topo.PP)}
	r.hold(stagingGate)
	id := r.id
	x := r.x()
	x.onEnd = append(x.onEnd, func() { m.stagingReleaseLocked(sh, id) })
}

// stagingReleaseLocked frees every region of a room (SGLang's
// unregister_decode_req) and forgets its staging state. It runs when no
// scatter of the room is in flight.
func (m *Manager) stagingReleaseLocked(sh *shard, id uint64) {
	sr := sh.staged[id]
	if sr == nil {
		return
	}
	delete(sh.staged, id)
	m.clearDeadlineLocked(&sr.timer)
	for _, f := range m.stg.s.Release(sr.st) {
		m.log.Debug("releasing unscattered staging allocation", "room", id, "chunk", f.Chunk, "decode_tp", f.DecodeTP,
			"offset", f.Region.Offset, "size", f.Region.Size, "round", f.Region.Round)
	}
}

// stagingSettleLocked is consulted by checkSuccessLocked once every required
// rank's chunks landed: it lifts the staging gate when every region is
// scattered, else starts the completion timeout (SGLang: completion_timeout
// after all-success; the waiting timeout no longer applies).
func (m *Manager) stagingSettleLocked(r *room) {
	if !r.gate(stagingGate) {
		return
	}
	sr := m.shardOf(r).staged[r.id]
	if sr == nil || sr.st.Attempt() != r.attempt || m.stg.s.Pending(sr.st) == 0 || !m.stg.s.ScattersDue(sr.st) {
		// Every rank is done, so a region whose writers have not all
		// reported never will be (its pages are covered, and nothing may
		// follow a last chunk): it does not hold the room back; it is freed
		// with the room.
		r.unhold(stagingGate)
		if sr != nil && m.dlArmed(&sr.timer) {
			m.clearDeadlineLocked(&sr.timer)
			// The waiting deadline was lifted for the completion timer:
			// restore it, so that a room that does not succeed now (the
			// metadata marker never came) is still failed in time.
			if r.waitingAt.IsZero() {
				r.waitingAt = sr.deadline
				m.armTimerLocked(r)
			}
		}
		return
	}
	if m.dlArmed(&sr.timer) {
		return
	}
	r.waitingAt = time.Time{}
	m.armTimerLocked(r)
	sr.deadline = m.clock.Now().Add(m.cfg.Timeouts.Waiting)
	m.setDeadlineLocked(&sr.timer, dlStaging, sr.deadline, r.id, r.attempt, nil)
}

// stagingDeadlineLocked fails a staged room whose scatters did not finish within
// the completion timeout.
func (m *Manager) stagingDeadlineLocked(r *room, attempt uint32) {
	id := r.id
	sr := m.shardOf(r).staged[id]
	if r.attempt != attempt || r.phase.Terminal() || sr == nil || sr.st.Attempt() != attempt || m.stg.s.Pending(sr.st) == 0 {
		return
	}
	m.failLocked(r, Failure{Code: FailureStagingFailed, Message: fmt.Sprintf(
		"Request %d: staged KV was not scattered within %.1fs after every prefill rank reported (a scatter never arrived): %s",
		id, m.cfg.Timeouts.Waiting.Seconds(), strings.Join(m.stg.s.Missing(sr.st), "; "))})
}

// stagingRankLocked checks that rank may write room r now: the room's
// prefill, DP rank, a required rank that claimed the destination, a room
// being handed off, and the room is staged.
func (m *Manager) stagingRankLocked(r *room, rank RankID, what string) (*rankProgress, *stagedRoom, error) {
	if rank.Addr != r.addr {
		return nil, nil, invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", rank.Addr, r.id, r.addr)
	}
	if r.phase == PhaseFailed {
		return nil, nil, fmt.Errorf("%s of room %d: %w: the room failed: %s", what, r.id, ErrWrongState, r.failure.Message)
	}
	if r.plan == nil || r.prefillDP < 0 || r.handoff == nil {
		return nil, nil, fmt.Errorf("%s of room %d: %w: the room has no destination yet (phase %s)", what, r.id, ErrWrongState, r.phase)
	}
	if rank.DP != r.prefillDP {
		return nil, nil, invalid("rank.dp_rank", "%d is not room %d's prefill DP rank %d (%s)", rank.DP, r.id, r.prefillDP, r.dpRule)
	}
	rp := r.progress(rank.Key())
	if rp == nil {
		return nil, nil, invalid("rank", "%s sends no KV for room %d: it is a dummy target or not addressed by any decode rank", rank, r.id)
	}
	switch r.phase {
	case PhaseAdmitted, PhaseClaimed, PhaseTransferring:
	default:
		return nil, nil, fmt.Errorf("%s of room %d: %w: phase %s", what, r.id, ErrWrongState, r.phase)
	}
	if !rp.claimed {
		// As for chunks (chunkBeginLocked): a rank whose claim stream was
		// given the destination holds it, even if the claim is not recorded
		// yet (the stream's Send races with this call).
		if c := r.claims.get(rank.Key()); c == nil || r.phase != PhaseAdmitted {
			return nil, nil, fmt.Errorf("%s of room %d from %s: %w: this rank has not claimed the destination (call AwaitDestination first)", what, r.id, rank, ErrWrongState)
		}
		m.claimRankLocked(r, rp)
		if r.phase == PhaseFailed {
			return nil, nil, fmt.Errorf("%s of room %d: %w: the room failed: %s", what, r.id, ErrWrongState, r.failure.Message)
		}
	}
	sr := m.shardOf(r).staged[r.id]
	if !r.staging || sr == nil || sr.st.Attempt() != r.attempt {
		return nil, nil, fmt.Errorf("%s of room %d: %w: the room is not staged (its destination has staging = false): send its KV with Rooms.Transfer or ReportTransfer", what, r.id, ErrWrongState)
	}
	return rp, sr, nil
}

// AllocateStaging allocates the regions of one chunk of a staged room, one
// per decode rank the prefill rank writes to, each shared by all its writers
// (SGLang's handle_staging_req). A chunk larger than the ring fails the room
// and returns ErrStagingTooLarge with SGLang's hint.
func (m *Manager) AllocateStaging(room uint64, rank RankID, chunk, numPages int) ([]StagingRegion, error) {
	heads, err := m.stagingUsable()
	if err != nil {
		return nil, err
	}
	sh, r := m.lockRoom(room)
	if r == nil {
		return nil, fmt.Errorf("allocate staging for chunk %d of room %d: %w", chunk, room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	_, sr, err := m.stagingRankLocked(r, rank, fmt.Sprintf("allocate staging for chunk %d", chunk))
	if err != nil {
		return nil, err
	}
	if numPages <= 0 {
		return nil, invalid("num_pages", "must be > 0")
	}
	if numPages > len(r.pages) {
		return nil, invalid("num_pages", "%d is more than the destination's %d pages", numPages, len(r.pages))
	}
	q := sr.st.Stage(m.stg.s, rank.PP)
	var out []StagingRegion
	for _, tg := range r.plan.Rank(rank.Key()).Targets() {
		if tg.Dummy {
			continue
		}
		reg, err := m.stg.s.Allocate(sr.st, staging.Alloc{DecodeDP: r.decodeDP, DecodeTP: tg.DecodeTP, Stage: q, Chunk: chunk, NumPages: numPages,
			Heads: heads, WriterTP: rank.TP, WriterPP: rank.PP})
		if err != nil {
			var tl *staging.TooLargeError
			if errors.As(err, &tl) {
				m.failLocked(r, Failure{Code: FailureStagingFailed, Message: tl.Msg})
			}
			return nil, err
		}
		out = append(out, reg)
	}
	if rp := r.progress(rank.Key()); rp != nil && len(out) > 0 {
		rp.stagingOpen++ // the rank writes into these regions (deferred release: drain.go)
	}
	return out, nil
}

// stagingTargets lists the decode TP ranks rank writes to in room r (dummy
// targets included: they have no region).
func stagingTargets(r *room, rank RankID) []int {
	if r.plan == nil {
		return nil
	}
	rpl := r.plan.Rank(rank.Key())
	if rpl == nil {
		return nil
	}
	tps := make([]int, 0, len(rpl.Targets()))
	for _, tg := range rpl.Targets() {
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
	if _, err := m.stagingUsable(); err != nil {
		return StagingChunkResult{}, err
	}
	sh, r := m.lockRoom(req.Room)
	if r == nil {
		return StagingChunkResult{}, fmt.Errorf("chunk %d of room %d: %w", req.Index, req.Room, ErrRoomNotFound)
	}
	if rp := r.ranksOf(req.Rank.Key()); rp != nil && req.Rank.Addr == r.addr && req.Rank.DP == r.prefillDP && rp.chunks[req.Index] != nil {
		if err := rp.chunks[req.Index].sameChunk(req); err != nil {
			m.unlockShard(sh)
			return StagingChunkResult{}, err
		}
		// A retry: resubmit the regions whose scatter did not happen.
		sr := sh.staged[r.id]
		todo := m.readyRegionsLocked(r, sr, req.Rank, req.Index)
		m.unlockShard(sh)
		res, err := m.runScatters(ctx, r, sr, todo)
		res.Duplicate = true
		return res, err
	}
	rp, sr, err := m.stagingRankLocked(r, req.Rank, fmt.Sprintf("chunk %d", req.Index))
	if err != nil {
		m.unlockShard(sh)
		return StagingChunkResult{}, err
	}
	if req.Marker != 0 || len(req.OutputIDs) > 0 {
		if !req.Last {
			m.unlockShard(sh)
			return StagingChunkResult{}, invalid("aux", "only the last chunk carries the metadata (aux)")
		}
		if len(req.OutputIDs) > kvcopy.MaxOutputIDs {
			m.unlockShard(sh)
			return StagingChunkResult{}, invalid("aux.output_ids", "has %d ids; a metadata slot holds at most %d", len(req.OutputIDs), kvcopy.MaxOutputIDs)
		}
	}
	q := sr.st.Stage(m.stg.s, req.Rank.PP)
	var scs []*staging.Staged
	var writerIdx []int
	rep := staging.Report{DecodeDP: r.decodeDP, NumPages: req.NumPages, PageOffset: req.PageOffset, WriterTP: req.Rank.TP, WriterPP: req.Rank.PP}
	for _, tg := range r.plan.Rank(req.Rank.Key()).Targets() {
		if tg.Dummy {
			continue
		}
		sc := m.stg.s.Lookup(sr.st, req.Index, tg.DecodeTP, q)
		if sc == nil {
			m.unlockShard(sh)
			return StagingChunkResult{}, fmt.Errorf("chunk %d of room %d for decode rank %d: %w: no staging region is allocated (call AllocateStaging first)", req.Index, r.id, tg.DecodeTP, ErrWrongState)
		}
		wi, err := m.stg.s.Check(sr.st, sc, rep)
		if err != nil {
			m.unlockShard(sh)
			return StagingChunkResult{}, err
		}
		if wi < 0 {
			m.unlockShard(sh)
			return StagingChunkResult{}, invalid("rank", "%s is not a writer of chunk %d's region on decode rank %d", req.Rank, req.Index, tg.DecodeTP)
		}
		scs = append(scs, sc)
		writerIdx = append(writerIdx, wi)
	}
	creq := ChunkRequest{Room: req.Room, Rank: req.Rank, Index: req.Index, PageOffset: req.PageOffset, NumPages: req.NumPages, Last: req.Last, Marker: req.Marker}
	_, cs, fresh, err := m.chunkBeginLocked(r, creq, false)
	if err != nil || !fresh {
		m.unlockShard(sh)
		if err == nil {
			err = fmt.Errorf("chunk %d of room %d: %w: already reported", req.Index, r.id, ErrWrongState)
		}
		return StagingChunkResult{}, err
	}
	if rp := r.ranksOf(req.Rank.Key()); rp != nil && rp.stagingOpen > 0 {
		rp.stagingOpen-- // this chunk's writes are done (deferred release: drain.go)
	}
	res := transfer.ChunkResult{Duration: -1} // the prefill moved it into the ring
	for i, sc := range scs {
		res.Bytes += m.stg.s.Arrive(sc, writerIdx[i], req.PageOffset, req.Marker, req.OutputIDs)
	}
	cs.settle()
	cs.done, cs.result = true, res
	m.chunkLandedLocked(r, rp, creq, res)
	todo := m.readyRegionsLocked(r, sr, req.Rank, req.Index)
	m.unlockShard(sh)
	out, err := m.runScatters(ctx, r, sr, todo)
	for i, sc := range scs {
		if n, w := m.stg.s.Arrived(sc); i == 0 || n < out.Arrived {
			out.Arrived, out.NumWriters = n, w
		}
	}
	return out, err
}

// readyRegionsLocked lists the regions of rank's chunk whose writers have
// all reported and whose scatter has not landed.
func (m *Manager) readyRegionsLocked(r *room, sr *stagedRoom, rank RankID, chunk int) []*staging.Staged {
	if sr == nil || sr.st.Attempt() != r.attempt {
		return nil
	}
	tps := stagingTargets(r, rank)
	if tps == nil {
		return nil
	}
	return m.stg.s.Ready(sr.st, chunk, sr.st.Stage(m.stg.s, rank.PP), tps)
}

// runScatters scatters the regions (one after the other) and returns once
// they landed or failed. It is called without the lock.
func (m *Manager) runScatters(ctx context.Context, r *room, sr *stagedRoom, scs []*staging.Staged) (StagingChunkResult, error) {
	out := StagingChunkResult{Scattered: len(scs) > 0}
	eng, _ := m.engine.(transfer.Scatterer)
	sh := m.shardOf(r)
	for _, sc := range scs {
		sh.mu.Lock()
		wait, done := m.stg.s.Scattering(sc)
		for wait != nil {
			m.unlockShard(sh)
			select {
			case <-wait:
			case <-ctx.Done():
				return out, ctx.Err()
			}
			sh.mu.Lock()
			wait, done = m.stg.s.Scattering(sc)
		}
		if done {
			m.unlockShard(sh)
			continue
		}
		if r.phase.Terminal() || sh.staged[r.id] != sr {
			msg := "the room ended"
			if r.failure != nil {
				msg = "the room failed: " + r.failure.Message
			}
			m.unlockShard(sh)
			return out, fmt.Errorf("scatter chunk %d of room %d: %w: %s", sc.Chunk(), r.id, ErrWrongState, msg)
		}
		if r.phase == PhaseAdmitted {
			// A scatter writes the pages before every rank claimed: the
			// ledger must not expire them under it at admission.claim_timeout
			// (as Transfer does); timeouts.bootstrap still bounds the room.
			if err := sh.led.Claim(r.id); err == nil {
				m.armShardTimerLocked(r.decodeDP)
			}
		}
		op := m.scatterOpLocked(r, m.stg.s.StartScatter(sc))
		r.inflight++
		xctx, roomSpan := m.xferCtxLocked(r), r.logCtx()
		m.unlockShard(sh)

		// The scatter outlives the caller's RPC (every writer already
		// reported) but not the room.
		var attrs []attribute.KeyValue
		if m.tracing {
			attrs = []attribute.KeyValue{
				attribute.Int64("decodeplane.room", int64(op.Room)), attribute.Int("decodeplane.chunk", op.ChunkIndex),
				attribute.Int("decodeplane.decode_tp_rank", op.DecodeTP), attribute.Int("decodeplane.pages", len(op.DestPages)),
				attribute.Int("decodeplane.staging.writers", len(op.Writers))}
		}
		res, err := m.runRoomOp(context.WithoutCancel(ctx), xctx, roomSpan, "staging.scatter", attrs,
			func(ctx context.Context) (transfer.ChunkResult, error) { return eng.Scatter(ctx, op) })

		sh.mu.Lock()
		r.inflight--
		m.noteWritesMayContinueLocked(r, err)
		err = m.scatterDoneLocked(r, sr, sc, op, res, err)
		m.releaseIfIdleLocked(r)
		out.Poll = r.phase.Poll()
		m.unlockShard(sh)
		if err != nil {
			out.Scattered = false
			return out, err
		}
	}
	sh.mu.Lock()
	out.Poll = r.phase.Poll()
	m.unlockShard(sh)
	return out, nil
}

// scatterOpLocked is the engine's operation for one region of room r.
func (m *Manager) scatterOpLocked(r *room, sc staging.Scatter) transfer.ScatterOp {
	op := transfer.ScatterOp{
		Room: r.id, RID: r.rid(), Attempt: r.attempt, ChunkIndex: sc.Chunk, DecodeDP: r.decodeDP, DecodeTP: sc.DecodeTP,
		Layout: m.layout, RingOffset: sc.Region.Offset, Tokens: sc.Tokens,
		DestPages: slices.Clone(r.pages[sc.PageOffset : sc.PageOffset+sc.NumPages]),
		Writers:   make([]transfer.ScatterWriter, len(sc.Writers)), MetadataSlot: r.metaSlot, Marker: sc.Marker, OutputIDs: sc.OutputIDs,
	}
	for i, w := range sc.Writers {
		op.Writers[i] = transfer.ScatterWriter{NumHeads: w.Slice.NumHeads, DstHeadStart: w.Slice.DstHeadStart, LayerBegin: w.LayerBegin, LayerEnd: w.LayerEnd,
			BytesPerToken: w.BytesPerToken, OffsetPerToken: w.OffsetPerToken}
	}
	return op
}

// scatterDoneLocked records a scatter's outcome: the region is freed (the
// scatter returned, nothing reads it any more) unless it may be retried, the
// watermark advances, and the room moves on or fails.
func (m *Manager) scatterDoneLocked(r *room, sr *stagedRoom, sc *staging.Staged, op transfer.ScatterOp, res transfer.ChunkResult, err error) error {
	switch {
	case err == nil && !r.phase.Terminal():
		m.stg.s.EndScatter(sr.st, sc, true)
		m.markerLandedLocked(r, res.MarkerWritten)
		m.checkSuccessLocked(r)
		return nil
	case r.phase.Terminal():
		m.stg.s.EndScatter(sr.st, sc, true)
		msg := "the room ended"
		if r.failure != nil {
			msg = "the room failed: " + r.failure.Message
		}
		return fmt.Errorf("scatter chunk %d of room %d: %w: %s", op.ChunkIndex, r.id, ErrWrongState, msg)
	case errors.Is(err, transfer.ErrEngineUnavailable):
		m.stg.s.EndScatter(sr.st, sc, false) // nothing landed: a retried ChunkReady resubmits it
		return fmt.Errorf("scatter chunk %d of room %d into decode rank %d: %w", op.ChunkIndex, r.id, op.DecodeTP, err)
	default:
		m.stg.s.EndScatter(sr.st, sc, true)
		f := Failure{Code: FailureStagingFailed, Message: fmt.Sprintf("KVTransferError(bootstrap_room=%d): scatter of staged chunk %d into decode rank dp %d tp %d failed: %v", r.id, op.ChunkIndex, r.decodeDP, op.DecodeTP, err)}
		m.failLocked(r, f)
		return fmt.Errorf("%w: %s", transfer.ErrTransferFailed, f.Message)
	}
}

// WatchWatermark watches the rings of decode DP shard dp (tps empty: every
// TP rank). The first Next returns every ring's current state.
func (m *Manager) WatchWatermark(dp int, tps []int) (*WatermarkWatch, error) {
	if _, err := m.stagingUsable(); err != nil {
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
