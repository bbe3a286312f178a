package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The bench tests run `decodeplane bench` in-process (Main, as main does),
// with a daemon of its own on loopback TCP. They assert what the run did,
// never how fast: the machines are noisy.

// benchTestRun runs `decodeplane bench args...` with an environment that
// configures nothing (no OTEL_*, SGLANG_*, DECODEPLANE_*).
func benchTestRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main("test", args, []string{}, &out, &errb)
	return code, out.String(), errb.String()
}

// benchTestJSON parses a --json summary.
func benchTestJSON(t *testing.T, stdout string) benchJSON {
	t.Helper()
	var j benchJSON
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		t.Fatalf("the JSON summary does not parse: %v\n%s", err, stdout)
	}
	return j
}

// The table and JSON tests run the unary path (--api unary): its mix is
// fixed per room and it measures the bare-gRPC bound; TestBenchStreamAPI
// runs both.
func TestBenchInProcessTable(t *testing.T) {
	code, out, errOut := benchTestRun(t, "--api", "unary", "--rooms", "300", "--concurrency", "16", "--warmup", "20", "--bare-duration", "100ms")
	if code != exitOK {
		t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^rooms ok\s+300$`),
		regexp.MustCompile(`(?m)^rooms failed\s+0$`),
		regexp.MustCompile(`(?m)^latency \(ms\)\s+p50\s+p90\s+p99\s+max$`),
		regexp.MustCompile(`(?m)^open -> destination(\s+[0-9.]+){4}$`),
		regexp.MustCompile(`(?m)^destination -> success(\s+[0-9.]+){4}$`),
		regexp.MustCompile(`(?m)^lifecycle \(open->release\)(\s+[0-9.]+){4}$`),
		regexp.MustCompile(`(?m)^CPU per room\s+[0-9.]+ µs`),
		regexp.MustCompile(`(?m)^heap allocs per room\s+[0-9]+ objects`),
		// One chunk, one prefill rank: OpenRoom, Transfer, ReleaseRoom;
		// WatchRoom and AwaitDestination.
		regexp.MustCompile(`(?m)^messages per room\s+3\.00 unary calls \(OpenRoom 1\.00, Transfer 1\.00, ReleaseRoom 1\.00\)$`),
		regexp.MustCompile(`(?m)^\s+2\.00 stream opens \(WatchRoom 1\.00, AwaitDestination 1\.00\)$`),
		regexp.MustCompile(`(?m)^bare bound for this mix\s+[0-9]+ rooms/s`),
	} {
		if !want.MatchString(out) {
			t.Errorf("the summary does not match %s:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`(?m)^ratio\s+([0-9.eE+-]+)\s`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the summary has no ratio:\n%s", out)
	}
	if r, err := strconv.ParseFloat(m[1], 64); err != nil || r <= 0 || math.IsInf(r, 0) {
		t.Errorf("ratio %q, want a number in (0, inf)", m[1])
	}
}

func TestBenchInProcessJSON(t *testing.T) {
	// Prefill TP 2 -> decode TP 1 in two DP groups, in chunks of 4 pages.
	code, out, errOut := benchTestRun(t, "--api", "unary", "--rooms", "300", "--concurrency", "16", "--warmup", "20", "--bare-duration", "100ms",
		"--prefill-ranks", "2", "--dp", "2", "--chunk-pages", "4", "--prompt-len", "uniform:64-1024", "--json")
	if code != exitOK {
		t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	j := benchTestJSON(t, out)
	if j.RoomsOK != 300 || j.RoomsFailed != 0 || j.Interrupted {
		t.Errorf("rooms ok %d, failed %d, interrupted %v; want 300, 0, false (failures: %v)", j.RoomsOK, j.RoomsFailed, j.Interrupted, j.Failures)
	}
	if !j.InProcess || j.Mode != "closed-loop" || j.API != "unary" {
		t.Errorf("in_process %v, mode %q, api %q; want true, closed-loop, unary", j.InProcess, j.Mode, j.API)
	}
	for _, name := range []string{"open_to_destination", "destination_to_success", "lifecycle", "last_chunk_to_engine_told"} {
		p, ok := j.LatencyMS[name]
		if !ok || p.N != 300 || p.P50 <= 0 || p.P50 > p.P90 || p.P90 > p.P99 || p.P99 > p.Max {
			t.Errorf("latency %s = %+v, want 300 ordered percentiles", name, p)
		}
	}
	benchTestDelaysWithinLifecycle(t, j)
	// Two prefill ranks send every room; a prompt of 64+ tokens is at least
	// one 64-token page, so each rank sends at least one chunk.
	if got := j.Messages.ByMethod["AwaitDestination"].Calls; got != 2 {
		t.Errorf("AwaitDestination per room = %v, want 2", got)
	}
	if got := j.Messages.ByMethod["Transfer"].Calls; got < 2 {
		t.Errorf("Transfer per room = %v, want >= 2", got)
	}
	if j.Messages.StreamMessages < j.Messages.StreamOpens {
		t.Errorf("stream messages %v < stream opens %v", j.Messages.StreamMessages, j.Messages.StreamOpens)
	}
	if j.Bare == nil || j.Bare.Unary.PerSecond <= 0 || j.Bare.StreamOpen.PerSecond <= 0 {
		t.Errorf("bare = %+v, want measured rates", j.Bare)
	}
	if j.Ratio <= 0 || math.IsInf(j.Ratio, 0) || j.BoundRoomsPerSec <= 0 {
		t.Errorf("ratio %v, bound %v; want both in (0, inf)", j.Ratio, j.BoundRoomsPerSec)
	}
	benchTestBounds(t, j, "client")
	if j.BareNoOtel.Unary.PerSecond <= 0 || j.BareNoOtel.StreamOpen.PerSecond <= 0 || j.BareNoOtel.Mix != nil {
		t.Errorf("bare without otelgrpc = %+v, want the unary mix's parts measured", j.BareNoOtel)
	}
	if j.CPUSecondsPerRoom <= 0 || j.AllocsPerRoom <= 0 {
		t.Errorf("cpu per room %v, allocs per room %v; want > 0", j.CPUSecondsPerRoom, j.AllocsPerRoom)
	}
	if j.Daemon == nil || j.Daemon.AdmissionBlocked != 0 {
		t.Errorf("daemon = %+v, want the in-process daemon's metrics with admission never blocked", j.Daemon)
	}
}

// TestBenchRateModeStopsAtDuration runs the low-load mode on both apis:
// every room that succeeded has its open -> destination and last chunk ->
// engine told delays.
func TestBenchRateModeStopsAtDuration(t *testing.T) {
	for _, api := range []string{"stream", "unary"} {
		code, out, errOut := benchTestRun(t, "--api", api, "--rate", "200", "--duration", "1s", "--concurrency", "8", "--prefill-ranks", "2", "--json")
		if code != exitOK {
			t.Fatalf("--api %s: exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", api, code, out, errOut)
		}
		j := benchTestJSON(t, out)
		if j.Mode != "rate" || j.API != api || j.RoomsOK < 1 || j.RoomsFailed != 0 || j.Interrupted {
			t.Errorf("--api %s: mode %q, api %q, rooms ok %d, failed %d, interrupted %v; want rate, %s, >= 1, 0, false",
				api, j.Mode, j.API, j.RoomsOK, j.RoomsFailed, j.Interrupted, api)
		}
		if j.Bare != nil || j.BareNoOtel != nil || j.Ratio != 0 || !strings.Contains(j.BareSkipped, "rate mode") {
			t.Errorf("--api %s: bare %+v, ratio %v, skipped %q; want no bare measurement in rate mode", api, j.Bare, j.Ratio, j.BareSkipped)
		}
		for _, name := range []string{"open_to_destination", "last_chunk_to_engine_told"} {
			p, ok := j.LatencyMS[name]
			if !ok || p.N != int(j.RoomsOK) || p.P50 <= 0 || p.P50 > p.P90 || p.P90 > p.P99 || p.P99 > p.Max {
				t.Errorf("--api %s: latency %s = %+v, want %d ordered percentiles > 0", api, name, p, j.RoomsOK)
			}
		}
		benchTestDelaysWithinLifecycle(t, j)
	}
}

func TestBenchCountsInjectedFailures(t *testing.T) {
	// Every chunk fails with probability 0.3 (seeded): rooms fail, the run
	// ends, and since the failures were configured the exit code is 0.
	code, out, errOut := benchTestRun(t, "--rooms", "200", "--concurrency", "16", "--warmup", "0", "--bare-duration", "0",
		"--set", "transfer.sim.failure_probability=0.3", "--room-timeout", "30s", "--json")
	if code != exitOK {
		t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	j := benchTestJSON(t, out)
	if j.RoomsOK+j.RoomsFailed != 200 || j.RoomsFailed == 0 || j.RoomsOK == 0 {
		t.Fatalf("rooms ok %d, failed %d; want 200 in all, some of each", j.RoomsOK, j.RoomsFailed)
	}
	var counted int64
	for reason, f := range j.Failures {
		counted += f.Count
		if !strings.Contains(reason, "FAILURE_CODE_TRANSFER_FAILED") {
			t.Errorf("failure reason %q (e.g. %s), want the injected transfer failure", reason, f.Example)
		}
	}
	if counted != j.RoomsFailed {
		t.Errorf("failure reasons count %d rooms, want %d", counted, j.RoomsFailed)
	}
	if j.LatencyMS["lifecycle"].N != int(j.RoomsOK) {
		t.Errorf("lifecycle latencies of %d rooms, want the %d that succeeded", j.LatencyMS["lifecycle"].N, j.RoomsOK)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt-len", "uniform:9-3"}, "upper bound"},
		{[]string{"--prompt-len", "normal:5"}, "unknown distribution"},
		{[]string{"--concurrency", "0"}, "--concurrency 0"},
		{[]string{"--api", "grpc"}, `--api "grpc": must be unary or stream`},
		{[]string{"--queued", "10", "--api", "unary"}, "--api applies to the lifecycle"},
		{[]string{"--target", "127.0.0.1:1", "--decode-tp", "2"}, "--decode-tp applies to the in-process daemon only"},
		{[]string{"--metrics-url", "http://127.0.0.1:1/metrics"}, "--metrics-url needs --target"},
		{[]string{"--set", "kv_pool.page_size=3"}, "kv_pool.page_size"},
	} {
		code, out, errOut := benchTestRun(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want %d and %q (stdout %q)", tc.args, code, errOut, exitUsage, tc.want, out)
		}
	}
}

func TestBenchParseMetrics(t *testing.T) {
	s, err := benchParseMetrics(strings.NewReader(`# HELP process_cpu_seconds_total x
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
go_memstats_alloc_bytes_total 1.5e+06
go_memstats_mallocs_total 3000
decodeplane_admission_blocked_total{dp_rank="0",reason="tokens"} 2
decodeplane_admission_blocked_total{dp_rank="1",reason="req_slots"} 3
decodeplane_admission_admitted_total{dp_rank="0"} 10
`))
	if err != nil {
		t.Fatal(err)
	}
	want := benchDaemonStats{cpuSeconds: 12.5, allocBytes: 1.5e6, mallocs: 3000, admissionBlock: 5, admitted: 10}
	if s != want {
		t.Errorf("parsed %+v, want %+v", s, want)
	}
	if _, err := benchParseMetrics(strings.NewReader("up 1\n")); err == nil || !strings.Contains(err.Error(), "process_cpu_seconds_total") {
		t.Errorf("an exposition without the process metrics: err %v, want one naming them", err)
	}
}

func TestBenchStreamAPI(t *testing.T) {
	// The same short run on both apis (each against its own in-process
	// daemon): the stream path carries the rooms on two sessions' messages
	// instead of calls and streams per room.
	args := []string{"--rooms", "400", "--concurrency", "64", "--warmup", "20", "--bare-duration", "0",
		"--prefill-ranks", "2", "--json"}
	runs := map[string]benchJSON{}
	for _, api := range []string{"unary", "stream"} {
		code, out, errOut := benchTestRun(t, append([]string{"--api", api}, args...)...)
		if code != exitOK {
			t.Fatalf("--api %s: exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", api, code, out, errOut)
		}
		j := benchTestJSON(t, out)
		if j.API != api || j.RoomsOK != 400 || j.RoomsFailed != 0 || j.Interrupted {
			t.Errorf("--api %s: api %q, rooms ok %d, failed %d, interrupted %v; want %s, 400, 0, false (failures: %v)",
				api, j.API, j.RoomsOK, j.RoomsFailed, j.Interrupted, api, j.Failures)
		}
		if p := j.LatencyMS["open_to_destination"]; p.N != 400 {
			t.Errorf("--api %s: open -> destination of %d rooms, want 400 (the destination seen on the fleet's streams)", api, p.N)
		}
		runs[api] = j
	}
	u, s := runs["unary"].Messages, runs["stream"].Messages
	// Unary: OpenRoom, Transfer x2, ReleaseRoom; WatchRoom, AwaitDestination x2.
	if u.Unary != 4 || u.StreamOpens != 3 || u.StreamSent != 0 {
		t.Errorf("unary mix %+v, want 4 unary calls, 3 stream opens, nothing sent on sessions", u)
	}
	// Stream: no call, and the sessions were opened in the warm-up (or
	// again, at most once per connection, after one ended).
	if s.Unary != 0 || s.StreamOpens*400 > 3 {
		t.Errorf("stream mix %+v, want no unary call and at most 3 session opens in 400 rooms", s)
	}
	// Each prefill rank claims and sends its one chunk on its session
	// (2 ops, plus the session's pings), and receives the claim's result,
	// the destination, the chunk's result and the room's end: 4 ops and 8
	// events per room for 2 ranks, which the sessions may pack into fewer
	// messages (PrefillRequest.more, PrefillEvent.more), never more.
	if ps := s.ByMethod["PrefillSession"]; ps.Sent <= 0 || ps.Sent > 4.1 || ps.Messages <= 0 || ps.Messages > 8.1 {
		t.Errorf("stream mix PrefillSession = %+v, want (0, 4] sent, (0, 8] received per room (2 ranks; pings aside)", ps)
	}
	// The engine: an open (batched) and a release sent; the open's reply
	// (batched), the room's outcome alone (ENGINE_EVENTS_OUTCOME: not one
	// event per transition) and the release's reply received.
	if es := s.ByMethod["EngineSession"]; es.Sent <= 0 || es.Sent > 2 || es.Messages <= 0 || es.Messages > 3 {
		t.Errorf("stream mix EngineSession = %+v, want (0, 2] sent (release + batched open), (0, 3] received (replies + the outcome)", es)
	}
	for _, m := range []string{"OpenRoom", "WatchRoom", "AwaitDestination", "Transfer", "ReleaseRoom"} {
		if _, ok := s.ByMethod[m]; ok {
			t.Errorf("stream mix has %s: %+v", m, s.ByMethod[m])
		}
	}
	// What a room opens on the wire, calls and streams: 7 per room unary,
	// none on the stream path (its messages ride on open streams).
	if uc, sc := u.Unary+u.StreamOpens, s.Unary+s.StreamOpens; sc >= uc/100 {
		t.Errorf("calls and stream opens per room: stream %v, unary %v; want under a hundredth", sc, uc)
	}
	if want := s.StreamMessages + s.StreamSent; math.Abs(s.Total-want) > 1e-9 {
		t.Errorf("stream messages in all %v, want received %v + sent %v", s.Total, s.StreamMessages, s.StreamSent)
	}
}
