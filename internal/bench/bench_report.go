package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
)

// benchSummary is what the bench prints.
type benchSummary struct {
	o         *benchOptions
	target    string
	inProcess bool
	setup     []string // description lines: layout, fleet, load
	machine   benchMachine

	lifecycle *benchPhase
	// byDaemon are the measured rooms of each daemon (--fleet).
	byDaemon []benchDaemonRooms
	// bare is the bare-gRPC limit with the otelgrpc handlers as the run
	// has them (the bound the ratio compares with), bareNoOtel without any.
	bare        *benchBare
	bareNoOtel  *benchBare
	bareSkipped string

	// computed
	rooms int64 // finished rooms (ok + failed)
	mix   benchMix
	rps   float64
	bound float64
	ratio float64
	// boundNoOtel, ratioNoOtel, cpuBoundNoOtel and cpuRatioNoOtel are
	// against bareNoOtel.
	boundNoOtel    float64
	ratioNoOtel    float64
	cpuBoundNoOtel float64
	cpuRatioNoOtel float64
	// cpuBound is the bare CPU time of one room's mix; cpuRatio compares it
	// with the measured CPU per room (0 when the daemon's CPU is unknown).
	cpuBound float64
	cpuRatio float64
}

type benchMachine struct {
	NumCPU     int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model"`
	GoVersion  string `json:"go_version"`
}

// benchMix is what one room costs on the wire, per finished room. The
// sessions of --api stream count as streams: their opens (one per session,
// not per room), the messages received and, since the client sends on them
// too, the messages sent.
type benchMix struct {
	Unary          float64 `json:"unary_calls"`
	StreamOpens    float64 `json:"stream_opens"`
	StreamMessages float64 `json:"stream_messages"`
	// StreamSent are the messages sent on the sessions (--api stream).
	StreamSent float64                   `json:"stream_messages_sent,omitempty"`
	ByMethod   map[string]benchMethodMix `json:"by_method"`
	// Total is every message of a room, both ways: a unary call's request
	// and answer, a server stream's request and the messages received, a
	// session's messages sent and received.
	Total float64 `json:"messages_total"`
}

type benchMethodMix struct {
	Calls    float64 `json:"calls"`
	Messages float64 `json:"messages,omitempty"`
	Sent     float64 `json:"sent,omitempty"`
}

// describe records the setup the figures belong to.
func (b *benchRun) describe(s *benchSummary) {
	o := b.o
	s.o = o
	s.inProcess = b.tgt.inProcess
	s.target = b.tgt.addr
	st := b.status
	l := st.GetLayout()
	s.setup = append(s.setup, fmt.Sprintf("layout      %s, %s, page size %d, decode attn TP %d, decode DP shards %d, transfer path %s",
		l.GetKind(), l.GetKvCacheDtype(), l.GetPageSize(), max(1, l.GetAttnTpSize()), len(st.GetShards()), st.GetTransferPath()))
	if b.tgt.inProcess {
		sim := b.tgt.cfg.Transfer.Sim
		bw := "instant"
		if sim.BandwidthGBytesPerS > 0 {
			bw = fmt.Sprintf("%g GB/s", sim.BandwidthGBytesPerS)
		}
		s.setup = append(s.setup, fmt.Sprintf("daemon      in-process (daemon.Build, as 'serve'), sim bandwidth %s, latency %s, failure probability %g, KV pool %d tokens/shard, %d request slots",
			bw, sim.Latency, sim.FailureProbability, b.tgt.cfg.KVPool.TotalTokens, b.tgt.cfg.KVPool.RequestSlots))
	}
	senders := 0
	for _, g := range b.groups {
		senders = max(senders, len(g))
	}
	s.setup = append(s.setup, fmt.Sprintf("fleet       prefill DP %d x TP %d -> decode TP %d: %d prefill rank(s) per room; %d connections (decode engine + one per prefill rank)",
		o.dp, o.prefillRanks, b.decTP, senders, 1+b.ranks))
	if o.fleet {
		s.setup = append(s.setup, b.describeFleet()) // bench_fleet.go
	}
	chunks := "one chunk per rank"
	if o.chunkPages > 0 {
		chunks = fmt.Sprintf("%d pages per chunk", o.chunkPages)
	}
	load := fmt.Sprintf("closed loop, %d rooms after %d warm-up, concurrency %d", o.rooms, o.warmup, o.concurrency)
	if o.rateMode() {
		dur := "until SIGINT"
		if o.duration > 0 {
			dur = "for " + o.duration.String()
		}
		load = fmt.Sprintf("rate %g rooms/s %s, at most %d in flight", o.rate, dur, o.concurrency)
		if o.roomsSet {
			load += fmt.Sprintf(", at most %d rooms", o.rooms)
		}
	} else if o.duration > 0 {
		load += ", stopped after " + o.duration.String()
	}
	api := "unary: OpenRoom, WatchRoom and ReleaseRoom per room on the decode engine; AwaitDestination and Transfer per room on each prefill rank"
	if o.stream() {
		api = "stream: the Go client's default transport: OpenAndWait, ReleaseRoom and AbortRoom on the decode engine's shared EngineSession (opens batched as a group commit, one event per room), SendRoom on each prefill rank's shared PrefillSession; a session that ends is re-opened and its rooms resumed by the client"
	}
	s.setup = append(s.setup, "api         "+api)
	owner := "daemon: OpenRoom admits each room and chooses its pages"
	if b.alloc != nil {
		owner = "engine: the bench's decode engine allocates each room's pages and metadata row from its own free lists and declares them (OpenDeclareAndWait: on the engine session with --api stream, DeclareDestination with --api unary), frees them at release"
	}
	s.setup = append(s.setup, "page owner  "+owner)
	s.setup = append(s.setup, fmt.Sprintf("load        %s; prompt %s, max new tokens %d, %s, seed %d", load, o.prompt.String(), o.maxNewTokens, chunks, o.seed))
	s.machine = benchMachine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), CPUModel: benchCPUModel(), GoVersion: runtime.Version()}
	s.setup = append(s.setup, fmt.Sprintf("machine     %d CPUs (GOMAXPROCS %d), %s, %s", s.machine.NumCPU, s.machine.GOMAXPROCS, s.machine.CPUModel, s.machine.GoVersion))
}

// benchCPUModel reads the CPU model from /proc/cpuinfo.
func benchCPUModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// compute derives the mix, the bare bound and the ratio.
func (s *benchSummary) compute() {
	lc := s.lifecycle
	s.rooms = lc.ok + lc.failed
	if lc.wall > 0 {
		s.rps = float64(lc.ok) / lc.wall.Seconds()
	}
	s.mix = benchMix{ByMethod: map[string]benchMethodMix{}}
	if s.rooms == 0 {
		return
	}
	n := float64(s.rooms)
	for _, m := range benchRoomUnary {
		c := float64(lc.counts.Calls[m]) / n
		s.mix.Unary += c
		if c > 0 {
			s.mix.ByMethod[benchMethodNames[m]] = benchMethodMix{Calls: c}
		}
	}
	for _, m := range benchRoomStreams {
		c, msgs := float64(lc.counts.Calls[m])/n, float64(lc.counts.Msgs[m])/n
		s.mix.StreamOpens += c
		s.mix.StreamMessages += msgs
		if c > 0 {
			s.mix.ByMethod[benchMethodNames[m]] = benchMethodMix{Calls: c, Messages: msgs}
		}
	}
	for _, m := range benchRoomSessions {
		c, msgs, sent := float64(lc.counts.Calls[m])/n, float64(lc.counts.Msgs[m])/n, float64(lc.counts.Sent[m])/n
		s.mix.StreamOpens += c
		s.mix.StreamMessages += msgs
		s.mix.StreamSent += sent
		if c > 0 || msgs > 0 || sent > 0 {
			s.mix.ByMethod[benchMethodNames[m]] = benchMethodMix{Calls: c, Messages: msgs, Sent: sent}
		}
	}
	// A unary call is two messages; a server stream's open is its request
	// (the sessions' requests are in StreamSent).
	serverStreamOpens := 0.0
	for _, m := range benchRoomStreams {
		serverStreamOpens += float64(lc.counts.Calls[m]) / n
	}
	s.mix.Total = 2*s.mix.Unary + serverStreamOpens + s.mix.StreamMessages + s.mix.StreamSent
	s.bound, s.cpuBound = s.boundOf(s.bare)
	if s.bound > 0 {
		s.ratio = s.rps / s.bound
	}
	if s.cpuBound > 0 {
		if cpu := s.roomCPU(); cpu > 0 {
			s.cpuRatio = s.cpuBound / cpu
		}
	}
	if s.boundNoOtel, s.cpuBoundNoOtel = s.boundOf(s.bareNoOtel); s.boundNoOtel > 0 {
		s.ratioNoOtel = s.rps / s.boundNoOtel
	}
	if cpu := s.roomCPU(); s.cpuBoundNoOtel > 0 && cpu > 0 {
		s.cpuRatioNoOtel = s.cpuBoundNoOtel / cpu
	}
}

// boundOf is the bare bound of the run's mix in rooms/s, and the bare CPU
// seconds of a room (0, 0 when b measured nothing usable). The stream mix
// was measured whole (a bare room per op); the unary mix is composed from
// its parts (boundTerms).
func (s *benchSummary) boundOf(b *benchBare) (bound, cpu float64) {
	switch {
	case b == nil:
		return 0, 0
	case b.Mix != nil:
		return b.StreamMix.PerSecond, b.StreamMix.CPUMicrosPerOp / 1e6
	case b.Unary.PerSecond > 0 && b.StreamOpen.PerSecond > 0 && (b.StreamMsg.PerSecond > 0 || b.StreamMsg.Negligible):
		t := s.boundTerms(b)
		if sum := t[0] + t[1] + t[2]; sum > 0 {
			bound = 1 / sum
		}
		cpu = (s.mix.Unary*b.Unary.CPUMicrosPerOp + s.mix.StreamOpens*b.StreamOpen.CPUMicrosPerOp +
			s.extraMessages()*b.StreamMsg.CPUMicrosPerOp) / 1e6
		return bound, cpu
	}
	return 0, 0
}

// boundTerms are the seconds of bare-gRPC capacity one room's messages take:
// its unary calls at the bare unary rate, its stream opens (each with its
// first message) at the bare open rate, and its other stream messages at the
// bare stream-message rate.
func (s *benchSummary) boundTerms(b *benchBare) [3]float64 {
	t := [3]float64{s.mix.Unary / b.Unary.PerSecond, s.mix.StreamOpens / b.StreamOpen.PerSecond}
	if !b.StreamMsg.Negligible {
		t[2] = s.extraMessages() / b.StreamMsg.PerSecond
	}
	return t
}

// extraMessages are the stream messages per room after each stream's first.
func (s *benchSummary) extraMessages() float64 {
	return math.Max(0, s.mix.StreamMessages-s.mix.StreamOpens)
}

// benchPercentile is the nearest-rank percentile of sorted values.
func benchPercentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

type benchPercentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func benchPercentilesMS(sorted []time.Duration) benchPercentiles {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return benchPercentiles{
		N: len(sorted), P50: ms(benchPercentile(sorted, 0.50)), P90: ms(benchPercentile(sorted, 0.90)),
		P99: ms(benchPercentile(sorted, 0.99)), Max: ms(benchPercentile(sorted, 1)),
	}
}

func (s *benchSummary) cpuScope() string {
	if s.inProcess {
		return benchCPUSource + " of the bench process: the in-process daemon, the fleet and the client library together"
	}
	return benchCPUSource + " of the bench process: the fleet and the client library only (the daemon runs elsewhere)"
}

// roomCPU is the CPU seconds one room took on both sides: the bench
// process's in-process, plus the daemon's own (from --metrics-url) with
// --target; 0 when the daemon's share is unknown.
func (s *benchSummary) roomCPU() float64 {
	lc := s.lifecycle
	cpu := s.perRoom(lc.usage.cpu.Seconds())
	if s.inProcess {
		return cpu
	}
	if lc.daemon == nil {
		return 0
	}
	return cpu + s.perRoom(lc.daemon.cpuSeconds)
}

func (s *benchSummary) perRoom(v float64) float64 {
	if s.rooms == 0 {
		return 0
	}
	return v / float64(s.rooms)
}

func (s *benchSummary) gcShare() float64 {
	u := s.lifecycle.usage
	if u.goCPU <= 0 {
		return 0
	}
	return u.gcCPU / u.goCPU
}

// benchJSON is the --json summary.
type benchJSON struct {
	API               string                      `json:"api"`
	PageOwner         string                      `json:"page_owner"`
	Mode              string                      `json:"mode"`
	Target            string                      `json:"target"`
	InProcess         bool                        `json:"in_process"`
	Setup             []string                    `json:"setup"`
	ByDaemon          []benchDaemonRooms          `json:"by_daemon,omitempty"`
	Machine           benchMachine                `json:"machine"`
	RoomsOK           int64                       `json:"rooms_ok"`
	RoomsFailed       int64                       `json:"rooms_failed"`
	Failures          map[string]*benchFailure    `json:"failures,omitempty"`
	Interrupted       bool                        `json:"interrupted"`
	WallSeconds       float64                     `json:"wall_seconds"`
	RoomsPerSecond    float64                     `json:"rooms_per_second"`
	LatencyMS         map[string]benchPercentiles `json:"latency_ms"`
	CPUSecondsPerRoom float64                     `json:"cpu_seconds_per_room"`
	CPUScope          string                      `json:"cpu_scope"`
	AllocsPerRoom     float64                     `json:"heap_allocs_per_room"`
	AllocBytesPerRoom float64                     `json:"heap_alloc_bytes_per_room"`
	GCCPUFraction     float64                     `json:"gc_cpu_fraction"`
	Daemon            *benchDaemonJSON            `json:"daemon,omitempty"`
	Messages          benchMix                    `json:"messages_per_room"`
	HeartbeatErrors   int64                       `json:"heartbeat_errors"`
	// Bare, BoundRoomsPerSec and Ratio are with the otelgrpc handlers as
	// the run has them (what the daemon and the client library install);
	// the *NoOtel ones without any otelgrpc handler.
	Bare             *benchBare `json:"bare,omitempty"`
	BareNoOtel       *benchBare `json:"bare_no_otel,omitempty"`
	BareSkipped      string     `json:"bare_skipped,omitempty"`
	BoundRoomsPerSec float64    `json:"bare_bound_rooms_per_second,omitempty"`
	Ratio            float64    `json:"ratio,omitempty"`
	BoundNoOtel      float64    `json:"bare_bound_rooms_per_second_no_otel,omitempty"`
	RatioNoOtel      float64    `json:"ratio_no_otel,omitempty"`
	BareCPUPerRoom   float64    `json:"bare_cpu_seconds_per_room,omitempty"`
	CPURatio         float64    `json:"cpu_ratio,omitempty"`
	BareCPUNoOtel    float64    `json:"bare_cpu_seconds_per_room_no_otel,omitempty"`
	CPURatioNoOtel   float64    `json:"cpu_ratio_no_otel,omitempty"`
}

// benchDaemonJSON are the daemon's own figures from its /metrics.
type benchDaemonJSON struct {
	CPUSecondsPerRoom float64 `json:"cpu_seconds_per_room"`
	AllocsPerRoom     float64 `json:"heap_allocs_per_room"`
	AllocBytesPerRoom float64 `json:"heap_alloc_bytes_per_room"`
	AdmissionBlocked  float64 `json:"admission_blocked_passes"`
	Admitted          float64 `json:"rooms_admitted"`
}

func (s *benchSummary) json() benchJSON {
	lc := s.lifecycle
	j := benchJSON{
		API: s.o.api, PageOwner: s.o.pageOwner, Mode: "closed-loop", Target: s.target, InProcess: s.inProcess, Setup: s.setup, ByDaemon: s.byDaemon, Machine: s.machine,
		RoomsOK: lc.ok, RoomsFailed: lc.failed, Interrupted: lc.interrupted,
		WallSeconds: lc.wall.Seconds(), RoomsPerSecond: s.rps,
		LatencyMS: map[string]benchPercentiles{
			"open_to_destination":    benchPercentilesMS(lc.openDest),
			"destination_to_success": benchPercentilesMS(lc.destSucc),
			"lifecycle":              benchPercentilesMS(lc.life),
			// bench_delays.go
			"last_chunk_to_engine_told": benchPercentilesMS(lc.chunkTold),
		},
		CPUSecondsPerRoom: s.perRoom(lc.usage.cpu.Seconds()), CPUScope: s.cpuScope(),
		AllocsPerRoom: s.perRoom(float64(lc.usage.allocObjects)), AllocBytesPerRoom: s.perRoom(float64(lc.usage.allocBytes)),
		GCCPUFraction: s.gcShare(), Messages: s.mix, HeartbeatErrors: lc.hbErrors,
		Bare: s.bare, BareNoOtel: s.bareNoOtel, BareSkipped: s.bareSkipped, BoundRoomsPerSec: s.bound, Ratio: s.ratio,
		BoundNoOtel: s.boundNoOtel, RatioNoOtel: s.ratioNoOtel,
		BareCPUPerRoom: s.cpuBound, CPURatio: s.cpuRatio, BareCPUNoOtel: s.cpuBoundNoOtel, CPURatioNoOtel: s.cpuRatioNoOtel,
	}
	if s.o.rateMode() {
		j.Mode = "rate"
	}
	if len(lc.reasons) > 0 {
		j.Failures = lc.reasons
	}
	if d := lc.daemon; d != nil {
		j.Daemon = &benchDaemonJSON{
			CPUSecondsPerRoom: s.perRoom(d.cpuSeconds), AllocsPerRoom: s.perRoom(d.mallocs), AllocBytesPerRoom: s.perRoom(d.allocBytes),
			AdmissionBlocked: d.admissionBlock, Admitted: d.admitted,
		}
	}
	return j
}

func (s *benchSummary) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s.json())
}

func (s *benchSummary) methodList(methods []int, msgs bool) string {
	var parts []string
	for _, m := range methods {
		mm, ok := s.mix.ByMethod[benchMethodNames[m]]
		if !ok {
			continue
		}
		v := mm.Calls
		if msgs {
			v = mm.Messages
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", benchMethodNames[m], v))
	}
	return strings.Join(parts, ", ")
}

func (s *benchSummary) sentList() string {
	var parts []string
	for _, m := range benchRoomSessions {
		if mm, ok := s.mix.ByMethod[benchMethodNames[m]]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", benchMethodNames[m], mm.Sent))
		}
	}
	return strings.Join(parts, ", ")
}

func benchBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func benchTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// benchProgress is the progress line on stderr: redrawn in place on a
// terminal, a plain line every few seconds otherwise.
type benchProgress struct {
	w       io.Writer
	enabled bool
	tty     bool

	mu    sync.Mutex
	label string
	total int
	rec   *benchRecorder
	start time.Time

	once sync.Once
	quit chan struct{}
	done chan struct{}
}

func newBenchProgress(w io.Writer, enabled bool) *benchProgress {
	p := &benchProgress{w: w, enabled: enabled, quit: make(chan struct{}), done: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	if !enabled {
		close(p.done)
		return p
	}
	every := 5 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				if p.tty {
					p.mu.Lock()
					fmt.Fprint(p.w, "\r\033[K")
					p.mu.Unlock()
				}
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

// setPhase starts a phase: total rooms (0: unbounded, or not rooms).
func (p *benchProgress) setPhase(label string, total int) {
	p.mu.Lock()
	defer p.mu.Unlock() // the output too: the drawing goroutine writes to the same writer
	p.label, p.total, p.rec, p.start = label, total, nil, time.Now()
	if p.enabled && !p.tty {
		fmt.Fprintf(p.w, "bench: %s...\n", label)
	}
}

func (p *benchProgress) attach(rec *benchRecorder) {
	p.mu.Lock()
	p.rec, p.start = rec, time.Now()
	p.mu.Unlock()
}

func (p *benchProgress) draw() {
	p.mu.Lock()
	label, total, rec, start := p.label, p.total, p.rec, p.start
	p.mu.Unlock()
	el := time.Since(start)
	var line string
	if rec == nil {
		line = fmt.Sprintf("%s: %s", label, el.Round(100*time.Millisecond))
	} else {
		ok, failed, inflight := rec.ok.Load(), rec.failed.Load(), rec.inflight.Load()
		done := ok + failed
		rate := float64(done) / max(el.Seconds(), 1e-9)
		counts := fmt.Sprintf("%d rooms", done)
		bar := ""
		if total > 0 {
			frac := math.Min(1, float64(done)/float64(total))
			counts = fmt.Sprintf("%d/%d rooms (%.0f%%)", done, total, 100*frac)
			if p.tty {
				const width = 24
				fill := int(frac * width)
				bar = "[" + strings.Repeat("=", fill) + strings.Repeat(" ", width-fill) + "] "
			}
		}
		line = fmt.Sprintf("%s %s%s, ok %d, failed %d, %.0f rooms/s, %d in flight, %s", label, bar, counts, ok, failed, rate, inflight, el.Round(time.Second))
		if total > 0 && rate > 0 && int(done) < total {
			line += fmt.Sprintf(", ETA %s", (time.Duration(float64(total-int(done))/rate) * time.Second).Round(time.Second))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintf(p.w, "bench: %s\n", line)
	}
}

// stop ends the progress display (idempotent).
func (p *benchProgress) stop() {
	p.once.Do(func() {
		close(p.quit)
		<-p.done
	})
}
