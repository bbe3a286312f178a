package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/decodeplane/decodeplane/internal/stormlog"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/kvmanager/staging"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// Deps are the manager's collaborators.
type Deps struct {
	// Ledgers are the decode DP shards, index = decode DP rank; required.
	Ledgers []*prealloc.Ledger
	// Engine moves chunks; required.
	Engine transfer.Engine
	// Clock defaults to kvlayout.RealClock.
	Clock kvlayout.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider defaults to a no-op provider.
	TracerProvider trace.TracerProvider
	// Observer defaults to NopObserver.
	Observer Observer
	// LeaseLiveness: prefill instances live while their fleet lease does
	// (registry.backend etcd, package fleet), not by this daemon's own
	// heartbeat count; the fleet calls LosePrefill when a lease ends.
	LeaseLiveness bool
}

// Manager owns rooms, prefill registrations, DP-rank bindings and the
// transfer state machine. It is safe for concurrent use.
type Manager struct {
	cfg    Config
	dec    kvlayout.Config
	layout kvlayout.Layout
	clock  kvlayout.Clock
	log    *slog.Logger
	// storm logs what may happen to many rooms at once: one line per cause
	// per interval (logs.go).
	storm  *stormlog.Logger
	tracer trace.Tracer
	// selfWriters: prefill addresses known to write by themselves (drain.go).
	selfWriters selfWriters
	// tracing: the provider is not the no-op one; without it no span or
	// attribute is built on the room path.
	tracing bool
	obs     Observer
	engine  transfer.Engine
	shards  shardSet // the decode DP shards, index = decode DP rank (shard.go)
	// params are what every room reads of the configuration (room.Params).
	params *room.Params

	reg *registry.Registry // prefill instances, liveness, DP-rank bindings (own lock)
	dl  deadlines          // every deadline, one heap and one timer (deadline.go; own lock)
	stg stagingState       // the staging handler (staging.go; own lock)
	rs  resyncGate         // the engine resync wait (resync.go; own lock)
	// layouts serializes the decode engine's layout registrations
	// (layout.go); the layouts live in their shards.
	layouts layoutBook

	// openMu makes a room id unique across the shards: OpenRoom holds it
	// (under the new room's shard lock) for the lookup and the insert only.
	openMu sync.Mutex

	pend pendingClaims // claims for rooms not opened yet (claims.go; a leaf lock)
	// offers are the ranks subscribed to their rooms (offers.go; taken
	// under a shard's lock, the registry's under it).
	offers offers
	wait   waitList // rooms waiting for an instance's registration (prefill.go; a leaf lock)

	draining atomic.Bool
	closed   atomic.Bool

	prog progress // a waiting Shutdown's progress signal (publish.go)

	shut shutdown // what Shutdown ended
}

// New builds a manager. dec must be validated.
func New(cfg Config, dec kvlayout.Config, deps Deps) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(deps.Ledgers) == 0 {
		return nil, errors.New("kvmanager: at least one ledger (decode DP shard) is required")
	}
	if len(deps.Ledgers) != max(1, dec.Parallel.DP) {
		return nil, fmt.Errorf("kvmanager: %d ledgers for parallel.dp = %d", len(deps.Ledgers), dec.Parallel.DP)
	}
	if deps.Engine == nil {
		return nil, errors.New("kvmanager: a transfer engine is required")
	}
	if deps.Clock == nil {
		deps.Clock = kvlayout.RealClock{}
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	tracing := true
	switch deps.TracerProvider.(type) {
	case nil:
		deps.TracerProvider, tracing = noop.NewTracerProvider(), false
	case noop.TracerProvider, *noop.TracerProvider:
		tracing = false
	}
	if deps.Observer == nil {
		deps.Observer = NopObserver{}
	}
	m := &Manager{
		cfg:     cfg,
		dec:     dec,
		layout:  dec.Layout(),
		clock:   deps.Clock,
		log:     deps.Logger,
		storm:   stormlog.New(deps.Logger, stormlog.Options{Clock: deps.Clock}),
		tracer:  deps.TracerProvider.Tracer("github.com/decodeplane/decodeplane/kvmanager"),
		tracing: tracing,
		obs:     deps.Observer,
		engine:  deps.Engine,
		reg:     newRegistry(cfg, dec.Layout(), deps.Clock, deps.LeaseLiveness),
		stg:     stagingState{s: staging.New(dec.Layout(), StagingRingBytes(dec)), layout: dec.Layout(), engine: deps.Engine},
	}
	if oc, ok := deps.Engine.(transfer.OpChecker); ok {
		m.layouts.check = oc.CheckOp // made once: a chunk's check allocates nothing
	}
	m.params = &room.Params{
		Layout: m.layout, Bootstrap: cfg.Timeouts.Bootstrap, Waiting: cfg.Timeouts.Waiting,
		DPRankResolution: cfg.Timeouts.DPRankResolution, Retracted: cfg.Timeouts.Retracted, Held: cfg.Timeouts.Held,
		ClaimTimeout: dec.Admission.ClaimTimeout, DeferredTimeout: cfg.Release.DeferredTimeout, Owner: dec.Pool.Owner,
	}
	for i, led := range deps.Ledgers {
		sh := newShard(m, i, led)
		sh.reach = newReachTable(dec)
		if dec.Pool.Owner == kvlayout.OwnerEngine {
			// The engine allocates: the shard holds what it declares.
			h, err := prealloc.NewHolds(dec, i)
			if err != nil {
				return nil, fmt.Errorf("kvmanager: decode shard %d: %w", i, err)
			}
			sh.holds = h
		}
		m.shards = append(m.shards, sh)
	}
	m.pend.m = m
	m.pend.rooms = map[uint64][]*Claim{}
	m.wait.m = m
	m.wait.addrs = map[string]*addrWait{}
	m.dl.clock, m.dl.closed, m.dl.fire = deps.Clock, &m.closed, m.fireDeadlines
	return m, nil
}

// Layout returns the decode KV layout.
func (m *Manager) Layout() kvlayout.Layout { return m.layout }

// Run runs the background checks until ctx is done: prefill heartbeat
// liveness (four times per effective heartbeat interval), DP-rank binding expiry and
// the retention of finished rooms. It returns ctx's error.
func (m *Manager) Run(ctx context.Context) error {
	interval, _ := m.cfg.Timeouts.EffectiveHeartbeat()
	// Check four times per interval, so that a dead instance is found at
	// most a quarter interval after interval × max_failures of silence.
	// (A check much later than that is the daemon's own stall:
	// registry.CheckLiveness.)
	hb := kvlayout.NewTicker(m.clock, interval/registry.ChecksPerInterval)
	defer hb.Stop()
	sweep := kvlayout.NewTicker(m.clock, min(m.cfg.DPRank.BindingTTL, time.Minute))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-hb.C:
			m.apply(m.reg.CheckLiveness())
		case <-sweep.C:
			// DP-rank bindings expire; finished rooms past retention go.
			m.reg.ExpireBindings()
			m.shards.each(func(sh *shard) { sh.trim(m.clock.Now()) })
		}
	}
}

// Drain stops opening rooms (OpenRoom and claims for unopened rooms return
// ErrDraining); rooms already open, queued ones included, go on.
func (m *Manager) Drain() {
	if !m.draining.CompareAndSwap(false, true) {
		return
	}
	// The ledgers keep admitting: rooms already opened are accepted requests
	// whose prefill is waiting, and finishing them is what a drain is for.
	m.log.Info("draining: no new rooms; rooms already open go on")
}

// InFlight counts rooms that have not reached a terminal phase.
func (m *Manager) InFlight() int {
	n := 0
	m.shards.each(func(sh *shard) {
		for p, c := range sh.byPhase { // counted on transition: no walk of the rooms
			if !Phase(p).Terminal() {
				n += c
			}
		}
	})
	return n
}

// Shutdown ends every room, in this order:
//  1. drain: no new rooms, no admission;
//  2. the rooms not admitted yet (waiting for their prefill, resolving their
//     DP rank, queued) fail at once with FailureShutdown, and so do the
//     claims waiting for rooms never opened (the drain refuses OpenRoom, so
//     nothing could serve them): they hold nothing a prefill writes into;
//  3. the admitted rooms whose KV may be moving get until ctx is done to
//     finish (Succeeded rooms do not hold this up);
//  4. every room still handing off fails with FailureShutdown, and every
//     Succeeded room (its hand-off is complete) is released.
//
// Each failure is the room's terminal event on every claim stream (a
// Failure event, then the channel closes) and on every watcher (the
// terminal RoomEvent, then the channel closes), queued before Shutdown
// returns, so that the caller can let the stream handlers send them before
// it stops serving. Resources go back exactly once and never while a
// transfer the engine runs is in flight; afterwards every ledger is full.
// The message is decodeplane's account followed by SGLang-style wording:
// "... : Request {rid} aborted: decode server shutting down". ShutdownSummary
// reports what Shutdown had to end.
func (m *Manager) Shutdown(ctx context.Context) {
	m.Drain()
	// Rooms not admitted yet hold nothing prefill writes into: fail them now
	// and stop admitting, then give the rooms whose KV may be moving time to
	// finish. Each shard in turn, one shard lock at a time.
	failed := 0
	m.shards.each(func(sh *shard) {
		sh.led.Drain()
		for _, e := range sh.sorted(func(e *entry) bool {
			p := e.Phase()
			return p == PhaseWaitingPrefill || p == PhaseResolvingDP || p == PhaseQueued
		}) {
			sh.fail(e, Failure{Code: FailureShutdown, Message: shutdownMessage(fmt.Sprintf("decodeplane shut down before room %d was admitted (phase %s)", e.ID(), e.Phase()), e.RequestName())})
			failed++
		}
	})
	pending := m.pend.failAll()
	m.shut.add(ShutdownSummary{Failed: failed, PendingClaims: pending})
	for {
		// The signal is set before the rooms are counted: a room that stops
		// handing off after its shard was counted closes it.
		m.prog.mu.Lock()
		if m.prog.ch == nil {
			m.prog.ch = make(chan struct{})
			m.prog.waiting.Store(true)
		}
		progress := m.prog.ch
		m.prog.mu.Unlock()
		busy := 0
		m.shards.each(func(sh *shard) {
			for _, e := range sh.rooms {
				if e.HandingOff() {
					busy++
				}
			}
		})
		if busy == 0 {
			break
		}
		select {
		case <-progress:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	// Closed first: no admission, no new timers, and no quarantine or drain:
	// the process is going away, every room's accounting goes back now.
	m.closed.Store(true)
	var sum ShutdownSummary
	m.shards.each(func(sh *shard) {
		now := m.clock.Now()
		for _, e := range sh.sorted(nil) {
			sh.exec(e, room.Close{Now: now}) // rooms quarantined or draining go back now
		}
		for _, e := range sh.sorted(func(e *entry) bool { return !e.Phase().Terminal() }) {
			if e.Phase().Poll() == PollSuccess {
				sh.exec(e, room.Release{Now: now, Why: "released at shutdown"})
				sum.Released++
				continue
			}
			sh.fail(e, Failure{Code: FailureShutdown, Message: shutdownMessage(fmt.Sprintf("decodeplane shut down before room %d finished (phase %s)", e.ID(), e.Phase()), e.RequestName())})
			sum.Failed++
		}
	})
	sum.PendingClaims = m.pend.failAll() // none can be left: AwaitDestination refuses them while draining
	m.shut.add(sum)
	m.dl.reset()    // closed: no deadline applies any more
	m.storm.Flush() // the summaries of what the shutdown ended
}

// shutdown is what Shutdown ended, behind its own lock.
type shutdown struct {
	mu  sync.Mutex
	sum ShutdownSummary
}

// add adds to what Shutdown ended.
func (sd *shutdown) add(s ShutdownSummary) {
	sd.mu.Lock()
	sd.sum.Failed += s.Failed
	sd.sum.PendingClaims += s.PendingClaims
	sd.sum.Released += s.Released
	sd.mu.Unlock()
}

// shutdownMessage is a room's FailureShutdown message: what decodeplane saw,
// then SGLang-style abort wording naming the request.
func shutdownMessage(what, request string) string {
	return what + ": Request " + request + " aborted: decode server shutting down"
}

// ShutdownSummary is what Shutdown had to end.
type ShutdownSummary struct {
	// Failed counts the rooms Shutdown failed with FailureShutdown (their
	// hand-off had not finished).
	Failed int
	// PendingClaims counts the claim streams for rooms never opened that
	// Shutdown ended with FailureShutdown.
	PendingClaims int
	// Released counts the Succeeded rooms Shutdown released (their hand-off
	// was complete: not a failure).
	Released int
}

// CutShort reports whether Shutdown ended work before it finished: a room
// or a claim failed with FailureShutdown.
func (s ShutdownSummary) CutShort() bool { return s.Failed > 0 || s.PendingClaims > 0 }

// ShutdownSummary reports what Shutdown ended (zero before Shutdown).
func (m *Manager) ShutdownSummary() ShutdownSummary {
	m.shut.mu.Lock()
	defer m.shut.mu.Unlock()
	return m.shut.sum
}

// ShardStats returns every shard's ledger stats (with the engine as the
// page owner, made from its holds and reports: shard.stats).
func (m *Manager) ShardStats() []prealloc.Stats {
	out := make([]prealloc.Stats, len(m.shards))
	for i, sh := range m.shards {
		out[i] = sh.stats()
	}
	return out
}

// Status is a summary for operators.
type Status struct {
	Draining     bool
	RoomsByPhase map[Phase]int
	Shards       []prealloc.Stats
	Prefills     []PrefillStatus
	// PendingClaims counts the claims waiting for rooms not opened yet (at
	// most maxPendingClaims).
	PendingClaims int
	// Holds is every shard's hand-off ledger when the decode engine owns
	// the pages (kv_pool.owner: engine; nil otherwise).
	Holds []ShardHolds
}

// HoldStats returns every shard's hand-off ledger when the decode engine
// owns the pages (nil otherwise), each read under its own leaf lock only.
func (m *Manager) HoldStats() []prealloc.HoldStats {
	var out []prealloc.HoldStats
	for _, sh := range m.shards {
		if sh.holds != nil {
			out = append(out, sh.holds.Stats())
		}
	}
	return out
}

// ShardHolds is a shard's hand-off ledger (kv_pool.owner: engine), and
// whether its engine has reported its capacity (ReportCapacity).
type ShardHolds struct {
	prealloc.HoldStats
	CapacityReported bool
}

// PrefillStatus is one known prefill instance: the registry's view of it and
// the rooms that refer to its address and have not ended.
type PrefillStatus struct {
	registry.InstanceStatus
	ActiveRooms int
}

// Status returns rooms by phase, shard stats and prefill instances.
func (m *Manager) Status() Status {
	st := Status{Draining: m.draining.Load(), RoomsByPhase: map[Phase]int{}}
	active := map[string]int{}
	m.shards.each(func(sh *shard) {
		for p, n := range sh.byPhase { // counted on transition: no walk of the rooms
			if n > 0 {
				st.RoomsByPhase[Phase(p)] += n
			}
		}
		for addr, a := range sh.byAddr {
			if a.live > 0 {
				active[addr] += a.live
			}
		}
	})
	for _, p := range m.reg.Status() {
		ps := PrefillStatus{InstanceStatus: p}
		ps.ActiveRooms = active[p.Addr]
		st.Prefills = append(st.Prefills, ps)
	}
	sort.Slice(st.Prefills, func(i, j int) bool { return st.Prefills[i].Addr < st.Prefills[j].Addr })
	st.Shards = m.ShardStats()
	st.PendingClaims = m.pend.len()
	for _, sh := range m.shards {
		if sh.holds != nil {
			st.Holds = append(st.Holds, ShardHolds{HoldStats: sh.holds.Stats(), CapacityReported: sh.engineCap.Load() != nil})
		}
	}
	return st
}

// RoomsFor counts the rooms held (finished ones until they are forgotten
// included) whose bootstrap address is addr.
func (m *Manager) RoomsFor(addr string) int {
	n := 0
	m.shards.each(func(sh *shard) {
		if a := sh.byAddr[addr]; a != nil {
			n += a.all
		}
	})
	return n
}

// invariant reports a broken invariant between the room and the allocator
// (or another internal inconsistency): under the package's tests it
// panics, in production it is logged as an internal error and the daemon
// goes on.
func (m *Manager) invariant(what string, room uint64, err error) {
	if strictInvariants {
		panic(fmt.Sprintf("kvmanager: %s: room %d: %v", what, room, err))
	}
	m.storm.Log(context.Background(), slog.LevelError, "internal: "+what, nil, strconv.FormatUint(room, 10), slog.Uint64("room", room), slog.Any("err", err))
}

// strictInvariants makes a broken invariant panic (set by the package's
// tests).
var strictInvariants = false
