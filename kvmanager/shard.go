package kvmanager

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// shard is one decode DP shard: the unit of concurrency and the rooms'
// only executor. Its mutex guards every field of its rooms, its retained
// terminal rooms, its staged rooms, its admission-due flag and what its
// deadline entries bound; a call on a room takes only its room's shard lock.
// Every call that changes a room does the same: lock the shard, build one
// event with its inputs, apply it to the room (room.Room.Apply), carry out
// the effects once (exec), unlock — and when it unlocks, the shard's due
// admission pass runs (unlock). Its ledger has its own lock (taken under
// mu, and alone by the capacity readers).
//
// rooms is also the shard's part of the room directory: it is written only
// with both mu and dirMu held (OpenRoom inserts, a forgotten room is
// deleted), so that a holder of mu may read it freely and a lookup that
// holds no shard lock (shardSet.find) reads it under dirMu alone, which is
// never held for anything but the map operation. A room never changes
// shard; its shard is chosen at OpenRoom (routed_dp_rank, or room % dp).
type shard struct {
	m   *Manager
	idx int
	led *prealloc.Ledger
	// holds is the hand-off ledger when the decode engine owns the pages
	// (kv_pool.owner: engine; nil otherwise): the rooms' ledger operations
	// go to it, and led stays empty. engineCap is the shard's capacity as
	// the engine last reported it (ReportCapacity; nil until its first
	// report), read without the shard lock by the capacity readers.
	holds     *prealloc.Holds
	engineCap atomic.Pointer[EngineCapacity]
	// reach is the reuse invariant's record of the indices a writer may
	// still reach (reach.go), guarded by mu.
	reach *reachTable

	mu sync.Mutex
	// dirMu guards rooms for readers that do not hold mu.
	dirMu sync.RWMutex
	rooms map[uint64]*entry

	retained []*entry               // terminal rooms, oldest first
	staged   map[uint64]*stagedRoom // staged rooms' handler state (staging.go), made on first use
	due      bool                   // an admission pass is due when the call holding mu unlocks
	admitDl  deadline               // an admission pass right after a retraction
	// byPhase and byAddr count the shard's rooms by phase and by bootstrap
	// address (counts.go), so that Status, InFlight and RoomsFor walk no room.
	byPhase [room.PhaseHeld + 1]int
	byAddr  map[string]*addrRooms
	// layouts are the decode engine's buffer layouts by decode TP rank (nil
	// until one is registered; replaced, never changed in place, so that a
	// room keeps the slice it was declared with), layoutChanging is set
	// while one is being registered (layout.go). Written under mu and
	// Manager.layouts.mu.
	layouts        []*kvlayout.BufferLayout
	layoutChanging bool
}

// entry is the shard's record of one room: the room itself (pure state),
// and what only the executor touches: the allocator's record, the deadline
// heap's entry, and the room's subscribers, engine calls and trace.
type entry struct {
	room.Room
	led     prealloc.Entry // the ledger's record of the room (its request, queue position, allocation)
	dl      deadline       // the room's one entry on the deadline heap (room.NextDeadline)
	subs    *subscribers   // claims, watchers, end hooks, engine calls; made on first use
	parked  bool           // among its address's rooms waiting for a registration (Manager.wait)
	counted bool           // in the shard's counts (its opening was carried out)
	// handoffEnded: the hand-off ledger let go of what the room held
	// (kv_pool.owner: engine).
	handoffEnded bool
}

// subscribers are a room's claim streams by rank, its watchers, its end
// hooks, the engine calls running into it and its spans.
type subscribers struct {
	claims   claimSet
	attached room.Attachments // the room's record of its attached claims (room.Attach.Set)
	watchers map[*Watcher]struct{}
	onEnd    []func()
	// calls are the engine calls (chunks) in flight (the first two kept in
	// inline); xfer ends the room's staged scatters when it fails.
	calls      []call
	inline     [2]call
	xferCtx    context.Context
	xferCancel context.CancelFunc
	tr         *roomTrace // nil unless the room's span is built
	// reach is the destination the room noted in its shard's reuse record
	// (reach.go).
	reach reached
}

// call is one engine Transfer running into a room: its cancel, and what a
// retry of the same chunk waits on (made by the first such retry).
type call struct {
	rank   rankKey
	index  int
	cancel context.CancelFunc
	wait   *callWait
}

// callWait is a chunk in flight's outcome for the retries waiting for it:
// done closes when it ends, after res and err are set.
type callWait struct {
	done chan struct{}
	res  transfer.ChunkResult
	err  error
	then []func(transfer.ChunkResult, bool, error) // TransferAsync's retries
}

// s is the room's subscribers, made on first use.
func (e *entry) s() *subscribers {
	if e.subs == nil {
		e.subs = &subscribers{}
	}
	return e.subs
}

func newShard(m *Manager, idx int, led *prealloc.Ledger) *shard {
	return &shard{m: m, idx: idx, led: led, rooms: map[uint64]*entry{}}
}

// insert adds e to the shard's rooms (mu held).
func (sh *shard) insert(e *entry) {
	sh.dirMu.Lock()
	sh.rooms[e.ID()] = e
	sh.dirMu.Unlock()
}

// forget removes e from the shard's rooms (mu held).
func (sh *shard) forget(e *entry) {
	sh.dirMu.Lock()
	if sh.rooms[e.ID()] == e {
		delete(sh.rooms, e.ID())
		sh.uncount(e)
	}
	sh.dirMu.Unlock()
}

// lookup reads the shard's rooms without holding mu.
func (sh *shard) lookup(id uint64) *entry {
	sh.dirMu.RLock()
	e := sh.rooms[id]
	sh.dirMu.RUnlock()
	return e
}

// unlock runs the shard's due admission pass, then unlocks it. Every entry
// point that may end a room unlocks its shard with it.
func (sh *shard) unlock() {
	for sh.due && !sh.m.closed.Load() {
		sh.admit() // clears the flag
	}
	sh.mu.Unlock()
}

// shardSet is the manager's decode DP shards, index = decode DP rank.
type shardSet []*shard

// find locates a room without taking any shard lock: its home shard
// (room % dp) first, then the others. It returns nil when no shard holds it.
func (ss shardSet) find(id uint64) (*shard, *entry) {
	n := len(ss)
	home := int(id % uint64(n))
	for i := range n {
		sh := ss[(home+i)%n]
		if e := sh.lookup(id); e != nil {
			return sh, e
		}
	}
	return nil, nil
}

// lock finds a room and locks its shard; it returns (nil, nil), with
// nothing locked, when the room does not exist. After the shard lock is
// taken the room is checked to still be the shard's (it may have been
// forgotten meanwhile; then the lookup starts again). The caller unlocks
// with sh.unlock().
func (ss shardSet) lock(id uint64) (*shard, *entry) {
	for {
		sh, e := ss.find(id)
		if e == nil {
			return nil, nil
		}
		sh.mu.Lock()
		if sh.rooms[id] == e {
			return sh, e
		}
		sh.mu.Unlock()
	}
}

// each runs f on every shard, one shard lock at a time (unlocked with
// unlock, so that what f made due is admitted).
func (ss shardSet) each(f func(sh *shard)) {
	for _, sh := range ss {
		sh.mu.Lock()
		f(sh)
		sh.unlock()
	}
}

// exec applies ev to e's room and carries out its effects, then the steps
// they ask for (Effects.Then), each built here with what it reads. It
// returns the effects of ev itself (its answer). The shard's lock is held.
func (sh *shard) exec(e *entry, ev room.Event) room.Effects {
	first := e.Apply(ev)
	sh.apply(e, &first)
	for then := first.Then; then != room.ThenNone; {
		var next room.Effects
		now := sh.m.clock.Now()
		switch then {
		case room.ThenTransferring:
			next = e.Apply(room.Transferring{Now: now})
		case room.ThenCheckSuccess:
			next = e.Apply(room.CheckSuccess{Now: now, ScattersPending: sh.scattersPending(e), SelfWriter: sh.m.selfWriters.known(e.Addr())})
		}
		sh.apply(e, &next)
		then = next.Then
	}
	if first.Resolved {
		sh.offerResolved(e) // offers.go
	}
	return first
}

// apply carries out one event's effects, in the order room.Effects
// documents.
func (sh *shard) apply(e *entry, ef *room.Effects) {
	m := sh.m
	if ef.Unwait {
		m.wait.leave(e)
	}
	if ef.Cancel {
		e.cancelCalls()
	}
	sh.claimEffects(e, ef)
	if ef.Admission {
		m.obs.DestinationLatency(ef.AdmittedAfter)
	}
	if ef.Resolved {
		m.obs.DPRankResolved(ef.Rule)
		if tr := e.trace(); tr != nil && tr.span != nil {
			tr.span.SetAttributes(attribute.Int("decodeplane.prefill_dp_rank", ef.DP), attribute.String("decodeplane.dp_rank_rule", ef.Rule.String()))
		}
	}
	if ef.Finished {
		if ef.Outcome == PhaseSucceeded {
			m.obs.TransferLatency(ef.Transferred, ef.TransferredBytes)
		}
		m.obs.RoomFinished(ef.Outcome, ef.Code, ef.SinceOpen)
	}
	if f := ef.Failure; f != nil {
		m.roomFailed(e, f, ef.Move.From)
	}
	if ef.Move.Moved {
		sh.moved(e, ef.Move)
	}
	if ef.Chunk {
		m.obs.ChunkDone(ef.ChunkRes.Bytes, ef.ChunkRes.Duration, ef.ChunkOK)
	}
	if ef.Offer != room.OfferNone {
		sh.offer(e, ef)
	}
	if ef.Ledger != 0 {
		sh.ledger(e, ef.Ledger)
	}
	if ef.StagingOpen {
		sh.stagingOpen(e)
	}
	sh.drainNotes(e, ef)
	if ef.End {
		sh.retained = append(sh.retained, e)
		sh.trim(e.UpdatedAt())
	}
	if ef.Release {
		sh.released(e)
	}
	sh.writersStopped(e, ef)
	if ef.AdmitNow {
		sh.admit()
	}
	sh.arm(e)
}

// ledger applies the allocator's operations on e's record. The room decided
// them from its own state, which the ledger mirrors: a refusal is an
// invariant broken between the two, never an answer (errInvariant).
func (sh *shard) ledger(e *entry, ops room.LedgerOp) {
	id := e.ID()
	check := func(op string, err error) {
		if err != nil {
			sh.m.invariant("ledger refused "+op, id, err)
		}
	}
	if sh.holds != nil {
		// The engine's pages: held from the declaration until the hand-off
		// ends (at success the engine decodes in them; at a failure's end,
		// after the drain).
		if ops&room.LedgerDrain != 0 {
			check("drain", sh.holds.Drain(id))
		}
		if ops&(room.LedgerRunning|room.LedgerRelease) != 0 && !e.handoffEnded {
			e.handoffEnded = true
			check("release", sh.holds.Release(id, e.Pages() != nil || ops&room.LedgerRunning != 0))
		}
		return
	}
	if ops&room.LedgerReady != 0 {
		check("set ready", sh.led.SetReady(id))
	}
	if ops&room.LedgerClaim != 0 {
		check("claim", sh.led.Claim(id))
	}
	if ops&room.LedgerRunning != 0 {
		check("start running", sh.led.StartRunning(id))
	}
	if ops&room.LedgerDrain != 0 {
		check("drain", sh.led.DrainRoom(id))
	}
	if ops&room.LedgerRelease != 0 {
		check("release", sh.led.Release(id))
	}
}

// released gives an ended room's resources back (the room decided it:
// nothing is in flight, no write may still land): its staging regions and
// end hooks, and the shard's admission pass is due.
func (sh *shard) released(e *entry) {
	sh.stagingRelease(e.ID())
	if s := e.subs; s != nil {
		hooks := s.onEnd
		s.onEnd = nil
		if s.xferCancel != nil {
			s.xferCancel()
		}
		for _, f := range hooks {
			f()
		}
	}
	sh.admitDue()
}

// admitDue records that the shard's resources changed: its admission pass
// runs once, when the call that changed them unlocks the shard — never
// inside the call of the room that freed them.
func (sh *shard) admitDue() {
	if !sh.m.closed.Load() {
		sh.due = true
	}
}

// arm keeps e's entry on the deadline heap at its room's next deadline.
func (sh *shard) arm(e *entry) {
	next := e.NextDeadline()
	if next.IsZero() {
		sh.m.dl.clear(&e.dl)
		return
	}
	sh.m.dl.set(&e.dl, dlRoom, next, e.Attempt(), e)
}

// admit runs one admission pass and hands out what it admitted:
// destinations to the prefill ranks, pages back to resumed rooms.
func (sh *shard) admit() {
	m := sh.m
	sh.due = false
	if m.closed.Load() || m.rs.gated.Load() || sh.holds != nil { // resync.go: nothing is admitted during the resync wait; the engine admits its own
		return
	}
	adms, blocked := sh.led.Admit()
	m.obs.AdmissionPass(sh.idx, len(adms), blocked)
	now := m.clock.Now()
	staging := m.stg.ringBytes() > 0
	for _, a := range adms {
		e := sh.rooms[a.Room]
		if e == nil || e.Phase().Terminal() {
			m.invariant("ledger admitted a room the manager does not hold; releasing it", a.Room, nil)
			_ = sh.led.Release(a.Room)
			continue
		}
		if !a.Resumed && e.Attempt() > 1 && e.subs != nil && e.subs.xferCancel != nil {
			// The previous attempt's staged scatters end: nothing of it runs
			// any more.
			e.subs.xferCancel()
			e.subs.xferCtx, e.subs.xferCancel = nil, nil
		}
		al := a.Alloc
		sh.handOut(e, al.Pages, al.MetadataSlot, al.State)
		sh.exec(e, room.Admitted{Now: now, Pages: al.Pages, FillLen: al.FillLen, MetadataSlot: al.MetadataSlot, State: al.State,
			Resumed: a.Resumed, Staged: !a.Resumed && e.Staging() && staging})
	}
}

// trim forgets the shard's finished rooms past retention or beyond its
// share of the cap (rooms.max_retained split across the shards).
func (sh *shard) trim(now time.Time) {
	m := sh.m
	limit := (m.cfg.Rooms.MaxRetained + len(m.shards) - 1) / len(m.shards)
	for len(sh.retained) > 0 {
		old := sh.retained[0]
		if len(sh.retained) <= limit && now.Sub(old.UpdatedAt()) < m.cfg.Rooms.Retention {
			break
		}
		sh.retained[0] = nil
		sh.retained = sh.retained[1:]
		if sh.rooms[old.ID()] != old {
			continue
		}
		if old.ReleasePending() {
			sh.retained = append(sh.retained, old) // still draining transfers: look again later
			break
		}
		sh.forget(old)
		m.obs.RoomForgotten(old.Phase())
	}
}
