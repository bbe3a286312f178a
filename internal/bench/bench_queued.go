package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// benchQueuedDaemon is the daemon being measured.
type benchQueuedDaemon struct {
	addr       string
	metricsURL string
	pid        int
	token      string
	child      bool
	stopFn     func() error
	// exited is closed when the child exits; exitErr then describes how.
	exited  chan struct{}
	exitErr func() string
}

func (d *benchQueuedDaemon) stop() error {
	if d.stopFn == nil {
		return nil
	}
	err := d.stopFn()
	d.stopFn = nil
	return err
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

// benchDaemon is the daemon binary --queued starts: decodeplane, next to
// decodeplane-bench (make build puts both into bin/).
const benchDaemon = "decodeplane"

// benchDaemonExecutable returns the path of the decodeplane binary in the
// directory of this executable (symbolic links resolved).
func benchDaemonExecutable() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("the daemon executable: the path of this executable: %w", err)
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	name := benchDaemon
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	path := filepath.Join(filepath.Dir(exe), name)
	if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		return "", fmt.Errorf("--queued starts the daemon binary, %s, which is not next to the bench (%s is missing): build both with `make build` (or go build -o DIR/ ./cmd/...)", name, path)
	}
	return path, nil
}

// benchFreePort reserves and releases a loopback port for the child.
func benchFreePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// benchStartChild starts `decodeplane serve` (the daemon binary next to
// this executable) with the queued-room settings, --config and --set.
func benchStartChild(o *benchOptions, environ []string) (*benchQueuedDaemon, error) {
	exe, err := benchDaemonExecutable()
	if err != nil {
		return nil, err
	}
	addr, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	maddr, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--listen", addr, "--metrics-listen", maddr, "--log-level", "error",
		// Every shard may receive every room.
		"--set", "admission.max_queued=" + strconv.Itoa(o.queued+1),
		"--set", "timeouts.bootstrap=" + benchQueuedLongTimeout,
		"--set", "admission.claim_timeout=" + benchQueuedLongTimeout,
		// Its queued rooms never finish: do not wait for them on SIGTERM.
		"--set", "server.shutdown_timeout=1s",
		"--set", "timeouts.heartbeat_max_failures=" + benchQueuedHeartbeatFailures,
	}
	if o.configPath != "" {
		args = append(args, "--config", o.configPath)
	}
	if o.visited["decode-tp"] {
		args = append(args, "--set", "parallel.attn_tp="+strconv.Itoa(o.decodeTP))
	}
	token := ""
	for _, s := range o.sets {
		args = append(args, "--set", s.Key+"="+s.Value)
		if s.Key == "server.auth_token" {
			token = s.Value
		}
	}
	// The child is configured by its flags only: nothing from the
	// environment that configures decodeplane or exports telemetry.
	var env []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SGLANG_") || strings.HasPrefix(name, "DECODEPLANE_") || strings.HasPrefix(name, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	var errBuf benchTail
	cmd.Stdout = io.Discard
	cmd.Stderr = &errBuf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", exe, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	d := &benchQueuedDaemon{addr: addr, metricsURL: "http://" + maddr + "/metrics", pid: cmd.Process.Pid, token: token, child: true}
	d.stopFn = func() error {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(30 * time.Second)
			defer t.Stop()
			select {
			case <-exited:
			case <-t.C:
				_ = cmd.Process.Kill()
				<-exited
				return fmt.Errorf("the child daemon (pid %d) was still failing its queued rooms 30s after SIGTERM and was killed (the measurement was complete)", d.pid)
			}
		}
		return nil
	}
	d.exited = exited
	d.exitErr = func() string {
		return fmt.Sprintf("%v; its stderr ends:\n%s", waitErr, errBuf.String())
	}
	return d, nil
}

// benchTail keeps the last 16 KiB a child wrote.
type benchTail struct {
	mu sync.Mutex
	b  []byte
}

func (t *benchTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if n := len(t.b) - 16<<10; n > 0 {
		t.b = append(t.b[:0], t.b[n:]...)
	}
	return len(p), nil
}

func (t *benchTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// benchWaitReady polls the child with GetStatus until it answers (30 s at
// most) or exits.
func benchWaitReady(ctx context.Context, c *client.Client, d *benchQueuedDaemon) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Admin().Status(sctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-d.exited:
			return fmt.Errorf("the child daemon exited before serving: %s", d.exitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the child daemon at %s did not answer GetStatus within 30s: %w", d.addr, err)
		}
	}
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
	o := q.o
	st, err := q.c.Admin().Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("daemon at %s: %w", q.d.addr, err)
	}
	q.status = st
	if st.GetDraining() {
		return nil, fmt.Errorf("the daemon at %s is draining", q.d.addr)
	}
	cfg := map[string]string{}
	for _, cv := range st.GetConfig() {
		cfg[cv.GetKey()] = cv.GetValue()
	}
	shards := st.GetShards()
	if len(shards) == 0 {
		return nil, fmt.Errorf("the daemon at %s reports no decode shard", q.d.addr)
	}
	var problems []error
	for _, s := range shards {
		if n := s.GetWaiting() + s.GetQueued() + s.GetAdmitted() + s.GetClaimed() + s.GetRunning() + s.GetRetracted() + s.GetHeld(); n > 0 {
			problems = append(problems, fmt.Errorf("decode shard %d already holds %d rooms: --queued needs an idle daemon", s.GetDpRank(), n))
		}
	}
	maxQueued, _ := strconv.Atoi(strings.Trim(cfg["admission.max_queued"], `"`))
	if maxQueued == 0 {
		maxQueued = 65536 // prealloc's default for 0
	}
	if perShard := (o.queued + len(shards) - 1) / len(shards); maxQueued < perShard {
		problems = append(problems, fmt.Errorf("admission.max_queued is %d but %d rooms per shard must queue: set admission.max_queued above %d", maxQueued, perShard, perShard))
	}
	for _, k := range []string{"timeouts.bootstrap", "admission.claim_timeout"} {
		if v, err := time.ParseDuration(strings.Trim(cfg[k], `"`)); err == nil && v > 0 && v < benchQueuedShortTimeout {
			fmt.Fprintf(q.stderr, "decodeplane bench: warning: %s is %s on the daemon: rooms may fail before the measurement ends (set it to 1h)\n", k, v)
		}
	}
	reserved, _ := strconv.ParseInt(strings.Trim(cfg["admission.reserved_decode_tokens"], `"`), 10, 64)
	page := int64(max(1, st.GetLayout().GetPageSize()))
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}

	if err := q.register(ctx, st); err != nil {
		return nil, err
	}
	// One admitted room per shard that takes the whole pool but the
	// reserve, rounded to pages: the budget left is below any room's need,
	// so every later room queues behind it, blocked by tokens.
	reservePages := (reserved + page - 1) / page
	for _, s := range shards {
		total := int64(s.GetPagesTotal()) * page
		prompt := total - reservePages*page
		if prompt < 1 || prompt > 1<<31-1 {
			return nil, fmt.Errorf("decode shard %d: a pool of %d tokens cannot be filled by one room (reserved decode tokens %d)", s.GetDpRank(), total, reserved)
		}
		room := q.base + uint64(len(q.fillers))
		dp := s.GetDpRank()
		resp, err := q.c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{
			Rid: "queued-filler-" + strconv.FormatUint(room, 10), BootstrapAddr: q.addr, Room: room,
			DecodeDpRank: &dp, PromptLen: uint32(prompt), MaxNewTokens: 1,
		})
		if err != nil {
			return nil, fmt.Errorf("open the room that fills shard %d: %w", dp, err)
		}
		q.fillers = append(q.fillers, room)
		if ph := resp.GetRoom().GetPhase(); ph != pb.RoomPhase_ROOM_PHASE_ADMITTED {
			return nil, fmt.Errorf("the room that fills shard %d is %s, want ADMITTED (is the pool used otherwise?)", dp, ph)
		}
	}
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
		fmt.Sprintf("admission   max_queued %d per shard, timeouts.bootstrap %s, claim_timeout %s, heartbeat_max_failures %s, reserved decode tokens %d", maxQueued, cfg["timeouts.bootstrap"], cfg["admission.claim_timeout"], cfg["timeouts.heartbeat_max_failures"], reserved),
		fmt.Sprintf("rooms       1 prefill instance (TP 1, heartbeats), %d filler room(s) admitted and never claimed, then %d rooms opened at concurrency %d; prompt %s, max new tokens %d", len(q.fillers), o.queued, o.concurrency, o.prompt.String(), o.maxNewTokens),
	}

	q.progress("baseline: waiting for a GC and a settled RSS")
	if sum.Baseline, err = q.read(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := q.openAll(ctx); err != nil {
		return nil, err
	}
	sum.OpenSeconds = time.Since(start).Seconds()
	if sum.OpenSeconds > 0 {
		sum.OpenPerSec = float64(o.queued) / sum.OpenSeconds
	}
	if sum.Verified, err = q.verify(ctx); err != nil {
		return nil, err
	}
	q.progress(fmt.Sprintf("%d rooms queued: waiting for a GC and a settled RSS", o.queued))
	if sum.Queued, err = q.read(ctx); err != nil {
		return nil, err
	}
	// Still queued at the end of the reading.
	if v, err := q.verify(ctx); err != nil {
		return nil, fmt.Errorf("after the reading: %w", err)
	} else {
		sum.Verified = v
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
	return sum, nil
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

// read waits for a garbage collection (with /metrics) and a settled RSS,
// both within --settle-timeout, and reads the daemon.
func (q *benchQueued) read(ctx context.Context) (benchQueuedReading, error) {
	var r benchQueuedReading
	start := time.Now()
	deadline := start.Add(q.o.settleTimeout)
	if q.d.metricsURL != "" {
		g0, err := benchScrapeGauges(ctx, q.d.metricsURL)
		if err != nil {
			return r, fmt.Errorf("daemon metrics: %w", err)
		}
		g := g0
		for g["go_gc_duration_seconds_count"] <= g0["go_gc_duration_seconds_count"] && time.Now().Before(deadline) {
			// GetStatus makes the daemon allocate, towards its next GC;
			// the pause spaces the calls.
			t0 := time.Now()
			sctx, cancel := context.WithTimeout(ctx, benchQueuedCallTimeout)
			_, _ = q.c.Admin().Status(sctx)
			cancel()
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(max(benchNudgePause, 4*time.Since(t0))):
			}
			if g, err = benchScrapeGauges(ctx, q.d.metricsURL); err != nil {
				return r, fmt.Errorf("daemon metrics: %w", err)
			}
		}
		r.GCObserved = g["go_gc_duration_seconds_count"] > g0["go_gc_duration_seconds_count"]
	}
	if q.d.pid > 0 {
		var last []int64
		for {
			rss, err := benchReadRSS(q.d.pid)
			if err != nil {
				return r, err
			}
			r.RSSBytes = rss
			last = append(last, rss)
			if len(last) > benchSettleReadings {
				last = last[1:]
			}
			if len(last) == benchSettleReadings {
				lo, hi := slices.Min(last), slices.Max(last)
				if float64(hi-lo) <= benchSettleTolerance*float64(hi) {
					r.RSSSettled = true
					break
				}
			}
			if time.Now().After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(benchSettleInterval):
			}
		}
	}
	if q.d.metricsURL != "" {
		// Read after the RSS settled (2 s at least): by then the GC's
		// sweep is done, so the heap holds the live objects and what the
		// idle daemon allocated since.
		g, err := benchScrapeGauges(ctx, q.d.metricsURL)
		if err != nil {
			return r, fmt.Errorf("daemon metrics: %w", err)
		}
		r.HeapAllocBytes, r.HeapInuseBytes = g["go_memstats_heap_alloc_bytes"], g["go_memstats_heap_inuse_bytes"]
		r.HeapObjects, r.GoSysBytes = g["go_memstats_heap_objects"], g["go_memstats_sys_bytes"]
	}
	r.WaitSeconds = time.Since(start).Seconds()
	return r, nil
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

// benchReadRSS reads VmRSS from /proc/<pid>/status, in bytes.
func benchReadRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("the daemon's RSS: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmRSS %q: %w", pid, v, err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS line (is it a live process?)", pid)
}

// benchQueuedGauges are the metrics a reading takes.
var benchQueuedGauges = []string{
	"go_gc_duration_seconds_count", "go_memstats_heap_alloc_bytes", "go_memstats_heap_inuse_bytes",
	"go_memstats_heap_objects", "go_memstats_sys_bytes",
}

// benchScrapeGauges reads benchQueuedGauges from a /metrics URL.
func benchScrapeGauges(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, benchQueuedCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return benchParseGauges(resp.Body)
}

// benchParseGauges picks benchQueuedGauges out of a text exposition; every
// one must be there.
func benchParseGauges(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, raw, ok := strings.Cut(line, " ")
		if !ok || !slices.Contains(benchQueuedGauges, name) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
		if err != nil {
			continue
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var missing []string
	for _, n := range benchQueuedGauges {
		if _, ok := out[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the exposition has no %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// benchQueuedTable prints the summary for people.
func benchQueuedTable(w io.Writer, s *benchQueuedJSON) {
	fmt.Fprintf(w, "decodeplane bench --queued: %s\n", s.Target)
	for _, l := range s.Setup {
		fmt.Fprintf(w, "  %s\n", l)
	}
	fmt.Fprintf(w, "  machine     %d CPUs (GOMAXPROCS %d), %s, %s\n", s.Machine.NumCPU, s.Machine.GOMAXPROCS, s.Machine.CPUModel, s.Machine.GoVersion)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-26s %d  (GetStatus shards: %d queued, blocked by %s; ListRooms(live_only, QUEUED): %d)\n", "rooms queued", s.Rooms,
		s.Verified.ShardQueued, strings.Join(s.Verified.BlockedBy, ","), s.Verified.ListQueued)
	fmt.Fprintf(w, "%-26s %.2f s  (%.0f rooms/s)\n", "opened in", s.OpenSeconds, s.OpenPerSec)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-26s %14s %14s %14s\n", "", "baseline", "queued", "per room")
	fmt.Fprintf(w, "%-26s %14s %14s %14s\n", "RSS (VmRSS)", benchBytes(float64(s.Baseline.RSSBytes)), benchBytes(float64(s.Queued.RSSBytes)), benchBytes(s.PerRoom.RSSBytes))
	if s.Baseline.HeapAllocBytes > 0 {
		fmt.Fprintf(w, "%-26s %14s %14s %14s\n", "Go heap alloc (after GC)", benchBytes(s.Baseline.HeapAllocBytes), benchBytes(s.Queued.HeapAllocBytes), benchBytes(s.PerRoom.HeapAllocBytes))
		fmt.Fprintf(w, "%-26s %14s %14s %14s\n", "Go heap in use", benchBytes(s.Baseline.HeapInuseBytes), benchBytes(s.Queued.HeapInuseBytes), benchBytes(s.PerRoom.HeapInuseBytes))
		fmt.Fprintf(w, "%-26s %14.0f %14.0f %14.1f\n", "Go heap objects", s.Baseline.HeapObjects, s.Queued.HeapObjects, s.PerRoom.HeapObjects)
		fmt.Fprintf(w, "%-26s %14s %14s\n", "Go runtime sys", benchBytes(s.Baseline.GoSysBytes), benchBytes(s.Queued.GoSysBytes))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-26s %.0f B = %.2f KiB of RSS, %.0f B = %.2f KiB of Go heap  ((queued - baseline) / %d rooms)\n", "per queued room",
		s.PerRoom.RSSBytes, s.PerRoom.RSSKiB, s.PerRoom.HeapAllocBytes, s.PerRoom.HeapAllocKiB, s.Rooms)
	for _, x := range []struct {
		name string
		r    benchQueuedReading
	}{{"baseline reading", s.Baseline}, {"queued reading", s.Queued}} {
		fmt.Fprintf(w, "%-26s after %.1f s: GC observed %v, RSS settled %v\n", x.name, x.r.WaitSeconds, x.r.GCObserved, x.r.RSSSettled)
	}
}
