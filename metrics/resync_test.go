package metrics_test

import (
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/metrics"
)

// TestResyncSeries: the manager's resync events reach the /metrics
// series (adopted rooms, the wait's duration, an expiry).
func TestResyncSeries(t *testing.T) {
	m := metrics.New()
	d := &metricsDaemon{metrics: m}
	var obs kvmanager.Observer = m
	ro, ok := obs.(kvmanager.ResyncObserver)
	if !ok {
		t.Fatal("*metrics.Metrics is not a kvmanager.ResyncObserver: the manager would not count resyncs")
	}
	fams := d.scrape(t)
	for _, name := range []string{"decodeplane_resync_rooms_adopted_total", "decodeplane_resync_expired_total", "decodeplane_resync_duration_seconds"} {
		if fams[name] == nil {
			t.Errorf("%s is not exported before any resync", name)
		}
	}
	ro.RoomsAdopted(3)
	ro.RoomsAdopted(2)
	ro.ResyncEnded(1500*time.Millisecond, 5, true)
	fams = d.scrape(t)
	if v := value(fams, "decodeplane_resync_rooms_adopted_total", nil); v != 5 {
		t.Errorf("rooms adopted = %v; want 5", v)
	}
	if v := value(fams, "decodeplane_resync_expired_total", nil); v != 1 {
		t.Errorf("expired = %v; want 1", v)
	}
	h := fams["decodeplane_resync_duration_seconds"].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() != 1.5 {
		t.Errorf("duration: %d samples, sum %v; want 1, 1.5", h.GetSampleCount(), h.GetSampleSum())
	}
}
