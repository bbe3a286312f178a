// Package bench is `decodeplane bench`, built as its own binary,
// decodeplane-bench (cmd/decodeplane-bench), which the daemon binary runs
// for that command, so that the daemon links neither the client nor the
// bench. It drives the whole room lifecycle over real gRPC (a simulated
// decode engine and a simulated prefill fleet, each rank on its own
// connection) against a daemon started in this process
// (internal/daemon, as serve builds it) or an external one (--target). With
// --api stream (the default) the rooms ride on the Go client's default
// transport, long-lived sessions (the decode engine's OpenAndWait,
// ReleaseRoom and AbortRoom on one shared EngineSession, each prefill
// rank's SendRoom on one shared PrefillSession); with --api unary
// (client.TransportUnary) each step of a room is its own call or stream. The bench then measures the bare-gRPC limit of the run's message
// mix on the same kind of connection (bench_bare.go; the stream mix:
// bench_bare_stream.go), with the otelgrpc handlers as the run has them and
// without, and prints the ratio of the two. See BENCHMARKS.md.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
)

// The exit codes of decodeplane bench (decodeplane's).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// benchOptions are the bench's flags.
type benchOptions struct {
	target     string
	metricsURL string
	token      string
	// api is how the fleet talks to the daemon: "stream" (one
	// EngineSession for the decode engine, one PrefillSession per prefill
	// rank) or "unary" (a call or a stream per step of every room).
	api string
	// pageOwner is who allocates the KV pages: "daemon" (OpenRoom admits
	// and allocates) or "engine" (the bench's decode engine allocates from
	// its own free lists and declares each room's destination:
	// bench_owner.go).
	pageOwner    string
	rooms        int
	roomsSet     bool
	concurrency  int
	prefillRanks int
	decodeTP     int
	dp           int
	prompt       benchDist
	chunkPages   int
	maxNewTokens int
	warmup       int
	rate         float64
	duration     time.Duration
	seed         int64
	json         bool
	simBandwidth float64
	simLatency   time.Duration
	configPath   string
	sets         []config.FlagSetting
	bareDuration time.Duration
	roomTimeout  time.Duration
	// unreachableTimeout stops the run once the daemon has not answered a
	// health check for this long (0: never).
	unreachableTimeout time.Duration
	cpuProfile         string
	memProfile         string
	progress           bool
	// queued > 0 measures N queued rooms instead of the lifecycle
	// (bench_queued.go); targetPID is the --target daemon's process.
	queued        int
	targetPID     int
	settleTimeout time.Duration
	// fleet: the prefill ranks are client.FleetPrefills registered through
	// --target, and the rooms are spread over the daemons of its fleet
	// (the first fleetDaemons of them, --target first; 0: all).
	fleet        bool
	fleetDaemons int
	// visited are the flags given on the command line.
	visited map[string]bool
	// version is decodeplane's, reported by the in-process daemon and in
	// traces.
	version string
}

// stream reports --api stream.
func (o *benchOptions) stream() bool { return o.api == "stream" }

// transport is the Go client's transport for the api.
func (o *benchOptions) transport() client.Transport {
	if o.stream() {
		return client.TransportStreams
	}
	return client.TransportUnary
}

// rateMode reports an open-loop run (--rate): rooms start at a fixed rate
// instead of as soon as one finishes.
func (o *benchOptions) rateMode() bool { return o.rate > 0 }

// benchInProcessFlags only apply to the daemon the bench starts itself.
var benchInProcessFlags = []string{"decode-tp", "sim-bandwidth-gbytes-per-s", "sim-latency", "config", "set"}

func benchFlags(stderr io.Writer) (*flag.FlagSet, *benchOptions) {
	o := &benchOptions{prompt: benchDist{lo: 256, hi: 4096}}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: decodeplane bench [flags]

Benchmarks the control path: a simulated decode engine and a simulated prefill
fleet drive rooms through the whole lifecycle over real gRPC (OpenRoom ->
AwaitDestination -> Transfer -> WatchRoom sees Success -> ReleaseRoom), then the
bare-gRPC limit of that message mix (an empty unary call, an empty
server-stream message) is measured on the same kind of connection, and the
ratio of the two is printed.

--api stream (the default) carries every room on long-lived streams: the
decode engine opens, watches and releases its rooms on one EngineSession,
each prefill rank claims, transfers and acknowledges on one PrefillSession.
--api unary makes a call or a stream per step of every room, as above. With
--api stream the bare-gRPC limit is that of the stream mix: bare
bidirectional streams (one on the engine's connection, one on each prefill
rank's, no decodeplane logic) carrying per room the messages, both ways and
of the sizes, that this run's rooms carried on their sessions. The bare
limit is measured with the otelgrpc stats handlers as the run has them (the
bound the ratio uses) and without any.

By default the daemon runs in this process on a loopback TCP listener with a
bench configuration (large KV pool, simulated transfers at infinite
bandwidth); --target drives an external daemon instead. --rate turns the
closed loop into a steady stream of rooms (the demo mode, and the low-load
delays: open -> destination, last chunk -> engine told; no bare-gRPC
measurement).

--queued N measures what a QUEUED room costs instead: the daemon runs as a
child process ('serve', settings by --set; or --target with --target-pid),
one prefill instance is registered, one admitted room that is never claimed
fills each shard's KV pool, N rooms are opened and checked to be QUEUED
(blocked by tokens), and the daemon's RSS and Go heap before and after give
the cost per room.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.target, "target", "", "drive an external daemon at this gRPC address instead of starting one in-process")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "with --target: the daemon's /metrics URL, to report its CPU and allocations per room (e.g. http://127.0.0.1:7601/metrics)")
	fs.StringVar(&o.token, "token", "", "bootstrap token for mutating RPCs (default $DECODEPLANE_TOKEN; in-process: the configured server.auth_token)")
	fs.StringVar(&o.api, "api", "stream", "how the fleet talks to the daemon: stream (the decode engine on one EngineSession, each prefill rank on one PrefillSession, every room multiplexed) or unary (OpenRoom, WatchRoom, ReleaseRoom; AwaitDestination, Transfer per room)")
	fs.StringVar(&o.pageOwner, "page-owner", "daemon", "who allocates the KV pages: daemon (OpenRoom admits each room and chooses its pages) or engine (the bench's decode engine allocates each room's pages and metadata row from its own free lists and declares them, DeclareDestination; it gives them back at release, or once a failed room's pages are reusable); in-process it sets kv_pool.owner, with --target it must be the daemon's")
	fs.IntVar(&o.rooms, "rooms", 10000, "rooms to measure (with --rate: a cap, none unless given)")
	fs.IntVar(&o.concurrency, "concurrency", 256, "rooms in flight at most")
	fs.IntVar(&o.prefillRanks, "prefill-ranks", 1, "prefill attention TP size: ranks per prefill DP group")
	fs.IntVar(&o.decodeTP, "decode-tp", 1, "in-process: the daemon's attention TP (parallel.attn_tp)")
	fs.IntVar(&o.dp, "dp", 1, "prefill DP ranks; rooms are resolved by follow_bootstrap_room (room % dp)")
	fs.Var(&o.prompt, "prompt-len", "prompt length distribution: fixed:N or uniform:A-B")
	fs.IntVar(&o.chunkPages, "chunk-pages", 0, "pages per Transfer chunk (0: one chunk per rank)")
	fs.IntVar(&o.maxNewTokens, "max-new-tokens", 128, "max_new_tokens of every room")
	fs.IntVar(&o.warmup, "warmup", 1000, "rooms run first and not measured (closed loop only)")
	fs.Float64Var(&o.rate, "rate", 0, "open loop: start this many rooms per second (0: closed loop)")
	fs.DurationVar(&o.duration, "duration", 0, "stop starting rooms after this long (0: with --rate, until SIGINT)")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the prompt lengths (and, in-process, of the simulated faults)")
	fs.BoolVar(&o.json, "json", false, "print the summary as JSON instead of a table")
	fs.Float64Var(&o.simBandwidth, "sim-bandwidth-gbytes-per-s", 0, "in-process: simulated transfer bandwidth in gigabytes per second (0: instant, so that the control path is measured)")
	fs.Float64Var(new(float64), "sim-bandwidth-gbps", 0, "renamed --sim-bandwidth-gbytes-per-s (the value was always gigabytes per second)")
	fs.DurationVar(&o.simLatency, "sim-latency", 0, "in-process: simulated per-transfer latency")
	fs.StringVar(&o.configPath, "config", "", "in-process: daemon configuration file (YAML) over the bench defaults; where the daemon listens and logs stays the bench's (loopback, errors only) unless --set")
	fs.Var(config.SetFlag(&o.sets), "set", "in-process: set a daemon configuration key: --set transfer.sim.failure_probability=0.1 (repeatable)")
	fs.DurationVar(&o.bareDuration, "bare-duration", 2*time.Second, "measuring time of each bare-gRPC test (0: skip the bare-gRPC limit)")
	fs.DurationVar(&o.roomTimeout, "room-timeout", time.Minute, "a room not done after this long is aborted and counted failed")
	fs.DurationVar(&o.unreachableTimeout, "unreachable-timeout", defaultUnreachableTimeout, "stop, print the summary and exit 1 once the daemon has not answered a health check for this long (0: never)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured rooms to this file")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a heap allocation profile (since start, taken after the measured rooms) to this file")
	fs.BoolVar(&o.progress, "progress", true, "show progress on stderr")
	fs.IntVar(&o.queued, "queued", 0, "measure the daemon's resident memory per QUEUED room instead of the lifecycle: start the daemon as a child process (or measure --target, --target-pid), keep N rooms queued behind a full KV pool, report (RSS, Go heap) delta / N")
	fs.IntVar(&o.targetPID, "target-pid", 0, "with --queued --target: the daemon's process id, to read its RSS from /proc/<pid>/status")
	fs.DurationVar(&o.settleTimeout, "settle-timeout", 3*time.Minute, "with --queued: how long each reading waits at most for a garbage collection in the daemon and a settled RSS")
	fs.BoolVar(&o.fleet, "fleet", false, "with --target: spread the rooms over the daemons of --target's fleet (Fleet.GetFleet; registry.backend etcd), one decode engine per daemon, while each prefill rank is a client.FleetPrefill registered through --target only and told only each room (the daemon that holds it offers it)")
	fs.IntVar(&o.fleetDaemons, "fleet-daemons", 0, "with --fleet: open the rooms on the first N daemons of the fleet only, --target first (0: all)")
	return fs, o
}

// parse parses and checks the flags.
func (o *benchOptions) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	o.visited = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.visited[f.Name] = true })
	o.roomsSet = o.visited["rooms"]
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.rooms < 1 {
		bad("--rooms %d: must be >= 1", o.rooms)
	}
	if o.api != "unary" && o.api != "stream" {
		bad("--api %q: must be unary or stream", o.api)
	}
	if o.pageOwner != "daemon" && o.pageOwner != "engine" {
		bad("--page-owner %q: must be daemon or engine", o.pageOwner)
	}
	if o.concurrency < 1 {
		bad("--concurrency %d: must be >= 1", o.concurrency)
	}
	if o.prefillRanks < 1 {
		bad("--prefill-ranks %d: must be >= 1", o.prefillRanks)
	}
	if o.decodeTP < 1 {
		bad("--decode-tp %d: must be >= 1", o.decodeTP)
	}
	if o.dp < 1 {
		bad("--dp %d: must be >= 1", o.dp)
	}
	if o.chunkPages < 0 {
		bad("--chunk-pages %d: must be >= 0", o.chunkPages)
	}
	if o.maxNewTokens < 1 {
		bad("--max-new-tokens %d: must be >= 1", o.maxNewTokens)
	}
	if o.warmup < 0 {
		bad("--warmup %d: must be >= 0", o.warmup)
	}
	if o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0) {
		bad("--rate %v: must be a finite number >= 0", o.rate)
	}
	if o.duration < 0 {
		bad("--duration %s: must be >= 0", o.duration)
	}
	if o.simBandwidth < 0 || math.IsNaN(o.simBandwidth) || math.IsInf(o.simBandwidth, 0) {
		bad("--sim-bandwidth-gbytes-per-s %v: must be a finite number >= 0", o.simBandwidth)
	}
	if o.visited["sim-bandwidth-gbps"] {
		bad("--sim-bandwidth-gbps is deprecated and no longer read: it was renamed --sim-bandwidth-gbytes-per-s (the value is in gigabytes per second, as it always was; the old name read as gigabits). Please use --sim-bandwidth-gbytes-per-s instead")
	}
	if o.simLatency < 0 {
		bad("--sim-latency %s: must be >= 0", o.simLatency)
	}
	if o.bareDuration < 0 {
		bad("--bare-duration %s: must be >= 0", o.bareDuration)
	}
	if o.roomTimeout <= 0 {
		bad("--room-timeout %s: must be > 0", o.roomTimeout)
	}
	if o.unreachableTimeout < 0 {
		bad("--unreachable-timeout %s: must be >= 0 (0: never stop)", o.unreachableTimeout)
	}
	if o.queued < 0 {
		bad("--queued %d: must be >= 0 (0: measure the lifecycle)", o.queued)
	}
	if o.settleTimeout <= 0 {
		bad("--settle-timeout %s: must be > 0", o.settleTimeout)
	}
	o.checkCombinations(bad)
	return errors.Join(errs...)
}

// checkCombinations checks the flags that apply only with others (parse's
// second half: each value alone was checked before).
func (o *benchOptions) checkCombinations(bad func(format string, a ...any)) {
	if o.queued > 0 {
		if o.rate > 0 {
			bad("--rate applies to the lifecycle; --queued opens its rooms at --concurrency")
		}
		if o.visited["api"] {
			bad("--api applies to the lifecycle; --queued opens its rooms with OpenRoom")
		}
		if o.visited["page-owner"] {
			bad("--page-owner applies to the lifecycle; --queued measures rooms queued for the daemon's admission")
		}
		if o.target != "" && o.targetPID <= 0 {
			bad("--queued --target %s needs --target-pid, the daemon's process id (its RSS is read from /proc/<pid>/status)", o.target)
		}
		if o.target == "" && o.metricsURL != "" {
			bad("--metrics-url needs --target (the child daemon's /metrics is known)")
		}
	} else if o.targetPID != 0 {
		bad("--target-pid applies to --queued only")
	}
	if o.targetPID < 0 {
		bad("--target-pid %d: must be a process id", o.targetPID)
	}
	if o.fleet && (o.target == "" || o.api != "stream" || o.queued > 0) {
		bad("--fleet needs --target (a daemon of a fleet) and --api stream (the rooms are offered on the prefill's sessions), and not --queued")
	}
	if o.fleet && o.pageOwner == "engine" {
		bad("--fleet with --page-owner engine: the fleet bench's decode engines let their daemons allocate; use --page-owner daemon with --fleet")
	}
	if o.fleetDaemons < 0 || (o.fleetDaemons > 0 && !o.fleet) {
		bad("--fleet-daemons %d: must be >= 0, and applies to --fleet only", o.fleetDaemons)
	}
	if o.target != "" {
		for _, name := range benchInProcessFlags {
			if o.visited[name] {
				bad("--%s applies to the in-process daemon only; configure the daemon at %s itself", name, o.target)
			}
		}
	} else if o.metricsURL != "" && o.queued == 0 {
		bad("--metrics-url needs --target (in-process, the bench's own CPU and allocations include the daemon's)")
	}
}

// benchDist is a prompt-length distribution: fixed:N or uniform:A-B.
type benchDist struct{ lo, hi int }

func (d *benchDist) String() string {
	if d == nil {
		return ""
	}
	if d.lo == d.hi {
		return fmt.Sprintf("fixed:%d", d.lo)
	}
	return fmt.Sprintf("uniform:%d-%d", d.lo, d.hi)
}

func (d *benchDist) Set(v string) error {
	kind, arg, ok := strings.Cut(v, ":")
	if !ok {
		return fmt.Errorf("want fixed:N or uniform:A-B, got %q", v)
	}
	positive := func(s string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%q is not a positive integer", s)
		}
		return n, nil
	}
	switch kind {
	case "fixed":
		n, err := positive(arg)
		if err != nil {
			return err
		}
		d.lo, d.hi = n, n
	case "uniform":
		a, b, ok := strings.Cut(arg, "-")
		if !ok {
			return fmt.Errorf("want uniform:A-B, got %q", v)
		}
		lo, err := positive(a)
		if err != nil {
			return err
		}
		hi, err := positive(b)
		if err != nil {
			return err
		}
		if hi < lo {
			return fmt.Errorf("uniform:%d-%d: the upper bound is below the lower one", lo, hi)
		}
		d.lo, d.hi = lo, hi
	default:
		return fmt.Errorf("unknown distribution %q (want fixed:N or uniform:A-B)", kind)
	}
	return nil
}

// draw returns the prompt length of room index i: deterministic for a seed,
// whatever the scheduling.
func (d benchDist) draw(seed int64, i uint64) int {
	if d.lo == d.hi {
		return d.lo
	}
	return d.lo + int(benchSplitMix(uint64(seed)^(i*0x9e3779b97f4a7c15))%uint64(d.hi-d.lo+1))
}

// benchSplitMix is SplitMix64's finalizer: a cheap, well-mixed hash.
func benchSplitMix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Main runs decodeplane bench with args (after "bench") and returns the exit
// code: 0, 1 on a failed run, 2 on a usage or configuration error. version
// is decodeplane's.
func Main(version string, args, environ []string, stdout, stderr io.Writer) int {
	fs, o := benchFlags(stderr)
	o.version = version
	if err := o.parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane bench: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal, a second one kills the process as usual.
		<-ctx.Done()
		stop()
	}()
	run := runBench
	if o.queued > 0 {
		run = runBenchQueued
	}
	code, err := run(ctx, o, environ, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "decodeplane bench: %v\n", err)
		if ue := (*config.UsageError)(nil); errors.As(err, &ue) {
			return exitUsage
		}
		return exitFailure
	}
	return code
}

// runBench runs the whole benchmark; ctx ends on SIGINT/SIGTERM.
func runBench(ctx context.Context, o *benchOptions, environ []string, stdout, stderr io.Writer) (int, error) {
	tr, err := benchNewTracing(ctx, environ, o.version)
	if err != nil {
		return 0, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tr.shutdown(sctx)
	}()
	tgt, token, err := benchTargetOf(ctx, o, environ, stderr)
	if err != nil {
		return 0, err
	}
	defer tgt.stop()

	prog := newBenchProgress(stderr, o.progress)
	defer prog.stop()
	run, err := newBenchRun(ctx, o, tgt, token, tr, prog)
	if err != nil {
		return 0, err
	}
	defer run.close()
	var watch *benchWatch
	if o.unreachableTimeout > 0 {
		if watch, err = startBenchWatch(tgt.addr, o.unreachableTimeout, run.giveUp); err != nil {
			return 0, err
		}
		defer watch.stop()
	}

	sum := &benchSummary{}
	run.describe(sum)
	if err := run.lifecycle(ctx, prog, sum); err != nil {
		return 0, err
	}
	sum.byDaemon = run.roomsByDaemon() // bench_fleet.go
	// The rooms are done: the daemon may go (the bare measurement does not
	// use it).
	unreachable := watch.stop()
	if tgt.metricsURL != "" && sum.lifecycle.daemonErr != nil && unreachable == nil {
		fmt.Fprintf(stderr, "decodeplane bench: daemon metrics at %s: %v\n", tgt.metricsURL, sum.lifecycle.daemonErr)
	}
	if err := run.bareUnlessSkipped(ctx, prog, sum, unreachable); err != nil {
		return 0, err
	}
	prog.stop()
	sum.compute()
	if o.json {
		if err := sum.writeJSON(stdout); err != nil {
			return 0, err
		}
	} else {
		sum.writeTable(stdout)
	}
	return run.exit(sum, unreachable, stderr)
}

// benchTargetOf is the daemon the bench runs against (one it starts, or
// --target) and the token to call it with: --token, else
// DECODEPLANE_TOKEN, else the started daemon's.
func benchTargetOf(ctx context.Context, o *benchOptions, environ []string, stderr io.Writer) (*benchTarget, string, error) {
	var tgt *benchTarget
	var err error
	if o.target == "" {
		tgt, err = benchStartDaemon(ctx, o, environ, stderr)
	} else {
		tgt = &benchTarget{addr: o.target, metricsURL: o.metricsURL}
	}
	if err != nil {
		return nil, "", err
	}
	token := o.token
	if token == "" {
		token = benchEnvMap(environ)["DECODEPLANE_TOKEN"]
	}
	if token == "" {
		token = tgt.token
	}
	return tgt, token, nil
}

// lifecycle runs the warmup (closed loop only) and the measured phase,
// under the profilers asked for, into sum.lifecycle.
func (b *benchRun) lifecycle(ctx context.Context, prog *benchProgress, sum *benchSummary) error {
	o := b.o
	if !o.rateMode() && o.warmup > 0 {
		prog.setPhase("warmup", o.warmup)
		b.phase(ctx, 0, o.warmup, false)
	}
	first := uint64(0)
	if !o.rateMode() {
		first = uint64(o.warmup)
	}
	total := o.rooms
	if o.rateMode() && !o.roomsSet {
		total = 0
	}
	for _, e := range b.engines { // the measured rooms only
		e.rooms.Store(0)
		e.routed.Store(0)
	}
	prog.setPhase("measuring", total)
	if err := benchCPUProfile(o.cpuProfile, func() { sum.lifecycle = b.phase(ctx, first, total, true) }); err != nil {
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	if o.memProfile != "" {
		if err := benchWriteHeapProfile(o.memProfile); err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
	}
	return nil
}

// bareUnlessSkipped runs the bare-gRPC measurement into sum, or records why
// it was skipped (the daemon became unreachable, rate mode,
// --bare-duration 0, an interruption).
func (b *benchRun) bareUnlessSkipped(ctx context.Context, prog *benchProgress, sum *benchSummary, unreachable error) error {
	o := b.o
	switch {
	case unreachable != nil:
		sum.bareSkipped = "the daemon became unreachable"
	case o.rateMode():
		sum.bareSkipped = "rate mode: rooms arrive at the offered rate, so there is no throughput to compare"
	case o.bareDuration == 0:
		sum.bareSkipped = "--bare-duration 0"
	case o.fleet:
		sum.bareSkipped = "--fleet: the rooms go to several daemons, which one bare server does not model"
	case ctx.Err() != nil:
		sum.bareSkipped = "interrupted"
	default:
		bare, noOtel, skipped, err := b.bare(ctx, prog, sum.lifecycle)
		switch {
		case err != nil && ctx.Err() != nil:
			sum.bareSkipped = "interrupted"
		case err != nil:
			return fmt.Errorf("bare-gRPC measurement: %w", err)
		case skipped != "":
			sum.bareSkipped = skipped
		default:
			sum.bare, sum.bareNoOtel = bare, noOtel
		}
	}
	return nil
}

// exit is the bench's exit code: a failure when the daemon became
// unreachable, the run was interrupted (closed loop), rooms failed that
// were not expected to, or no room finished.
func (b *benchRun) exit(sum *benchSummary, unreachable error, stderr io.Writer) (int, error) {
	o, lc := b.o, sum.lifecycle
	switch {
	case unreachable != nil:
		fmt.Fprintf(stderr, "decodeplane bench: %v\n", unreachable)
		return exitFailure, nil
	case lc.interrupted && !o.rateMode():
		fmt.Fprintln(stderr, "decodeplane bench: interrupted: the figures cover the rooms that finished")
		return exitFailure, nil
	case lc.failed > 0 && !b.failuresExpected:
		fmt.Fprintf(stderr, "decodeplane bench: %d rooms failed\n", lc.failed)
		return exitFailure, nil
	case lc.ok == 0 && lc.failed == 0 && !o.rateMode():
		return exitFailure, errors.New("no room finished")
	}
	return exitOK, nil
}

// benchCPUProfile runs f under the CPU profiler when path is set.
func benchCPUProfile(path string, f func()) error {
	if path == "" {
		f()
		return nil
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return err
	}
	f()
	pprof.StopCPUProfile()
	return out.Close()
}

// benchWriteHeapProfile writes the allocation profile (every allocation
// since the process started, sampled).
func benchWriteHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// benchEnvMap indexes an environment.
func benchEnvMap(environ []string) map[string]string {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}
