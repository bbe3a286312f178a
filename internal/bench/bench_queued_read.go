package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A --queued reading: the daemon's RSS once it settled after a garbage
// collection, and its Go heap from /metrics; and the run's table.

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
