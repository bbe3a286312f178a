package metrics

import "github.com/prometheus/client_golang/prometheus"

// newReuseViolations is decodeplane_page_reuse_violations_total: the reuse
// invariant the room manager checks at every hand-out of pages, metadata
// rows and state slots (kvmanager/reach.go). It is exported from the start
// at 0 and must stay 0: anything else is a bug (alert on any increase).
func newReuseViolations() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "decodeplane_page_reuse_violations_total",
		Help: "Pages, metadata rows and state slots handed to a room while a writer of the room that held them could still land in them (the room manager's independent check of its ledgers). Must stay 0; anything else is a bug.",
	})
}

// PageReuseViolations implements kvmanager.Observer.
func (m *Metrics) PageReuseViolations(_, n int) { m.reuseViolations.Add(float64(n)) }
