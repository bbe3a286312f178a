package kvmanager

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// The domain benchmarks: the room path without gRPC, over a real
// prealloc ledger and the simulated engine with zero latency, no watcher
// and the default (no-op) tracer.
//
//	go test -run '^$' -bench 'BenchmarkRoomLifecycle|BenchmarkQueuedRoomMemory' -benchmem ./kvmanager/

// benchManager builds a manager over one real ledger; it is shut down when
// the benchmark ends.
func benchManager(b *testing.B, dec kvlayout.Config, cfg Config) *Manager {
	b.Helper()
	if err := dec.Validate(); err != nil {
		b.Fatalf("decode config: %v", err)
	}
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		b.Fatal(err)
	}
	m, err := New(cfg, dec, Deps{Ledgers: []*prealloc.Ledger{led}, Engine: sim.NewSimEngine(sim.SimConfig{}, kvlayout.RealClock{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Shutdown(endedContext()) })
	return m
}

// endedContext is a context already done: Shutdown fails what is still
// handing off at once.
func endedContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// benchRegister registers a one-rank prefill instance (tp = dp = pp = 1).
func benchRegister(b *testing.B, m *Manager, dec kvlayout.Config) RankID {
	b.Helper()
	reg := Registration{
		Addr: addrA, Endpoint: "tcp://rank-0-0-0-0",
		Parallel: ParallelInfo{AttnTP: 1, AttnDP: 1, AttnCP: 1, PP: 1, SystemDP: 1},
		PageSize: dec.Pool.PageSize, KVDType: dec.Pool.DType, HTTPPort: 30000,
	}
	res, err := m.RegisterPrefill(reg)
	if err != nil || res.Registered != res.Expected {
		b.Fatalf("RegisterPrefill = %+v, %v", res, err)
	}
	return RankID{Addr: addrA}
}

// BenchmarkRoomLifecycle is one room's walk: OpenRoom, admission, the claim
// (AwaitDestination + Delivered), one last chunk moved by the engine,
// success, ReleaseRoom and the claim stream's end — with each page owner:
// owner=daemon admits and allocates at OpenRoom; owner=engine opens the
// room QUEUED and admits it with DeclareDestination into pages the decode
// engine allocated (held in the hand-off ledger until the success).
func BenchmarkRoomLifecycle(b *testing.B) {
	for _, owner := range []kvlayout.Owner{kvlayout.OwnerDaemon, kvlayout.OwnerEngine} {
		b.Run("owner="+owner.String(), func(b *testing.B) { benchLifecycle(b, owner) })
	}
}

func benchLifecycle(b *testing.B, owner kvlayout.Owner) {
	dec := kvlayout.DefaultConfig()
	dec.Pool.Owner = owner
	m := benchManager(b, dec, DefaultConfig())
	rk := benchRegister(b, m, dec)
	ctx := context.Background()
	rids := make([]string, 4096)
	for i := range rids {
		rids[i] = fmt.Sprintf("rid-%d", i)
	}
	// The engine's destinations, allocated up front: 16 pages (1000
	// tokens at 64 a page) and a row each, cycled (a room's hold ends at
	// its success, before the next room's declaration).
	decls := make([]Declaration, 256)
	for k := range decls {
		decls[k].MetadataSlot = int32(k)
		for p := range int32(16) {
			decls[k].Pages = append(decls[k].Pages, int32(k)*16+p)
		}
	}
	want := PhaseAdmitted
	if owner == kvlayout.OwnerEngine {
		want = PhaseQueued
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		room := uint64(i + 1)
		s, _, err := m.OpenRoom(ctx, OpenRequest{RID: rids[i%len(rids)], Addr: addrA, Room: room, PrefillDP: -1, DecodeDP: -1, PromptLen: 1000, MaxNewTokens: 128})
		if err != nil || s.Phase != want {
			b.Fatalf("OpenRoom(%d) = %s, %v; want %s", room, s.Phase, err, want)
		}
		if owner == kvlayout.OwnerEngine {
			d := decls[i%len(decls)]
			d.Room = room
			if s, _, err := m.DeclareDestination(d); err != nil || s.Phase != PhaseAdmitted {
				b.Fatalf("DeclareDestination(%d) = %s, %v; want admitted", room, s.Phase, err)
			}
		}
		c, err := m.AwaitDestination(room, rk)
		if err != nil {
			b.Fatal(err)
		}
		ev := <-c.Events()
		if ev.Destination == nil {
			b.Fatalf("claim of room %d: %+v, want a destination", room, ev)
		}
		c.Delivered(ev.Destination)
		if _, _, err := m.Transfer(ctx, ChunkRequest{Room: room, Rank: rk, NumPages: len(ev.Destination.Pages), Last: true, Marker: room}); err != nil {
			b.Fatal(err)
		}
		if ev := <-c.Events(); ev.Done == nil || *ev.Done != PhaseSucceeded {
			b.Fatalf("claim of room %d ended with %+v, want done (succeeded)", room, ev)
		}
		if _, _, err := m.ReleaseRoom(room); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// queuedRooms is how many rooms BenchmarkQueuedRoomMemory queues.
const queuedRooms = 100_000

// BenchmarkQueuedRoomMemory opens queuedRooms rooms behind a pool that
// admits only the first (one request slot), with long bootstrap and claim
// timeouts and admission.max_queued raised, and reports the domain heap
// (kvmanager + prealloc) each queued room holds: the HeapInuse delta after
// runtime.GC, divided by the rooms.
func BenchmarkQueuedRoomMemory(b *testing.B) {
	dec := kvlayout.DefaultConfig()
	oneSlot(&dec)
	dec.Admission.MaxQueued = 2 * queuedRooms
	dec.Admission.ClaimTimeout = time.Hour
	cfg := DefaultConfig()
	cfg.Timeouts.Bootstrap = time.Hour
	rids := make([]string, queuedRooms+1)
	for i := range rids {
		rids[i] = fmt.Sprintf("rid-%d", i)
	}
	ctx := context.Background()
	var perRoom float64
	for range b.N {
		b.StopTimer()
		m := benchManager(b, dec, cfg)
		benchRegister(b, m, dec)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		for i := range queuedRooms + 1 {
			room := uint64(i + 1)
			s, _, err := m.OpenRoom(ctx, OpenRequest{RID: rids[i], Addr: addrA, Room: room, PrefillDP: -1, DecodeDP: -1, PromptLen: 1000, MaxNewTokens: 128})
			want := PhaseQueued
			if i == 0 {
				want = PhaseAdmitted // the only slot
			}
			if err != nil || s.Phase != want {
				b.Fatalf("OpenRoom(%d) = %s, %v; want %s", room, s.Phase, err, want)
			}
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		if n := m.InFlight(); n != queuedRooms+1 {
			b.Fatalf("%d rooms in flight, want %d", n, queuedRooms+1)
		}
		perRoom = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / queuedRooms
		runtime.KeepAlive(m)
		m.Shutdown(endedContext()) // the admitted room does not hold it up
	}
	b.ReportMetric(perRoom, "B/queued-room")
}
