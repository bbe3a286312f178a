package bench

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

// TestBenchQueuedEndToEnd runs the real binary's `bench --queued` (which
// runs decodeplane-bench), which starts the real binary's `serve` as its
// child, keeps 2,000 rooms queued and measures the child. The figures are
// asserted to be measured and plausible, never to be fast or small: the
// machines are shared.
func TestBenchQueuedEndToEnd(t *testing.T) {
	// decodeplane bench runs decodeplane-bench from its own directory, which
	// starts decodeplane serve from there: e2e.Binary builds both into one.
	e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-bench")
	bin := e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane")
	const rooms = 10000 // ~4 MiB of queued rooms: well above the GC noise of a heap reading
	cmd := exec.Command(bin, "bench", "--queued", strconv.Itoa(rooms), "--concurrency", "32", "--settle-timeout", "2m", "--json")
	cmd.Env = e2e.Environ()
	stderr := e2e.NewOutput()
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench --queued: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	var j benchQueuedJSON
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		t.Fatalf("the JSON summary does not parse: %v\n%s", err, out)
	}
	if j.Mode != "queued" || !j.ChildDaemon || j.PID <= 0 || j.Rooms != rooms || j.Shards != 1 || j.FillerRooms != 1 {
		t.Errorf("mode %q, child %v, pid %d, rooms %d, shards %d, fillers %d; want queued, true, > 0, %d, 1, 1", j.Mode, j.ChildDaemon, j.PID, j.Rooms, j.Shards, j.FillerRooms, rooms)
	}
	// The daemon itself counted the rooms as queued, blocked by tokens.
	if v := j.Verified; v.ShardQueued != rooms || v.ListQueued != rooms || len(v.BlockedBy) != 1 || v.BlockedBy[0] != "tokens" {
		t.Errorf("verified %+v, want %d queued by GetStatus and ListRooms, blocked by tokens", v, rooms)
	}
	for name, r := range map[string]benchQueuedReading{"baseline": j.Baseline, "queued": j.Queued} {
		// A Go daemon with its gRPC server is more than 4 MiB and (here)
		// well under 4 GiB resident.
		if r.RSSBytes < 4<<20 || r.RSSBytes > 4<<30 {
			t.Errorf("%s RSS %d bytes, want a resident size in [4 MiB, 4 GiB]", name, r.RSSBytes)
		}
		if r.HeapAllocBytes <= 0 || r.HeapObjects <= 0 || r.HeapInuseBytes < r.HeapAllocBytes {
			t.Errorf("%s heap %+v, want heap figures read from /metrics", name, r)
		}
		if !r.GCObserved {
			t.Errorf("%s reading: no garbage collection observed within --settle-timeout", name)
		}
	}
	// A queued room holds its request, its state and its deadline: more
	// than 100 bytes, far less than 1 MiB.
	p := j.PerRoom
	if p.HeapAllocBytes < 100 || p.HeapAllocBytes > 1<<20 || p.HeapObjects <= 0 {
		t.Errorf("heap per queued room %.0f B, %.1f objects; want in [100 B, 1 MiB] and > 0 objects", p.HeapAllocBytes, p.HeapObjects)
	}
	if p.RSSBytes <= 0 || p.RSSBytes > 1<<20 || j.Queued.RSSBytes <= j.Baseline.RSSBytes {
		t.Errorf("RSS per queued room %.0f B (baseline %d, queued %d); want in (0, 1 MiB] and the RSS grown", p.RSSBytes, j.Baseline.RSSBytes, j.Queued.RSSBytes)
	}
	if got := p.RSSKiB * 1024; got != p.RSSBytes {
		t.Errorf("rss_kib %v is not rss_bytes %v / 1024", p.RSSKiB, p.RSSBytes)
	}
}

func TestBenchQueuedFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--queued", "-1"}, "--queued -1"},
		{[]string{"--queued", "10", "--target", "127.0.0.1:1"}, "needs --target-pid"},
		{[]string{"--target-pid", "1", "--target", "127.0.0.1:1"}, "--target-pid applies to --queued only"},
		{[]string{"--queued", "10", "--rate", "5"}, "--rate applies to the lifecycle"},
		{[]string{"--queued", "10", "--settle-timeout", "0s"}, "--settle-timeout 0s"},
		{[]string{"--queued", "10", "--metrics-url", "http://127.0.0.1:1/metrics"}, "--metrics-url needs --target"},
	} {
		code, out, errOut := benchTestRun(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want %d and %q (stdout %q)", tc.args, code, errOut, exitUsage, tc.want, out)
		}
	}
}

func TestBenchParseGauges(t *testing.T) {
	g, err := benchParseGauges(strings.NewReader(`# HELP go_gc_duration_seconds x
go_gc_duration_seconds{quantile="0"} 1e-05
go_gc_duration_seconds_sum 0.5
go_gc_duration_seconds_count 7
go_memstats_heap_alloc_bytes 1.5e+06
go_memstats_heap_inuse_bytes 2e+06
go_memstats_heap_objects 3000
go_memstats_sys_bytes 8e+06
go_memstats_heap_alloc_bytes_total 9
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"go_gc_duration_seconds_count": 7, "go_memstats_heap_alloc_bytes": 1.5e6, "go_memstats_heap_inuse_bytes": 2e6, "go_memstats_heap_objects": 3000, "go_memstats_sys_bytes": 8e6}
	for k, v := range want {
		if g[k] != v {
			t.Errorf("%s = %v, want %v", k, g[k], v)
		}
	}
	if len(g) != len(want) {
		t.Errorf("parsed %v, want exactly %v", g, want)
	}
	if _, err := benchParseGauges(strings.NewReader("up 1\n")); err == nil || !strings.Contains(err.Error(), "go_gc_duration_seconds_count") {
		t.Errorf("an exposition without the Go metrics: err %v, want one naming them", err)
	}
}
