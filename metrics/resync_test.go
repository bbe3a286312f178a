package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/metrics"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestResyncSeries: the manager's resync events reach the /metrics
// series (adopted rooms, the wait's duration, an expiry).
func TestResyncSeries(t *testing.T) {
	m := metrics.New()
	d := &metricsDaemon{metrics: m}
	var ro kvmanager.Observer = m
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

// TestPrefillIncarnationChanges: a prefill instance replaced behind the same
// bootstrap address by a new instance_id is counted once, through the real
// daemon (server, manager, registry) and the /metrics handler; the same
// instance registering again is not a change.
func TestPrefillIncarnationChanges(t *testing.T) {
	d := startMetricsDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const name = "decodeplane_prefill_incarnation_changes_total"
	if fams := d.scrape(t); fams[name] == nil {
		t.Fatalf("%s is not exported before any prefill registered", name)
	}
	registerAs := func(id string) {
		t.Helper()
		_, err := d.boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: metricsAddr, RankEndpoint: "10.1.0.1:9000",
			Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: id})
		if err != nil {
			t.Fatalf("RegisterPrefill(instance %q): %v", id, err)
		}
	}
	for _, step := range []struct {
		id   string
		want float64
	}{{"prefill-a", 0}, {"prefill-a", 0}, {"prefill-b", 1}, {"prefill-b", 1}, {"prefill-c", 2}} {
		registerAs(step.id)
		if v := value(d.scrape(t), name, nil); v != step.want {
			t.Fatalf("after registering instance %q: %s = %v; want %v", step.id, name, v, step.want)
		}
	}
}
