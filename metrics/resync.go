package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// resyncMetrics count the decode engine's resync after a restart
// (kvmanager.Observer) and the prefill instances seen restarting.
type resyncMetrics struct {
	duration prometheus.Histogram
	adopted  prometheus.Counter
	expired  prometheus.Counter
	// incarnations: prefill instances replaced behind their bootstrap
	// address by a new instance_id (kvmanager.Observer).
	incarnations prometheus.Counter
}

func newResyncMetrics() resyncMetrics {
	return resyncMetrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "decodeplane_resync_duration_seconds",
			Help:    "Time from the daemon's start to the end of the decode engine's resync wait (done, or engine.resync_timeout expired).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
		}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "decodeplane_resync_rooms_adopted_total",
			Help: "Running rooms the decode engine re-declared at its resync and the daemon adopted.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "decodeplane_resync_expired_total",
			Help: "Resync waits that expired before the decode engine said done: admission started with the pool less what was declared.",
		}),
		incarnations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "decodeplane_prefill_incarnation_changes_total",
			Help: "Prefill instances replaced behind the same bootstrap address by a new instance_id (a prefill restart); their rooms still handing off fail as prefill lost.",
		}),
	}
}

func (r resyncMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.duration, r.adopted, r.expired, r.incarnations}
}

// RoomsAdopted implements kvmanager.Observer.
func (m *Metrics) RoomsAdopted(n int) { m.resync.adopted.Add(float64(n)) }

// ResyncEnded implements kvmanager.Observer.
func (m *Metrics) ResyncEnded(d time.Duration, _ int, expired bool) {
	m.resync.duration.Observe(d.Seconds())
	if expired {
		m.resync.expired.Inc()
	}
}

// PrefillInstanceReplaced implements kvmanager.Observer.
func (m *Metrics) PrefillInstanceReplaced(string) { m.resync.incarnations.Inc() }
