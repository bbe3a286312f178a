package metrics_test

import (
	"context"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/metrics"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// sglangReference is SGLang's decode-side metrics as its
// SchedulerMetricsCollector (python/sglang/srt/metrics/collector.py)
// declares them and the metrics routers read
// (docs/observability.md, "SGLang's names"): the name as exposed and its
// type. The transfer figures are histograms with SGLang's buckets.
var sglangReference = map[string]dto.MetricType{
	"sglang:num_decode_prealloc_queue_reqs":  dto.MetricType_GAUGE,
	"sglang:num_decode_transfer_queue_reqs":  dto.MetricType_GAUGE,
	"sglang:pending_prealloc_token_usage":    dto.MetricType_GAUGE,
	"sglang:num_retracted_reqs":              dto.MetricType_GAUGE,
	"sglang:num_transfer_failed_reqs_total":  dto.MetricType_COUNTER,
	"sglang:num_bootstrap_failed_reqs_total": dto.MetricType_COUNTER,
	"sglang:kv_transfer_latency_ms":          dto.MetricType_HISTOGRAM,
	"sglang:kv_transfer_speed_gb_s":          dto.MetricType_HISTOGRAM,
}

// sglangLabels are SGLang's scheduler labels (Scheduler.init_metrics),
// without dp_rank, which it adds under DP attention.
var sglangLabels = []string{"engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}

func labelNames(m *dto.Metric) []string {
	var names []string
	for _, l := range m.GetLabel() {
		names = append(names, l.GetName())
	}
	sort.Strings(names)
	return names
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestSGLangNamesMatchTheReference: the daemon serves each reference
// metric under SGLang's name and type with SGLang's labels (the model
// name from model.name, engine_type decode), no other sglang:* name, and
// SGLangNames lists exactly what it serves; with dp 2 the per-shard gauges
// carry dp_rank, one series per shard.
func TestSGLangNamesMatchTheReference(t *testing.T) {
	for _, dp := range []int{1, 2} {
		d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) { c.Model.Name, c.Parallel.DP = "meta-llama/Llama-3.1-8B-Instruct", dp }})
		md := &metricsDaemon{metrics: d.Metrics()}
		fams := md.scrape(t)
		var served []string
		for name := range fams {
			if strings.HasPrefix(name, "sglang:") {
				served = append(served, name)
			}
		}
		for name, typ := range sglangReference {
			f := fams[name]
			if f == nil {
				t.Errorf("dp %d: /metrics does not serve %s", dp, name)
				continue
			}
			if f.GetType() != typ {
				t.Errorf("dp %d: %s is a %v, SGLang's is a %v", dp, name, f.GetType(), typ)
			}
			perShard := typ == dto.MetricType_GAUGE
			want := sglangLabels
			if perShard && dp > 1 {
				want = []string{"dp_rank", "engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}
			}
			if n := len(f.GetMetric()); perShard && n != dp || !perShard && n != 1 {
				t.Errorf("dp %d: %s has %d series", dp, name, n)
			}
			for _, m := range f.GetMetric() {
				if got := labelNames(m); !slices.Equal(got, want) {
					t.Errorf("dp %d: %s labels %v, want SGLang's %v", dp, name, got, want)
				}
				if labelValue(m, "model_name") != "meta-llama/Llama-3.1-8B-Instruct" || labelValue(m, "engine_type") != "decode" || labelValue(m, "tp_rank") != "0" {
					t.Errorf("dp %d: %s labels %v", dp, name, m.GetLabel())
				}
			}
		}
		var listed []string
		for _, n := range metrics.SGLangNames {
			listed = append(listed, n.Name)
			if typ, ok := sglangReference[n.Name]; !ok || strings.ToLower(typ.String()) != n.Type {
				t.Errorf("SGLangNames lists %s as a %s", n.Name, n.Type)
			}
		}
		slices.Sort(served)
		slices.Sort(listed)
		if !slices.Equal(served, listed) || len(served) != len(sglangReference) {
			t.Errorf("dp %d: served sglang:* %v; SGLangNames %v; the reference has %d", dp, served, listed, len(sglangReference))
		}
	}
}

// TestSGLangMetricsOff: server.sglang_metrics false serves no sglang:*
// metric, and the decodeplane_* ones as before.
func TestSGLangMetricsOff(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) { c.Server.SGLangMetrics = false }})
	fams := (&metricsDaemon{metrics: d.Metrics()}).scrape(t)
	for name := range fams {
		if strings.HasPrefix(name, "sglang:") {
			t.Errorf("with server.sglang_metrics false /metrics serves %s", name)
		}
	}
	if fams["decodeplane_admission_queue_depth"] == nil {
		t.Error("with server.sglang_metrics false decodeplane_admission_queue_depth is gone too")
	}
}

// histogram returns the sample count and sum of a histogram family.
func histogram(fams map[string]*dto.MetricFamily, name string) (count uint64, sum float64) {
	for _, m := range fams[name].GetMetric() {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

// TestSGLangValuesEqualDecodeplane: with rooms in every state that moves
// them (two succeeded, one admitted, one waiting for an unregistered
// prefill, one failed before admission, one failed admitted), each sglang:*
// metric answers the value of its decodeplane_* equivalent (SGLangNames),
// and the values are the ones the rooms imply.
func TestSGLangValuesEqualDecodeplane(t *testing.T) {
	d := startMetricsDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d.register(t, ctx)
	d.succeed(t, ctx, 1)
	d.succeed(t, ctx, 2)
	open := func(room uint64, addr string, prompt uint32) {
		t.Helper()
		if _, err := d.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "rid", BootstrapAddr: addr, Room: room, PromptLen: prompt, MaxNewTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	abort := func(room uint64) {
		t.Helper()
		if _, err := d.rooms.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	const unknown = "10.1.0.2:8998" // never registers: its rooms wait
	open(3, metricsAddr, 100)       // admitted: SGLang's transfer queue
	open(4, unknown, 300)           // waiting: SGLang's prealloc queue
	open(5, unknown, 200)
	abort(5)                  // failed waiting: a bootstrap failure
	open(6, metricsAddr, 100) // admitted, then
	abort(6)                  // failed: a transfer failure
	fams := d.scrape(t)

	gauge := func(name string, labels map[string]string) float64 { return value(fams, name, labels) }
	type equality struct {
		name       string
		sglang, dp float64
		want       float64
	}
	checks := []equality{
		{"sglang:num_decode_prealloc_queue_reqs", gauge("sglang:num_decode_prealloc_queue_reqs", nil),
			gauge("decodeplane_admission_queue_depth", nil), 1},
		{"sglang:num_decode_transfer_queue_reqs", gauge("sglang:num_decode_transfer_queue_reqs", nil),
			gauge("decodeplane_ledger_rooms", map[string]string{"state": "admitted"}) + gauge("decodeplane_ledger_rooms", map[string]string{"state": "claimed"}), 1},
		{"sglang:pending_prealloc_token_usage", gauge("sglang:pending_prealloc_token_usage", nil),
			gauge("decodeplane_admission_queue_tokens", nil) / gauge("decodeplane_shard_tokens_total", nil), 300 / gauge("decodeplane_shard_tokens_total", nil)},
		{"sglang:num_retracted_reqs", gauge("sglang:num_retracted_reqs", nil),
			gauge("decodeplane_ledger_rooms", map[string]string{"state": "retracted"}), 0},
	}
	failed := func(phases ...string) float64 {
		var n float64
		for _, p := range phases {
			n += value(fams, "decodeplane_rooms_failed_by_phase_total", map[string]string{"phase": p})
		}
		return n
	}
	checks = append(checks,
		equality{"sglang:num_bootstrap_failed_reqs_total", gauge("sglang:num_bootstrap_failed_reqs_total", nil),
			failed("unspecified", "waiting_prefill", "resolving_dp_rank", "queued", "held"), 1},
		equality{"sglang:num_transfer_failed_reqs_total", gauge("sglang:num_transfer_failed_reqs_total", nil),
			failed("admitted", "claimed", "transferring"), 1})
	for _, c := range checks {
		if c.sglang != c.dp || c.sglang != c.want {
			t.Errorf("%s = %v; its decodeplane_* equivalent = %v; want both %v", c.name, c.sglang, c.dp, c.want)
		}
	}

	// The transfer histograms observe the same rooms as decodeplane's, in
	// SGLang's units.
	lc, ls := histogram(fams, "sglang:kv_transfer_latency_ms")
	dc, ds := histogram(fams, "decodeplane_room_destination_to_success_seconds")
	if lc != 2 || lc != dc || math.Abs(ls-1000*ds) > 1e-6*math.Max(ls, 1) {
		t.Errorf("sglang:kv_transfer_latency_ms count %d sum %v; decodeplane_room_destination_to_success_seconds count %d sum %v s; want 2 rooms, the same sum in ms", lc, ls, dc, ds)
	}
	sc, ss := histogram(fams, "sglang:kv_transfer_speed_gb_s")
	bc, bs := histogram(fams, "decodeplane_room_transfer_speed_bytes_per_second")
	if sc != 2 || sc != bc || math.Abs(ss*1e9-bs) > 1e-6*math.Max(bs, 1) {
		t.Errorf("sglang:kv_transfer_speed_gb_s count %d sum %v; decodeplane_room_transfer_speed_bytes_per_second count %d sum %v; want 2 rooms, the same sum in GB/s", sc, ss, bc, bs)
	}
}

// TestQueuedTokensDrain: decodeplane_admission_queue_tokens counts a
// waiting room's prompt and falls back to 0 once it is admitted (its
// prefill registers and receives the destination).
func TestQueuedTokensDrain(t *testing.T) {
	d := startMetricsDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "rid", BootstrapAddr: metricsAddr, Room: 7, PromptLen: 640, MaxNewTokens: 10}); err != nil {
		t.Fatal(err)
	}
	if got := value(d.scrape(t), "decodeplane_admission_queue_tokens", nil); got != 640 {
		t.Fatalf("decodeplane_admission_queue_tokens with one 640-token room waiting = %v", got)
	}
	d.register(t, ctx)
	st, err := d.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 7, Rank: &pb.PrefillRank{BootstrapAddr: metricsAddr}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Recv(); err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination(7) = %v, %v; want a destination", ev, err)
	}
	fams := d.scrape(t)
	if got := value(fams, "decodeplane_admission_queue_tokens", nil); got != 0 {
		t.Fatalf("decodeplane_admission_queue_tokens after admission = %v, want 0", got)
	}
	if got := value(fams, "sglang:pending_prealloc_token_usage", nil); got != 0 {
		t.Fatalf("sglang:pending_prealloc_token_usage after admission = %v, want 0", got)
	}
}
