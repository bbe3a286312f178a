package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// engineMetrics count what happens when the decode engine owns the pages
// (kv_pool.owner: engine), and report its hand-off ledger at scrape time.
type engineMetrics struct {
	// refused: declarations refused because a page, row or slot they named
	// was still held by another room's hand-off (the reuse-while-a-write-
	// may-land bug class, caught at the boundary).
	refused *prometheus.CounterVec
}

func newEngineMetrics() engineMetrics {
	return engineMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_declarations_refused_total",
			Help: "Destinations the decode engine declared that named a page, row or slot another room's hand-off still held (kv_pool.owner: engine), by decode DP shard: the engine reused them too early.",
		}, []string{"dp_rank"}),
	}
}

func (e engineMetrics) collectors() []prometheus.Collector { return []prometheus.Collector{e.refused} }

var (
	descHoldRooms = prometheus.NewDesc("decodeplane_handoff_rooms",
		"The hand-off ledger of a decode DP shard whose pages the decode engine owns (kv_pool.owner: engine), by state: rooms waiting for their declaration (queued), declared rooms whose hand-off has not ended (held, draining included), and those of them that failed and wait for their prefill ranks' acknowledgements (draining).", []string{"dp_rank", "state"}, nil)
	descHoldPages = prometheus.NewDesc("decodeplane_handoff_pages",
		"Pages the declared rooms of a decode DP shard hold until their hand-off ends (kv_pool.owner: engine), by state: held (draining included) and draining; the engine must not reuse them.", []string{"dp_rank", "state"}, nil)
)

// holdsCollector reports the hand-off ledgers (Manager.Status().Holds;
// nothing when the daemon owns the pages) at scrape time.
type holdsCollector struct{ m *Metrics }

func (c holdsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHoldRooms
	ch <- descHoldPages
}

func (c holdsCollector) Collect(ch chan<- prometheus.Metric) {
	mgr := c.m.attached()
	if mgr == nil {
		return
	}
	g := func(d *prometheus.Desc, v int64, labels ...string) { gauge(ch, d, v, labels...) }
	for _, h := range mgr.HoldStats() {
		s := strconv.Itoa(h.Shard)
		g(descHoldRooms, int64(h.Queued), s, "queued")
		g(descHoldRooms, int64(h.Held), s, "held")
		g(descHoldRooms, int64(h.Draining), s, "draining")
		g(descHoldPages, h.HeldPages, s, "held")
		g(descHoldPages, h.DrainingPages, s, "draining")
	}
}

// DeclarationRefused implements kvmanager.Observer.
func (m *Metrics) DeclarationRefused(shard int) {
	m.engine.refused.WithLabelValues(strconv.Itoa(shard)).Inc()
}
