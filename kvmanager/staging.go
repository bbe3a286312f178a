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

	"github.com/decodeplane/decodeplane/kvmanager/kvcopy"
	"github.com/decodeplane/decodeplane/prealloc"
)

// The staging handler (SGLang's DecodeStagingHandler, spec §5): per decode
// rank a ring (StagingRing), per staged room the regions of its chunks. A
// prefill rank allocates a chunk's region per decode rank (AllocateStaging,
// deduplicated across the rank's peers), writes it once the watermark allows,
// and reports it (StagingChunkReady); the report counts as the rank's chunk
// for the room's progress. When every writer of a region has reported, the
// region is scattered into the room's pages by the transfer engine
// (Scatterer), freed, and the watermark advances. A staged room holds a
// success gate from admission until every allocated region is scattered; if
// the scatters are not done timeouts.waiting after every prefill rank
// reported, the room fails (FailureStagingFailed). Every exit path frees
// every region of the room, after any scatter in flight returned.

// Scatterer is the transfer-engine capability staging needs: scatter one
// staged region into a room's pages. SimEngine and DelegateEngine implement
// it; an engine without it cannot serve staged rooms.
type Scatterer interface {
	// Scatter copies op's ring region into the decode pages and, when
	// op.Marker is set, writes the metadata slot. Errors and cancellation as
	// TransferEngine.Transfer: after it returns nothing writes into the pages.
	Scatter(ctx context.Context, op ScatterOp) (ChunkResult, error)
}

// ScatterOp is one staged region to scatter into a room's pages.
type ScatterOp struct {
	Room       uint64
	RID        string
	Attempt    uint32
	ChunkIndex int
	DecodeDP   int
	DecodeTP   int
	Layout     prealloc.Layout
	// Region is the allocation in the ring of (DecodeDP, DecodeTP).
	Region RingRegion
	// Tokens is num_pages × page_size: the region's token rows per block.
	Tokens    int
	DestPages []int32
	// Writers are the region's writers in order.
	Writers []StagingWriter
	// Marker (0: none) and OutputIDs go into MetadataSlot with the scatter.
	MetadataSlot int32
	Marker       uint64
	OutputIDs    []int32
}

// Bytes is what the scatter moves out of the ring.
func (op ScatterOp) Bytes() int64 {
	var n int64
	for _, w := range op.Writers {
		n += int64(op.Tokens) * w.BytesPerToken
	}
	return n
}

// StagingWriter is one prefill rank's part of a region.
type StagingWriter struct {
	Index     int
	PrefillTP int
	PrefillPP int
	// Slice is the head slice it carries (ComputeHeadSliceParams).
	Slice HeadSlice
	// LayerBegin and LayerEnd are the model layers it carries.
	LayerBegin, LayerEnd int
	// BytesPerToken is Slice.NumHeads × head bytes × layers × 2.
	BytesPerToken int64
	// OffsetPerToken: the writer starts tokens × OffsetPerToken into the region.
	OffsetPerToken int64
}

// StagingTarget is one decode rank a prefill rank writes to.
type StagingTarget struct {
	DecodeTP            int
	Slice               HeadSlice
	Writer              StagingWriter
	Writers             []StagingWriter
	RegionBytesPerToken int64
}

// HeadSlicePair is one (prefill TP rank, decode TP rank) pair.
type HeadSlicePair struct {
	PrefillTP, DecodeTP int
	Slice               HeadSlice
}

// Watermark is one ring's state.
type Watermark struct {
	DecodeDP, DecodeTP int
	Round, Tail        int64
	HeadRound, Head    int64
	Live               int
	Size               int64
}

// StagingRingInfo describes one decode rank's ring.
type StagingRingInfo struct {
	DecodeDP, DecodeTP int
	Buffer             string
	Size               int64
	Watermark          Watermark
}

// StagingPlan is SetupStaging's answer.
type StagingPlan struct {
	Required                                 bool
	PrefillTP, DecodeTP, PrefillPP, DecodePP int
	TotalKVHeads, PageSize, NumLayers        int
	HeadBytes                                int64
	Pairs                                    []HeadSlicePair
	Targets                                  []StagingTarget
	Rings                                    []StagingRingInfo
	CompletionTimeout                        time.Duration
}

// StagingRegion is one allocated region as a writer sees it.
type StagingRegion struct {
	DecodeTP     int
	Buffer       string
	Region       RingRegion
	NumPages     int
	Writable     bool
	NumWriters   int
	WriterIndex  int
	WriterOffset int64
	WriterBytes  int64
	Existing     bool
}

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

type ringKey struct{ dp, tp int }

type stagingRing struct {
	key     ringKey
	ring    *StagingRing
	watches map[*WatermarkWatch]struct{}
}

// stagingState is the manager's staging handler; its zero value is ready and
// Manager.mu guards it.
type stagingState struct {
	rings map[ringKey]*stagingRing
	rooms map[uint64]*roomStaging
}

type roomStaging struct {
	attempt uint32
	topo    PrefillTopology
	chunks  map[stagedKey]*stagedChunk
	pending int      // regions allocated and not yet freed
	timer   deadline // the completion timeout, on the manager's deadline heap
	// deadline is when timer fires: once every region is scattered it
	// becomes the room's waiting deadline again, so that a room still not
	// successful (no metadata marker, another gate) stays bounded.
	deadline time.Time
}

// stagedKey is one region: (chunk, decode TP rank, decode PP stage).
type stagedKey struct{ chunk, tp, pp int }

type scatterState int

const (
	scatterIdle scatterState = iota
	scatterRunning
	scatterDone
)

type stagedChunk struct {
	key        stagedKey
	ring       *stagingRing
	region     RingRegion
	numPages   int
	pageOffset int // -1 until the first writer reported
	writers    []StagingWriter
	arrived    []bool
	nArrived   int
	aux        []*chunkAux
	state      scatterState
	running    chan struct{} // closed when the scatter in flight returns
	freed      bool
}

type chunkAux struct {
	marker    uint64
	outputIDs []int32
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

func (m *Manager) ringBytes() int64 { return StagingRingBytes(m.dec) }

func (m *Manager) ringLocked(dp, tp int) *stagingRing {
	if m.stg.rings == nil {
		m.stg.rings = map[ringKey]*stagingRing{}
	}
	k := ringKey{dp, tp}
	sr := m.stg.rings[k]
	if sr == nil {
		sr = &stagingRing{key: k, ring: NewStagingRing(m.ringBytes()), watches: map[*WatermarkWatch]struct{}{}}
		m.stg.rings[k] = sr
	}
	return sr
}

func (sr *stagingRing) watermark() Watermark {
	r, t := sr.ring.Watermark()
	hr, h := sr.ring.Head()
	return Watermark{DecodeDP: sr.key.dp, DecodeTP: sr.key.tp, Round: r, Tail: t, HeadRound: hr, Head: h, Live: sr.ring.Live(), Size: sr.ring.Size()}
}

// notifyLocked tells the ring's watchers its new state.
func (sr *stagingRing) notifyLocked() {
	wm := sr.watermark()
	for w := range sr.watches {
		w.update(sr.key, wm)
	}
}

// totalKVHeadsLocked is SGLang's resolve_total_kv_heads: the model's total,
// else per-rank heads × decode TP.
func (m *Manager) totalKVHeads() (int, error) {
	if m.layout.TotalKVHeads > 0 {
		return m.layout.TotalKVHeads, nil
	}
	if m.layout.HeadsPerRank > 0 {
		return m.layout.HeadsPerRank * m.layout.AttnTP, nil
	}
	return 0, &StagingError{Msg: "Cannot resolve total_kv_heads: the decode KV layout has neither a total KV head count nor per-rank KV heads (SGLang's kv_args has neither total_kv_head_num nor kv_head_num). Set kv_pool.kv_heads to the model's number of KV heads."}
}

// stagingUsable applies SGLang's setup checks in its order (spec §5.2): MLA,
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
	if _, ok := m.engine.(Scatterer); !ok {
		return 0, &StagingError{Msg: fmt.Sprintf("Staging is enabled but the transfer engine (%T) cannot scatter staged chunks into the KV pool. Use transfer.path sim or delegate.", m.engine)}
	}
	return heads, nil
}

// decodeStage is the decode PP stage a prefill PP rank writes to.
func (m *Manager) decodeStage(topo PrefillTopology, ppRank int) int {
	if m.layout.PP == topo.PP {
		return ppRank
	}
	return 0
}

// stagingWriters lists the writers of decode rank e's regions for decode PP
// stage q, in order (pp stage, tp writer), with their per-token layout.
func (m *Manager) stagingWriters(topo PrefillTopology, heads, e, q int) []StagingWriter {
	P, D := topo.AttnTP, m.layout.AttnTP
	var tps []int
	if P > D {
		k := P / D
		for t := e * k; t < (e+1)*k; t++ {
			tps = append(tps, t)
		}
	} else {
		tps = []int{e / max(1, D/P)}
	}
	stages := []int{q}
	if m.layout.PP != topo.PP {
		stages = nil
		for s := range topo.PP {
			stages = append(stages, s)
		}
	}
	var out []StagingWriter
	var off int64
	for _, s := range stages {
		b, end := kvcopy.StageLayers(m.layout.NumLayers, topo.PP, s)
		for _, t := range tps {
			hs := ComputeHeadSliceParams(P, D, t, e, heads)
			w := StagingWriter{Index: len(out), PrefillTP: t, PrefillPP: s, Slice: hs, LayerBegin: b, LayerEnd: end,
				BytesPerToken: int64(hs.NumHeads) * m.layout.HeadBytes() * int64(end-b) * 2, OffsetPerToken: off}
			off += w.BytesPerToken
			out = append(out, w)
		}
	}
	return out
}

// SetupStaging validates staging against this decode instance and returns
// the plan of one prefill rank (spec §5.2–§5.4). Errors: *StagingError
// (ErrStagingUnavailable) with SGLang's messages; ErrPrefillNotFound.
func (m *Manager) SetupStaging(rank RankID) (StagingPlan, error) {
	heads, err := m.stagingUsable()
	if err != nil {
		return StagingPlan{}, err
	}
	m.mu.Lock()
	defer m.unlock()
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
			plan.Pairs = append(plan.Pairs, HeadSlicePair{PrefillTP: t, DecodeTP: dm.DecodeTP, Slice: ComputeHeadSliceParams(topo.AttnTP, l.AttnTP, t, dm.DecodeTP, heads)})
		}
	}
	sort.Slice(plan.Pairs, func(i, j int) bool {
		a, b := plan.Pairs[i], plan.Pairs[j]
		if a.PrefillTP != b.PrefillTP {
			return a.PrefillTP < b.PrefillTP
		}
		return a.DecodeTP < b.DecodeTP
	})
	q := m.decodeStage(topo, rank.PP)
	if rp := inst.Plan.Rank(rank.Key()); rp != nil {
		for _, tg := range rp.Targets() {
			if tg.Dummy {
				continue
			}
			ws := m.stagingWriters(topo, heads, tg.DecodeTP, q)
			st := StagingTarget{DecodeTP: tg.DecodeTP, Slice: HeadSlice{SrcHeadStart: tg.SrcHeadStart, DstHeadStart: tg.DstHeadStart, NumHeads: tg.NumHeads}, Writers: ws}
			for _, w := range ws {
				st.RegionBytesPerToken += w.BytesPerToken
				if w.PrefillTP == rank.TP && w.PrefillPP == rank.PP {
					st.Writer = w
				}
			}
			plan.Targets = append(plan.Targets, st)
			for dp := range l.DP {
				sr := m.ringLocked(dp, tg.DecodeTP)
				plan.Rings = append(plan.Rings, StagingRingInfo{DecodeDP: dp, DecodeTP: tg.DecodeTP, Buffer: kvcopy.StagingName(dp, tg.DecodeTP), Size: sr.ring.Size(), Watermark: sr.watermark()})
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
	if m.stg.rooms == nil {
		m.stg.rooms = map[uint64]*roomStaging{}
	}
	if old := m.stg.rooms[r.id]; old != nil {
		m.stagingReleaseLocked(r.id)
	}
	m.stg.rooms[r.id] = &roomStaging{attempt: r.attempt, topo: m.topoLocked(r.addr), chunks: map[stagedKey]*stagedChunk{}}
	if r.gates == nil {
		r.gates = map[string]bool{}
	}
	r.gates[stagingGate] = true
	id := r.id
	r.onEnd = append(r.onEnd, func() { m.stagingReleaseLocked(id) })
}

// stagingReleaseLocked frees every region of a room (SGLang's
// unregister_decode_req) and forgets its staging state. It runs when no
// scatter of the room is in flight.
func (m *Manager) stagingReleaseLocked(id uint64) {
	rs := m.stg.rooms[id]
	if rs == nil {
		return
	}
	delete(m.stg.rooms, id)
	m.clearDeadlineLocked(&rs.timer)
	touched := map[*stagingRing]bool{}
	for _, sc := range rs.chunks {
		if sc.freed {
			continue
		}
		m.log.Debug("releasing unscattered staging allocation", "room", id, "chunk", sc.key.chunk, "decode_tp", sc.key.tp,
			"offset", sc.region.Offset, "size", sc.region.Size, "round", sc.region.Round)
		sc.ring.ring.Free(sc.region.ID)
		sc.freed = true
		touched[sc.ring] = true
	}
	for sr := range touched {
		sr.notifyLocked()
	}
}

// stagingSettleLocked is consulted by checkSuccessLocked once every required
// rank's chunks landed: it lifts the staging gate when every region is
// scattered, else starts the completion timeout (SGLang: completion_timeout
// after all-success; the waiting timeout no longer applies).
func (m *Manager) stagingSettleLocked(r *room) {
	if !r.gates[stagingGate] {
		return
	}
	rs := m.stg.rooms[r.id]
	if rs == nil || rs.attempt != r.attempt || rs.pending == 0 || !scattersDue(rs) {
		// Every rank is done, so a region whose writers have not all
		// reported never will be (its pages are covered, and nothing may
		// follow a last chunk): it does not hold the room back; it is freed
		// with the room.
		delete(r.gates, stagingGate)
		if rs != nil && rs.timer.armed() {
			m.clearDeadlineLocked(&rs.timer)
			// The waiting deadline was lifted for the completion timer:
			// restore it, so that a room that does not succeed now (the
			// metadata marker never came) is still failed in time.
			if r.waitingAt.IsZero() {
				r.waitingAt = rs.deadline
				m.armTimerLocked(r)
			}
		}
		return
	}
	if rs.timer.armed() {
		return
	}
	r.waitingAt = time.Time{}
	m.armTimerLocked(r)
	rs.deadline = m.clock.Now().Add(m.cfg.Timeouts.Waiting)
	m.setDeadlineLocked(&rs.timer, dlStaging, rs.deadline, r.id, r.attempt, nil)
}

// scattersDue: a region every writer reported is still to be scattered.
func scattersDue(rs *roomStaging) bool {
	for _, sc := range rs.chunks {
		if !sc.freed && sc.state != scatterDone && sc.nArrived == len(sc.writers) {
			return true
		}
	}
	return false
}

// stagingDeadlineLocked fails a staged room whose scatters did not finish within
// the completion timeout.
func (m *Manager) stagingDeadlineLocked(id uint64, attempt uint32) {
	r := m.rooms[id]
	rs := m.stg.rooms[id]
	if r == nil || r.attempt != attempt || r.phase.Terminal() || rs == nil || rs.attempt != attempt || rs.pending == 0 {
		return
	}
	var missing []string
	for _, sc := range rs.chunks {
		if !sc.freed {
			missing = append(missing, fmt.Sprintf("chunk %d -> decode tp %d (%d/%d writers)", sc.key.chunk, sc.key.tp, sc.nArrived, len(sc.writers)))
		}
	}
	sort.Strings(missing)
	m.failLocked(r, Failure{Code: FailureStagingFailed, Message: fmt.Sprintf(
		"Request %d: staged KV was not scattered within %.1fs after every prefill rank reported (a scatter never arrived): %s",
		id, m.cfg.Timeouts.Waiting.Seconds(), strings.Join(missing, "; "))})
}

// stagingRankLocked checks that rank may write room r now: the room's
// prefill, DP rank, a required rank that claimed the destination, a room
// being handed off, and the room is staged.
func (m *Manager) stagingRankLocked(r *room, rank RankID, what string) (*rankProgress, *roomStaging, error) {
	if rank.Addr != r.addr {
		return nil, nil, invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", rank.Addr, r.id, r.addr)
	}
	if r.phase == PhaseFailed {
		return nil, nil, fmt.Errorf("%s of room %d: %w: the room failed: %s", what, r.id, ErrWrongState, r.failure.Message)
	}
	if r.plan == nil || r.prefillDP < 0 {
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
	rs := m.stg.rooms[r.id]
	if !r.staging || rs == nil || rs.attempt != r.attempt {
		return nil, nil, fmt.Errorf("%s of room %d: %w: the room is not staged (its destination has staging = false): send its KV with Rooms.Transfer or ReportTransfer", what, r.id, ErrWrongState)
	}
	return rp, rs, nil
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
	m.mu.Lock()
	defer m.unlock()
	r := m.rooms[room]
	if r == nil {
		return nil, fmt.Errorf("allocate staging for chunk %d of room %d: %w", chunk, room, ErrRoomNotFound)
	}
	_, rs, err := m.stagingRankLocked(r, rank, fmt.Sprintf("allocate staging for chunk %d", chunk))
	if err != nil {
		return nil, err
	}
	if numPages <= 0 {
		return nil, invalid("num_pages", "must be > 0")
	}
	if numPages > len(r.pages) {
		return nil, invalid("num_pages", "%d is more than the destination's %d pages", numPages, len(r.pages))
	}
	tokens := numPages * m.layout.PageSize
	q := m.decodeStage(rs.topo, rank.PP)
	var out []StagingRegion
	for _, tg := range r.plan.Rank(rank.Key()).Targets() {
		if tg.Dummy {
			continue
		}
		key := stagedKey{chunk: chunk, tp: tg.DecodeTP, pp: q}
		sc := rs.chunks[key]
		existing := sc != nil
		if existing && sc.numPages != numPages {
			return nil, invalid("num_pages", "%d differs from the %d pages chunk %d's region on decode rank %d was allocated with", numPages, sc.numPages, chunk, tg.DecodeTP)
		}
		if !existing {
			ws := m.stagingWriters(rs.topo, heads, tg.DecodeTP, q)
			var perToken int64
			for _, w := range ws {
				perToken += w.BytesPerToken
			}
			sr := m.ringLocked(r.decodeDP, tg.DecodeTP)
			reg, aerr := sr.ring.Assign(int64(tokens) * perToken)
			if aerr != nil {
				msg := fmt.Sprintf("Staging chunk %d of room %d (%d pages, %d bytes for decode rank dp %d tp %d) exceeds the staging ring (%d bytes): %s",
					chunk, r.id, numPages, int64(tokens)*perToken, r.decodeDP, tg.DecodeTP, sr.ring.Size(), StagingHint)
				m.failLocked(r, Failure{Code: FailureStagingFailed, Message: msg})
				return nil, fmt.Errorf("%w: %s", ErrStagingTooLarge, msg)
			}
			sc = &stagedChunk{key: key, ring: sr, region: reg, numPages: numPages, pageOffset: -1, writers: ws,
				arrived: make([]bool, len(ws)), aux: make([]*chunkAux, len(ws))}
			rs.chunks[key] = sc
			rs.pending++
			sr.notifyLocked()
		}
		reg := StagingRegion{DecodeTP: tg.DecodeTP, Buffer: kvcopy.StagingName(r.decodeDP, tg.DecodeTP), Region: sc.region,
			NumPages: numPages, Writable: !sc.freed && sc.ring.ring.Writable(sc.region), NumWriters: len(sc.writers), Existing: existing}
		for _, w := range sc.writers {
			if w.PrefillTP == rank.TP && w.PrefillPP == rank.PP {
				reg.WriterIndex, reg.WriterOffset, reg.WriterBytes = w.Index, int64(tokens)*w.OffsetPerToken, int64(tokens)*w.BytesPerToken
			}
		}
		out = append(out, reg)
	}
	return out, nil
}

// StagingChunkReady records that a prefill rank wrote its part of a chunk's
// regions (SGLang's CHUNK_READY, handle_chunk_arrived). It counts as the
// rank's chunk for the room's progress; when it completes a region's writer
// set the region is scattered before it returns. A region the watermark has
// not released is ErrStagingNotWritable and nothing is recorded. A retry of
// a reported chunk is a duplicate; it resubmits a scatter that failed with
// ErrEngineUnavailable.
func (m *Manager) StagingChunkReady(ctx context.Context, req ChunkRequest) (StagingChunkResult, error) {
	if _, err := m.stagingUsable(); err != nil {
		return StagingChunkResult{}, err
	}
	m.mu.Lock()
	r := m.rooms[req.Room]
	if r == nil {
		m.unlock()
		return StagingChunkResult{}, fmt.Errorf("chunk %d of room %d: %w", req.Index, req.Room, ErrRoomNotFound)
	}
	if rp := r.ranks[req.Rank.Key()]; rp != nil && req.Rank.Addr == r.addr && req.Rank.DP == r.prefillDP && rp.chunks[req.Index] != nil {
		if err := rp.chunks[req.Index].sameChunk(req); err != nil {
			m.unlock()
			return StagingChunkResult{}, err
		}
		// A retry: resubmit the regions whose scatter did not happen.
		rs := m.stg.rooms[r.id]
		todo := m.readyRegionsLocked(r, rs, req.Rank, req.Index)
		m.unlock()
		res, err := m.runScatters(ctx, r, rs, todo)
		res.Duplicate = true
		return res, err
	}
	rp, rs, err := m.stagingRankLocked(r, req.Rank, fmt.Sprintf("chunk %d", req.Index))
	if err != nil {
		m.unlock()
		return StagingChunkResult{}, err
	}
	var aux *chunkAux
	if req.Marker != 0 || len(req.OutputIDs) > 0 {
		if !req.Last {
			m.unlock()
			return StagingChunkResult{}, invalid("aux", "only the last chunk carries the metadata (aux)")
		}
		if len(req.OutputIDs) > kvcopy.MaxOutputIDs {
			m.unlock()
			return StagingChunkResult{}, invalid("aux.output_ids", "has %d ids; a metadata slot holds at most %d", len(req.OutputIDs), kvcopy.MaxOutputIDs)
		}
		aux = &chunkAux{marker: req.Marker, outputIDs: slices.Clone(req.OutputIDs)}
	}
	q := m.decodeStage(rs.topo, req.Rank.PP)
	var scs []*stagedChunk
	var writerIdx []int
	for _, tg := range r.plan.Rank(req.Rank.Key()).Targets() {
		if tg.Dummy {
			continue
		}
		sc := rs.chunks[stagedKey{chunk: req.Index, tp: tg.DecodeTP, pp: q}]
		if sc == nil {
			m.unlock()
			return StagingChunkResult{}, fmt.Errorf("chunk %d of room %d for decode rank %d: %w: no staging region is allocated (call AllocateStaging first)", req.Index, r.id, tg.DecodeTP, ErrWrongState)
		}
		if sc.numPages != req.NumPages {
			m.unlock()
			return StagingChunkResult{}, invalid("num_pages", "%d differs from the region's %d pages (chunk %d, decode rank %d)", req.NumPages, sc.numPages, req.Index, tg.DecodeTP)
		}
		if sc.pageOffset >= 0 && sc.pageOffset != req.PageOffset {
			m.unlock()
			return StagingChunkResult{}, invalid("page_offset", "%d differs from %d reported by another writer of chunk %d (decode rank %d)", req.PageOffset, sc.pageOffset, req.Index, tg.DecodeTP)
		}
		if !sc.ring.ring.Writable(sc.region) {
			wr, wt := sc.ring.ring.Watermark()
			m.unlock()
			return StagingChunkResult{}, fmt.Errorf("chunk %d of room %d: %w: region [%d, %d) of round %d on decode rank dp %d tp %d is released only when the watermark passes it (now round %d, tail %d); wait for WatchWatermark, write it, then report it",
				req.Index, r.id, ErrStagingNotWritable, sc.region.Offset, sc.region.End(), sc.region.Round, r.decodeDP, tg.DecodeTP, wr, wt)
		}
		wi := -1
		for _, w := range sc.writers {
			if w.PrefillTP == req.Rank.TP && w.PrefillPP == req.Rank.PP {
				wi = w.Index
			}
		}
		if wi < 0 {
			m.unlock()
			return StagingChunkResult{}, invalid("rank", "%s is not a writer of chunk %d's region on decode rank %d", req.Rank, req.Index, tg.DecodeTP)
		}
		scs = append(scs, sc)
		writerIdx = append(writerIdx, wi)
	}
	creq := ChunkRequest{Room: req.Room, Rank: req.Rank, Index: req.Index, PageOffset: req.PageOffset, NumPages: req.NumPages, Last: req.Last, Marker: req.Marker}
	_, _, cs, fresh, err := m.chunkBeginLocked(creq, false)
	if err != nil || !fresh {
		m.unlock()
		if err == nil {
			err = fmt.Errorf("chunk %d of room %d: %w: already reported", req.Index, r.id, ErrWrongState)
		}
		return StagingChunkResult{}, err
	}
	res := ChunkResult{Duration: -1} // the prefill moved it into the ring
	tokens := req.NumPages * m.layout.PageSize
	for i, sc := range scs {
		w := writerIdx[i]
		sc.pageOffset = req.PageOffset
		sc.arrived[w] = true
		sc.nArrived++
		sc.aux[w] = aux
		res.Bytes += int64(tokens) * sc.writers[w].BytesPerToken
	}
	cs.settle()
	cs.done, cs.result = true, res
	m.chunkLandedLocked(r, rp, creq, res)
	todo := m.readyRegionsLocked(r, rs, req.Rank, req.Index)
	m.unlock()
	out, err := m.runScatters(ctx, r, rs, todo)
	m.mu.Lock()
	for i, sc := range scs {
		if i == 0 || sc.nArrived < out.Arrived {
			out.Arrived, out.NumWriters = sc.nArrived, len(sc.writers)
		}
	}
	m.unlock()
	return out, err
}

// readyRegionsLocked lists the regions of rank's chunk whose writers have
// all reported and whose scatter has not landed.
func (m *Manager) readyRegionsLocked(r *room, rs *roomStaging, rank RankID, chunk int) []*stagedChunk {
	if rs == nil || rs.attempt != r.attempt || r.plan == nil {
		return nil
	}
	rpl := r.plan.Rank(rank.Key())
	if rpl == nil {
		return nil
	}
	q := m.decodeStage(rs.topo, rank.PP)
	var out []*stagedChunk
	for _, tg := range rpl.Targets() {
		sc := rs.chunks[stagedKey{chunk: chunk, tp: tg.DecodeTP, pp: q}]
		if sc != nil && sc.nArrived == len(sc.writers) && sc.state != scatterDone {
			out = append(out, sc)
		}
	}
	return out
}

// runScatters scatters the regions (one after the other) and returns once
// they landed or failed. It is called without the lock.
func (m *Manager) runScatters(ctx context.Context, r *room, rs *roomStaging, scs []*stagedChunk) (StagingChunkResult, error) {
	out := StagingChunkResult{Scattered: len(scs) > 0}
	eng, _ := m.engine.(Scatterer)
	for _, sc := range scs {
		m.mu.Lock()
		for sc.state == scatterRunning {
			ch := sc.running
			m.unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return out, ctx.Err()
			}
			m.mu.Lock()
		}
		if sc.state == scatterDone {
			m.unlock()
			continue
		}
		if r.phase.Terminal() || m.stg.rooms[r.id] != rs {
			msg := "the room ended"
			if r.failure != nil {
				msg = "the room failed: " + r.failure.Message
			}
			m.unlock()
			return out, fmt.Errorf("scatter chunk %d of room %d: %w: %s", sc.key.chunk, r.id, ErrWrongState, msg)
		}
		op := m.scatterOpLocked(r, sc)
		if r.phase == PhaseAdmitted {
			// A scatter writes the pages before every rank claimed: the
			// ledger must not expire them under it at admission.claim_timeout
			// (as Transfer does); timeouts.bootstrap still bounds the room.
			if err := r.led.Claim(r.id); err == nil {
				m.armShardTimerLocked(r.decodeDP)
			}
		}
		sc.state, sc.running = scatterRunning, make(chan struct{})
		r.inflight++
		xctx, roomSpan := m.xferCtxLocked(r), r.spanCtx
		m.unlock()

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
			func(ctx context.Context) (ChunkResult, error) { return eng.Scatter(ctx, op) })

		m.mu.Lock()
		r.inflight--
		close(sc.running)
		m.noteWritesMayContinueLocked(r, err)
		err = m.scatterDoneLocked(r, rs, sc, res, err)
		m.releaseIfIdleLocked(r)
		out.Poll = r.phase.Poll()
		m.unlock()
		if err != nil {
			out.Scattered = false
			return out, err
		}
	}
	m.mu.Lock()
	out.Poll = r.phase.Poll()
	m.unlock()
	return out, nil
}

func (m *Manager) scatterOpLocked(r *room, sc *stagedChunk) ScatterOp {
	op := ScatterOp{
		Room: r.id, RID: r.rid, Attempt: r.attempt, ChunkIndex: sc.key.chunk, DecodeDP: r.decodeDP, DecodeTP: sc.key.tp,
		Layout: m.layout, Region: sc.region, Tokens: sc.numPages * m.layout.PageSize,
		DestPages: slices.Clone(r.pages[sc.pageOffset : sc.pageOffset+sc.numPages]),
		Writers:   sc.writers, MetadataSlot: r.metaSlot,
	}
	for _, a := range sc.aux {
		if a != nil {
			op.Marker, op.OutputIDs = a.marker, a.outputIDs
			break
		}
	}
	return op
}

// scatterDoneLocked records a scatter's outcome: the region is freed (the
// scatter returned, nothing reads it any more) unless it may be retried, the
// watermark advances, and the room moves on or fails.
func (m *Manager) scatterDoneLocked(r *room, rs *roomStaging, sc *stagedChunk, res ChunkResult, err error) error {
	free := func() {
		if !sc.freed {
			sc.ring.ring.Free(sc.region.ID)
			sc.freed = true
			if m.stg.rooms[r.id] == rs {
				rs.pending--
			}
			sc.ring.notifyLocked()
		}
	}
	switch {
	case err == nil && !r.phase.Terminal():
		sc.state = scatterDone
		free()
		m.markerLandedLocked(r, res.MarkerWritten)
		m.checkSuccessLocked(r)
		return nil
	case r.phase.Terminal():
		sc.state = scatterDone
		free()
		msg := "the room ended"
		if r.failure != nil {
			msg = "the room failed: " + r.failure.Message
		}
		return fmt.Errorf("scatter chunk %d of room %d: %w: %s", sc.key.chunk, r.id, ErrWrongState, msg)
	case errors.Is(err, ErrEngineUnavailable):
		sc.state = scatterIdle // nothing landed: a retried ChunkReady resubmits it
		return fmt.Errorf("scatter chunk %d of room %d into decode rank %d: %w", sc.key.chunk, r.id, sc.key.tp, err)
	default:
		sc.state = scatterDone
		free()
		f := Failure{Code: FailureStagingFailed, Message: fmt.Sprintf("KVTransferError(bootstrap_room=%d): scatter of staged chunk %d into decode rank dp %d tp %d failed: %v", r.id, sc.key.chunk, r.decodeDP, sc.key.tp, err)}
		m.failLocked(r, f)
		return fmt.Errorf("%w: %s", ErrTransferFailed, f.Message)
	}
}

// WatermarkWatch streams the watermarks of some rings (WatchWatermark).
// Updates coalesce: Next returns the latest state of every ring that changed.
type WatermarkWatch struct {
	m      *Manager
	rings  []*stagingRing
	notify chan struct{}
	latest map[ringKey]Watermark // guarded by m.mu
	closed bool
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
	m.mu.Lock()
	defer m.unlock()
	w := &WatermarkWatch{m: m, notify: make(chan struct{}, 1), latest: map[ringKey]Watermark{}}
	for _, tp := range tps {
		if tp < 0 || tp >= m.layout.AttnTP {
			return nil, invalid("decode_tp_ranks", "%d is out of range (allowed 0..%d)", tp, m.layout.AttnTP-1)
		}
		sr := m.ringLocked(dp, tp)
		if slices.Contains(w.rings, sr) {
			continue
		}
		w.rings = append(w.rings, sr)
		sr.watches[w] = struct{}{}
		w.update(sr.key, sr.watermark())
	}
	return w, nil
}

// update records a ring's state and wakes Next; called with m.mu held.
func (w *WatermarkWatch) update(k ringKey, wm Watermark) {
	w.latest[k] = wm
	select {
	case w.notify <- struct{}{}:
	default: // a wake-up is already pending; Next reads the latest state
	}
}

// Next waits for changes and returns the latest state of every changed ring,
// ordered by TP rank.
func (w *WatermarkWatch) Next(ctx context.Context) ([]Watermark, error) {
	for {
		select {
		case <-w.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		w.m.mu.Lock()
		if w.closed {
			w.m.unlock()
			return nil, errors.New("watermark watch closed")
		}
		out := make([]Watermark, 0, len(w.latest))
		for _, wm := range w.latest {
			out = append(out, wm)
		}
		clear(w.latest)
		w.m.unlock()
		if len(out) == 0 {
			continue
		}
		sort.Slice(out, func(i, j int) bool { return out[i].DecodeTP < out[j].DecodeTP })
		return out, nil
	}
}

// Close stops the watch.
func (w *WatermarkWatch) Close() {
	w.m.mu.Lock()
	defer w.m.unlock()
	w.closed = true
	for _, sr := range w.rings {
		delete(sr.watches, w)
	}
}

// StagingWatermarks returns the state of every decode rank's ring (for
// status and metrics): rings not used yet are reported empty. None when
// staging is off.
func (m *Manager) StagingWatermarks() []Watermark {
	m.mu.Lock()
	defer m.unlock()
	size := m.ringBytes()
	if size <= 0 {
		return nil
	}
	out := make([]Watermark, 0, m.layout.DP*m.layout.AttnTP)
	for dp := range m.layout.DP {
		for tp := range m.layout.AttnTP {
			if sr := m.stg.rings[ringKey{dp, tp}]; sr != nil {
				out = append(out, sr.watermark())
			} else {
				out = append(out, Watermark{DecodeDP: dp, DecodeTP: tp, Size: size})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].DecodeDP != out[j].DecodeDP {
			return out[i].DecodeDP < out[j].DecodeDP
		}
		return out[i].DecodeTP < out[j].DecodeTP
	})
	return out
}
