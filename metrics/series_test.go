package metrics_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/test/bufconn"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/kvmanager"
)

// TestAddrSeriesDeletedWhenGone: the per-bootstrap_addr series
// (decodeplane_prefill_heartbeat_failures_total, decodeplane_prefill_lost_total)
// stay while the instance is known or a room refers to its address, and a
// scrape deletes them once neither holds: with a real manager whose prefill
// stops heartbeating, is declared lost (its room fails), and whose failed
// room is forgotten after rooms.retention.
func TestAddrSeriesDeletedWhenGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The daemon's own wiring (internal/daemon), built and never served:
		// its manager, with the metrics as its Observer, runs here.
		cfg := config.DefaultConfig()
		cfg.Server.MetricsListen = ""
		cfg.Rooms.Retention = time.Minute
		lis := bufconn.Listen(1 << 10)
		d, err := daemon.Build(t.Context(), cfg, daemon.Options{Listener: lis})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Shutdown(context.Background()) // never run: releases the listener
		m, mgr := d.Metrics(), d.Manager()
		dec := cfg.Decode()
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- mgr.Run(ctx) }()
		defer func() { cancel(); <-ran }()

		const addr = "10.0.0.9:8998"
		if _, err := mgr.RegisterPrefill(kvmanager.Registration{Addr: addr, Endpoint: "tcp://rank-0",
			Parallel: kvmanager.ParallelInfo{AttnTP: 1, AttnDP: 1, AttnCP: 1, PP: 1, SystemDP: 1},
			PageSize: dec.Pool.PageSize, KVDType: dec.Pool.DType, HTTPPort: 30000}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := mgr.OpenRoom(ctx, kvmanager.OpenRequest{RID: "r1", Addr: addr, Room: 1, PrefillDP: -1, DecodeDP: -1,
			PromptLen: 1000, MaxNewTokens: 128}); err != nil {
			t.Fatal(err)
		}
		series := func() (misses, lost bool) {
			rec := httptest.NewRecorder()
			m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			for line := range strings.Lines(rec.Body.String()) {
				if strings.Contains(line, `bootstrap_addr="`+addr+`"`) {
					misses = misses || strings.HasPrefix(line, "decodeplane_prefill_heartbeat_failures_total{")
					lost = lost || strings.HasPrefix(line, "decodeplane_prefill_lost_total{")
				}
			}
			return misses, lost
		}
		interval, failures := mgr.HeartbeatPolicy()

		time.Sleep(interval + interval/2) // one interval missed: still known
		synctest.Wait()
		if misses, _ := series(); !misses {
			t.Fatal("a heartbeat missed by a known instance: no heartbeat_failures series")
		}
		if misses, _ := series(); !misses {
			t.Fatal("a second scrape deleted the series of a known instance")
		}

		time.Sleep(time.Duration(failures) * interval) // declared lost; its failed room refers to it
		synctest.Wait()
		if st, _ := mgr.GetRoom(1, false); st.Phase != kvmanager.PhaseFailed {
			t.Fatalf("room 1 is %s after its prefill was lost, want failed", st.Phase)
		}
		if misses, lost := series(); !misses || !lost {
			t.Fatalf("instance lost, its room retained: heartbeat_failures series %v, prefill_lost series %v; want both", misses, lost)
		}

		time.Sleep(cfg.Rooms.Retention + cfg.DPRank.BindingTTL) // the failed room is forgotten (the sweep runs at most a minute apart)
		synctest.Wait()
		if n := mgr.RoomsFor(addr); n != 0 {
			t.Fatalf("RoomsFor(%s) = %d after the retention", addr, n)
		}
		if misses, lost := series(); misses || lost {
			t.Errorf("instance gone and no room refers to it: heartbeat_failures series %v, prefill_lost series %v; want neither", misses, lost)
		}
	})
}
