package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// engineMetrics count what happens when the decode engine owns the pages
// (kv_pool.owner: engine).
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

// DeclarationRefused implements kvmanager.Observer.
func (m *Metrics) DeclarationRefused(shard int) {
	m.engine.refused.WithLabelValues(strconv.Itoa(shard)).Inc()
}
