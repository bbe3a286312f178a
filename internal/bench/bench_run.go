package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/client"
	benchv1 "github.com/decodeplane/decodeplane/proto/decodeplane/bench/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The RPCs the bench counts, per method: calls (every attempt of a unary
// call, every stream opened) and the messages received on streams.
const (
	benchOpenRoom = iota
	benchWatchRoom
	benchAwaitDestination
	benchTransfer
	benchReleaseRoom
	benchGetRoom
	benchAbortRoom
	benchRegisterPrefill
	benchHeartbeat
	benchGetStatus
	benchBareUnary
	benchBareStream
	benchEngineSessionMethod
	benchPrefillSessionMethod
	benchBareSession
	benchOtherMethod
	benchNumMethods
)

var benchMethodNames = [benchNumMethods]string{
	"OpenRoom", "WatchRoom", "AwaitDestination", "Transfer", "ReleaseRoom", "GetRoom", "AbortRoom",
	"RegisterPrefill", "Heartbeat", "GetStatus", "Bench/Unary", "Bench/Stream",
	"EngineSession", "PrefillSession", "Bench/Session", "other",
}

var benchMethodIndex = map[string]int{
	pb.Rooms_OpenRoom_FullMethodName:            benchOpenRoom,
	pb.Rooms_WatchRoom_FullMethodName:           benchWatchRoom,
	pb.Rooms_AwaitDestination_FullMethodName:    benchAwaitDestination,
	pb.Rooms_Transfer_FullMethodName:            benchTransfer,
	pb.Rooms_ReleaseRoom_FullMethodName:         benchReleaseRoom,
	pb.Rooms_GetRoom_FullMethodName:             benchGetRoom,
	pb.Rooms_AbortRoom_FullMethodName:           benchAbortRoom,
	pb.Bootstrap_RegisterPrefill_FullMethodName: benchRegisterPrefill,
	pb.Bootstrap_Heartbeat_FullMethodName:       benchHeartbeat,
	pb.Admin_GetStatus_FullMethodName:           benchGetStatus,
	benchv1.Bench_Unary_FullMethodName:          benchBareUnary,
	benchv1.Bench_Stream_FullMethodName:         benchBareStream,
	pb.EngineSession_Session_FullMethodName:     benchEngineSessionMethod,
	pb.PrefillSession_Session_FullMethodName:    benchPrefillSessionMethod,
	benchv1.Bench_Session_FullMethodName:        benchBareSession,
}

// The lifecycle's share of the counted RPCs: what one room costs on the wire.
var (
	benchRoomUnary   = []int{benchOpenRoom, benchTransfer, benchReleaseRoom, benchGetRoom, benchAbortRoom}
	benchRoomStreams = []int{benchWatchRoom, benchAwaitDestination}
	// benchRoomSessions are the --api stream sessions: bidirectional, so
	// the messages the client sends are counted too.
	benchRoomSessions = []int{benchEngineSessionMethod, benchPrefillSessionMethod}
)

func benchMethodOf(full string) int {
	if i, ok := benchMethodIndex[full]; ok {
		return i
	}
	return benchOtherMethod
}

type benchCounters struct {
	calls [benchNumMethods]atomic.Int64
	msgs  [benchNumMethods]atomic.Int64
	// sent counts the messages sent on the sessions (benchRoomSessions,
	// and the bare phase's Bench/Session) only: a unary call or a server
	// stream's request is its call. sentBytes and recvBytes are the
	// sessions' messages' sizes (proto.Size), both ways.
	sent      [benchNumMethods]atomic.Int64
	sentBytes [benchNumMethods]atomic.Int64
	recvBytes [benchNumMethods]atomic.Int64
}

type benchCounts struct {
	Calls     [benchNumMethods]int64
	Msgs      [benchNumMethods]int64
	Sent      [benchNumMethods]int64
	SentBytes [benchNumMethods]int64
	RecvBytes [benchNumMethods]int64
}

func (c *benchCounters) snapshot() benchCounts {
	var s benchCounts
	for i := range benchNumMethods {
		s.Calls[i] = c.calls[i].Load()
		s.Msgs[i] = c.msgs[i].Load()
		s.Sent[i] = c.sent[i].Load()
		s.SentBytes[i] = c.sentBytes[i].Load()
		s.RecvBytes[i] = c.recvBytes[i].Load()
	}
	return s
}

func (a benchCounts) sub(b benchCounts) benchCounts {
	for i := range benchNumMethods {
		a.Calls[i] -= b.Calls[i]
		a.Msgs[i] -= b.Msgs[i]
		a.Sent[i] -= b.Sent[i]
		a.SentBytes[i] -= b.SentBytes[i]
		a.RecvBytes[i] -= b.RecvBytes[i]
	}
	return a
}

// dialOptions are the counting interceptors (the same on the daemon's
// connections and on the bare-gRPC ones). onDest, when set, sees every
// destination an AwaitDestination stream or a prefill session delivers.
func (c *benchCounters) dialOptions(onDest func(*pb.Destination)) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.calls[benchMethodOf(method)].Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			m := benchMethodOf(method)
			c.calls[m].Add(1)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			bs := &benchStream{ClientStream: s, recv: &c.msgs[m]}
			if m == benchAwaitDestination || m == benchPrefillSessionMethod {
				bs.onDest = onDest
			}
			if m == benchEngineSessionMethod || m == benchPrefillSessionMethod || m == benchBareSession {
				bs.sent, bs.sentBytes, bs.recvBytes = &c.sent[m], &c.sentBytes[m], &c.recvBytes[m]
			}
			return bs, nil
		}),
	}
}

// benchStream counts a stream's messages and reports destinations.
type benchStream struct {
	grpc.ClientStream
	recv *atomic.Int64
	sent *atomic.Int64 // nil: not counted (a server stream's request)
	// sentBytes and recvBytes (set with sent) add up the messages' sizes,
	// estimated from one message in benchSizeEvery (sized, counted
	// benchSizeEvery times): sizing every message would cost the measured
	// run a tenth of the client's CPU. sentN and recvN count the messages
	// (each written by one goroutine at a time: a stream's sends are
	// serialised, and so are its receives).
	sentBytes, recvBytes *atomic.Int64
	sentN, recvN         uint32
	onDest               func(*pb.Destination)
}

// benchSizeEvery is how many session messages one sized message stands for.
const benchSizeEvery = 8

func (s *benchStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.recv.Add(1)
		if s.recvBytes != nil {
			if s.recvN%benchSizeEvery == 0 {
				s.recvBytes.Add(benchSizeEvery * benchSize(m))
			}
			s.recvN++
		}
		if s.onDest != nil {
			switch ev := m.(type) {
			case *pb.DestinationEvent:
				if ev.GetDestination() != nil {
					s.onDest(ev.GetDestination())
				}
			case *pb.PrefillEvent:
				if d := ev.GetRoom().GetEvent().GetDestination(); d != nil {
					s.onDest(d)
				}
				for _, m := range ev.GetMore() { // the events packed in the message
					if d := m.GetRoom().GetEvent().GetDestination(); d != nil {
						s.onDest(d)
					}
				}
			}
		}
	}
	return err
}

func (s *benchStream) SendMsg(m any) error {
	if s.sent == nil {
		return s.ClientStream.SendMsg(m)
	}
	// Sized before it is sent: the message is not to be read once gRPC has
	// it.
	var n int64
	if s.sentN%benchSizeEvery == 0 {
		n = benchSizeEvery * benchSize(m)
	}
	s.sentN++
	err := s.ClientStream.SendMsg(m)
	if err == nil {
		s.sent.Add(1)
		s.sentBytes.Add(n)
	}
	return err
}

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

	decode  *client.Client
	clients []*client.Client
	// groups are, per prefill DP rank, the ranks a room of that rank needs
	// (every rank some decode TP rank addresses; dummies only wait).
	groups [][]*client.Prefill
	ranks  int
	addr   string
	base   uint64
	status *pb.GetStatusResponse
	decTP  uint32

	failuresExpected bool
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
	newClient := func(onDest func(*pb.Destination)) (*client.Client, error) {
		opts := []client.Option{
			client.WithTracerProvider(tr.provider), client.WithPropagator(tr.propagator),
			client.WithDialOptions(b.counters.dialOptions(onDest)...),
			// --api stream is the client's default transport (OpenAndWait,
			// SendRoom, ReleaseRoom and AbortRoom on the shared sessions),
			// --api unary the unary one.
			client.WithTransport(o.transport()),
		}
		if token != "" {
			opts = append(opts, client.WithToken(token))
		}
		c, err := client.New(tgt.addr, opts...)
		if err != nil {
			return nil, err
		}
		b.clients = append(b.clients, c)
		return c, nil
	}
	var err error
	if b.decode, err = newClient(nil); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := b.decode.Admin().Status(sctx)
	if err != nil {
		return nil, fmt.Errorf("daemon at %s: %w", tgt.addr, err)
	}
	b.status = st
	switch {
	case st.GetDraining():
		return nil, fmt.Errorf("the daemon at %s is draining", tgt.addr)
	case st.GetTransferPath() != "sim":
		return nil, fmt.Errorf("the daemon at %s uses transfer path %q: the bench's prefill fleet has no KV buffers to move, so it needs the simulated path (transfer.path: sim)", tgt.addr, st.GetTransferPath())
	}
	for _, cv := range st.GetConfig() {
		if cv.GetKey() == "transfer.sim.failure_probability" {
			if p, err := strconv.ParseFloat(cv.GetValue(), 64); err == nil && p > 0 {
				b.failuresExpected = true
			}
		}
	}
	layout := st.GetLayout()
	b.decTP = max(1, layout.GetAttnTpSize())

	// A fresh prefill instance per run, so that runs against one daemon
	// (make demo next to make bench) never replace each other's ranks; in
	// another daemon, rooms from a fresh id range.
	tag := rand.Uint32()
	b.addr = fmt.Sprintf("bench-%08x:8998", tag)
	instance := fmt.Sprintf("decodeplane-bench-%d-%08x", os.Getpid(), tag)
	b.base = 1
	if !tgt.inProcess {
		b.base = 1 + rand.Uint64N(1<<40)<<20
	}
	onDest := func(d *pb.Destination) {
		if s := b.table.get(d.GetRoom()); s != nil {
			s.dest.CompareAndSwap(0, b.now())
		}
	}
	b.groups = make([][]*client.Prefill, o.dp)
	var prefills []*client.Prefill
	for dp := range o.dp {
		for tp := range o.prefillRanks {
			c, err := newClient(onDest)
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
			resp, err := p.Register(sctx)
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
	hbCtx, hbCancel := context.WithCancel(context.Background())
	b.hbCancel = hbCancel
	for _, p := range prefills {
		b.hbWG.Go(func() { _ = p.RunHeartbeat(hbCtx) })
	}
	ok = true
	return b, nil
}

func (b *benchRun) close() {
	if b.hbCancel != nil {
		b.hbCancel()
		b.hbWG.Wait()
		b.hbCancel = nil
	}
	for _, c := range b.clients {
		c.Close()
	}
	b.clients = nil
}

// now is the time since the run's epoch, monotonic, never 0.
func (b *benchRun) now() int64 { return max(1, int64(time.Since(b.epoch))) }

// benchRecorder collects one phase's rooms.
type benchRecorder struct {
	ok, failed, inflight atomic.Int64

	mu       sync.Mutex
	openDest []time.Duration
	destSucc []time.Duration
	life     []time.Duration
	// chunkTold are the last chunk -> engine told delays (bench_delays.go).
	chunkTold []time.Duration
	reasons   map[string]*benchFailure
}

// benchFailure counts one failure reason, with an example message.
type benchFailure struct {
	Count   int64  `json:"count"`
	Example string `json:"example"`
}

func (r *benchRecorder) done(openDest, destSucc, life time.Duration) {
	r.mu.Lock()
	if openDest >= 0 {
		r.openDest = append(r.openDest, openDest)
		r.destSucc = append(r.destSucc, destSucc)
	}
	r.life = append(r.life, life)
	r.mu.Unlock()
	r.ok.Add(1)
}

func (r *benchRecorder) fail(err error) {
	reason := benchReason(err)
	r.mu.Lock()
	f := r.reasons[reason]
	if f == nil {
		f = &benchFailure{Example: err.Error()}
		r.reasons[reason] = f
	}
	f.Count++
	r.mu.Unlock()
	r.failed.Add(1)
}

// benchReason classifies a room's failure.
func benchReason(err error) string {
	if errors.Is(err, errBenchUnreachable) {
		return "daemon unreachable"
	}
	var rf *client.RoomFailedError
	if errors.As(err, &rf) {
		return "room failed: " + rf.Code.String()
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Op() + ": " + ce.Code().String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "room timeout"
	}
	return "error"
}

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
	var span trace.Span
	if b.tr.tracer != nil {
		ctx, span = b.tr.tracer.Start(ctx, "router.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.Int64("decodeplane.room", int64(room)), attribute.String("decodeplane.rid", rid),
			attribute.String("decodeplane.prefill.addr", b.addr), attribute.Int("decodeplane.prompt_len", prompt)))
	}

	senders := b.groups[room%uint64(len(b.groups))]
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	perr := make([]error, len(senders))
	var wg sync.WaitGroup
	so := client.SendOptions{ChunkPages: b.o.chunkPages, Source: b.chunkStamp(st)}
	for i, p := range senders {
		wg.Go(func() { _, perr[i] = p.SendRoom(pctx, room, so) })
	}

	// The decode engine. --api unary: OpenRoom, then watch until Success
	// (what client.OpenAndWait does on that transport, spelled out to know
	// whether the room was opened), then ReleaseRoom. --api stream:
	// OpenAndWait and ReleaseRoom on the client's shared engine session
	// (an OpenAndWait that fails other than by the room's failure may have
	// opened the room: it is aborted, an unknown room's abort being a
	// harmless NotFound).
	t0 := b.now()
	opened := false
	var tSucc int64
	req := &pb.OpenRoomRequest{
		Rid: rid, BootstrapAddr: b.addr, Room: room, PromptLen: uint32(prompt), MaxNewTokens: uint32(b.o.maxNewTokens),
	}
	var err error
	if b.o.stream() {
		_, err = b.decode.Engine().OpenAndWait(ctx, req)
		opened = true
	} else {
		var resp *pb.OpenRoomResponse
		resp, err = b.decode.Engine().OpenRoom(ctx, req)
		if err == nil {
			opened = true
			if resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				_, err = b.decode.Engine().WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
			}
		}
	}
	tSucc = b.now()
	if err == nil {
		_, err = b.decode.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room})
	}
	tEnd := b.now()
	if err != nil && !errors.Is(err, client.ErrRoomFailed) {
		// The room will not come (OpenRoom refused) or the decode side gave
		// up: the prefill ranks must not wait for their bootstrap timeout.
		pcancel()
	}
	wg.Wait()
	if err == nil {
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
	if span != nil {
		span.End()
	}
}

// abort gives a room the bench abandoned back to the daemon.
func (b *benchRun) abort(room uint64, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = b.decode.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: "decodeplane bench: " + reason})
}

// benchUsage is the process's resource use: CPU (getrusage) and heap
// allocations and GC CPU (runtime/metrics).
type benchUsage struct {
	cpu          time.Duration
	allocObjects uint64
	allocBytes   uint64
	gcCPU        float64 // runtime estimate, seconds
	goCPU        float64 // runtime estimate of all non-idle CPU, seconds
}

var benchMetricNames = []string{
	"/gc/heap/allocs:objects", "/gc/heap/tiny/allocs:objects", "/gc/heap/allocs:bytes",
	"/cpu/classes/gc/total:cpu-seconds", "/cpu/classes/total:cpu-seconds", "/cpu/classes/idle:cpu-seconds",
}

func benchReadUsage() benchUsage {
	s := make([]metrics.Sample, len(benchMetricNames))
	for i, n := range benchMetricNames {
		s[i].Name = n
	}
	metrics.Read(s)
	u64 := func(i int) uint64 {
		if s[i].Value.Kind() == metrics.KindUint64 {
			return s[i].Value.Uint64()
		}
		return 0
	}
	f64 := func(i int) float64 {
		if s[i].Value.Kind() == metrics.KindFloat64 {
			return s[i].Value.Float64()
		}
		return 0
	}
	return benchUsage{
		cpu:          benchProcessCPU(),
		allocObjects: u64(0) + u64(1),
		allocBytes:   u64(2),
		gcCPU:        f64(3),
		goCPU:        f64(4) - f64(5),
	}
}

func (u benchUsage) sub(o benchUsage) benchUsage {
	return benchUsage{
		cpu: u.cpu - o.cpu, allocObjects: u.allocObjects - o.allocObjects, allocBytes: u.allocBytes - o.allocBytes,
		gcCPU: u.gcCPU - o.gcCPU, goCPU: u.goCPU - o.goCPU,
	}
}
