package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// benchRoomTable holds the rooms in flight, for the destination timestamps.
type benchRoomTable struct {
	mu    sync.Mutex
	rooms map[uint64]*benchRoomState
}

type benchRoomState struct {
	// dest is when the first prefill rank received the destination
	// (nanoseconds since the run's epoch; 0: not yet).
	dest atomic.Int64
	// lastChunk is when the room's last chunk was about to be sent: the
	// latest of its prefill ranks' last chunks (0: none sent;
	// bench_delays.go).
	lastChunk atomic.Int64
}

func (t *benchRoomTable) add(room uint64) *benchRoomState {
	s := &benchRoomState{}
	t.mu.Lock()
	t.rooms[room] = s
	t.mu.Unlock()
	return s
}

func (t *benchRoomTable) remove(room uint64) {
	t.mu.Lock()
	delete(t.rooms, room)
	t.mu.Unlock()
}

func (t *benchRoomTable) get(room uint64) *benchRoomState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rooms[room]
}

// benchRun is the simulated decode engine and prefill fleet, connected to the
// daemon.
type benchRun struct {
	o        *benchOptions
	tgt      *benchTarget
	tr       *benchTracing
	prog     *benchProgress
	counters benchCounters
	table    benchRoomTable
	epoch    time.Time

	// engine is the decode engine's view of the daemon; clients are every
	// connection of the run (the engine's, then one per prefill rank).
	// engines are the decode engines the rooms are spread over: the
	// daemon's, or with --fleet one per daemon of the fleet
	// (bench_fleet.go).
	engine  *client.Engine
	engines []*benchEngine
	clients []*client.Client
	// groups are, per prefill DP rank, the ranks a room of that rank needs
	// (every rank some decode TP rank addresses; dummies only wait).
	groups [][]benchSender
	// fleetRanks are the ranks with --fleet (their Close is the run's).
	fleetRanks []*client.FleetPrefill
	ranks      int
	addr       string
	base       uint64
	status     *pb.GetStatusResponse
	decTP      uint32
	// instance is one rank of the simulated prefill instance, through which
	// close deregisters it.
	instance *client.Prefill

	failuresExpected bool
	// alloc is the decode engine's allocator when it owns the pages
	// (--page-owner engine; nil otherwise).
	alloc *benchAlloc
	// abandon ends when the bench gives up on the daemon (the watchdog
	// found it unreachable): no room starts, the rooms in flight end.
	abandon  context.Context
	giveUp   func(error)
	hbCancel context.CancelFunc
	hbWG     sync.WaitGroup
	hbErrors atomic.Int64
}

// newBenchRun connects the decode engine, registers the prefill fleet (one
// connection per rank) and starts its heartbeats.
func newBenchRun(ctx context.Context, o *benchOptions, tgt *benchTarget, token string, tr *benchTracing, prog *benchProgress) (*benchRun, error) {
	b := &benchRun{o: o, tgt: tgt, tr: tr, prog: prog, table: benchRoomTable{rooms: map[uint64]*benchRoomState{}}, epoch: time.Now()}
	var abandon context.CancelCauseFunc
	b.abandon, abandon = context.WithCancelCause(context.Background())
	b.giveUp = func(err error) { abandon(err) }
	ok := false
	defer func() {
		if !ok {
			b.close()
		}
	}()
	dc, err := b.connect(token, nil)
	if err != nil {
		return nil, err
	}
	b.engine = dc.Engine()
	b.engines = []*benchEngine{{addr: tgt.addr, e: b.engine}}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.checkDaemon(sctx, dc.Admin()); err != nil {
		return nil, err
	}
	hbCtx, hbCancel := context.WithCancel(context.Background())
	b.hbCancel = hbCancel
	if o.fleet {
		if err := b.joinFleet(sctx, hbCtx, token, dc.Admin()); err != nil { // bench_fleet.go
			return nil, err
		}
		ok = true
		return b, nil
	}
	prefills, err := b.registerFleet(sctx, token)
	if err != nil {
		return nil, err
	}
	if b.alloc != nil {
		if err := b.alloc.report(sctx, b.engine); err != nil {
			return nil, err
		}
	}
	b.instance = prefills[0]
	for _, p := range prefills {
		b.hbWG.Go(func() { _ = p.RunHeartbeat(hbCtx) })
	}
	ok = true
	return b, nil
}

// connect opens one of the run's connections to the daemon, counted (and
// telling onDest of each destination it receives).
func (b *benchRun) connect(token string, onDest func(*pb.Destination)) (*client.Client, error) {
	return b.connectTo(b.tgt.addr, token, onDest)
}

// connectTo is connect to the daemon at addr.
func (b *benchRun) connectTo(addr, token string, onDest func(*pb.Destination)) (*client.Client, error) {
	c, err := client.New(addr, b.clientOptions(token, onDest)...)
	if err != nil {
		return nil, err
	}
	b.clients = append(b.clients, c)
	return c, nil
}

// clientOptions are the options of every connection of the run.
func (b *benchRun) clientOptions(token string, onDest func(*pb.Destination)) []client.Option {
	opts := []client.Option{
		client.WithTracerProvider(b.tr.provider), client.WithPropagator(b.tr.propagator),
		client.WithDialOptions(b.counters.dialOptions(onDest)...),
		// --api stream is the client's default transport (OpenAndWait,
		// SendRoom, ReleaseRoom and AbortRoom on the shared sessions),
		// --api unary the unary one.
		client.WithTransport(b.o.transport()),
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	return opts
}

// checkDaemon reads the daemon's status and refuses one the bench cannot
// run against (draining, or a transfer path other than the simulated one).
func (b *benchRun) checkDaemon(ctx context.Context, admin *client.Admin) error {
	st, err := admin.Status(ctx)
	if err != nil {
		return fmt.Errorf("daemon at %s: %w", b.tgt.addr, err)
	}
	b.status = st
	switch {
	case st.GetDraining():
		return fmt.Errorf("the daemon at %s is draining", b.tgt.addr)
	case st.GetTransferPath() != "sim":
		return fmt.Errorf("the daemon at %s uses transfer path %q: the bench's prefill fleet has no KV buffers to move, so it needs the simulated path (transfer.path: sim)", b.tgt.addr, st.GetTransferPath())
	}
	for _, cv := range st.GetConfig() {
		if cv.GetKey() == "transfer.sim.failure_probability" {
			if p, err := strconv.ParseFloat(cv.GetValue(), 64); err == nil && p > 0 {
				b.failuresExpected = true
			}
		}
	}
	b.decTP = max(1, st.GetLayout().GetAttnTpSize())
	owner := st.GetLayout().GetPageOwner()
	if owner == "" {
		owner = "daemon" // a daemon older than kv_pool.owner
	}
	if owner != b.o.pageOwner {
		return fmt.Errorf("the daemon at %s has kv_pool.owner %s: run the bench with --page-owner %s (or start the daemon with --page-owner %s)", b.tgt.addr, owner, owner, b.o.pageOwner)
	}
	if owner == "engine" {
		a, err := newBenchAlloc(st)
		if err != nil {
			return err
		}
		b.alloc = a
	}
	return nil
}

// registerFleet registers a fresh prefill instance, --dp groups of
// --prefill-ranks ranks, one connection each, and returns its ranks. A
// fresh instance per run, so that runs against one daemon (make demo next
// to make bench) never replace each other's ranks; in another daemon,
// rooms from a fresh id range.
func (b *benchRun) registerFleet(ctx context.Context, token string) ([]*client.Prefill, error) {
	o, layout := b.o, b.status.GetLayout()
	tag := rand.Uint32()
	b.addr = fmt.Sprintf("bench-%08x:8998", tag)
	instance := fmt.Sprintf("decodeplane-bench-%d-%08x", os.Getpid(), tag)
	b.base = 1
	if !b.tgt.inProcess {
		b.base = 1 + rand.Uint64N(1<<40)<<20
	}
	onDest := b.onDest
	b.groups = make([][]benchSender, o.dp)
	var prefills []*client.Prefill
	for dp := range o.dp {
		for tp := range o.prefillRanks {
			c, err := b.connect(token, onDest)
			if err != nil {
				return nil, err
			}
			reg := &pb.RegisterPrefillRequest{
				BootstrapAddr: b.addr,
				RankEndpoint:  fmt.Sprintf("127.0.0.1:%d", 17000+dp*o.prefillRanks+tp),
				Parallel: &pb.ParallelInfo{
					AttnTpSize: uint32(o.prefillRanks), AttnTpRank: uint32(tp),
					AttnDpSize: uint32(o.dp), AttnDpRank: uint32(dp), PpSize: 1,
				},
				PageSize:          layout.GetPageSize(),
				KvCacheDtype:      layout.GetKvCacheDtype(),
				LoadBalanceMethod: "follow_bootstrap_room",
				InstanceId:        instance,
			}
			p := c.Prefill(reg, client.OnHeartbeatError(func(error) { b.hbErrors.Add(1) }))
			resp, err := p.Register(ctx)
			if errors.Is(err, client.ErrUnauthenticated) {
				return nil, fmt.Errorf("register prefill rank dp %d tp %d: %w (give the daemon's bootstrap token with --token or DECODEPLANE_TOKEN)", dp, tp, err)
			}
			if err != nil {
				return nil, fmt.Errorf("register prefill rank dp %d tp %d: %w", dp, tp, err)
			}
			if resp.GetMapping().GetStagingRequired() {
				return nil, fmt.Errorf("the daemon needs the staging path for prefill TP %d -> decode TP %d (staging.enabled): the bench's fleet sends direct transfers only; turn staging off", o.prefillRanks, b.decTP)
			}
			if len(resp.GetMapping().GetServesDecodeTpRanks()) > 0 {
				b.groups[dp] = append(b.groups[dp], p)
			}
			prefills = append(prefills, p)
			b.ranks++
		}
	}
	for dp, g := range b.groups {
		if len(g) == 0 {
			return nil, fmt.Errorf("no prefill rank of DP group %d is addressed by the decode ranks (prefill TP %d, decode TP %d)", dp, o.prefillRanks, b.decTP)
		}
	}
	return prefills, nil
}

// onDest records when a room's first destination reached a prefill
// rank.
func (b *benchRun) onDest(d *pb.Destination) {
	if s := b.table.get(d.GetRoom()); s != nil {
		s.dest.CompareAndSwap(0, b.now())
	}
}

func (b *benchRun) close() {
	if b.hbCancel != nil {
		b.hbCancel()
		b.hbWG.Wait()
		b.hbCancel = nil
	}
	for _, fp := range b.fleetRanks {
		fp.Close()
	}
	b.fleetRanks = nil
	if p := b.instance; p != nil {
		// The simulated prefill instance stops cleanly: the daemon (and its
		// fleet) forget it now, not after its liveness bound. Best effort.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = p.Close(ctx)
		cancel()
		b.instance = nil
	}
	for _, c := range b.clients {
		c.Close()
	}
	b.clients = nil
}

// now is the time since the run's epoch, monotonic, never 0.
func (b *benchRun) now() int64 { return max(1, int64(time.Since(b.epoch))) }

// benchPhase is what one phase (warmup, or the measured rooms) produced.
type benchPhase struct {
	ok, failed  int64
	reasons     map[string]*benchFailure
	wall        time.Duration
	openDest    []time.Duration // sorted
	destSucc    []time.Duration
	life        []time.Duration
	chunkTold   []time.Duration
	usage       benchUsage // the phase's delta
	counts      benchCounts
	interrupted bool
	hbErrors    int64
	daemon      *benchDaemonStats
	daemonErr   error
}

// phase runs rooms first, first+1, ... (n of them; 0 with --rate: until
// --duration or SIGINT). Closed loop: --concurrency workers, each starting
// its next room as soon as its room ended. Rate mode: rooms start every
// 1/--rate, at most --concurrency in flight.
func (b *benchRun) phase(ctx context.Context, first uint64, n int, measured bool) *benchPhase {
	rec := &benchRecorder{reasons: map[string]*benchFailure{}}
	b.prog.attach(rec)
	// Rooms start until ctx ends (SIGINT), --duration passes or the bench
	// gives up on the daemon.
	launch, stopLaunch := context.WithCancel(ctx)
	defer stopLaunch()
	defer context.AfterFunc(b.abandon, stopLaunch)()
	if b.o.duration > 0 && measured {
		var cancel context.CancelFunc
		launch, cancel = context.WithTimeout(ctx, b.o.duration)
		defer cancel()
	}
	var d0 benchDaemonStats
	var derr error
	if measured && b.tgt.metricsURL != "" {
		d0, derr = benchScrape(ctx, b.tgt.metricsURL)
	}
	hb0 := b.hbErrors.Load()
	c0 := b.counters.snapshot()
	u0 := benchReadUsage()
	start := time.Now()
	var wg sync.WaitGroup
	if b.o.rateMode() {
		b.rateLoop(launch, first, n, rec, &wg)
	} else {
		var next atomic.Uint64
		for range min(b.o.concurrency, n) {
			wg.Go(func() {
				for launch.Err() == nil {
					i := next.Add(1) - 1
					if i >= uint64(n) {
						return
					}
					b.room(first+i, rec)
				}
			})
		}
	}
	wg.Wait()
	wall := time.Since(start)
	u1 := benchReadUsage()
	c1 := b.counters.snapshot()
	p := &benchPhase{
		ok: rec.ok.Load(), failed: rec.failed.Load(), reasons: rec.reasons, wall: wall,
		openDest: rec.openDest, destSucc: rec.destSucc, life: rec.life, chunkTold: rec.chunkTold,
		usage: u1.sub(u0), counts: c1.sub(c0), interrupted: ctx.Err() != nil, hbErrors: b.hbErrors.Load() - hb0,
	}
	if measured && b.tgt.metricsURL != "" && derr == nil {
		var d1 benchDaemonStats
		if d1, derr = benchScrape(context.Background(), b.tgt.metricsURL); derr == nil {
			d := d1.sub(d0)
			p.daemon = &d
		}
	}
	p.daemonErr = derr
	for _, s := range [][]time.Duration{p.openDest, p.destSucc, p.life, p.chunkTold} {
		slices.Sort(s)
	}
	return p
}

// rateLoop starts a room every 1/--rate until n rooms (0: no limit) or until
// ctx ends. With --concurrency rooms in flight it waits for one to end, and
// after falling behind it does not burst to catch up.
func (b *benchRun) rateLoop(ctx context.Context, first uint64, n int, rec *benchRecorder, wg *sync.WaitGroup) {
	interval := time.Duration(float64(time.Second) / b.o.rate)
	slots := make(chan struct{}, b.o.concurrency)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	next := time.Now()
	for i := uint64(0); n == 0 || i < uint64(n); i++ {
		if d := time.Until(next); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if ctx.Err() != nil {
			<-slots
			return
		}
		wg.Go(func() {
			defer func() { <-slots }()
			b.room(first+i, rec)
		})
		next = next.Add(interval)
		if time.Since(next) > time.Second {
			next = time.Now()
		}
	}
}

// room runs one room through its whole lifecycle, as a router would: the
// prefill ranks of its DP group start their hand-off (AwaitDestination, then
// Transfer, then wait for the end) while the decode engine opens the room,
// watches it until Success and releases it.
func (b *benchRun) room(idx uint64, rec *benchRecorder) {
	room := b.base + idx
	prompt := b.o.prompt.draw(b.o.seed, idx)
	rid := "bench-" + strconv.FormatUint(room, 10)
	st := b.table.add(room)
	defer b.table.remove(room)
	rec.inflight.Add(1)
	defer rec.inflight.Add(-1)

	// Not derived from the signal context: a room in flight at SIGINT
	// finishes (or times out) instead of leaving the daemon a dangling room.
	// A daemon that cannot be reached any more ends it (b.abandon).
	ctx, cancel := context.WithTimeout(b.abandon, b.o.roomTimeout)
	defer cancel()
	ctx, span := b.roomSpan(ctx, room, rid, prompt)

	senders := b.groups[room%uint64(len(b.groups))]
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	perr := make([]error, len(senders))
	var wg sync.WaitGroup
	so := client.SendOptions{ChunkPages: b.o.chunkPages, Source: b.chunkStamp(st)}
	for i, p := range senders {
		wg.Go(func() { _, perr[i] = p.SendRoom(pctx, room, so) })
	}

	t0 := b.now()
	opened, tSucc, err := b.decodeRoom(ctx, &pb.OpenRoomRequest{
		Rid: rid, BootstrapAddr: b.addr, Room: room, PromptLen: uint32(prompt), MaxNewTokens: uint32(b.o.maxNewTokens),
	})
	tEnd := b.now()
	if err != nil && !errors.Is(err, client.ErrRoomFailed) {
		// The room will not come (OpenRoom refused) or the decode side gave
		// up: the prefill ranks must not wait for their bootstrap timeout.
		pcancel()
	}
	wg.Wait()
	if err == nil { // the first failed hand-off's error, if any
		for _, e := range perr {
			if e != nil {
				err = e
				break
			}
		}
	}
	if err != nil {
		if b.abandon.Err() != nil {
			// Given up with the daemon: nobody to abort it with.
			err = fmt.Errorf("%w: %w", errBenchUnreachable, err)
		} else if opened && !errors.Is(err, client.ErrRoomFailed) {
			b.abort(room, benchReason(err))
		}
		if b.alloc != nil && b.abandon.Err() == nil {
			// The engine's pages come back once no rank may write into them.
			if werr := b.alloc.end(b.engine, room, false, b.o.roomTimeout); werr != nil {
				err = errors.Join(err, werr)
			}
		}
		rec.fail(err)
		if span != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, benchReason(err))
			span.End()
		}
		return
	}
	openDest, destSucc := time.Duration(-1), time.Duration(-1)
	if dest := st.dest.Load(); dest != 0 {
		openDest, destSucc = time.Duration(dest-t0), time.Duration(tSucc-dest)
	}
	rec.chunkToTold(st, tSucc)
	rec.done(openDest, destSucc, time.Duration(tEnd-t0))
	b.routed(room, senders)
	if span != nil {
		span.End()
	}
}

// roomSpan starts the room's router span when the bench traces (nil
// otherwise).
func (b *benchRun) roomSpan(ctx context.Context, room uint64, rid string, prompt int) (context.Context, trace.Span) {
	if b.tr.tracer == nil {
		return ctx, nil
	}
	return b.tr.tracer.Start(ctx, "router.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.Int64("decodeplane.room", int64(room)), attribute.String("decodeplane.rid", rid),
		attribute.String("decodeplane.prefill.addr", b.addr), attribute.Int("decodeplane.prompt_len", prompt)))
}

// decodeRoom is the decode engine's side of a room: it opens the room,
// waits for its KV (tSucc: when it succeeded) and releases it; opened
// tells whether the room may be open. --api unary: OpenRoom, then watch
// until Success (what Engine.OpenAndWait does on that transport, spelled
// out to know whether the room was opened), then ReleaseRoom. --api
// stream: OpenAndWait and ReleaseRoom on the client's shared engine session
// (an OpenAndWait that fails other than by the room's failure may have
// opened the room: it is aborted, an unknown room's abort being a harmless
// NotFound).
func (b *benchRun) decodeRoom(ctx context.Context, req *pb.OpenRoomRequest) (opened bool, tSucc int64, err error) {
	if b.alloc != nil {
		// The engine owns the pages: it declares the destination it
		// allocated once the room waits for it (bench_owner.go), on either
		// transport; a room it could not declare is aborted.
		_, err = b.engine.OpenDeclareAndWait(ctx, req, b.alloc.declare)
		tSucc = b.now()
		if err == nil {
			_, err = b.engine.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: req.GetRoom()})
		}
		if err == nil {
			b.alloc.free(req.GetRoom()) // decoded and released: the engine's own again
		}
		return true, tSucc, err
	}
	engine := b.engineOf(req.GetRoom()).e
	if b.o.stream() {
		_, err = engine.OpenAndWait(ctx, req)
		opened = true
	} else {
		var resp *pb.OpenRoomResponse
		resp, err = engine.OpenRoom(ctx, req)
		if err == nil {
			opened = true
			if resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				_, err = engine.WaitRoom(ctx, req.GetRoom(), pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
			}
		}
	}
	tSucc = b.now()
	if err == nil {
		_, err = engine.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: req.GetRoom()})
	}
	return opened, tSucc, err
}

// abort gives a room the bench abandoned back to the daemon.
func (b *benchRun) abort(room uint64, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = b.engineOf(room).e.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: "decodeplane bench: " + reason})
}
