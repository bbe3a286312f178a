package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// OpenRequest opens a room (OpenRoom).
type OpenRequest struct {
	RID  string
	Addr string
	Room uint64
	// PrefillDP is the router's hint (disagg_prefill_dp_rank), -1 if none.
	PrefillDP int
	// DecodeDP is the decode shard (routed_dp_rank), -1 for room % dp.
	DecodeDP       int
	PromptLen      int
	OutputLen      int
	MaxNewTokens   int
	Priority       int
	Rebootstrap    bool
	IdempotencyKey string
}

// OpenRoom admits a request to the decode side. It returns at once: the
// room then waits for its prefill's registration, its DP rank and admission.
// Capacity errors leave nothing allocated and nothing queued:
// prealloc.ErrExceedsCapacity (a *prealloc.CapacityError with SGLang's
// message) for a request its shard could not admit even when empty (see
// prealloc's Enqueue), ErrQueueFull when admission.max_queued rooms wait.
func (m *Manager) OpenRoom(ctx context.Context, req OpenRequest) (RoomSnapshot, bool, error) {
	for {
		snap, idem, err, again := m.openRoom(ctx, req)
		if !again {
			return snap, idem, err
		}
	}
}

// existingRoom answers an OpenRoom for a room that exists.
func existingRoom(r *room, req OpenRequest) (RoomSnapshot, bool, error) {
	// Before the draining check: a retry of an OpenRoom that succeeded
	// must learn that the room exists.
	if req.IdempotencyKey != "" && r.extra != nil && r.extra.idemKey == req.IdempotencyKey {
		return r.snapshot(false, false), true, nil
	}
	return RoomSnapshot{}, false, fmt.Errorf("open room %d (rid %q): %w (rid %q, phase %s)", req.Room, req.RID, ErrRoomExists, r.rid(), r.phase)
}

// openRoom is one try of OpenRoom; again is true when another OpenRoom of
// the same room id raced it onto another shard (the next try sees it).
func (m *Manager) openRoom(ctx context.Context, req OpenRequest) (_ RoomSnapshot, _ bool, _ error, again bool) {
	if sh, r := m.lockRoom(req.Room); r != nil {
		snap, idem, err := existingRoom(r, req)
		m.unlockShard(sh)
		return snap, idem, err, false
	}
	if m.draining.Load() || m.closed.Load() {
		return RoomSnapshot{}, false, fmt.Errorf("open room %d: %w", req.Room, ErrDraining), false
	}
	shard := req.DecodeDP
	if shard < 0 {
		shard = int(req.Room % uint64(len(m.shards)))
	} else if shard >= len(m.shards) {
		return RoomSnapshot{}, false, invalid("decode_dp_rank", "%d is out of range: this daemon hosts %d decode DP shards (allowed 0..%d)", shard, len(m.shards), len(m.shards)-1), false
	}
	if inst, ok := m.reg.Instance(req.Addr); ok && inst.Complete && req.PrefillDP >= inst.Topology.DP {
		return RoomSnapshot{}, false, invalid("prefill_dp_rank", "%d is out of range: %s has dp_size %d (allowed 0..%d)", req.PrefillDP, req.Addr, inst.Topology.DP, inst.Topology.DP-1), false
	}
	preq := prealloc.Request{Room: req.Room, RID: req.RID, PromptLen: req.PromptLen, OutputLen: req.OutputLen,
		MaxNewTokens: req.MaxNewTokens, Priority: req.Priority, Rebootstrap: req.Rebootstrap}
	sh := m.shards[shard]
	addr := req.Addr
	if inst, ok := m.reg.Instance(addr); ok {
		addr = inst.Addr // one copy of the address per instance, not one per room
	}
	r := newRoom(req.Room, addr, shard, req.PrefillDP, m.clock.Now(), m.cfg.Timeouts.Bootstrap)
	if req.IdempotencyKey != "" {
		r.x().idemKey = req.IdempotencyKey
	}
	sh.mu.Lock()
	defer m.unlockShard(sh)
	if m.draining.Load() || m.closed.Load() {
		// Shutdown drains, then visits each shard under its lock: a room
		// inserted after that visit would escape its first pass.
		return RoomSnapshot{}, false, fmt.Errorf("open room %d: %w", req.Room, ErrDraining), false
	}
	// The room id is unique across the shards: look again, and insert, under
	// openMu. Calls that find the room now wait for this shard's lock and
	// see it opened (or gone, when the ledger refuses it below).
	m.openMu.Lock()
	if _, other := m.find(req.Room); other != nil {
		m.openMu.Unlock()
		return RoomSnapshot{}, false, nil, true
	}
	sh.insert(r)
	m.openMu.Unlock()
	if err := sh.led.EnqueueEntry(&r.entry, preq); err != nil { // the room's ledger record lives in the room
		sh.forget(r)
		if errors.Is(err, prealloc.ErrQueueFull) {
			err = &RetryError{Err: err, RetryAfter: time.Second}
		}
		return RoomSnapshot{}, false, fmt.Errorf("open room %d on decode shard %d: %w", req.Room, shard, err), false
	}
	m.startSpanLocked(ctx, r)
	m.transitionLocked(r, PhaseWaitingPrefill, "T1", numNote(noteOpened, int64(shard), 0))
	if cs := m.takePending(r.id); cs != nil {
		for _, c := range cs {
			c.stopExpiry()
			m.attachClaimLocked(r, c)
		}
	}
	m.prefillOrWaitLocked(r, "T4")
	return r.snapshot(false, false), false, nil, false
}

// prefillOrWaitLocked continues a room once its prefill instance is fully
// registered, or parks it until it is. A registration completed while the
// room was being parked is seen by the second look (the registry records
// the completion before its event takes the waiting rooms).
func (m *Manager) prefillOrWaitLocked(r *room, sglang string) {
	if inst, ok := m.reg.Instance(r.addr); ok && inst.Complete {
		m.afterPrefillKnownLocked(r, inst, sglang)
		return
	}
	if r.phase.Terminal() {
		return
	}
	m.waitForPrefillLocked(r)
	if inst, ok := m.reg.Instance(r.addr); ok && inst.Complete && r.phase == PhaseWaitingPrefill {
		m.afterPrefillKnownLocked(r, inst, sglang)
	}
}

// takePending removes and returns the claims waiting for room.
func (m *Manager) takePending(room uint64) []*Claim {
	m.pend.mu.Lock()
	defer m.pend.mu.Unlock()
	cs := m.pend.rooms[room]
	if cs != nil {
		delete(m.pend.rooms, room)
		m.pend.count -= len(cs)
	}
	return cs
}

func (m *Manager) startSpanLocked(ctx context.Context, r *room) {
	if !m.tracing {
		r.tr = nil
		return
	}
	attrs := []attribute.KeyValue{
		attribute.Int64("decodeplane.room", int64(r.id)),
		attribute.String("decodeplane.rid", r.rid()),
		attribute.String("decodeplane.prefill.addr", r.addr),
		attribute.Int("decodeplane.decode_dp_rank", r.decodeDP),
		attribute.Int("decodeplane.prompt_len", r.entry.Request().PromptLen),
		attribute.Int("decodeplane.attempt", int(r.attempt)),
	}
	_, span := m.tracer.Start(ctx, "room", trace.WithAttributes(attrs...))
	r.tr = &roomTrace{span: span, spanCtx: trace.ContextWithSpan(context.Background(), span)}
}

// afterPrefillKnownLocked continues a room once its prefill instance is
// fully registered: plan the ranks, then resolve the DP rank.
func (m *Manager) afterPrefillKnownLocked(r *room, inst registry.Instance, sglang string) {
	m.unwait(r)
	topo := inst.Topology
	r.prefillKnown(inst.Plan)
	if r.hintDP >= topo.DP {
		m.failLocked(r, Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf("disagg_prefill_dp_rank %d is out of range for %s (dp_size %d)", r.hintDP, r.addr, topo.DP)})
		return
	}
	if r.prefillDP >= 0 { // rebootstrap: stay on the bound DP rank (SGLang #40730)
		if r.prefillDP >= topo.DP {
			m.failLocked(r, Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf(
				"rebootstrap of room %d: its prefill DP rank %d no longer exists at %s (dp_size is now %d)", r.id, r.prefillDP, r.addr, topo.DP)})
			return
		}
		m.dpResolvedLocked(r, r.prefillDP, r.dpRule)
		return
	}
	if dp, rule, ok := m.reg.ResolveDP(r.addr, r.id, r.hintDP, topo); ok {
		m.dpResolvedLocked(r, dp, rule)
		return
	}
	m.applyLocked(r, r.resolvingDP(m.clock.Now(), m.cfg.Timeouts.DPRankResolution, topo.DP, topo.FollowBootstrapRoom))
}

// dpResolvedLocked records the room's prefill DP rank and queues it for
// admission (handshake done: KVPoll WaitingForInput).
func (m *Manager) dpResolvedLocked(r *room, dp int, rule DPRule) {
	for _, c := range r.claims.removeIf(func(c *Claim) bool { return c.rank.DP != dp }) {
		c.finish(DestinationEvent{Failure: &Failure{Code: FailureDPRankConflict, Message: fmt.Sprintf("rank %s is not a source of room %d: the room's prefill DP rank is %d (%s)", c.rank, r.id, dp, rule)}})
	}
	m.applyLocked(r, r.dpResolved(m.clock.Now(), dp, rule))
	if err := m.shards[r.decodeDP].led.SetReady(r.id); err != nil {
		m.failLocked(r, Failure{Code: FailureUnspecified, Message: fmt.Sprintf("internal: ledger refused room %d: %v", r.id, err)})
		return
	}
	m.admitLocked(r.decodeDP)
}

// admitLocked runs one admission pass on a shard and hands out what it
// admitted: destinations to the prefill ranks, pages back to resumed rooms.
func (m *Manager) admitLocked(shard int) {
	sh := m.shards[shard]
	sh.due = false
	if m.closed.Load() || m.rs.gated.Load() { // resync.go: nothing is admitted during the resync wait
		return
	}
	led := sh.led
	adms, blocked := led.Admit()
	m.obs.AdmissionPass(shard, len(adms), blocked)
	now := m.clock.Now()
	for _, a := range adms {
		r := sh.rooms[a.Room]
		if r == nil || r.phase.Terminal() {
			m.log.Error("ledger admitted a room the manager does not hold; releasing it", "room", a.Room)
			_ = led.Release(a.Room)
			continue
		}
		r.allocated(a.Alloc)
		if a.Resumed {
			// The engine reloads the room's KV from its CPU copy: the room
			// runs again (the ledger's resumed -> running), so that it can
			// grow, be retracted again and be released.
			if err := led.StartRunning(r.id); err != nil {
				m.failLocked(r, Failure{Code: FailureUnspecified, Message: fmt.Sprintf("internal: ledger refused to resume room %d: %v", r.id, err)})
				continue
			}
			m.applyLocked(r, r.resumed(now))
			continue
		}
		m.applyLocked(r, r.admitted(now))
		m.stagingAdmittedLocked(r) // staged rooms: register before the destination goes out
		r.claims.each(func(c *Claim) { c.queue(DestinationEvent{Destination: m.destinationLocked(r, c.rank.Key())}) })
	}
	m.armShardTimerLocked(shard)
}

func cloneState(in []prealloc.StateIndices) []prealloc.StateIndices {
	out := make([]prealloc.StateIndices, len(in))
	for i, s := range in {
		out[i] = prealloc.StateIndices{Type: s.Type, Indices: slices.Clone(s.Indices)}
	}
	return out
}

// destinationLocked builds the destination one prefill rank needs.
func (m *Manager) destinationLocked(r *room, k rankKey) *Destination {
	d := &Destination{
		Room: r.id, DecodeDP: r.decodeDP, Pages: r.pages, PageSize: m.layout.PageSize, FillLen: r.fillLen,
		MetadataSlot: r.metaSlot, State: r.state, Staging: r.staging, Attempt: r.attempt, Dummy: true,
	}
	if rp := r.plan.Rank(k); rp != nil {
		d.Targets = rp.Targets()
		d.Dummy = rp.Dummy()
		d.RequiredDstInfoNum = rp.RequiredDstInfoNum()
		d.TokenBytes, d.StateBytes = transfer.RankWeights(m.layout, rp.Targets(), m.topoLocked(r.addr).PP, k.PP)
	}
	if d.Dummy {
		// Dummy targets get an empty destination, as SGLang sends empty
		// frames to MLA's extra ranks.
		d.Pages, d.State, d.MetadataSlot = nil, nil, -1
	}
	return d
}

// AwaitDestination registers a prefill rank's claim on a room. A claim for a
// room not opened yet waits (bounded by timeouts.bootstrap) for OpenRoom;
// a rank that a registered instance lacks is refused at once, opened room
// or not (an instance unknown or still registering is not refused: its
// ranks may claim before the last one registered).
func (m *Manager) AwaitDestination(room uint64, rank RankID) (*Claim, error) {
	c := &Claim{m: m, room: room, rank: rank, ch: make(chan DestinationEvent, claimBuffer)}
	for {
		if sh, r := m.lockRoom(room); r != nil {
			// An open room checks the source first (another address or
			// DP rank: INVALID_ARGUMENT), then the registration.
			err := m.attachClaimLocked(r, c)
			m.unlockShard(sh)
			if err != nil {
				return nil, err
			}
			return c, nil
		}
		if !m.reg.RankRegistered(rank) {
			return nil, errRankNotRegistered(room, rank)
		}
		queued, err := m.queuePending(c)
		if queued || err != nil {
			return c, err
		}
		// The room was opened meanwhile: attach to it.
	}
}

// errRankNotRegistered refuses a claim of a rank that its registered
// instance lacks.
func errRankNotRegistered(room uint64, rank RankID) error {
	return fmt.Errorf("await destination of room %d: %w: rank %s is not registered with this daemon (RegisterPrefill first)", room, ErrPrefillNotFound, rank)
}

// queuePending queues a claim for a room not opened yet; false (and no
// error) when the room is open by now. Under the pending claims' lock the
// room is looked up again: OpenRoom inserts the room before it takes the
// claims waiting for it, so that a claim is either seen here or taken there.
func (m *Manager) queuePending(c *Claim) (bool, error) {
	m.pend.mu.Lock()
	defer m.pend.mu.Unlock()
	if _, r := m.find(c.room); r != nil {
		return false, nil
	}
	room := c.room
	if m.draining.Load() || m.closed.Load() {
		return false, fmt.Errorf("await destination of room %d: %w", room, ErrDraining)
	}
	if m.pend.count >= maxPendingClaims {
		return false, &RetryError{Err: fmt.Errorf("await destination of room %d: %w (%d)", room, ErrTooManyWaiters, m.pend.count), RetryAfter: time.Second}
	}
	m.pend.rooms[room] = append(m.pend.rooms[room], c)
	m.pend.count++
	m.setDeadlineLocked(&c.expiry, dlPendingClaim, m.clock.Now().Add(m.cfg.Timeouts.Bootstrap), room, 0, c)
	return true, nil
}

// expirePendingClaim fails a claim whose room was never opened within
// timeouts.bootstrap (the heap's dlPendingClaim entry).
func (m *Manager) expirePendingClaim(c *Claim) {
	m.pend.mu.Lock()
	defer m.pend.mu.Unlock()
	if m.closed.Load() {
		return
	}
	cs := m.pend.rooms[c.room]
	for i, x := range cs {
		if x == c {
			m.pend.rooms[c.room] = append(cs[:i], cs[i+1:]...)
			m.pend.count--
			if len(m.pend.rooms[c.room]) == 0 {
				delete(m.pend.rooms, c.room)
			}
			c.finish(DestinationEvent{Failure: &Failure{Code: FailureBootstrapTimeout, Message: fmt.Sprintf(
				"Request %d timed out after %.1fs in KVPoll.Bootstrapping: the decode side never opened the room", c.room, m.cfg.Timeouts.Bootstrap.Seconds())}})
			return
		}
	}
}

// attachClaimLocked binds a claim to an open room and replays what the rank
// has missed (destination, end).
func (m *Manager) attachClaimLocked(r *room, c *Claim) error {
	if c.rank.Addr != r.addr {
		err := invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", c.rank.Addr, r.id, r.addr)
		c.finish(DestinationEvent{Failure: &Failure{Code: FailureUnspecified, Message: err.Error()}, Refused: err})
		return err
	}
	if r.prefillDP >= 0 && c.rank.DP != r.prefillDP {
		err := invalid("rank.dp_rank", "%d is not room %d's prefill DP rank %d (%s)", c.rank.DP, r.id, r.prefillDP, r.dpRule)
		c.finish(DestinationEvent{Failure: &Failure{Code: FailureDPRankConflict, Message: err.Error()}, Refused: err})
		return err
	}
	if !m.reg.RankRegistered(c.rank) {
		err := errRankNotRegistered(r.id, c.rank)
		c.finish(DestinationEvent{Failure: &Failure{Code: FailureUnspecified, Message: err.Error()}, Refused: err})
		return err
	}
	k := c.rank.Key()
	if old := r.claims.get(k); old != nil && old != c {
		old.finish(DestinationEvent{Failure: &Failure{Code: FailureUnspecified, Message: "superseded by a newer AwaitDestination from the same rank"}})
	}
	switch {
	case r.phase == PhaseFailed:
		c.finish(DestinationEvent{Failure: r.failure})
		return nil
	case r.phase.Poll() == PollSuccess || r.phase == PhaseReleased:
		p := r.phase
		c.finish(DestinationEvent{Done: &p})
		return nil
	}
	r.addClaim(k, c)
	if r.handoff != nil && r.pages != nil && (r.phase == PhaseAdmitted || r.phase == PhaseClaimed || r.phase == PhaseTransferring) {
		c.queue(DestinationEvent{Destination: m.destinationLocked(r, k)})
	}
	return nil
}

// delivered records that a rank received its destination: its claim.
func (m *Manager) delivered(c *Claim, d *Destination) {
	sh, r := m.lockRoom(c.room)
	if r == nil {
		return
	}
	defer m.unlockShard(sh)
	if d == nil || d.Attempt != r.attempt || r.phase != PhaseAdmitted {
		return
	}
	if rp := r.progress(c.rank.Key()); rp != nil {
		m.claimRankLocked(r, rp)
	}
}

// claimRankLocked records one required rank's claim on an admitted room; the
// room is claimed when every required rank has one.
func (m *Manager) claimRankLocked(r *room, rp *rankProgress) {
	if r.claimRank(rp) {
		m.claimedLocked(r)
	}
}

// claimedLocked: every required rank holds the destination. The ledger's
// claim deadline stops and SGLang's waiting timeout starts (T11).
func (m *Manager) claimedLocked(r *room) {
	if err := m.shards[r.decodeDP].led.Claim(r.id); err != nil {
		m.failLocked(r, Failure{Code: FailureUnspecified, Message: fmt.Sprintf("internal: ledger refused the claim of room %d: %v", r.id, err)})
		return
	}
	m.armShardTimerLocked(r.decodeDP)
	m.applyLocked(r, r.claimed(m.clock.Now(), m.cfg.Timeouts.Waiting))
	if r.chunksDone > 0 {
		m.transitionLocked(r, PhaseTransferring, "", textNote("chunks landed before every rank claimed"))
		m.checkSuccessLocked(r)
	}
}

// ChunkRequest is one chunk for the daemon's transfer engine (Transfer) or a
// chunk the prefill moved itself (ReportTransfer).
type ChunkRequest struct {
	Room       uint64
	Rank       RankID
	Index      int
	PageOffset int
	NumPages   int
	Last       bool
	// Transfer only.
	SrcBuffer string
	SrcPages  []int32
	Marker    uint64
	OutputIDs []int32
	// Attempt is the destination's attempt; 0 is not checked.
	Attempt uint32
	// ReportTransfer only.
	Failed bool
	Reason string
	Bytes  int64
}

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
	sh, r := m.lockRoom(req.Room)
	if r == nil {
		return transfer.ChunkResult{}, false, errNoChunkRoom(req)
	}
	rp, cs, fresh, err := m.chunkBeginLocked(r, req, false)
	if err != nil || !fresh {
		var inflight chan struct{}
		if cs != nil && cs.busy { // under the lock: chunkEndLocked settles it
			if cs.waiters == nil {
				cs.waiters = make(chan struct{})
			}
			inflight = cs.waiters
		}
		m.unlockShard(sh)
		if err != nil {
			return transfer.ChunkResult{}, false, err
		}
		return m.awaitChunk(ctx, sh, cs, inflight)
	}
	rp.engine = true // the daemon's engine writes this rank's chunks (deferred release: drain.go)
	op := m.chunkOpLocked(r, req)
	if r.phase == PhaseAdmitted {
		// A rank writes before every rank claimed: the ledger must not
		// expire (and hand out) the pages under the write at
		// admission.claim_timeout; timeouts.bootstrap still bounds the room.
		if err := sh.led.Claim(r.id); err == nil {
			m.armShardTimerLocked(r.decodeDP)
		}
	}
	// The engine call ends with the caller or when the room fails
	// (failLocked cancels every chunk in flight).
	opCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs.cancel = cancel
	roomSpan := r.logCtx()
	r.inflight++
	m.unlockShard(sh)

	var attrs []attribute.KeyValue
	if m.tracing {
		attrs = []attribute.KeyValue{
			attribute.Int64("decodeplane.room", int64(req.Room)), attribute.Int("decodeplane.chunk", req.Index),
			attribute.String("decodeplane.prefill.rank", req.Rank.String()), attribute.Int("decodeplane.pages", req.NumPages),
			attribute.Bool("decodeplane.last", req.Last)}
	}
	res, terr := m.runRoomOp(opCtx, nil, roomSpan, "chunk", attrs, func(ctx context.Context) (transfer.ChunkResult, error) { return m.engine.Transfer(ctx, op) })

	sh.mu.Lock() // the room stays on its shard while a transfer is in flight (releasePending holds it)
	defer m.unlockShard(sh)
	r.inflight--
	return m.chunkEndLocked(ctx, r, rp, req, cs, res, terr)
}

// xferCtxLocked is the room's transfer context (staged scatters), made on
// first use; it ends when the room fails.
func (m *Manager) xferCtxLocked(r *room) context.Context {
	if r.xferCtx == nil {
		r.xferCtx, r.xferCancel = context.WithCancel(context.Background())
		if r.phase == PhaseFailed {
			r.xferCancel()
		}
	}
	return r.xferCtx
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

func (m *Manager) awaitChunk(ctx context.Context, sh *shard, cs *chunkState, inflight chan struct{}) (transfer.ChunkResult, bool, error) {
	if inflight != nil {
		select {
		case <-inflight:
		case <-ctx.Done():
			return transfer.ChunkResult{}, false, ctx.Err()
		}
	}
	sh.mu.Lock()
	defer m.unlockShard(sh)
	return cs.result, cs.done, cs.err
}

// errNoChunkRoom is a chunk's (or a failure report's) unknown room.
func errNoChunkRoom(req ChunkRequest) error {
	return fmt.Errorf("chunk %d of room %d: %w", req.Index, req.Room, ErrRoomNotFound)
}

// sourceRankLocked checks the required prefill rank of room r a chunk (or a
// failure report) comes from.
func (m *Manager) sourceRankLocked(r *room, req ChunkRequest) (*rankProgress, error) {
	if req.Rank.Addr != r.addr {
		return nil, invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", req.Rank.Addr, r.id, r.addr)
	}
	if r.phase == PhaseFailed {
		return nil, fmt.Errorf("chunk %d of room %d: %w: the room failed: %s", req.Index, r.id, ErrWrongState, r.failure.Message)
	}
	if req.Attempt != 0 && req.Attempt != r.attempt {
		return nil, fmt.Errorf("chunk %d of room %d: %w: it belongs to attempt %d, but the room was rebootstrapped (attempt %d)", req.Index, r.id, ErrWrongState, req.Attempt, r.attempt)
	}
	if r.plan == nil || r.prefillDP < 0 || r.handoff == nil {
		return nil, fmt.Errorf("chunk %d of room %d: %w: the room has no destination yet (phase %s)", req.Index, r.id, ErrWrongState, r.phase)
	}
	if req.Rank.DP != r.prefillDP {
		return nil, invalid("rank.dp_rank", "%d is not room %d's prefill DP rank %d (%s)", req.Rank.DP, r.id, r.prefillDP, r.dpRule)
	}
	rp := r.progress(req.Rank.Key())
	if rp == nil {
		return nil, invalid("rank", "%s sends no KV for room %d: it is a dummy target or not addressed by any decode rank", req.Rank, r.id)
	}
	return rp, nil
}

// chunkBeginLocked validates a chunk and registers it in flight. fresh is
// false for a chunk already landed or in flight (cs tells which).
func (m *Manager) chunkBeginLocked(r *room, req ChunkRequest, checkBytes bool) (*rankProgress, *chunkState, bool, error) {
	rp, err := m.sourceRankLocked(r, req)
	if err != nil {
		return nil, nil, false, err
	}
	if cs := rp.chunks[req.Index]; cs != nil {
		if err := cs.sameChunk(req); err != nil {
			return nil, nil, false, err
		}
		return rp, cs, false, nil
	}
	switch r.phase {
	case PhaseAdmitted, PhaseClaimed, PhaseTransferring:
	default:
		return nil, nil, false, fmt.Errorf("chunk %d of room %d: %w: phase %s", req.Index, r.id, ErrWrongState, r.phase)
	}
	// A chunk from a rank whose claim stream was given the destination
	// proves it holds it: the stream's Send and this call race, and the
	// claim may not be recorded yet.
	if !rp.claimed {
		if c := r.claims.get(req.Rank.Key()); c == nil || r.phase != PhaseAdmitted {
			return nil, nil, false, fmt.Errorf("chunk %d of room %d from %s: %w: this rank has not claimed the destination (call AwaitDestination first)", req.Index, r.id, req.Rank, ErrWrongState)
		}
	}
	// Validate everything first; nothing changes until the chunk is accepted.
	if req.NumPages < 0 || req.PageOffset < 0 || req.PageOffset+req.NumPages > len(r.pages) {
		return nil, nil, false, invalid("page_offset", "pages [%d, %d) are outside the destination's %d pages", req.PageOffset, req.PageOffset+req.NumPages, len(r.pages))
	}
	if req.NumPages == 0 && !req.Last {
		return nil, nil, false, invalid("num_pages", "must be > 0 (only the last chunk may carry no pages)")
	}
	if len(req.SrcPages) > 0 && len(req.SrcPages) != req.NumPages {
		return nil, nil, false, invalid("source.page_indices", "has %d entries for %d pages", len(req.SrcPages), req.NumPages)
	}
	if rp.last >= 0 {
		return nil, nil, false, invalid("chunk_index", "%d comes after this rank's last chunk %d: nothing may follow the last chunk", req.Index, rp.last)
	}
	rp.cov.init(len(r.pages))
	if p := rp.cov.overlap(req.PageOffset, req.NumPages); p >= 0 {
		return nil, nil, false, invalid("page_offset", "pages [%d, %d) overlap page %d, which %s already sent for room %d: each page is sent once per rank",
			req.PageOffset, req.PageOffset+req.NumPages, p, req.Rank, r.id)
	}
	if req.Last && rp.cov.nSent+req.NumPages != rp.cov.need {
		rp.cov.mark(req.PageOffset, req.NumPages, true)
		gap := rp.cov.firstGap()
		rp.cov.mark(req.PageOffset, req.NumPages, false)
		return nil, nil, false, invalid("last", "chunk %d is marked last, but pages %s of the destination's %d were never sent by %s: send every page before (or with) the last chunk",
			req.Index, gap, len(r.pages), req.Rank)
	}
	if req.Last && req.Marker == 0 {
		return nil, nil, false, invalid("aux", "the last chunk of every prefill rank carries the room marker (aux.room_marker / metadata_room_marker), and chunk %d has none", req.Index)
	}
	if checkBytes {
		// The bytes a prefill reports are checked against what the layout
		// says the chunk's pages weigh for this rank (head slice included).
		if want := transfer.ChunkBytes(m.chunkOpLocked(r, req)); req.Bytes != want {
			return nil, nil, false, invalid("bytes", "%d is not what chunk %d of %s weighs: pages [%d, %d) carry %d bytes by the layout (Destination.token_bytes x tokens + state_bytes on the last chunk)",
				req.Bytes, req.Index, req.Rank, req.PageOffset, req.PageOffset+req.NumPages, want)
		}
	}
	if !rp.claimed {
		m.claimRankLocked(r, rp)
		if r.phase == PhaseFailed {
			return nil, nil, false, fmt.Errorf("chunk %d of room %d: %w: the room failed: %s", req.Index, r.id, ErrWrongState, r.failure.Message)
		}
	}
	rp.cov.mark(req.PageOffset, req.NumPages, true)
	if req.Last {
		rp.last = req.Index
	}
	cs := &chunkState{busy: true, off: req.PageOffset, n: req.NumPages, last: req.Last}
	if rp.chunks == nil {
		rp.chunks = make(map[int]*chunkState, 1)
	}
	rp.chunks[req.Index] = cs
	return rp, cs, true, nil
}

// sameChunk checks that req is a retry of cs: a chunk index names one page
// range and one last flag for the rank's attempt.
func (cs *chunkState) sameChunk(req ChunkRequest) error {
	if cs.off != req.PageOffset || cs.n != req.NumPages || cs.last != req.Last {
		return invalid("chunk_index", "%d was already sent with pages [%d, %d) and last=%v; a retry must carry the same page_offset, num_pages and last (got pages [%d, %d), last=%v)",
			req.Index, cs.off, cs.off+cs.n, cs.last, req.PageOffset, req.PageOffset+req.NumPages, req.Last)
	}
	return nil
}

// chunkDroppedLocked forgets a chunk that did not land and may be sent
// again (the engine was unavailable, or the caller went away).
func chunkDroppedLocked(rp *rankProgress, index int, cs *chunkState) {
	delete(rp.chunks, index)
	rp.cov.mark(cs.off, cs.n, false)
	if cs.last && rp.last == index {
		rp.last = -1
	}
}

func (m *Manager) chunkOpLocked(r *room, req ChunkRequest) transfer.ChunkOp {
	ps := m.layout.PageSize
	tokens := min((req.PageOffset+req.NumPages)*ps, r.fillLen) - req.PageOffset*ps
	op := transfer.ChunkOp{
		Room: r.id, RID: r.rid(), Attempt: r.attempt, Rank: transfer.Rank(req.Rank), ChunkIndex: req.Index,
		DestPages: r.pages[req.PageOffset : req.PageOffset+req.NumPages], Tokens: max(tokens, 0),
		SrcBuffer: req.SrcBuffer, SrcPages: req.SrcPages, Layout: m.layout, DecodeDP: r.decodeDP,
		Last: req.Last, MetadataSlot: r.metaSlot, Marker: req.Marker, OutputIDs: req.OutputIDs,
	}
	if rpl := r.plan.Rank(req.Rank.Key()); rpl != nil {
		op.Targets = rpl.Targets()
	}
	topo := m.topoLocked(r.addr)
	op.PrefillTP, op.PrefillPP = topo.AttnTP, topo.PP
	if req.Last {
		op.State = r.state
	}
	return op
}

// chunkEndLocked records a chunk's outcome and advances the room.
func (m *Manager) chunkEndLocked(ctx context.Context, r *room, rp *rankProgress, req ChunkRequest, cs *chunkState, res transfer.ChunkResult, terr error) (transfer.ChunkResult, bool, error) {
	finish := func(err error) (transfer.ChunkResult, bool, error) {
		cs.err = err
		cs.settle()
		m.releaseIfIdleLocked(r)
		return res, false, err
	}
	m.noteWritesMayContinueLocked(r, terr)
	if r.phase == PhaseFailed {
		return finish(fmt.Errorf("chunk %d of room %d: %w: the room failed: %s", req.Index, r.id, ErrWrongState, r.failure.Message))
	}
	if terr != nil {
		// The room has not failed (checked above): a cancelled call is the
		// caller's, and nothing landed.
		retryable := errors.Is(terr, transfer.ErrEngineUnavailable) || ctx.Err() != nil
		if retryable {
			chunkDroppedLocked(rp, req.Index, cs) // nothing landed: a retry may send it again
			return finish(terr)
		}
		m.obs.ChunkDone(res.Bytes, res.Duration, false)
		f := Failure{Code: FailureTransferFailed, Message: fmt.Sprintf("KVTransferError(bootstrap_room=%d): chunk %d from %s failed: %v", r.id, req.Index, req.Rank, terr)}
		m.failLocked(r, f)
		return finish(fmt.Errorf("%w: %s", transfer.ErrTransferFailed, f.Message))
	}
	cs.done, cs.result = true, res
	cs.settle()
	m.chunkLandedLocked(r, rp, req, res)
	return res, false, nil
}

// chunkLandedLocked advances a room after a chunk landed (moved by the
// engine or reported by the prefill).
func (m *Manager) chunkLandedLocked(r *room, rp *rankProgress, req ChunkRequest, res transfer.ChunkResult) {
	e := r.chunkLanded(m.clock.Now(), rp, req, res)
	m.applyLocked(r, e)
	if e.checkAfter {
		m.checkSuccessLocked(r)
	}
}

// markerLandedLocked records a room marker written into the metadata slot
// (room.markerLanded) and in the ledger.
func (m *Manager) markerLandedLocked(r *room, marker uint64) {
	m.applyLocked(r, effects{markerSet: r.markerLanded(marker)})
}

// ReportTransfer records a chunk the prefill moved itself. A failure fails
// the room with the prefill's reason (SGLang T13).
func (m *Manager) ReportTransfer(req ChunkRequest) (KVPoll, bool, error) {
	sh, r := m.lockRoom(req.Room)
	if r == nil {
		return PollFailed, false, errNoChunkRoom(req)
	}
	defer m.unlockShard(sh)
	if req.Failed {
		// A failure fails the room whatever the chunk's pages or index
		// (SGLang T13): nothing of it is to be kept.
		_, err := m.sourceRankLocked(r, req)
		if err != nil {
			return PollFailed, false, err
		}
		reason := req.Reason
		if reason == "" {
			reason = "Failed to get kvcache from prefill instance, it might be dead"
		}
		m.obs.ChunkDone(req.Bytes, -1, false)
		m.failLocked(r, Failure{Code: FailureTransferFailed, FromAnotherRank: true, Message: fmt.Sprintf(
			"KVTransferError(bootstrap_room=%d): %s (reported by %s, chunk %d)", r.id, reason, req.Rank, req.Index)})
		return PollFailed, false, nil
	}
	rp, cs, fresh, err := m.chunkBeginLocked(r, req, true)
	if err != nil {
		return PollFailed, false, err
	}
	if !fresh {
		if cs.busy {
			return r.phase.Poll(), false, fmt.Errorf("chunk %d of room %d: %w: the chunk is being moved by Transfer", req.Index, r.id, ErrWrongState)
		}
		return r.phase.Poll(), true, cs.err
	}
	cs.settle()
	cs.done = true
	cs.result = transfer.ChunkResult{Bytes: req.Bytes, Duration: -1, MarkerWritten: req.Marker} // duration unknown: the prefill moved it
	// The instance writes by itself: deferred release (drain.go).
	m.selfWriters.note(r.addr)
	m.chunkLandedLocked(r, rp, req, cs.result)
	return r.phase.Poll(), false, nil
}

// checkSuccessLocked declares Success once every required rank's chunks
// landed, no success gate is pending and the metadata slot holds the room's
// marker (SGLang's metadata gate).
func (m *Manager) checkSuccessLocked(r *room) {
	switch r.successCheck() {
	case checkWait:
		return
	case checkCorrupt:
		m.failLocked(r, Failure{Code: FailureMetadataCorruption, Message: fmt.Sprintf(
			"Metadata corruption detected - bootstrap_room mismatch: metadata slot %d holds room %d, expected %d", r.metaSlot, r.marker, r.id)})
		return
	}
	m.stagingSettleLocked(r) // lifts the staging gate once every region is scattered
	if !r.successReady() {
		return // a gate holds it, or aux not landed yet: stay Transferring (the waiting timeout bounds it)
	}
	if err := m.shards[r.decodeDP].led.StartRunning(r.id); err != nil {
		m.failLocked(r, Failure{Code: FailureUnspecified, Message: fmt.Sprintf("internal: ledger refused to start room %d: %v", r.id, err)})
		return
	}
	m.applyLocked(r, r.succeeded(m.clock.Now()))
}

// sglangFor names the SGLang transition a failure code corresponds to.
var sglangFor = map[FailureCode]string{
	FailureAborted:            "T16",
	FailurePrefillUnavailable: "T3",
	FailurePrefillLost:        "T15",
	FailureWaitingTimeout:     "T14",
	FailureTransferFailed:     "T13/T18",
	FailureMetadataCorruption: "T19",
	FailureStagingFailed:      "T18",
}

// failLocked ends a room with a failure: in-flight transfers are cancelled,
// claims and watchers are told, and every resource goes back once nothing
// is in flight.
func (m *Manager) failLocked(r *room, f Failure) {
	m.applyLocked(r, r.fail(m.clock.Now(), f))
}

// releaseRoomLocked ends a room the decode engine is done with.
func (m *Manager) releaseRoomLocked(r *room, note string) {
	m.applyLocked(r, r.released(m.clock.Now(), note))
}

// endLocked retains a room that ended (room.fail, room.released) and
// releases its resources once it may.
func (m *Manager) endLocked(r *room) {
	m.releaseIfIdleLocked(r)
	sh := m.shardOf(r)
	sh.retained = append(sh.retained, r)
	m.trimRetainedLocked(sh, r.updatedAt.time())
}

// releaseIfIdleLocked returns a terminal room's resources to the ledger once
// no transfer is in flight, exactly once.
func (m *Manager) releaseIfIdleLocked(r *room) {
	if m.holdForAcksLocked(r) {
		return // deferred release: a prefill rank may still write (drain.go)
	}
	rel := r.release(m.clock.Now(), m.closed.Load())
	if rel.wait {
		// An engine could not rule out writes into the pages until then.
		if !m.dlArmed(rel.q) {
			m.setDeadlineLocked(rel.q, dlQuarantine, rel.until, r.id, r.attempt, r)
		}
		return
	}
	if !rel.done {
		return
	}
	if rel.q != nil {
		m.clearDeadlineLocked(rel.q)
	}
	if rel.ledger {
		if err := m.shards[r.decodeDP].led.Release(r.id); err != nil {
			m.log.Error("ledger release failed", "room", r.id, "err", err)
		}
	}
	for _, f := range rel.onEnd {
		f()
	}
	m.admitDueLocked(r.decodeDP) // once, when the call that ended the room unlocks
}

// noteWritesMayContinueLocked records how long an engine failure may still
// write into the room's pages (see transfer.WritesMayContinueError).
func (m *Manager) noteWritesMayContinueLocked(r *room, err error) {
	if err == nil {
		return
	}
	var wmc *transfer.WritesMayContinueError
	if errors.As(err, &wmc) && wmc.Until.After(r.writesUntil()) {
		if r.quarantine == nil {
			r.quarantine = &quarantine{}
		}
		r.quarantine.until = wmc.Until
		m.log.Warn("room's pages held until the transfer agent's deadline", "room", r.id, "until", wmc.Until, "err", wmc.Err)
	}
}

// trimRetainedLocked forgets a shard's finished rooms past retention or
// beyond its share of the cap (retainCap).
func (m *Manager) trimRetainedLocked(sh *shard, now time.Time) {
	for len(sh.retained) > 0 {
		old := sh.retained[0]
		if len(sh.retained) <= m.retainCap() && now.Sub(old.updatedAt.time()) < m.cfg.Rooms.Retention {
			break
		}
		sh.retained[0] = nil
		sh.retained = sh.retained[1:]
		if sh.rooms[old.id] == old && old.phase.Terminal() && !old.releasePending {
			sh.forget(old)
			m.obs.RoomForgotten(old.phase)
		} else if sh.rooms[old.id] == old && old.releasePending {
			sh.retained = append(sh.retained, old) // still draining transfers: look again later
			break
		}
	}
}

// AbortRoom fails a room in any phase (held rebootstrap included) with
// "Aborted by AbortReq." or reason. Aborting a finished room is a no-op.
func (m *Manager) AbortRoom(room uint64, reason string) (RoomSnapshot, bool, error) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return RoomSnapshot{}, false, fmt.Errorf("abort room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	if r.phase.Terminal() {
		return r.snapshot(false, false), true, nil
	}
	msg := "Aborted by AbortReq."
	if reason != "" {
		msg = reason
	}
	m.failLocked(r, Failure{Code: FailureAborted, Message: msg})
	return r.snapshot(false, false), false, nil
}

// ReleaseRoom returns a successful room's pages; idempotent.
func (m *Manager) ReleaseRoom(room uint64) (pages int, already bool, err error) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return 0, false, fmt.Errorf("release room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	switch {
	case r.phase == PhaseReleased:
		return 0, true, nil
	case r.phase == PhaseFailed:
		return 0, false, fmt.Errorf("release room %d: %w: the room failed (its pages are already back): %s", room, ErrWrongState, r.failure.Message)
	case r.phase.Poll() != PollSuccess:
		return 0, false, fmt.Errorf("release room %d: %w: the room has not succeeded (phase %s); abort it instead", room, ErrWrongState, r.phase)
	}
	pages = len(r.pages)
	m.releaseRoomLocked(r, "released by the decode engine")
	return pages, false, nil
}

// Watch streams a room's transitions: its current state (every earlier
// transition when history is set), then each transition until terminal.
func (m *Manager) Watch(room uint64, history bool) (*Watcher, error) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return nil, fmt.Errorf("watch room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	steps := r.steps()
	first := len(steps) - 1
	if history {
		first = 0
	}
	w := &Watcher{ch: make(chan RoomEvent, watchBuffer+len(steps)-first), sh: sh, room: room, last: uint32(len(steps))}
	snap := r.snapshot(false, false)
	texts := r.texts()
	for i := first; i < len(steps); i++ {
		w.ch <- RoomEvent{Room: snap, Transition: steps[i].public(r.addr, texts), Terminal: r.phase.Terminal() && i == len(steps)-1, Seq: uint32(i + 1)}
	}
	if r.phase.Terminal() {
		w.close(nil)
		return w, nil
	}
	r.addWatcher(w)
	return w, nil
}

// WatchOutcome streams one event of a room, its outcome: the transition
// to PhaseSucceeded, or the terminal one of a room that ends without
// succeeding (an outcome already reached is sent at once); Events is then
// closed. The events before it are neither sent nor built.
func (m *Manager) WatchOutcome(room uint64) (*Watcher, error) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return nil, fmt.Errorf("watch room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	steps := r.steps()
	w := &Watcher{ch: make(chan RoomEvent, 1), sh: sh, room: room, outcome: true, last: uint32(len(steps))}
	at := -1
	for i, t := range steps {
		if Phase(t.phase) == PhaseSucceeded {
			at = i
			break
		}
	}
	if at < 0 && r.phase.Terminal() {
		at = len(steps) - 1
	}
	if at >= 0 {
		w.ch <- RoomEvent{Room: r.snapshot(false, false), Transition: steps[at].public(r.addr, r.texts()),
			Terminal: r.phase.Terminal() && at == len(steps)-1, Seq: uint32(at + 1)}
		w.close(nil)
		return w, nil
	}
	r.addWatcher(w)
	return w, nil
}

// GetRoom returns a room's state and timeline.
func (m *Manager) GetRoom(room uint64, withPages bool) (RoomSnapshot, error) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return RoomSnapshot{}, fmt.Errorf("get room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	snap := r.snapshot(true, withPages)
	snap.Coverage = r.coverageOf()
	snap.WaitingFor = m.waitingForLocked(r)
	if s := m.drainWaitingLocked(r); s != "" {
		snap.WaitingFor = s
	}
	return snap, nil
}

// ListFilter selects rooms for ListRooms.
type ListFilter struct {
	Phases   []Phase
	Addr     string
	LiveOnly bool
	Limit    int
	// NewestFirst orders by open time, newest first; Limit then keeps the
	// most recent rooms.
	NewestFirst bool
}

// ListRooms returns matching rooms, oldest first (or newest first), and the
// total before Limit.
func (m *Manager) ListRooms(f ListFilter) ([]RoomSnapshot, int) {
	// Each shard in turn: its matching rooms are rendered under its lock,
	// then every shard's are sorted together.
	var out []RoomSnapshot
	var opened []stamp // out[i]'s open time, to the nanosecond
	m.eachShard(func(sh *shard) {
		for _, r := range sh.rooms {
			if f.Addr != "" && r.addr != f.Addr {
				continue
			}
			if f.LiveOnly && r.phase.Terminal() {
				continue
			}
			if len(f.Phases) > 0 && !slices.Contains(f.Phases, r.phase) {
				continue
			}
			out = append(out, r.snapshot(false, false))
			opened = append(opened, r.openedAt)
		}
	})
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(i, j int) bool {
		a, b := idx[i], idx[j]
		if f.NewestFirst {
			a, b = b, a
		}
		if opened[a] != opened[b] {
			return opened[a] < opened[b]
		}
		return out[a].Room < out[b].Room
	})
	total := len(out)
	if f.Limit > 0 && len(idx) > f.Limit {
		idx = idx[:f.Limit]
	}
	sorted := make([]RoomSnapshot, len(idx))
	for i, k := range idx {
		sorted[i] = out[k]
	}
	return sorted, total
}

// Usage is a running room's output length.
type Usage struct {
	Room      uint64
	OutputLen int
}

// Grown are the pages a running room gained.
type Grown struct {
	Room     uint64
	NewPages []int32
}

// ReportRunning grows running rooms' allocations to their output lengths.
// Rooms that could not grow (no pages) are listed in noCapacity: the engine
// should retract one (RetractRoom), whose pages this growth then takes
// first. Unknown or non-running rooms are in notRunning. It is the engine's
// decode step: once every listed room has grown, each shard with a listed
// running room runs an admission pass (SGLang's process_decode_queue after
// the batch), which resumes the rooms retracted before this report when
// their pages and reserve fit, then admits queued rooms.
func (m *Manager) ReportRunning(usage []Usage) (grown []Grown, noCapacity, notRunning []uint64) {
	var stepped []bool // shards with a running room in this report
	for _, u := range usage {
		sh, r := m.lockRoom(u.Room)
		if r == nil {
			notRunning = append(notRunning, u.Room)
			continue
		}
		if r.phase != PhaseSucceeded {
			m.unlockShard(sh)
			notRunning = append(notRunning, u.Room)
			continue
		}
		if stepped == nil {
			stepped = make([]bool, len(m.shards))
		}
		stepped[r.decodeDP] = true
		pages, err := sh.led.UpdateRunning(r.id, u.OutputLen)
		switch {
		case errors.Is(err, prealloc.ErrNoCapacity):
			noCapacity = append(noCapacity, u.Room)
		case err != nil:
			notRunning = append(notRunning, u.Room)
		case len(pages) > 0:
			r.pages = append(r.pages, pages...)
			grown = append(grown, Grown{Room: r.id, NewPages: slices.Clone(pages)})
		}
		m.unlockShard(sh)
	}
	for shard, ok := range stepped {
		if ok {
			sh := m.shards[shard]
			sh.mu.Lock()
			m.admitLocked(shard)
			m.unlockShard(sh)
		}
	}
	return grown, noCapacity, notRunning
}

// RetractMode says what RetractRoom does with a running room.
type RetractMode int

// Retract modes.
const (
	// RetractCPU: the engine keeps a CPU copy; the room resumes (gets pages
	// again) before any new admission.
	RetractCPU RetractMode = iota + 1
	// RetractRebootstrap: held until ContinueGeneration, then re-bootstrapped
	// from its prefill (pause_generation in retract mode).
	RetractRebootstrap
)

// RetractRoom takes a running room's pages back at once.
//
// RetractCPU: the pages, req slot and state slots return to the pool and the
// room is PhaseRetracted (Poll stays Success) until an admission pass
// resumes it. It never resumes inside this call: while other rooms run on
// its shard it waits for the engine's next ReportRunning, whose growth gets
// the freed pages first (SGLang: retract, the batch grows, then
// resume_retracted_reqs); it then resumes, before any new admission, when
// fill_len + R fits the budget, with pages the ledger hands out afresh
// (GetRoom with pages shows them). With no other running room on the shard
// an admission pass runs right after the call. A room that could not
// resume even on an empty shard is refused (prealloc.ErrWrongState) and
// keeps running.
//
// RetractRebootstrap: the room is held (pages freed) until
// ContinueGeneration; new rooms may be admitted into its pages at once.
// RetractResumeAfter bounds how long a RETRACT room waits when nothing else
// runs on its shard: the next admission pass (a ReportRunning, an OpenRoom,
// a release) or this long after the retraction, whichever comes first.
const RetractResumeAfter = time.Second

func (m *Manager) RetractRoom(room uint64, mode RetractMode) (RoomSnapshot, error) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return RoomSnapshot{}, fmt.Errorf("retract room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	if r.phase != PhaseSucceeded {
		return RoomSnapshot{}, fmt.Errorf("retract room %d: %w: only a running (succeeded) room can be retracted (phase %s)", room, ErrWrongState, r.phase)
	}
	switch mode {
	case RetractCPU:
		if err := sh.led.Retract(r.id); err != nil {
			return RoomSnapshot{}, fmt.Errorf("retract room %d: %w", room, err)
		}
		m.parkLocked(r, m.clock.Now(), false)
		m.applyLocked(r, r.retracted(m.clock.Now()))
		if sh.led.Stats().Running == 0 {
			// Nothing left on the shard to grow into the pages: resume (or
			// not) at the next pass, at the latest RetractResumeAfter from
			// now, so that the pages are visibly free meanwhile (for a room
			// being admitted, or an engine reading the pool).
			m.setDeadlineLocked(&sh.admitDl, dlAdmit, m.clock.Now().Add(RetractResumeAfter), uint64(r.decodeDP), 0, nil)
		}
	case RetractRebootstrap:
		if err := sh.led.Hold(r.id); err != nil {
			return RoomSnapshot{}, fmt.Errorf("hold room %d: %w", room, err)
		}
		m.parkLocked(r, m.clock.Now(), true)
		m.applyLocked(r, r.held(m.clock.Now()))
		m.admitLocked(r.decodeDP)
	default:
		return RoomSnapshot{}, invalid("mode", "must be RETRACT or REBOOTSTRAP")
	}
	return r.snapshot(false, false), nil
}

// ContinueGeneration re-enqueues every held room as a rebootstrap request
// (SGLang T22): a new attempt that bootstraps again from the same prefill DP
// rank. ContinueGenerationResumed also says, per room, where the engine
// requests the prefill's recompute.
func (m *Manager) ContinueGeneration(ctx context.Context) []uint64 {
	var ids []uint64
	for _, rs := range m.ContinueGenerationResumed(ctx) {
		ids = append(ids, rs.Room)
	}
	return ids
}

// rebootstrapLocked starts the new attempt of a shard's re-queued held rooms.
func (m *Manager) rebootstrapLocked(ctx context.Context, sh *shard, ids []uint64) {
	now := m.clock.Now()
	for _, id := range ids {
		r := sh.rooms[id]
		if r == nil {
			continue
		}
		e := r.rebootstrap(now, m.cfg.Timeouts.Bootstrap)
		m.startSpanLocked(ctx, r) // the new attempt's transfer context is made at its admission
		m.applyLocked(r, e)
		m.prefillOrWaitLocked(r, "T22")
	}
}

// failDroppedHeldLocked fails the held rooms of a shard that the ledger
// dropped instead of re-queueing at ContinueGeneration (it refuses a request
// that can no longer fit the pool).
func (m *Manager) failDroppedHeldLocked(sh *shard, resumed []uint64) {
	back := make(map[uint64]bool, len(resumed))
	for _, id := range resumed {
		back[id] = true
	}
	for _, r := range sh.rooms {
		if r.phase != PhaseHeld || back[r.id] {
			continue
		}
		if _, known := sh.led.State(r.id); known {
			continue // the ledger still holds it
		}
		r.inLedger = false
		m.failLocked(r, Failure{Code: FailureUnspecified, Message: fmt.Sprintf(
			"rebootstrap of room %d refused at ContinueGeneration: prompt %d + output %d tokens exceed the decode pool", r.id, r.entry.Request().PromptLen, r.entry.Request().OutputLen)})
	}
}

// HoldSuccess adds a condition the room's success waits for (for example a
// staged chunk still scattering). ReleaseHold removes it.
func (m *Manager) HoldSuccess(room uint64, gate string) error {
	sh, r := m.lockRoom(room)
	if r == nil {
		return fmt.Errorf("hold success of room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	if r.phase.Terminal() || r.phase.Poll() == PollSuccess {
		return fmt.Errorf("hold success of room %d: %w (phase %s)", room, ErrWrongState, r.phase)
	}
	r.hold(gate)
	return nil
}

// ReleaseHold removes a success condition; a non-nil failure fails the room.
func (m *Manager) ReleaseHold(room uint64, gate string, failure *Failure) {
	sh, r := m.lockRoom(room)
	if r == nil {
		return
	}
	defer m.unlockShard(sh)
	if r.phase.Terminal() {
		return
	}
	r.unhold(gate)
	if failure != nil {
		m.failLocked(r, *failure)
		return
	}
	m.checkSuccessLocked(r)
}

// OnRoomEnd runs f exactly once when the room's resources are released, on
// every exit path (release, failure, abort, timeout, shutdown). f runs with
// the room's shard lock held and must not call back into the manager.
func (m *Manager) OnRoomEnd(room uint64, f func()) error {
	sh, r := m.lockRoom(room)
	if r == nil {
		return fmt.Errorf("on end of room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	if r.phase.Terminal() && !r.releasePending {
		f()
		return nil
	}
	x := r.x()
	x.onEnd = append(x.onEnd, f)
	return nil
}

// Poll returns a room's KVPoll (Failed for an unknown room).
func (m *Manager) Poll(room uint64) KVPoll {
	if sh, r := m.lockRoom(room); r != nil {
		defer m.unlockShard(sh)
		return r.phase.Poll()
	}
	return PollFailed
}
