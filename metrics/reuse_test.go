package metrics_test

import (
	"context"
	"testing"
	"time"
)

// TestPageReuseViolationsExported: decodeplane_page_reuse_violations_total
// is served at 0 from the start and stays 0 while rooms flow (the daemon's
// own check, kvmanager/reach.go, finds nothing), and the Observer method
// the check calls moves it by the number of indices it counted.
func TestPageReuseViolationsExported(t *testing.T) {
	d := startMetricsDaemon(t)
	const name = "decodeplane_page_reuse_violations_total"
	if f := d.scrape(t)[name]; f == nil {
		t.Fatalf("/metrics does not serve %s before any room", name)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d.register(t, ctx)
	for room := uint64(1); room <= 3; room++ {
		d.succeed(t, ctx, room)
	}
	if v := value(d.scrape(t), name, nil); v != 0 {
		t.Fatalf("%s after 3 rooms = %v, want 0", name, v)
	}
	d.metrics.PageReuseViolations(0, 17)
	if v := value(d.scrape(t), name, nil); v != 17 {
		t.Fatalf("%s after 17 counted violations = %v, want 17", name, v)
	}
}
