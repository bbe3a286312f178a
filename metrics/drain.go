package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Deferred release (kvmanager/drain.go): the pages of ended rooms that wait
// for their prefill ranks' AckRoomEnd, per shard, and the acknowledgements
// received or given up on.

var descDraining = prometheus.NewDesc("decodeplane_pages_draining",
	"KV pages of ended rooms waiting for their prefill ranks' AckRoomEnd (not free, not reusable), by decode DP shard.", []string{"dp_rank"}, nil)

// drainMetrics is the deferred release's counter.
type drainMetrics struct {
	acks *prometheus.CounterVec
}

func newDrainMetrics() drainMetrics {
	return drainMetrics{acks: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "decodeplane_room_end_acks_total",
		Help: "Prefill ranks' room-end acknowledgements owed by ended rooms: acked (AckRoomEnd) or expired (release.deferred_timeout passed, released with a warning).",
	}, []string{"outcome"})}
}

// register adds the counter (both outcomes at zero) and the gauge's collector.
func (d drainMetrics) register(reg *prometheus.Registry, m *Metrics) {
	d.acks.WithLabelValues("acked")
	d.acks.WithLabelValues("expired")
	reg.MustRegister(d.acks, drainCollector{m})
}

// RoomEndAcks counts acknowledgements by outcome (kvmanager.Observer).
func (m *Metrics) RoomEndAcks(outcome string, n int) {
	m.drain.acks.WithLabelValues(outcome).Add(float64(n))
}

// drainCollector reports decodeplane_pages_draining from the ledgers'
// stats at scrape time.
type drainCollector struct{ m *Metrics }

func (c drainCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descDraining }

func (c drainCollector) Collect(ch chan<- prometheus.Metric) {
	mgr := c.m.attached()
	if mgr == nil {
		return
	}
	for _, st := range mgr.ShardStats() {
		ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, float64(st.Pages.Draining), strconv.Itoa(st.Shard))
	}
}
