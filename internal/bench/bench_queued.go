package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// decodeplane bench --queued N measures what a QUEUED room costs the daemon
// in resident memory: it starts the real daemon as a child process (or
// measures the one at --target, --target-pid), registers one prefill
// instance (TP 1, kept alive with heartbeats), fills every decode shard's KV
// pool with one admitted room that is never claimed, so that every later
// room stays QUEUED blocked by tokens, reads the daemon's RSS
// (/proc/<pid>/status VmRSS) and Go heap (its /metrics), opens N rooms,
// checks that N rooms are QUEUED, and reads again.
//
// The daemon cannot be told to collect garbage, so each reading waits for
// a garbage collection that completed after the rooms were opened
// (go_gc_duration_seconds_count), asking GetStatus meanwhile (every 20 ms,
// less often when it is slow) so that the daemon allocates and reaches its
// GC goal sooner (the runtime also
// forces a cycle every 2 minutes), then for the RSS to settle (within 0.5%
// for 2 s), both bounded by --settle-timeout, and then reads the heap.

// Settling: RSS is read every benchSettleInterval; it has settled when the
// last benchSettleReadings readings are within benchSettleTolerance.
const (
	benchSettleInterval  = 250 * time.Millisecond
	benchSettleReadings  = 8
	benchSettleTolerance = 0.005
	// benchNudgePause spaces the GetStatus calls that hasten a GC.
	benchNudgePause = 20 * time.Millisecond
	// benchQueuedCallTimeout bounds a GetStatus or /metrics scrape. Both
	// read counts now; when they walked every room under one lock, a daemon
	// holding a million rooms on a busy 2-core machine took 81 s to answer
	// one scrape, and a GC of a multi-GiB heap can still stall it: the
	// bound stays generous.
	benchQueuedCallTimeout = 5 * time.Minute
	// benchQueuedHeartbeatFailures is the child's
	// timeouts.heartbeat_max_failures: a daemon that does not answer for
	// longer than 2 intervals (the default) declares the bench's prefill
	// instance dead and fails the filler room, and a daemon with a million
	// rooms can stall that long while it collects garbage on a busy machine.
	benchQueuedHeartbeatFailures = "60"
	// benchQueuedLongTimeout is what the child daemon's timeouts.bootstrap
	// and admission.claim_timeout are set to: longer than any measurement.
	benchQueuedLongTimeout = "1h"
	// benchQueuedShortTimeout: a --target daemon whose bootstrap or claim
	// timeout is shorter may fail rooms during the measurement.
	benchQueuedShortTimeout = 10 * time.Minute
)

// benchQueuedJSON is the --queued --json summary.
type benchQueuedJSON struct {
	Mode        string              `json:"mode"`
	Target      string              `json:"target"`
	PID         int                 `json:"pid"`
	ChildDaemon bool                `json:"child_daemon"`
	Setup       []string            `json:"setup"`
	Machine     benchMachine        `json:"machine"`
	Rooms       int                 `json:"rooms"`
	Concurrency int                 `json:"concurrency"`
	Shards      int                 `json:"shards"`
	FillerRooms int                 `json:"filler_rooms"`
	OpenSeconds float64             `json:"open_seconds"`
	OpenPerSec  float64             `json:"opens_per_second"`
	Verified    benchQueuedVerified `json:"verified"`
	Baseline    benchQueuedReading  `json:"baseline"`
	Queued      benchQueuedReading  `json:"queued"`
	PerRoom     benchQueuedPerRoom  `json:"per_queued_room"`
}

// benchQueuedVerified is how the bench checked that the rooms are queued.
type benchQueuedVerified struct {
	// ShardQueued is the sum of GetStatus shards[].queued.
	ShardQueued int64 `json:"shard_queued"`
	// ListQueued is ListRooms(live_only, phases=QUEUED).total.
	ListQueued int64 `json:"list_rooms_queued"`
	// BlockedBy are the shards' blocked_by after the opens.
	BlockedBy []string `json:"blocked_by"`
}

// benchQueuedReading is one measurement of the daemon.
type benchQueuedReading struct {
	RSSBytes int64 `json:"rss_bytes"`
	// RSSSettled: the RSS was stable before --settle-timeout.
	RSSSettled bool `json:"rss_settled"`
	// GCObserved: a garbage collection completed after the rooms were
	// opened and before the heap was read (false without /metrics or when
	// --settle-timeout ended first).
	GCObserved     bool    `json:"gc_observed"`
	HeapAllocBytes float64 `json:"heap_alloc_bytes,omitempty"`
	HeapInuseBytes float64 `json:"heap_inuse_bytes,omitempty"`
	HeapObjects    float64 `json:"heap_objects,omitempty"`
	GoSysBytes     float64 `json:"go_sys_bytes,omitempty"`
	WaitSeconds    float64 `json:"wait_seconds"`
}

// benchQueuedPerRoom is (queued − baseline) / rooms.
type benchQueuedPerRoom struct {
	RSSBytes       float64 `json:"rss_bytes"`
	RSSKiB         float64 `json:"rss_kib"`
	HeapAllocBytes float64 `json:"heap_alloc_bytes,omitempty"`
	HeapAllocKiB   float64 `json:"heap_alloc_kib,omitempty"`
	HeapInuseBytes float64 `json:"heap_inuse_bytes,omitempty"`
	HeapObjects    float64 `json:"heap_objects,omitempty"`
}

// runBenchQueued is decodeplane bench --queued N.
func runBenchQueued(ctx context.Context, o *benchOptions, environ []string, stdout, stderr io.Writer) (int, error) {
	env := benchEnvMap(environ)
	var d *benchQueuedDaemon
	var err error
	if o.target == "" {
		d, err = benchStartChild(o, environ)
		if err != nil {
			return 0, err
		}
	} else {
		d = &benchQueuedDaemon{addr: o.target, metricsURL: o.metricsURL, pid: o.targetPID}
	}
	defer func() {
		if err := d.stop(); err != nil {
			fmt.Fprintf(stderr, "decodeplane bench: %v\n", err)
		}
	}()
	token := o.token
	if token == "" {
		token = env["DECODEPLANE_TOKEN"]
	}
	if token == "" {
		token = d.token
	}
	opts := []client.Option{}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	c, err := client.New(d.addr, opts...)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if d.child {
		if err := benchWaitReady(ctx, c, d); err != nil {
			return 0, err
		}
	}
	q := &benchQueued{o: o, d: d, c: c, stderr: stderr}
	sum, err := q.run(ctx)
	if err != nil {
		q.cleanup()
		return 0, err
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return 0, err
		}
	} else {
		benchQueuedTable(stdout, sum)
	}
	// A child's rooms end with it; a --target daemon's are aborted.
	q.cleanup()
	if !sum.Baseline.RSSSettled || !sum.Queued.RSSSettled || (d.metricsURL != "" && (!sum.Baseline.GCObserved || !sum.Queued.GCObserved)) {
		fmt.Fprintln(stderr, "decodeplane bench: a reading did not settle before --settle-timeout (see rss_settled, gc_observed): the figures are less precise")
	}
	return exitOK, nil
}

// benchQueued is one --queued run.
type benchQueued struct {
	o      *benchOptions
	d      *benchQueuedDaemon
	c      *client.Client
	stderr io.Writer

	status  *pb.GetStatusResponse
	addr    string
	base    uint64
	fillers []uint64
	opened  []uint64
	hbStop  func()
}

// run registers the prefill instance, fills the pools, measures, opens
// the rooms, verifies and measures again.
func (q *benchQueued) run(ctx context.Context) (*benchQueuedJSON, error) {
	st, err := q.c.Admin().Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("daemon at %s: %w", q.d.addr, err)
	}
	q.status = st
	lim, err := q.check(st)
	if err != nil {
		return nil, err
	}
	if err := q.register(ctx, st); err != nil {
		return nil, err
	}
	if err := q.fill(ctx, st.GetShards(), lim); err != nil {
		return nil, err
	}
	sum := q.summary(st, lim)
	if err := q.measure(ctx, sum); err != nil {
		return nil, err
	}
	return sum, nil
}

// benchQueuedLimits is what the daemon's status says of the room budget of
// a --queued run.
type benchQueuedLimits struct {
	cfg       map[string]string // the effective configuration, by key
	maxQueued int               // admission.max_queued
	reserved  int64             // admission.reserved_decode_tokens
	page      int64             // tokens per page
}

// check refuses a daemon the run cannot measure (draining, no shard, rooms
// already held, a queue bound below the rooms per shard) and warns of
// timeouts that may fail rooms during the measurement.
func (q *benchQueued) check(st *pb.GetStatusResponse) (benchQueuedLimits, error) {
	o := q.o
	if st.GetDraining() {
		return benchQueuedLimits{}, fmt.Errorf("the daemon at %s is draining", q.d.addr)
	}
	lim := benchQueuedLimits{cfg: map[string]string{}}
	for _, cv := range st.GetConfig() {
		lim.cfg[cv.GetKey()] = cv.GetValue()
	}
	shards := st.GetShards()
	if len(shards) == 0 {
		return lim, fmt.Errorf("the daemon at %s reports no decode shard", q.d.addr)
	}
	var problems []error
	for _, s := range shards {
		if n := s.GetWaiting() + s.GetQueued() + s.GetAdmitted() + s.GetClaimed() + s.GetRunning() + s.GetRetracted() + s.GetHeld(); n > 0 {
			problems = append(problems, fmt.Errorf("decode shard %d already holds %d rooms: --queued needs an idle daemon", s.GetDpRank(), n))
		}
	}
	lim.maxQueued, _ = strconv.Atoi(strings.Trim(lim.cfg["admission.max_queued"], `"`))
	if lim.maxQueued == 0 {
		lim.maxQueued = 65536 // prealloc's default for 0
	}
	if perShard := (o.queued + len(shards) - 1) / len(shards); lim.maxQueued < perShard {
		problems = append(problems, fmt.Errorf("admission.max_queued is %d but %d rooms per shard must queue: set admission.max_queued above %d", lim.maxQueued, perShard, perShard))
	}
	for _, k := range []string{"timeouts.bootstrap", "admission.claim_timeout"} {
		if v, err := time.ParseDuration(strings.Trim(lim.cfg[k], `"`)); err == nil && v > 0 && v < benchQueuedShortTimeout {
			fmt.Fprintf(q.stderr, "decodeplane bench: warning: %s is %s on the daemon: rooms may fail before the measurement ends (set it to 1h)\n", k, v)
		}
	}
	lim.reserved, _ = strconv.ParseInt(strings.Trim(lim.cfg["admission.reserved_decode_tokens"], `"`), 10, 64)
	lim.page = int64(max(1, st.GetLayout().GetPageSize()))
	return lim, errors.Join(problems...)
}

// fill opens one admitted room per shard that takes the whole pool but the
// reserve, rounded to pages: the budget left is below any room's need, so
// every later room queues behind it, blocked by tokens.
func (q *benchQueued) fill(ctx context.Context, shards []*pb.ShardStatus, lim benchQueuedLimits) error {
	page := lim.page
	reservePages := (lim.reserved + page - 1) / page
	for _, s := range shards {
		total := int64(s.GetPagesTotal()) * page
		prompt := total - reservePages*page
		if prompt < 1 || prompt > 1<<31-1 {
			return fmt.Errorf("decode shard %d: a pool of %d tokens cannot be filled by one room (reserved decode tokens %d)", s.GetDpRank(), total, lim.reserved)
		}
		room := q.base + uint64(len(q.fillers))
		dp := s.GetDpRank()
		resp, err := q.c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{
			Rid: "queued-filler-" + strconv.FormatUint(room, 10), BootstrapAddr: q.addr, Room: room,
			DecodeDpRank: &dp, PromptLen: uint32(prompt), MaxNewTokens: 1,
		})
		if err != nil {
			return fmt.Errorf("open the room that fills shard %d: %w", dp, err)
		}
		q.fillers = append(q.fillers, room)
		if ph := resp.GetRoom().GetPhase(); ph != pb.RoomPhase_ROOM_PHASE_ADMITTED {
			return fmt.Errorf("the room that fills shard %d is %s, want ADMITTED (is the pool used otherwise?)", dp, ph)
		}
	}
	return nil
}

// summary starts the run's summary: what was measured, and how.
func (q *benchQueued) summary(st *pb.GetStatusResponse, lim benchQueuedLimits) *benchQueuedJSON {
	o, cfg := q.o, lim.cfg
	shards := st.GetShards()
	sum := &benchQueuedJSON{
		Mode: "queued", Target: q.d.addr, PID: q.d.pid, ChildDaemon: q.d.child, Rooms: o.queued, Concurrency: o.concurrency,
		Shards: len(shards), FillerRooms: len(q.fillers),
		Machine: benchMachine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), CPUModel: benchCPUModel(), GoVersion: runtime.Version()},
	}
	l := st.GetLayout()
	where := "child daemon ('decodeplane serve', pid " + strconv.Itoa(q.d.pid) + ")"
	if !q.d.child {
		where = "daemon at " + q.d.addr + " (pid " + strconv.Itoa(q.d.pid) + ")"
	}
	sum.Setup = []string{
		fmt.Sprintf("daemon      %s, version %s", where, st.GetVersion()),
		fmt.Sprintf("layout      %s, %s, page size %d, decode attn TP %d, decode DP shards %d", l.GetKind(), l.GetKvCacheDtype(), l.GetPageSize(), max(1, l.GetAttnTpSize()), len(shards)),
		fmt.Sprintf("admission   max_queued %d per shard, timeouts.bootstrap %s, claim_timeout %s, heartbeat_max_failures %s, reserved decode tokens %d", lim.maxQueued, cfg["timeouts.bootstrap"], cfg["admission.claim_timeout"], cfg["timeouts.heartbeat_max_failures"], lim.reserved),
		fmt.Sprintf("rooms       1 prefill instance (TP 1, heartbeats), %d filler room(s) admitted and never claimed, then %d rooms opened at concurrency %d; prompt %s, max new tokens %d", len(q.fillers), o.queued, o.concurrency, o.prompt.String(), o.maxNewTokens),
	}
	return sum
}

// measure reads the daemon, opens the rooms, checks that they queue, reads
// it again and fills in sum's readings and per-room figures.
func (q *benchQueued) measure(ctx context.Context, sum *benchQueuedJSON) error {
	o := q.o
	var err error
	q.progress("baseline: waiting for a GC and a settled RSS")
	if sum.Baseline, err = q.read(ctx); err != nil {
		return err
	}
	start := time.Now()
	if err := q.openAll(ctx); err != nil {
		return err
	}
	sum.OpenSeconds = time.Since(start).Seconds()
	if sum.OpenSeconds > 0 {
		sum.OpenPerSec = float64(o.queued) / sum.OpenSeconds
	}
	if sum.Verified, err = q.verify(ctx); err != nil {
		return err
	}
	q.progress(fmt.Sprintf("%d rooms queued: waiting for a GC and a settled RSS", o.queued))
	if sum.Queued, err = q.read(ctx); err != nil {
		return err
	}
	// Still queued at the end of the reading.
	if sum.Verified, err = q.verify(ctx); err != nil {
		return fmt.Errorf("after the reading: %w", err)
	}
	n := float64(o.queued)
	b, a := sum.Baseline, sum.Queued
	sum.PerRoom = benchQueuedPerRoom{RSSBytes: float64(a.RSSBytes-b.RSSBytes) / n}
	sum.PerRoom.RSSKiB = sum.PerRoom.RSSBytes / 1024
	if q.d.metricsURL != "" {
		sum.PerRoom.HeapAllocBytes = (a.HeapAllocBytes - b.HeapAllocBytes) / n
		sum.PerRoom.HeapAllocKiB = sum.PerRoom.HeapAllocBytes / 1024
		sum.PerRoom.HeapInuseBytes = (a.HeapInuseBytes - b.HeapInuseBytes) / n
		sum.PerRoom.HeapObjects = (a.HeapObjects - b.HeapObjects) / n
	}
	return nil
}

func (q *benchQueued) progress(msg string) {
	if q.o.progress {
		fmt.Fprintf(q.stderr, "decodeplane bench: %s\n", msg)
	}
}

// register registers one prefill instance (TP 1, DP 1, follow_bootstrap_room)
// and keeps it alive with heartbeats until cleanup.
func (q *benchQueued) register(ctx context.Context, st *pb.GetStatusResponse) error {
	tag := rand.Uint32()
	q.addr = fmt.Sprintf("queued-%08x:8998", tag)
	q.base = 1
	if !q.d.child {
		q.base = 1 + rand.Uint64N(1<<40)<<20
	}
	l := st.GetLayout()
	p := q.c.Prefill(&pb.RegisterPrefillRequest{
		BootstrapAddr: q.addr, RankEndpoint: "127.0.0.1:17999",
		Parallel:          &pb.ParallelInfo{AttnTpSize: 1, AttnDpSize: 1, PpSize: 1},
		PageSize:          l.GetPageSize(),
		KvCacheDtype:      l.GetKvCacheDtype(),
		LoadBalanceMethod: "follow_bootstrap_room",
		InstanceId:        fmt.Sprintf("decodeplane-bench-queued-%d-%08x", os.Getpid(), tag),
	})
	if _, err := p.Register(ctx); err != nil {
		if errors.Is(err, client.ErrUnauthenticated) {
			return fmt.Errorf("register the prefill instance: %w (give the daemon's bootstrap token with --token or DECODEPLANE_TOKEN)", err)
		}
		return fmt.Errorf("register the prefill instance: %w", err)
	}
	hbCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.RunHeartbeat(hbCtx) })
	q.hbStop = func() { cancel(); wg.Wait() }
	return nil
}

// openAll opens the rooms at --concurrency; every one must answer QUEUED.
func (q *benchQueued) openAll(ctx context.Context) error {
	o := q.o
	first := q.base + uint64(len(q.fillers))
	ids := make([]uint64, o.queued)
	var next, done atomic.Int64
	var errOnce sync.Once
	var firstErr error
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	stopProg := q.openProgress(&done)
	var wg sync.WaitGroup
	for range min(o.concurrency, o.queued) {
		wg.Go(func() {
			for octx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(o.queued) {
					return
				}
				room := first + uint64(i)
				resp, err := q.c.Engine().OpenRoom(octx, &pb.OpenRoomRequest{
					Rid: "queued-" + strconv.FormatUint(room, 10), BootstrapAddr: q.addr, Room: room,
					PromptLen: uint32(o.prompt.draw(o.seed, uint64(i))), MaxNewTokens: uint32(o.maxNewTokens),
				})
				if err != nil {
					fail(fmt.Errorf("OpenRoom(room %d): %w", room, err))
					return
				}
				ids[i] = room
				switch ph := resp.GetRoom().GetPhase(); ph {
				case pb.RoomPhase_ROOM_PHASE_QUEUED, pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK:
				default:
					fail(fmt.Errorf("room %d is %s after OpenRoom, want QUEUED behind the filler room", room, ph))
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	stopProg()
	for _, id := range ids {
		if id != 0 {
			q.opened = append(q.opened, id)
		}
	}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// openProgress prints the opens done every 5 s while they run.
func (q *benchQueued) openProgress(done *atomic.Int64) func() {
	if !q.o.progress {
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Fprintf(q.stderr, "decodeplane bench: opened %d of %d rooms\n", done.Load(), q.o.queued)
			}
		}
	})
	return func() { close(stop); wg.Wait() }
}

// verify checks, with GetStatus and ListRooms, that exactly the opened rooms
// are QUEUED (rooms may pass WAITING_PREFILL or RESOLVING_DP_RANK first:
// 10 s at most).
func (q *benchQueued) verify(ctx context.Context) (benchQueuedVerified, error) {
	want := int64(q.o.queued)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var v benchQueuedVerified
		st, err := q.c.Admin().Status(ctx)
		if err != nil {
			return v, err
		}
		for _, s := range st.GetShards() {
			v.ShardQueued += int64(s.GetQueued())
			v.BlockedBy = append(v.BlockedBy, s.GetBlockedBy())
		}
		lr, err := q.c.Admin().ListRooms(ctx, &pb.ListRoomsRequest{Phases: []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_QUEUED}, LiveOnly: true, BootstrapAddr: q.addr, Limit: 1})
		if err != nil {
			return v, err
		}
		v.ListQueued = int64(lr.GetTotal())
		blocked := !slices.ContainsFunc(v.BlockedBy, func(b string) bool { return b != "tokens" })
		if v.ShardQueued == want && v.ListQueued == want && blocked {
			return v, nil
		}
		if time.Now().After(deadline) {
			var prefills []string
			for _, p := range st.GetPrefills() {
				prefills = append(prefills, fmt.Sprintf("%s: %d of %d ranks, %d missed heartbeats", p.GetBootstrapAddr(), p.GetRegisteredRanks(), p.GetExpectedRanks(), p.GetMissedHeartbeats()))
			}
			return v, fmt.Errorf("%d rooms opened, but GetStatus counts %d queued, ListRooms(QUEUED) %d, shards blocked by %v; want %d queued, blocked by tokens (rooms by phase %v; prefill instances: %s)",
				want, v.ShardQueued, v.ListQueued, v.BlockedBy, want, st.GetRoomsByPhase(), strings.Join(prefills, "; "))
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cleanup aborts the rooms this run opened in a --target daemon and stops
// the heartbeats.
func (q *benchQueued) cleanup() {
	if q.hbStop != nil {
		q.hbStop()
		q.hbStop = nil
	}
	if !q.d.child {
		rooms := append(slices.Clone(q.fillers), q.opened...)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(q.o.concurrency, len(rooms)) {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(len(rooms)) {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, _ = q.c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: rooms[i], Reason: "decodeplane bench --queued: measurement done"})
					cancel()
				}
			})
		}
		wg.Wait()
	}
}
