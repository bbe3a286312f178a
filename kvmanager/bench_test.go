package kvmanager

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// BenchmarkRoomLifecycle is one room's whole walk through the domain, without
// gRPC: OpenRoom (admitted at once: the pool is the default one and holds
// every room) → AwaitDestination (the claim takes its destination and
// reports it delivered) → Transfer (one last chunk of every page, writing
// the marker; the simulated engine is instant) → Success (the claim's Done
// event) → ReleaseRoom. The manager is built as the harness builds it
// (real ledgers, sim.SimEngine with zero latency, the real clock: timers are
// armed and stopped as in the daemon); one prefill instance, TP 1 → TP 1.
// "watched" adds what the decode engine's WaitRoom does: a Watch with
// history from the open to the release, every event drained.
//
//	go test -run '^$' -bench RoomLifecycle -benchmem ./kvmanager/
func BenchmarkHarnessRoomLifecycle(b *testing.B) {
	for _, watched := range []bool{false, true} {
		name := "bare"
		if watched {
			name = "watched"
		}
		b.Run(name, func(b *testing.B) { benchRoomLifecycle(b, watched) })
	}
}

func benchRoomLifecycle(b *testing.B, watched bool) {
	dec := kvlayout.DefaultConfig()
	if err := dec.Validate(); err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	simCfg := sim.SimConfig{Seed: 1} // instant: no bandwidth, no latency, no faults
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		b.Fatal(err)
	}
	m, err := New(cfg, dec, Deps{Ledgers: []*prealloc.Ledger{led}, Engine: sim.NewSimEngine(simCfg, kvlayout.RealClock{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	// The harness's registration needs only the decode configuration.
	h := &harness{m: m, dec: dec, cfg: cfg, leds: []*prealloc.Ledger{led}}
	in := instance{addr: addrA}
	for _, rk := range ranksOf(in) {
		if _, err := m.RegisterPrefill(h.registration(in, rk.DP, rk.CP, rk.TP, rk.PP)); err != nil {
			b.Fatal(err)
		}
	}
	rank := RankID{Addr: addrA}
	// Request ids are built before the timer: the router sends them.
	rids := make([]string, b.N)
	for i := range rids {
		rids[i] = fmt.Sprintf("rid-%d", i+1)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		room := uint64(i + 1)
		req := openReq(addrA, room)
		req.RID = rids[i]
		s, _, err := m.OpenRoom(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if s.Phase != PhaseAdmitted {
			b.Fatalf("room %d is %s after OpenRoom, want admitted", room, s.Phase)
		}
		var w *Watcher
		if watched {
			if w, err = m.Watch(room, true); err != nil {
				b.Fatal(err)
			}
		}
		c, err := m.AwaitDestination(room, rank)
		if err != nil {
			b.Fatal(err)
		}
		ev := <-c.Events()
		if ev.Destination == nil {
			b.Fatalf("room %d: claim event %+v, want the destination", room, ev)
		}
		c.Delivered(ev.Destination)
		if _, _, err := m.Transfer(ctx, chunk(room, rank, 0, 0, s.NumPages, true)); err != nil {
			b.Fatal(err)
		}
		if ev, ok := <-c.Events(); !ok || ev.Done == nil || *ev.Done != PhaseSucceeded {
			b.Fatalf("room %d: claim event %+v (open %v) after the last chunk, want Done(Succeeded)", room, ev, ok)
		}
		c.Close()
		if _, _, err := m.ReleaseRoom(room); err != nil {
			b.Fatal(err)
		}
		if w != nil {
			last := Phase(0)
			for ev := range w.Events() {
				last = ev.Room.Phase
			}
			if last != PhaseReleased {
				b.Fatalf("room %d: the watch ended at %s (err %v), want released", room, last, w.Err())
			}
		}
	}
	b.StopTimer()
	if n := m.InFlight(); n != 0 {
		b.Fatalf("%d rooms in flight after the benchmark, want 0", n)
	}
}
