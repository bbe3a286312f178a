package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/decodeplane/decodeplane/kvmanager"
)

// SGLang's decode-side metrics under SGLang's own names, meanings and
// labels (its SchedulerMetricsCollector), next to decodeplane_*, so that
// routers and dashboards that read an SGLang decode instance (AIBrix reads
// sglang:num_decode_prealloc_queue_reqs; Dynamo's SGLang dashboards the
// whole family) read a decodeplane daemon unchanged. Each is the value of
// decodeplane_* metrics (SGLangNames says which); server.sglang_metrics
// turns them off.
//
// Labels are SGLang's scheduler labels: model_name (model.name), engine_type
// "decode", tp_rank, pp_rank and moe_ep_rank "0" (the rank that reports in
// SGLang), and dp_rank on the per-shard gauges when the decode runs more
// than one DP shard (SGLang adds it under DP attention). The counters and
// histograms are the daemon's, without dp_rank.

// SGLangName is one sglang:* metric and the decodeplane_* metrics it
// equals.
type SGLangName struct {
	Name, Type, Equals string
}

// SGLangNames are the sglang:* metrics the daemon serves, with the
// decodeplane_* expression each one equals.
var SGLangNames = []SGLangName{
	{"sglang:num_decode_prealloc_queue_reqs", "gauge", `sum by (dp_rank) (decodeplane_admission_queue_depth): rooms opened and not admitted (waiting for the prefill's registration or DP rank, or queued for KV), per shard`},
	{"sglang:num_decode_transfer_queue_reqs", "gauge", `sum by (dp_rank) (decodeplane_ledger_rooms{state=~"admitted|claimed"}): rooms with pages pre-allocated whose KV has not all landed, per shard`},
	{"sglang:pending_prealloc_token_usage", "gauge", `decodeplane_admission_queue_tokens / decodeplane_shard_tokens_total: the tokens the queued rooms would pre-allocate, as a fraction of the shard's pool`},
	{"sglang:num_retracted_reqs", "gauge", `decodeplane_ledger_rooms{state="retracted"}: rooms whose pages are retracted, per shard`},
	{"sglang:num_bootstrap_failed_reqs_total", "counter", `sum(decodeplane_rooms_failed_by_phase_total{phase=~"unspecified|waiting_prefill|resolving_dp_rank|queued|held"}): rooms that failed before they had pages (SGLang's prealloc queue)`},
	{"sglang:num_transfer_failed_reqs_total", "counter", `sum(decodeplane_rooms_failed_by_phase_total{phase=~"admitted|claimed|transferring"}): rooms that failed with pages pre-allocated (SGLang's transfer queue)`},
	{"sglang:kv_transfer_latency_ms", "histogram", `decodeplane_room_destination_to_success_seconds in milliseconds: admission (pages pre-allocated) to all KV landed, per succeeded room`},
	{"sglang:kv_transfer_speed_gb_s", "histogram", `decodeplane_room_transfer_speed_bytes_per_second in GB/s (10^9 bytes): a succeeded room's KV bytes over its admission-to-success time (rooms whose chunks reported bytes)`},
}

// The phases a failed room was in when it counts as SGLang's bootstrap
// failure (no pages yet) or transfer failure (pages pre-allocated).
func bootstrapPhase(p kvmanager.Phase) bool {
	switch p {
	case kvmanager.PhaseUnspecified, kvmanager.PhaseWaitingPrefill, kvmanager.PhaseResolvingDP, kvmanager.PhaseQueued, kvmanager.PhaseHeld:
		return true
	}
	return false
}

func transferPhase(p kvmanager.Phase) bool {
	return p == kvmanager.PhaseAdmitted || p == kvmanager.PhaseClaimed || p == kvmanager.PhaseTransferring
}

// SGLang's buckets for the transfer histograms.
var (
	sglangLatencyBuckets = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000}
	sglangSpeedBuckets   = []float64{0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400}
)

// SGLangLabels are what the sglang:* labels carry.
type SGLangLabels struct {
	// ModelName is model.name (SGLang's --served-model-name).
	ModelName string
	// DPShards is the decode's DP shard count: dp_rank is a label when it
	// is more than 1.
	DPShards int
}

// sglangMetrics are the sglang:* metrics: the event-driven ones here, the
// gauges read at scrape time (sglangCollector).
type sglangMetrics struct {
	constLabels    prometheus.Labels
	dpLabel        bool
	bootstrapFail  prometheus.Counter
	transferFail   prometheus.Counter
	latency, speed prometheus.Histogram
	descs          [4]*prometheus.Desc // prealloc queue, transfer queue, pending usage, retracted
}

// EnableSGLang serves the sglang:* metrics (server.sglang_metrics). Call it
// once, before Attach and before any room event.
func (m *Metrics) EnableSGLang(l SGLangLabels) {
	cl := prometheus.Labels{"model_name": l.ModelName, "engine_type": "decode", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
	s := &sglangMetrics{constLabels: cl, dpLabel: l.DPShards > 1}
	s.bootstrapFail = prometheus.NewCounter(prometheus.CounterOpts{Name: "sglang:num_bootstrap_failed_reqs_total", Help: "The number of bootstrap failed requests.", ConstLabels: cl})
	s.transferFail = prometheus.NewCounter(prometheus.CounterOpts{Name: "sglang:num_transfer_failed_reqs_total", Help: "The number of transfer failed requests.", ConstLabels: cl})
	s.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sglang:kv_transfer_latency_ms", Help: "Histogram of KV cache transfer latency in ms.", Buckets: sglangLatencyBuckets, ConstLabels: cl})
	s.speed = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sglang:kv_transfer_speed_gb_s", Help: "Histogram of KV cache transfer speed in GB/s.", Buckets: sglangSpeedBuckets, ConstLabels: cl})
	var shardLabels []string
	if s.dpLabel {
		shardLabels = []string{"dp_rank"}
	}
	for i, d := range []struct{ name, help string }{
		{"sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."},
		{"sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."},
		{"sglang:pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."},
		{"sglang:num_retracted_reqs", "The number of retracted requests."},
	} {
		s.descs[i] = prometheus.NewDesc(d.name, d.help, shardLabels, cl)
	}
	m.reg.MustRegister(s.bootstrapFail, s.transferFail, s.latency, s.speed, sglangCollector{m: m, s: s})
	m.sglang = s
}

// roomFailed counts a room that failed in phase from.
func (s *sglangMetrics) roomFailed(from kvmanager.Phase) {
	switch {
	case bootstrapPhase(from):
		s.bootstrapFail.Inc()
	case transferPhase(from):
		s.transferFail.Inc()
	}
}

// transferred observes a succeeded room's transfer.
func (s *sglangMetrics) transferred(seconds float64, bytes uint64) {
	s.latency.Observe(seconds * 1000)
	if bytes > 0 && seconds > 0 {
		s.speed.Observe(float64(bytes) / 1e9 / seconds)
	}
}

// sglangCollector reads the per-shard gauges from the ledgers at scrape
// time.
type sglangCollector struct {
	m *Metrics
	s *sglangMetrics
}

func (c sglangCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.s.descs {
		ch <- d
	}
}

func (c sglangCollector) Collect(ch chan<- prometheus.Metric) {
	mgr := c.m.attached()
	if mgr == nil {
		return
	}
	total := map[int]int64{}
	for _, sc := range mgr.Capacity() {
		total[sc.Shard] = sc.TokensTotal
	}
	for _, st := range mgr.ShardStats() {
		var labels []string
		if c.s.dpLabel {
			labels = []string{strconv.Itoa(st.Shard)}
		}
		usage := 0.0
		if t := total[st.Shard]; t > 0 {
			usage = float64(st.QueuedTokens) / float64(t)
		}
		for i, v := range []float64{float64(st.Waiting + st.Ready), float64(st.Admitted + st.Claimed), usage, float64(st.Retracted)} {
			ch <- prometheus.MustNewConstMetric(c.s.descs[i], prometheus.GaugeValue, v, labels...)
		}
	}
}
