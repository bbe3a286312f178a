package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/telemetry"
)

// benchTarget is the daemon the bench drives.
type benchTarget struct {
	addr string
	// metricsURL is the daemon's /metrics (in-process: always; with
	// --target: --metrics-url).
	metricsURL string
	// token is the in-process daemon's bootstrap token.
	token     string
	inProcess bool
	// cfg is the in-process daemon's configuration.
	cfg    config.Config
	stopFn func()
}

func (t *benchTarget) stop() {
	if t.stopFn != nil {
		t.stopFn()
		t.stopFn = nil
	}
}

// benchOwnedKeys are where the in-process daemon listens and logs: the
// bench's business, not the daemon configuration's, so a --config file or
// DECODEPLANE_* variable made for a real daemon (listen :7600, log level
// info) does not apply to them; only --set does.
var benchOwnedKeys = map[string]bool{"server.listen": true, "server.metrics_listen": true, "log.level": true, "log.format": true}

// benchDefaults are the keys the bench sets for its in-process daemon when
// neither --config, the environment nor a flag set them (for benchOwnedKeys:
// unless --set did).
func benchDefaults(o *benchOptions, cfg config.Config) []config.FlagSetting {
	def := []config.FlagSetting{
		{Key: "server.listen", Value: "127.0.0.1:0"},
		// /metrics on an ephemeral loopback port: the bench reads the
		// admission counters from it. (Spelled localhost: server config
		// validation compares the two addresses as strings.)
		{Key: "server.metrics_listen", Value: "localhost:0"},
		// Successful calls log at debug; failures (injected ones too) would
		// interleave with the progress bar.
		{Key: "log.level", Value: "error"},
		{Key: "log.format", Value: "text"},
		{Key: "transfer.sim.bandwidth_gbytes_per_s", Value: "0"},
		{Key: "transfer.sim.latency", Value: "0s"},
		{Key: "transfer.sim.seed", Value: strconv.FormatInt(o.seed, 10)},
	}
	// A pool large enough that admission never blocks at this concurrency:
	// each room reserves its fill, min(max_new_tokens, clip), the reserved
	// decode tokens and a page of rounding; twice that for every room in
	// flight, as finished rooms hand their pages back while new ones open.
	perRoom := int64(o.prompt.hi) + int64(min(o.maxNewTokens, max(cfg.Admission.ClipMaxNewTokens, 1))) +
		int64(cfg.Admission.ReservedDecodeTokens) + 2*int64(max(cfg.KVPool.PageSize, 1))
	if tokens := 2 * int64(o.concurrency) * perRoom; tokens > cfg.KVPool.TotalTokens {
		def = append(def, config.FlagSetting{Key: "kv_pool.total_tokens", Value: strconv.FormatInt(tokens, 10)})
	}
	if slots := 2 * o.concurrency; slots > cfg.KVPool.RequestSlots {
		def = append(def, config.FlagSetting{Key: "kv_pool.request_slots", Value: strconv.Itoa(slots)})
	}
	return def
}

// benchLoadConfig builds the in-process daemon's configuration: the
// embedded defaults, then the bench's defaults, then --config, the
// environment and the flags (--decode-tp, --sim-*, --set).
func benchLoadConfig(o *benchOptions, environ []string) (*config.Loaded, []error) {
	var pairs []config.FlagSetting
	if o.visited["decode-tp"] {
		pairs = append(pairs, config.FlagSetting{Flag: "--decode-tp", Key: "parallel.attn_tp", Value: strconv.Itoa(o.decodeTP)})
	}
	if o.visited["sim-bandwidth-gbytes-per-s"] {
		pairs = append(pairs, config.FlagSetting{Flag: "--sim-bandwidth-gbytes-per-s", Key: "transfer.sim.bandwidth_gbytes_per_s", Value: strconv.FormatFloat(o.simBandwidth, 'g', -1, 64)})
	}
	if o.visited["sim-latency"] {
		pairs = append(pairs, config.FlagSetting{Flag: "--sim-latency", Key: "transfer.sim.latency", Value: o.simLatency.String()})
	}
	if o.visited["page-owner"] {
		pairs = append(pairs, config.FlagSetting{Flag: "--page-owner", Key: "kv_pool.owner", Value: o.pageOwner})
	}
	pairs = append(pairs, o.sets...)
	// DECODEPLANE_CONFIG is the operator's daemon configuration; the bench's
	// daemon takes a file only from --config.
	l, err := config.Load(o.configPath, environ, config.Overrides{Pairs: pairs})
	var problems []error
	if err != nil {
		problems = append(problems, config.Flatten(err)...)
	}
	for _, d := range benchDefaults(o, l.Config) {
		src := l.Sources[d.Key]
		if !l.Has(d.Key) || src != "default" && !(benchOwnedKeys[d.Key] && !strings.HasPrefix(src, "flag ")) {
			continue
		}
		if d.Key == "kv_pool.total_tokens" && l.Sources["kv_pool.total_pages"] != "default" {
			continue // the operator sized the pool in pages
		}
		if err := l.Set(d.Key, d.Value, "bench default"); err != nil {
			problems = append(problems, fmt.Errorf("bench default %s=%s: %w", d.Key, d.Value, err))
		}
	}
	if err := l.Config.Validate(); err != nil {
		problems = append(problems, config.Flatten(err)...)
	}
	return l, problems
}

// benchStartDaemon builds the daemon with daemon.Build (as serve does) and
// serves it in this process on a loopback TCP listener.
func benchStartDaemon(ctx context.Context, o *benchOptions, environ []string, stderr io.Writer) (*benchTarget, error) {
	l, problems := benchLoadConfig(o, environ)
	if len(problems) > 0 {
		config.PrintProblems(stderr, l, problems)
		return nil, &config.UsageError{Err: errors.New("the in-process daemon's configuration is invalid (see above)")}
	}
	cfg := l.Config
	log := telemetry.NewLogger(stderr, cfg.Log)
	d, err := daemon.Build(ctx, cfg, daemon.Options{Logger: log, Version: o.version, Entries: daemon.Entries(l), Environ: environ})
	if err != nil {
		return nil, err
	}
	// In-process, the daemon's tracer provider is the global one (as in
	// serve); the bare-gRPC test serves with it.
	otel.SetTracerProvider(d.TracerProvider())
	otel.SetTextMapPropagator(d.Propagator())
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t := &benchTarget{addr: d.Addr().String(), token: cfg.Server.AuthToken, inProcess: true, cfg: cfg, metricsURL: d.MetricsURL()}
	t.stopFn = func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintf(stderr, "decodeplane bench: in-process daemon: %v\n", err)
		}
	}
	return t, nil
}

// benchDaemonStats are counters read from a daemon's /metrics.
type benchDaemonStats struct {
	cpuSeconds     float64 // process_cpu_seconds_total
	allocBytes     float64 // go_memstats_alloc_bytes_total
	mallocs        float64 // go_memstats_mallocs_total
	admissionBlock float64 // sum of decodeplane_admission_blocked_total
	admitted       float64 // sum of decodeplane_admission_admitted_total
}

func (s benchDaemonStats) sub(o benchDaemonStats) benchDaemonStats {
	return benchDaemonStats{
		cpuSeconds: s.cpuSeconds - o.cpuSeconds, allocBytes: s.allocBytes - o.allocBytes, mallocs: s.mallocs - o.mallocs,
		admissionBlock: s.admissionBlock - o.admissionBlock, admitted: s.admitted - o.admitted,
	}
}

// benchScrape reads the counters from a Prometheus text exposition.
func benchScrape(ctx context.Context, url string) (benchDaemonStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return benchDaemonStats{}, err
	}
	// Ask for the text format: the scrape parses lines.
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return benchDaemonStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return benchDaemonStats{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return benchParseMetrics(resp.Body)
}

func benchParseMetrics(r io.Reader) (benchDaemonStats, error) {
	var s benchDaemonStats
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		series, raw := line[:i], line[i+1:]
		name, _, _ := strings.Cut(series, "{")
		v, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			continue
		}
		switch name {
		case "process_cpu_seconds_total":
			s.cpuSeconds = v
		case "go_memstats_alloc_bytes_total":
			s.allocBytes = v
		case "go_memstats_mallocs_total":
			s.mallocs = v
		case "decodeplane_admission_blocked_total":
			s.admissionBlock += v
		case "decodeplane_admission_admitted_total":
			s.admitted += v
		default:
			continue
		}
		seen[name] = true
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	var missing []string
	for _, n := range []string{"process_cpu_seconds_total", "go_memstats_alloc_bytes_total", "go_memstats_mallocs_total"} {
		if !seen[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return s, fmt.Errorf("the exposition has no %s", strings.Join(missing, ", "))
	}
	return s, nil
}
