package metrics

import "github.com/prometheus/client_golang/prometheus"

// registryMetrics count the fleet's shared registry (fleet.Observer):
// whether it is degraded, its failed etcd requests, the rebuilds of its
// cached view and the fleet registrations this daemon does not accept.
type registryMetrics struct {
	degraded prometheus.Gauge
	errors   *prometheus.CounterVec
	rebuilds prometheus.Counter
	rejected prometheus.Counter
}

func newRegistryMetrics() registryMetrics {
	return registryMetrics{
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "decodeplane_registry_degraded",
			Help: "1 while the fleet's shared registry (etcd) is unreachable: rooms flow on the cached view, new prefill registrations are refused. Always 0 with the memory registry.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_registry_etcd_errors_total",
			Help: "Failed etcd requests of the fleet registry, by operation (register, deregister, keepalive, publish_capacity, snapshot, watch, session).",
		}, []string{"op"}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "decodeplane_registry_view_rebuilds_total",
			Help: "Rebuilds of the cached fleet view from a fresh etcd revision (after a reconnect or a failed watch).",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "decodeplane_registry_rejected_total",
			Help: "Prefill registrations of the fleet registry this daemon does not accept (its decode layout differs from the registering daemon's).",
		}),
	}
}

func (r registryMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.degraded, r.errors, r.rebuilds, r.rejected}
}

// RegistryDegraded implements fleet.Observer.
func (m *Metrics) RegistryDegraded(degraded bool) {
	v := 0.0
	if degraded {
		v = 1
	}
	m.registry.degraded.Set(v)
}

// RegistryError implements fleet.Observer.
func (m *Metrics) RegistryError(op string) { m.registry.errors.WithLabelValues(op).Inc() }

// RegistryRebuilt implements fleet.Observer.
func (m *Metrics) RegistryRebuilt() { m.registry.rebuilds.Inc() }

// RegistryRejected implements fleet.Observer.
func (m *Metrics) RegistryRejected() { m.registry.rejected.Inc() }
