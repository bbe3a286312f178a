package faults

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The fleet scenarios' etcd settings: a 6 s lease (the minimum is 5 s),
// requests bounded by 1 s.
const (
	leaseTTL = 6 * time.Second
	outage   = 4 * time.Second
)

func etcdScenarios() []*Scenario {
	v := func(rooms int, bound time.Duration) Variant {
		return Variant{Rooms: rooms, Bound: bound, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 80}}
	}
	return []*Scenario{
		{
			Name:  "etcd-stopped",
			Fault: fmt.Sprintf("etcd stops for %s under a fleet of two daemons with rooms flowing on both, then starts again on its data", outage),
			Proves: "rooms keep flowing on both daemons' cached view, new registrations are refused UNAVAILABLE \"registry degraded\" while it is down, " +
				"and both daemons recover (degraded back to 0) once it is back",
			Short: v(96, 10*time.Second), Full: v(3000, 20*time.Second),
			run: func(ctx context.Context, s *Stage) error { return etcdFault(ctx, s, etcdStop) },
		},
		{
			Name:   "etcd-partitioned",
			Fault:  fmt.Sprintf("one daemon of two is cut from etcd (a TCP proxy between them drops every connection) for %s, longer than its %s lease, then healed", leaseTTL+outage/2, leaseTTL),
			Proves: "only the cut daemon degrades, rooms flow on both throughout (the cut one on its cached view), and once healed it re-registers its lapsed record and recovers",
			Short:  v(96, 10*time.Second), Full: v(3000, 20*time.Second),
			run: func(ctx context.Context, s *Stage) error { return etcdFault(ctx, s, etcdPartition) },
		},
		{
			Name:   "etcd-restarted",
			Fault:  "etcd is killed (kill -9) and started again at once on its data, under a fleet of two daemons with rooms flowing on both",
			Proves: "the daemons reconnect by themselves and no room notices: rooms flow across the restart, and a registration made after it reaches the other daemon",
			Short:  v(96, 10*time.Second), Full: v(3000, 20*time.Second),
			run: func(ctx context.Context, s *Stage) error { return etcdFault(ctx, s, etcdRestart) },
		},
	}
}

// etcdProc is the development etcd's process, restarted on its port and
// data directory.
type etcdProc struct {
	s    *Stage
	addr string
	dir  string
	p    *proc
}

func (s *Stage) startEtcd(ctx context.Context) (*etcdProc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	e := &etcdProc{s: s, addr: addr, dir: filepath.Join(s.dir, "etcd-data")}
	return e, e.start(ctx)
}

func (e *etcdProc) start(ctx context.Context) error {
	p, err := e.s.start("decodeplane-dev-etcd", e.s.o.Bins.Etcd, "--listen", e.addr, "--data-dir", e.dir)
	if err != nil {
		return err
	}
	e.p = p
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return p.waitLine(wctx, "etcd: http://"+e.addr)
}

// fleet is two daemons sharing a registry on etcd (B through a proxy it
// can be cut by), a prefill registered and heartbeating through A and able
// to send through either, and an engine on each.
type fleet struct {
	etcd       *etcdProc
	px         *proxy
	a, b       *Daemon
	pa, pb     *Prefill
	engA, engB *Engine
}

func startFleet(ctx context.Context, s *Stage) (*fleet, error) {
	f := &fleet{}
	var err error
	if f.etcd, err = s.startEtcd(ctx); err != nil {
		return nil, err
	}
	if f.px, err = s.newProxy(f.etcd.addr); err != nil {
		return nil, err
	}
	sets := func(endpoint string) []string {
		return baseSets("registry.backend=etcd", "registry.etcd.endpoints=http://"+endpoint, "registry.etcd.advertise_address={addr}",
			"registry.etcd.prefix=/faults/", "registry.etcd.lease_ttl="+leaseTTL.String(), "registry.etcd.request_timeout=1s")
	}
	if f.a, err = s.startDaemon(ctx, "decodeplane-A", sets(f.etcd.addr)...); err != nil {
		return nil, err
	}
	if f.b, err = s.startDaemon(ctx, "decodeplane-B", sets(f.px.Addr())...); err != nil {
		return nil, err
	}
	for _, d := range []*Daemon{f.a, f.b} {
		if err := degraded(ctx, d, 0); err != nil {
			return nil, err
		}
	}
	if f.pa, err = s.newPrefill(ctx, f.a, prefillSpec{addr: "10.60.0.1:8998", instance: "prefill"}); err != nil {
		return nil, err
	}
	if err := registered(ctx, f.b, f.pa.spec.addr, 1); err != nil { // B learns it through etcd
		return nil, err
	}
	if f.pb, err = f.pa.via(f.b); err != nil {
		return nil, err
	}
	if f.engA, err = s.newEngine(ctx, "engine-A", f.a, true); err != nil {
		return nil, err
	}
	f.engB, err = s.newEngine(ctx, "engine-B", f.b, true)
	return f, err
}

// traffic opens rooms on both daemons, aborts a tenth, delivers the rest;
// it returns the first failure.
func (f *fleet) traffic(ctx context.Context, base uint64, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, side := range []struct {
		eng *Engine
		p   *Prefill
	}{{f.engA, f.pa}, {f.engB, f.pb}} {
		ids := roomIDs(base+uint64(i)*100_000, n/2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := side.eng.Open(ctx, opens(side.p.spec.addr, ids)); err != nil {
				errs[i] = err
				return
			}
			aborted := every(ids, 10)
			if err := side.eng.Abort(ctx, aborted); err != nil {
				errs[i] = err
				return
			}
			if bad, some := failedSends(side.p.Deliver(ctx, without(ids, aborted), 32)); bad > 0 {
				errs[i] = fmt.Errorf("%d rooms failed on %s: %s", bad, side.eng.d.name, some)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// degraded waits until d's decodeplane_registry_degraded is want.
func degraded(ctx context.Context, d *Daemon, want float64) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return poll(wctx, fmt.Sprintf("%s's decodeplane_registry_degraded %g", d.name, want), func() (bool, error) {
		v, err := d.metric(wctx, "decodeplane_registry_degraded")
		return err == nil && v == want, err
	})
}

// The three etcd faults: each injects its fault, checks the fleet while it
// lasts (rooms delivered meanwhile through traffic) and ends it.
type etcdFaultKind int

const (
	etcdStop etcdFaultKind = iota
	etcdPartition
	etcdRestart
)

// etcdFault runs one etcd fault between two thirds of traffic.
func etcdFault(ctx context.Context, s *Stage, kind etcdFaultKind) error {
	n := s.rooms() / 3
	f, err := startFleet(ctx, s)
	if err != nil {
		return err
	}
	if err := f.traffic(ctx, 1_000_000, n); err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	switch kind {
	case etcdStop:
		err = etcdStopped(ctx, s, f, n)
	case etcdPartition:
		err = etcdPartitioned(ctx, s, f, n)
	case etcdRestart:
		err = etcdRestarted(ctx, s, f, n)
	}
	if err != nil {
		return err
	}
	for _, d := range []*Daemon{f.a, f.b} {
		if err := degraded(ctx, d, 0); err != nil {
			return fmt.Errorf("after the fault: %w", err)
		}
	}
	if err := f.traffic(ctx, 3_000_000, n); err != nil {
		s.check(false, "after the fault: %v", err)
	}
	// The views are live again: an instance registered through A now
	// reaches B through etcd.
	const late = "10.60.0.9:8998"
	if _, err := f.a.C.Prefill(lateRank(late)).Register(ctx); err != nil {
		s.check(false, "a registration through A after the fault: %v", err)
	} else if err := registered(ctx, f.b, late, 1); err != nil {
		s.check(false, "after the fault: %v", err)
	}
	return nil
}

// lateRank is the registration of a prefill that comes during or after
// the fault.
func lateRank(addr string) *pb.RegisterPrefillRequest {
	return &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: strings.Replace(addr, ":8998", ":17000", 1),
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: "late"}
}

func etcdStopped(ctx context.Context, s *Stage, f *fleet, n int) error {
	s.fault("etcd stops")
	if err := f.etcd.p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	stopped := time.Now()
	for _, d := range []*Daemon{f.a, f.b} {
		if err := degraded(ctx, d, 1); err != nil {
			return err
		}
	}
	_, err := f.a.C.Prefill(lateRank("10.60.0.8:8998")).Register(ctx)
	s.check(status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "registry degraded"),
		"a registration while etcd is down = %v, want UNAVAILABLE \"registry degraded\"", err)
	if err := f.traffic(ctx, 2_000_000, n); err != nil {
		s.check(false, "while etcd is down: %v", err)
	}
	if err := s.checkPages(ctx, f.b, false); err != nil {
		return err
	}
	if err := hold(ctx, outage-time.Since(stopped)); err != nil {
		return err
	}
	return f.etcd.start(ctx)
}

func etcdPartitioned(ctx context.Context, s *Stage, f *fleet, n int) error {
	s.fault("daemon B is cut from etcd")
	f.px.Cut()
	cut := time.Now()
	if err := degraded(ctx, f.b, 1); err != nil {
		return err
	}
	if v, err := f.a.metric(ctx, "decodeplane_registry_degraded"); err != nil || v != 0 {
		s.check(false, "daemon A's decodeplane_registry_degraded = %g (%v) while only B is cut, want 0", v, err)
	}
	if err := f.traffic(ctx, 2_000_000, n); err != nil {
		s.check(false, "while B is cut: %v", err)
	}
	if err := s.checkPages(ctx, f.b, false); err != nil {
		return err
	}
	if err := hold(ctx, leaseTTL+outage/2-time.Since(cut)); err != nil { // past B's own lease: its record lapses in etcd
		return err
	}
	f.px.Heal()
	return nil
}

func etcdRestarted(ctx context.Context, s *Stage, f *fleet, n int) error {
	s.fault("etcd is killed and started again")
	if err := f.etcd.p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if err := f.etcd.start(ctx); err != nil {
		return err
	}
	if err := f.traffic(ctx, 2_000_000, n); err != nil {
		s.check(false, "across the etcd restart: %v", err)
	}
	return nil
}

// via is the same prefill ranks seen from another daemon of the fleet
// (where the registration arrived through etcd): a client of d whose ranks
// neither register nor heartbeat there, used to send rooms opened on d.
func (p *Prefill) via(d *Daemon) (*Prefill, error) {
	c, err := client.New(d.Addr)
	if err != nil {
		return nil, err
	}
	q := &Prefill{s: p.s, spec: p.spec, d: d, c: c, chunkPages: p.chunkPages, source: p.source, regs: p.regs}
	for _, reg := range p.regs {
		q.ranks = append(q.ranks, c.Prefill(reg))
	}
	p.s.mu.Lock()
	p.s.prefills = append(p.s.prefills, q)
	p.s.mu.Unlock()
	return q, nil
}
