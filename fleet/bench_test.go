package fleet_test

// The benchmark of registry operations through the fleet: whole in-process
// daemons (internal/testing/daemontest: the real composition root, gRPC
// over bufconn) sharing one real etcd member (internal/testing/etcdtest,
// embedded, data in b.TempDir(), **fsync on**, clients over loopback TCP).
// BENCHMARKS.md (its "fleet on etcd" rows, measured by
// tools/bench/current.sh) gives the
// command and the figures.
//
// Each benchmark starts its etcd and daemons once and reuses them across
// its sub-benchmarks and the framework's b.N rounds; the metrics reported
// are those of the last round: a rate (wall clock) and the p50/p99 latency
// of each operation, in milliseconds.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/fleet"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// benchLeaseTTL and benchHeartbeat keep every instance a benchmark
// registers alive for its whole run (a lease of 5 minutes, a prefill
// declared dead after 2 × 2 minutes without heartbeats): nothing expires
// under the measurement.
const (
	benchLeaseTTL  = 5 * time.Minute
	benchHeartbeat = 2 * time.Minute
)

// benchEtcd starts a real etcd member with fsync on for b (stopped at
// cleanup, after the daemons started later).
func benchEtcd(b *testing.B) *etcdtest.Server {
	b.Helper()
	srv, err := etcdtest.New(etcdtest.Options{Dir: b.TempDir()}) // NoFsync false: etcd's default
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	return srv
}

// benchDaemon starts a daemon with the fleet registry on e (advertised as
// addr), or with the memory registry when e is nil, and its client.
func benchDaemon(b *testing.B, e *etcdtest.Server, addr string) (*daemontest.Daemon, *client.Client) {
	b.Helper()
	d := daemontest.Start(b, daemontest.Options{Config: func(c *config.Config) {
		c.Timeouts.HeartbeatInterval = benchHeartbeat
		if e == nil {
			return
		}
		c.Registry.Backend = fleet.BackendEtcd
		c.Registry.Etcd.Endpoints = e.Endpoint()
		c.Registry.Etcd.AdvertiseAddress = addr
		c.Registry.Etcd.Prefix = "/bench/"
		c.Registry.Etcd.LeaseTTL = benchLeaseTTL
	}})
	c, err := client.New(daemontest.Target, client.WithDialOptions(d.Dialer()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if e != nil {
		deadline := time.Now().Add(30 * time.Second)
		for deg, _, _ := d.Fleet().State(); deg; deg, _, _ = d.Fleet().State() {
			if time.Now().After(deadline) {
				b.Fatalf("%s: the registry did not reach etcd within 30 s", addr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return d, c
}

// instances names distinct prefill instances across every round.
var instances atomic.Uint64

// newInstance is a one-rank prefill instance never registered before.
func newInstance() *pb.RegisterPrefillRequest {
	n := instances.Add(1)
	r := rank(fmt.Sprintf("bench-%d", n))
	r.BootstrapAddr = fmt.Sprintf("10.%d.%d.%d:8998", 100+n>>16&0xff, n>>8&0xff, n&0xff)
	r.RankEndpoint = fmt.Sprintf("10.%d.%d.%d:17000", 100+n>>16&0xff, n>>8&0xff, n&0xff)
	return r
}

// run runs n calls of op over c goroutines, timing each, and returns the
// wall-clock time and the latencies. An error fails b.
func run(b *testing.B, c, n int, op func(i int) error) (time.Duration, []time.Duration) {
	b.Helper()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return elapsed, lat
}

// reportLatency reports the p50 and p99 of lat as name-p50-ms, name-p99-ms.
func reportLatency(b *testing.B, name string, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	q := func(p float64) float64 { return float64(s[min(len(s)-1, int(p*float64(len(s))))]) / 1e6 }
	b.ReportMetric(q(0.50), name+"p50-ms")
	b.ReportMetric(q(0.99), name+"p99-ms")
}

// BenchmarkFleetRegister: RegisterPrefill over gRPC through daemon A, each
// call a new one-rank instance (so each is a Get, a lease Grant and a
// conditional Txn on etcd, then the local record), sequentially and from
// 16 concurrent clients. A second daemon B watches the prefix, as every
// member of a fleet does, and applies each registration to its registry;
// the benchmark checks at the end that B has them all.
func BenchmarkFleetRegister(b *testing.B) {
	e := benchEtcd(b)
	a, ca := benchDaemon(b, e, "10.9.0.1:7600")
	bd, _ := benchDaemon(b, e, "10.9.0.2:7600")
	total := 0 // instances registered so far, every round
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ctx := context.Background()
			ranks := make([]*client.Prefill, b.N)
			for i := range ranks {
				ranks[i] = ca.Prefill(newInstance())
			}
			b.ResetTimer()
			elapsed, lat := run(b, clients, b.N, func(i int) error {
				_, err := ranks[i].Register(ctx)
				return err
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "registrations/s")
			reportLatency(b, "", lat)
			// Every registration is in A's view and, through etcd, in B's.
			total += b.N
			deadline := time.Now().Add(30 * time.Second)
			for _, d := range []*daemontest.Daemon{a, bd} {
				for {
					f, err := d.Fleet().GetFleet(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if len(f.GetPrefills()) == total {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("%d prefill instances in a daemon's view, want the %d registered", len(f.GetPrefills()), total)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
}

// BenchmarkFleetHeartbeat: Heartbeat RPCs per second through a daemon with
// the fleet registry (etcd) and through one with the memory registry, in
// the same run: with one client the two daemons are called alternately
// (each call timed), with 16 the run alternates phases of each (F M M F F
// M M F), so both see the same machine. fleet/memory is the ratio of the
// rates. A heartbeat through the fleet registry never waits on etcd (it
// notes the instance as heard here; its lease is kept alive once per
// lease_ttl/3 in the background).
func BenchmarkFleetHeartbeat(b *testing.B) {
	e := benchEtcd(b)
	_, cf := benchDaemon(b, e, "10.9.0.1:7600")
	_, cm := benchDaemon(b, nil, "")
	ctx := context.Background()
	reg := rank("p1")
	for _, c := range []*client.Client{cf, cm} {
		if _, err := c.Prefill(reg).Register(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// The rank's views on both daemons: rank 0 of instance "p1".
	pf, pm := cf.Prefill(reg), cm.Prefill(reg)
	beat := func(p *client.Prefill) func(int) error {
		return func(int) error { _, err := p.Heartbeat(ctx); return err }
	}
	report := func(b *testing.B, fleetN, memN int, fleetT, memT time.Duration, fleetLat, memLat []time.Duration) {
		fr, mr := float64(fleetN)/fleetT.Seconds(), float64(memN)/memT.Seconds()
		b.ReportMetric(fr, "fleet-hb/s")
		b.ReportMetric(mr, "memory-hb/s")
		b.ReportMetric(fr/mr, "fleet/memory")
		reportLatency(b, "fleet-", fleetLat)
		reportLatency(b, "memory-", memLat)
	}
	b.Run("clients=1", func(b *testing.B) {
		fleetLat, memLat := make([]time.Duration, b.N), make([]time.Duration, b.N)
		var fleetT, memT time.Duration
		b.ResetTimer()
		for i := range b.N {
			for k := range 2 {
				p, lat, sum := pf, fleetLat, &fleetT
				if (i+k)%2 == 1 {
					p, lat, sum = pm, memLat, &memT
				}
				t0 := time.Now()
				if _, err := p.Heartbeat(ctx); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t0)
				*sum += lat[i]
			}
		}
		b.StopTimer()
		report(b, b.N, b.N, fleetT, memT, fleetLat, memLat)
	})
	b.Run("clients=16", func(b *testing.B) {
		const phases = 8
		per := max(1, b.N/phases)
		var fleetT, memT time.Duration
		var fleetLat, memLat []time.Duration
		b.ResetTimer()
		for p := range phases {
			if p%4 == 0 || p%4 == 3 { // F M M F F M M F
				t, lat := run(b, 16, per, beat(pf))
				fleetT, fleetLat = fleetT+t, append(fleetLat, lat...)
			} else {
				t, lat := run(b, 16, per, beat(pm))
				memT, memLat = memT+t, append(memLat, lat...)
			}
		}
		b.StopTimer()
		report(b, len(fleetLat), len(memLat), fleetT, memT, fleetLat, memLat)
	})
}

// BenchmarkFleetPropagation: the time from a registration's call through
// daemon A until a room on daemon B that waits for that prefill gets its
// destination (its WatchRoom stream, opened before, delivers ADMITTED: the
// registration went A → etcd → B's watch → B's registry → the room's DP
// rank, admission and pre-allocation). One instance and one room per op,
// sequentially; the room is aborted after. Also reported: A's
// RegisterPrefill latency alone (register-p50-ms, register-p99-ms) and
// what B took after A answered (after-register-*: negative when B's room
// had its destination before A's answer reached the caller).
func BenchmarkFleetPropagation(b *testing.B) {
	e := benchEtcd(b)
	_, ca := benchDaemon(b, e, "10.9.0.1:7600")
	_, cb := benchDaemon(b, e, "10.9.0.2:7600")
	ctx := context.Background()
	var rooms atomic.Uint64
	b.ResetTimer()
	lat, regLat := make([]time.Duration, b.N), make([]time.Duration, b.N)
	for i := range b.N {
		b.StopTimer()
		reg := newInstance()
		rank := ca.Prefill(reg)
		room := rooms.Add(1)
		if _, err := cb.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r", BootstrapAddr: reg.GetBootstrapAddr(), Room: room, PromptLen: 256, MaxNewTokens: 16}); err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		w, err := cb.Engine().WatchRoom(wctx, &pb.WatchRoomRequest{Room: room, History: true})
		if err != nil {
			b.Fatal(err)
		}
		// The stream is live once it replayed the room's opening; the
		// room must still wait for its prefill.
		ev, err := w.Next()
		if err != nil || ev.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL {
			b.Fatalf("room %d on B before the registration: %v %v", room, ev.GetRoom().GetPhase(), err)
		}
		b.StartTimer()
		t0 := time.Now()
		if _, err := rank.Register(ctx); err != nil {
			b.Fatal(err)
		}
		regLat[i] = time.Since(t0)
		for {
			ev, err := w.Next()
			if err != nil {
				b.Fatalf("room %d on B: %v", room, err)
			}
			if ev.GetTransition().GetPhase() == pb.RoomPhase_ROOM_PHASE_ADMITTED {
				break
			}
			if ev.GetTerminal() {
				b.Fatalf("room %d on B ended before its destination: %v", room, ev.GetRoom().GetFailure())
			}
		}
		lat[i] = time.Since(t0)
		b.StopTimer()
		w.Close()
		cancel()
		if _, err := cb.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: "bench"}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	after := make([]time.Duration, b.N)
	for i := range after {
		after[i] = lat[i] - regLat[i]
	}
	reportLatency(b, "", lat)
	reportLatency(b, "register-", regLat)
	reportLatency(b, "after-register-", after)
}
