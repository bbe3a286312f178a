package etcdtest_test

// What one real etcd member (embedded, data in b.TempDir(), clients over
// loopback TCP) sustains for the operations the fleet registry issues, and
// for a per-request room → DP-rank binding (which the fleet keeps out of
// etcd). BENCHMARKS.md gives the command; docs/sizing.md the figures and
// the arithmetic.
//
// Every benchmark runs twice: fsync=on (etcd's default, the durable figure)
// and fsync=off (Options.NoFsync, the tests' setting; not a deployment).
// Each sub-benchmark starts its own member, once, and reuses it across the
// framework's b.N rounds; the metrics reported are those of the last round:
// ops/s (wall clock), p50-ms and p99-ms (the latency of each operation).

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
)

// valueSize is a rank record's size (~600 B of JSON in the design).
const valueSize = 600

var value600 = strings.Repeat("x", valueSize)

// maxConns bounds the client connections a benchmark opens: concurrent
// goroutines share them round-robin, as the goroutines of a few daemons
// would (etcd's own guide runs 1000 clients over 100 connections).
const maxConns = 8

// member is one embedded etcd and its clients, shared by the b.N rounds of
// one sub-benchmark.
type member struct {
	srv   *etcdtest.Server
	conns []*clientv3.Client
	seq   atomic.Int64 // unique key suffixes across rounds
}

// startMember starts a member with its data in dir (fsync as asked) and
// conns client connections; close stops both.
func startMember(b *testing.B, dir string, noFsync bool, conns int) *member {
	b.Helper()
	srv, err := etcdtest.New(etcdtest.Options{Dir: dir, NoFsync: noFsync})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	m := &member{srv: srv}
	for range conns {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
		if err != nil {
			m.close()
			b.Fatal(err)
		}
		m.conns = append(m.conns, c)
	}
	return m
}

func (m *member) close() {
	for _, c := range m.conns {
		c.Close()
	}
	m.srv.Stop()
}

func (m *member) key(prefix string) string {
	return prefix + strconv.FormatInt(m.seq.Add(1), 10)
}

// fsyncModes runs body under fsync=on and fsync=off.
func fsyncModes(b *testing.B, body func(b *testing.B, noFsync bool)) {
	for _, mode := range []struct {
		name    string
		noFsync bool
	}{{"fsync=on", false}, {"fsync=off", true}} {
		b.Run(mode.name, func(b *testing.B) { body(b, mode.noFsync) })
	}
}

// perMember runs the sub-benchmark name on its own member (data in a
// b.TempDir()), started on its first round and stopped after its last.
func perMember(b *testing.B, name string, noFsync bool, conns int, round func(b *testing.B, m *member)) {
	dir := b.TempDir()
	var m *member
	b.Run(name, func(b *testing.B) {
		if m == nil {
			m = startMember(b, dir, noFsync, conns)
		}
		round(b, m)
	})
	if m != nil {
		m.close()
	}
}

// parallel runs b.N calls of op spread over c goroutines (goroutine g uses
// connection g mod len(conns)), timing each call, and reports ops/s, p50-ms
// and p99-ms. An error fails the benchmark.
func parallel(b *testing.B, m *member, c int, op func(ctx context.Context, cli *clientv3.Client) error) {
	b.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range c {
		cli := m.conns[g%len(m.conns)]
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := op(ctx, cli); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	reportLatencies(b, lat, float64(b.N)/elapsed.Seconds())
}

// reportLatencies reports the rate and the p50/p99 of lat.
func reportLatencies(b *testing.B, lat []time.Duration, perSecond float64) {
	b.Helper()
	slices.Sort(lat)
	b.ReportMetric(perSecond, "ops/s")
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
}

func conns(c int) int { return min(c, maxConns) }

// BenchmarkPut: a 600 B Put (a new key each time, no lease) by 1
// sequential client and by 16, 64 and 256 concurrent goroutines.
func BenchmarkPut(b *testing.B) {
	fsyncModes(b, func(b *testing.B, noFsync bool) {
		for _, c := range []int{1, 16, 64, 256} {
			perMember(b, fmt.Sprintf("clients=%d", c), noFsync, conns(c), func(b *testing.B, m *member) {
				parallel(b, m, c, func(ctx context.Context, cli *clientv3.Client) error {
					_, err := cli.Put(ctx, m.key("/bench/put/"), value600)
					return err
				})
			})
		}
	})
}

// BenchmarkRegisterTxn: the rank registration of the design, one Txn per
// rank: If CreateRevision(instance) == 0 Then Put instance and rank (both
// on the instance's lease) Else Get instance. Each operation registers a
// new instance (the Then branch, the write), on one lease granted before.
func BenchmarkRegisterTxn(b *testing.B) {
	fsyncModes(b, func(b *testing.B, noFsync bool) {
		for _, c := range []int{1, 64} {
			perMember(b, fmt.Sprintf("clients=%d", c), noFsync, conns(c), func(b *testing.B, m *member) {
				lease, err := m.conns[0].Grant(context.Background(), 30)
				if err != nil {
					b.Fatal(err)
				}
				var thenBranch atomic.Int64
				parallel(b, m, c, func(ctx context.Context, cli *clientv3.Client) error {
					inst := m.key("/bench/prefills/10.0.0.1:")
					instKey := inst + "/instance"
					r, err := cli.Txn(ctx).
						If(clientv3.Compare(clientv3.CreateRevision(instKey), "=", 0)).
						Then(clientv3.OpPut(instKey, value600, clientv3.WithLease(lease.ID)),
							clientv3.OpPut(inst+"/ranks/0/0/0/0", value600, clientv3.WithLease(lease.ID))).
						Else(clientv3.OpGet(instKey)).
						Commit()
					if err == nil && r.Succeeded {
						thenBranch.Add(1)
					}
					return err
				})
				// Every instance was new: a Txn that took the Else branch
				// measured a read, not the registration.
				if got := thenBranch.Load(); got != int64(b.N) {
					b.Fatalf("%d of %d registrations took the Then branch", got, b.N)
				}
			})
		}
	})
}

// BenchmarkLeaseGrant: Grant (TTL 30 s) at 1 and 64 concurrency.
func BenchmarkLeaseGrant(b *testing.B) {
	fsyncModes(b, func(b *testing.B, noFsync bool) {
		for _, c := range []int{1, 64} {
			perMember(b, fmt.Sprintf("clients=%d", c), noFsync, conns(c), func(b *testing.B, m *member) {
				parallel(b, m, c, func(ctx context.Context, cli *clientv3.Client) error {
					_, err := cli.Grant(ctx, 30)
					return err
				})
			})
		}
	})
}

// BenchmarkLeaseKeepAliveOnce: KeepAliveOnce at 1 and 64 concurrency,
// over 1000 leases granted beforehand (as many instances keep theirs
// alive), each goroutine renewing them in turn.
func BenchmarkLeaseKeepAliveOnce(b *testing.B) {
	const leases = 1000
	fsyncModes(b, func(b *testing.B, noFsync bool) {
		for _, c := range []int{1, 64} {
			var ids []clientv3.LeaseID
			perMember(b, fmt.Sprintf("clients=%d", c), noFsync, conns(c), func(b *testing.B, m *member) {
				for len(ids) < leases {
					l, err := m.conns[0].Grant(context.Background(), 30)
					if err != nil {
						b.Fatal(err)
					}
					ids = append(ids, l.ID)
				}
				var n atomic.Int64
				parallel(b, m, c, func(ctx context.Context, cli *clientv3.Client) error {
					id := ids[n.Add(1)%leases]
					r, err := cli.KeepAliveOnce(ctx, id)
					if err == nil && r.TTL <= 0 {
						return fmt.Errorf("lease %x: keepalive answered TTL %d", id, r.TTL)
					}
					return err
				})
			})
		}
	})
}

// BenchmarkBindingPut: the room → DP-rank binding through etcd, one Put per
// request of a 600 B value with a lease (the binding's TTL; one lease
// shared by every binding, granted before), at 64 concurrency: the
// binding rate.
func BenchmarkBindingPut(b *testing.B) {
	fsyncModes(b, func(b *testing.B, noFsync bool) {
		const c = 64
		perMember(b, fmt.Sprintf("clients=%d", c), noFsync, conns(c), func(b *testing.B, m *member) {
			lease, err := m.conns[0].Grant(context.Background(), 60)
			if err != nil {
				b.Fatal(err)
			}
			parallel(b, m, c, func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Put(ctx, m.key("/bench/bindings/"), value600, clientv3.WithLease(lease.ID))
				return err
			})
		})
	})
}

// BenchmarkWatchDelivery: the time from a Put's call to its event on each
// watcher of the prefix (every watcher on its own connection, as every
// daemon watches the whole prefix), p50/p99 over every (event, watcher)
// pair; ops/s is the events delivered per second, all watchers together.
// writers=1 is one sequential writer; writers=64 loads the member while
// it fans out.
func BenchmarkWatchDelivery(b *testing.B) {
	fsyncModes(b, func(b *testing.B, noFsync bool) {
		for _, tc := range []struct{ writers, watchers int }{{1, 1}, {1, 10}, {64, 10}} {
			name := fmt.Sprintf("writers=%d/watchers=%d", tc.writers, tc.watchers)
			perMember(b, name, noFsync, conns(tc.writers), func(b *testing.B, m *member) {
				watchRound(b, m, tc.writers, tc.watchers)
			})
		}
	})
}

func watchRound(b *testing.B, m *member, writers, watchers int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	round := m.key("/bench/watch/") + "/"
	base := time.Now()
	sent := make([]atomic.Int64, b.N) // ns since base at each Put's call
	lat := make([]time.Duration, b.N*watchers)
	errs := make(chan error, watchers+writers)
	var ready, done sync.WaitGroup
	for w := range watchers {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.srv.Endpoint()}, DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer cli.Close()
		ready.Add(1)
		isReady := sync.OnceFunc(ready.Done)
		done.Go(func() {
			defer isReady()
			// WithCreatedNotify: the first response says the watch is
			// registered, so that no Put precedes it.
			wch := cli.Watch(ctx, round, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			got := 0
			for resp := range wch {
				isReady()
				if err := resp.Err(); err != nil {
					errs <- err
					return
				}
				now := time.Since(base)
				for _, ev := range resp.Events {
					i, err := strconv.Atoi(strings.TrimPrefix(string(ev.Kv.Key), round))
					if err != nil || i < 0 || i >= b.N {
						errs <- fmt.Errorf("watcher %d: unexpected key %q", w, ev.Kv.Key)
						return
					}
					lat[w*b.N+i] = now - time.Duration(sent[i].Load())
					got++
				}
				if got == b.N {
					return
				}
			}
			errs <- fmt.Errorf("watcher %d: the watch ended after %d of %d events", w, got, b.N)
		})
	}
	ready.Wait()
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := range writers {
		cli := m.conns[g%len(m.conns)]
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				sent[i].Store(int64(time.Since(base)))
				if _, err := cli.Put(ctx, round+strconv.FormatInt(i, 10), value600); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	select {
	case err := <-errs:
		cancel()
		<-finished
		b.Fatal(err)
	case <-finished:
	case <-time.After(30 * time.Second):
		cancel()
		<-finished
		b.Fatal("the watchers did not see every event within 30s")
	}
	elapsed := time.Since(start)
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	reportLatencies(b, lat, float64(b.N*watchers)/elapsed.Seconds())
}
