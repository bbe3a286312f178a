package kvmanager_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// TestDeferredReleaseStagingRegions: a staged room (prefill TP 1, decode TP
// 2) aborted while its prefill rank holds a staging region it writes into
// by itself keeps that region and its pages until the rank's AckRoomEnd;
// then both go back at once.
func TestDeferredReleaseStagingRegions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dec := stgDecode(2)
		led, err := prealloc.NewLedger(dec, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := kvmanager.DefaultConfig()
		cfg.Timeouts.HeartbeatInterval = time.Hour
		cfg.Release.DeferredTimeout = 30 * time.Second
		s := sim.NewSimEngine(sim.SimConfig{}, nil)
		m, err := kvmanager.New(cfg, dec, kvmanager.Deps{Ledgers: []*prealloc.Ledger{led}, Engine: s, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Shutdown(context.Background()) })
		e := &stgEnv{t: t, m: m, sim: s, led: led}
		const addr, room = "p1:1", 15
		e.register(addr, 1, 1)
		e.open(addr, 1, room, 100)
		e.alloc(addr, 0, room, 0, 4)
		e.ready(addr, 0, room, 0, 0, 4, false)
		e.alloc(addr, 0, room, 1, 3) // being written by the prefill
		synctest.Wait()
		if _, _, err := m.AbortRoom(room, ""); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		live := 0
		for _, w := range m.StagingWatermarks() {
			live += w.Live
		}
		if st := led.Stats(); st.Draining != 1 || live == 0 {
			t.Fatalf("after the abort: %d draining rooms, %d live staging regions; want the room draining and its region held", st.Draining, live)
		}
		res, err := m.AckRoomEnd(room, rank(addr, 0), 1)
		if err != nil || !res.Released {
			t.Fatalf("AckRoomEnd = %+v, %v", res, err)
		}
		e.settled()
	})
}
