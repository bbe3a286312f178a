package bench

import (
	"context"
	"math"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/encoding/protowire"
)

// benchTestClose reports whether a and b agree to a relative 1e-9.
func benchTestClose(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

// benchTestBounds checks the two bare bounds of a closed-loop run: the
// run's otelgrpc configuration (wantOtel) and none, each with its ratio
// rooms/s / bound.
func benchTestBounds(t *testing.T, j benchJSON, wantOtel string) {
	t.Helper()
	if j.Bare == nil || j.BareNoOtel == nil {
		t.Fatalf("bare %+v, bare without otelgrpc %+v; want both measured (skipped: %q)", j.Bare, j.BareNoOtel, j.BareSkipped)
	}
	if j.Bare.Otelgrpc != wantOtel || j.BareNoOtel.Otelgrpc != "none" {
		t.Errorf("otelgrpc %q and %q, want %q (as the daemon and client.New install them, tracing off) and none", j.Bare.Otelgrpc, j.BareNoOtel.Otelgrpc, wantOtel)
	}
	for _, b := range []struct {
		name                   string
		bound, ratio, cpu, cpr float64
	}{{"bare", j.BoundRoomsPerSec, j.Ratio, j.BareCPUPerRoom, j.CPURatio}, {"bare without otelgrpc", j.BoundNoOtel, j.RatioNoOtel, j.BareCPUNoOtel, j.CPURatioNoOtel}} {
		if b.bound <= 0 || math.IsInf(b.bound, 0) || !benchTestClose(b.ratio, j.RoomsPerSecond/b.bound) {
			t.Errorf("%s: bound %v rooms/s, ratio %v; want a bound in (0, inf) and ratio = %v rooms/s / bound", b.name, b.bound, b.ratio, j.RoomsPerSecond)
		}
		// In-process, the bench's CPU per room is the whole room's.
		if b.cpu <= 0 || !benchTestClose(b.cpr, b.cpu/j.CPUSecondsPerRoom) {
			t.Errorf("%s: bare CPU per room %v, CPU ratio %v; want > 0 and bare CPU / measured CPU %v", b.name, b.cpu, b.cpr, j.CPUSecondsPerRoom)
		}
	}
}

// benchTestDelaysWithinLifecycle checks that the delays inside a room are
// no longer than its lifecycle: over the same rooms, each percentile of a
// shorter span is at most the lifecycle's.
func benchTestDelaysWithinLifecycle(t *testing.T, j benchJSON) {
	t.Helper()
	life := j.LatencyMS["lifecycle"]
	for _, name := range []string{"open_to_destination", "last_chunk_to_engine_told"} {
		p := j.LatencyMS[name]
		if p.N != life.N {
			t.Errorf("latency %s of %d rooms, lifecycle of %d: want the same rooms", name, p.N, life.N)
			continue
		}
		if p.P50 < 0 || p.P50 > life.P50 || p.P90 > life.P90 || p.P99 > life.P99 || p.Max > life.Max {
			t.Errorf("latency %s = %+v, lifecycle %+v: want each percentile in [0, the lifecycle's]", name, p, life)
		}
	}
}

// TestBenchStreamBareBound runs the stream api with its bare phase: the
// bare rooms carry the mix the run measured, and the ratios are against
// their rate.
func TestBenchStreamBareBound(t *testing.T) {
	const conc = 16
	code, out, errOut := benchTestRun(t, "--api", "stream", "--rooms", "300", "--concurrency", "16", "--warmup", "20",
		"--bare-duration", "300ms", "--prefill-ranks", "2", "--json")
	if code != exitOK {
		t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	j := benchTestJSON(t, out)
	if j.API != "stream" || j.RoomsOK != 300 || j.RoomsFailed != 0 {
		t.Errorf("api %q, rooms ok %d, failed %d; want stream, 300, 0 (failures %v)", j.API, j.RoomsOK, j.RoomsFailed, j.Failures)
	}
	benchTestBounds(t, j, "client")
	for _, b := range []*benchBare{j.Bare, j.BareNoOtel} {
		if b == nil {
			continue
		}
		m := b.Mix
		if m == nil {
			t.Fatalf("bare (otelgrpc %s) has no stream mix: %+v", b.Otelgrpc, b)
		}
		if b.Unary.PerSecond != 0 || b.StreamOpen.PerSecond != 0 {
			t.Errorf("bare (otelgrpc %s) measured the unary parts for the stream api: %+v", b.Otelgrpc, b)
		}
		// The mix is the run's: per room, what the sessions sent and
		// received (two prefill ranks, each on its own session).
		es, ps := j.Messages.ByMethod["EngineSession"], j.Messages.ByMethod["PrefillSession"]
		if m.Engine.Streams != 1 || m.Prefill.Streams != 2 ||
			!benchTestClose(m.Engine.Sent, es.Sent) || !benchTestClose(m.Engine.Received, es.Messages) ||
			!benchTestClose(2*m.Prefill.Sent, ps.Sent) || !benchTestClose(2*m.Prefill.Received, ps.Messages) {
			t.Errorf("stream mix %+v, want the run's per room: EngineSession %+v, PrefillSession %+v over 2 streams", m, es, ps)
		}
		if m.Engine.SentBytes <= 0 || m.Engine.ReceivedBytes <= 0 || m.Prefill.SentBytes <= 0 || m.Prefill.ReceivedBytes <= 0 {
			t.Errorf("stream mix sizes %+v, want the sessions' messages' mean sizes", m)
		}
		// The bare rooms carried that mix: what the wire counted in the
		// measured window, per room completed in it, is the mix's, but for
		// the rooms in flight at either end of the window.
		r := b.StreamMix
		sent, recv := m.total()
		if r.PerSecond <= 0 || r.Ops <= 0 {
			t.Fatalf("bare stream mix (otelgrpc %s) = %+v, want rooms measured", b.Otelgrpc, r)
		}
		slack := 2 * conc * (math.Ceil(recv) + 1) / float64(r.Ops)
		if math.Abs(r.SentPerOp-sent) > slack || math.Abs(r.ReceivedPerOp-recv) > slack {
			t.Errorf("bare stream mix (otelgrpc %s) counted %.3f sent, %.3f received per room; want the mix's %.3f, %.3f (± %.3f)",
				b.Otelgrpc, r.SentPerOp, r.ReceivedPerOp, sent, recv, slack)
		}
	}
	if j.Bare != nil && !benchTestClose(j.BoundRoomsPerSec, j.Bare.StreamMix.PerSecond) {
		t.Errorf("bound %v rooms/s, want the bare stream mix's rate %v", j.BoundRoomsPerSec, j.Bare.StreamMix.PerSecond)
	}
	if j.Bare != nil && !benchTestClose(j.BareCPUPerRoom, j.Bare.StreamMix.CPUMicrosPerOp/1e6) {
		t.Errorf("bare CPU per room %v s, want the bare stream mix's %v µs", j.BareCPUPerRoom, j.Bare.StreamMix.CPUMicrosPerOp)
	}
}

func TestBenchSpread(t *testing.T) {
	for _, m := range []float64{0, 0.25, 1, 1.06, 2.5, 8.0625} {
		var sum int64
		for k := range int64(1000) {
			n := benchSpread(k, m)
			if n < int64(math.Floor(m)) || n > int64(math.Ceil(m)) {
				t.Fatalf("mean %v: room %d gets %d", m, k, n)
			}
			sum += n
		}
		if want := int64(math.Floor(1000 * m)); sum != want {
			t.Errorf("mean %v: 1000 rooms get %d, want %d", m, sum, want)
		}
	}
}

func TestBenchPad(t *testing.T) {
	for _, base := range []int{2, 8} {
		for target := base + 3; target < 400; target++ {
			l := benchPad(float64(target), base)
			size := base + 1 + protowire.SizeVarint(uint64(l)) + l
			if size > target || size < target-2 {
				t.Errorf("base %d, target %d: pad %d makes %d bytes", base, target, l, size)
			}
		}
		if l := benchPad(float64(base), base); l != 0 {
			t.Errorf("base %d, target %d: pad %d, want none", base, base, l)
		}
	}
}

func TestBenchStreamMixOf(t *testing.T) {
	groups := [][]benchSender{{nil, nil}}
	lc := &benchPhase{ok: 10}
	lc.counts.Sent[benchEngineSessionMethod], lc.counts.Msgs[benchEngineSessionMethod] = 10, 80
	lc.counts.SentBytes[benchEngineSessionMethod], lc.counts.RecvBytes[benchEngineSessionMethod] = 500, 8000
	lc.counts.Sent[benchPrefillSessionMethod], lc.counts.Msgs[benchPrefillSessionMethod] = 40, 80
	lc.counts.SentBytes[benchPrefillSessionMethod], lc.counts.RecvBytes[benchPrefillSessionMethod] = 1600, 3200
	m, why := benchStreamMixOf(lc, groups)
	if m == nil {
		t.Fatalf("no mix: %s", why)
	}
	want := benchBareMix{Source: m.Source,
		Engine:  benchBareSessionMix{Streams: 1, Sent: 1, Received: 8, SentBytes: 50, ReceivedBytes: 100},
		Prefill: benchBareSessionMix{Streams: 2, Sent: 2, Received: 4, SentBytes: 40, ReceivedBytes: 40}}
	if *m != want {
		t.Errorf("mix %+v, want %+v", *m, want)
	}
	lc.counts.Sent[benchEngineSessionMethod] = 0
	if m, why := benchStreamMixOf(lc, groups); m != nil || !strings.Contains(why, "EngineSession") {
		t.Errorf("engine messages received, none sent: mix %+v, %q; want none, naming the session", m, why)
	}
	if m, why := benchStreamMixOf(&benchPhase{}, groups); m != nil || why == "" {
		t.Errorf("no room: mix %+v, %q; want none and why", m, why)
	}
}

// TestBenchBareVariants: the bound the ratio uses has the otelgrpc server
// handler exactly when the daemon installs one (a tracer provider that is
// not the no-op one), the client's always; the other has none.
func TestBenchBareVariants(t *testing.T) {
	sdk := sdktrace.NewTracerProvider()
	defer sdk.Shutdown(context.Background())
	for _, tc := range []struct {
		tp   trace.TracerProvider
		want string
	}{{noop.NewTracerProvider(), "client"}, {sdk, "client+server"}} {
		b := &benchRun{tgt: &benchTarget{}, tr: &benchTracing{provider: tc.tp}}
		v := b.benchBareVariants()
		if v[0].String() != tc.want || v[1].String() != "none" {
			t.Errorf("provider %T: variants %s, %s; want %s, none", tc.tp, v[0], v[1], tc.want)
		}
	}
}
