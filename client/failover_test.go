package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	daemonpkg "github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The fail-over runs against whole daemons (bufconn) in a synctest bubble:
// their heartbeat interval is 4 s, so a Prefill beats every 2 s (cadence),
// and every time below is the bubble's clock.
const (
	fleetInterval = 4 * time.Second
	cadence       = fleetInterval / 2
	// retryBudget is the most the default retry policy waits before a
	// beat to a stopped daemon fails (50+100+200 ms of back-off).
	retryBudget = 350 * time.Millisecond
)

// call is one call a fleet daemon received, at the bubble's time.
type call struct {
	method string
	at     time.Time
}

// fleetDaemon is a test daemon of the fleet and the calls it received.
type fleetDaemon struct {
	*daemontest.Daemon
	mu    sync.Mutex
	calls []call
}

func (d *fleetDaemon) record(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	d.mu.Lock()
	d.calls = append(d.calls, call{info.FullMethod, time.Now()})
	d.mu.Unlock()
	return h(ctx, req)
}

// received lists the times of the calls of method.
func (d *fleetDaemon) received(method string) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []time.Time
	for _, c := range d.calls {
		if c.method == method {
			out = append(out, c.at)
		}
	}
	return out
}

// startFleetDaemon starts a daemon (memory registry: it knows a rank only
// once the rank registered with it) in the bubble; stop ends it.
func startFleetDaemon(t *testing.T) *fleetDaemon {
	t.Helper()
	d := &fleetDaemon{}
	td, err := daemontest.New(daemontest.Options{
		Config: func(c *config.Config) { c.Timeouts.HeartbeatInterval = fleetInterval },
		Daemon: daemonpkg.Options{Version: "fleet", UnaryInterceptors: []grpc.UnaryServerInterceptor{d.record}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Daemon = td
	return d
}

func (d *fleetDaemon) stop(t *testing.T) {
	t.Helper()
	if err := d.Stop(); err != nil {
		t.Errorf("daemon stop: %v", err)
	}
}

// target is where a client's connection goes: the daemon it holds, which a
// test replaces to restart "the same" daemon.
type target struct{ d atomic.Pointer[fleetDaemon] }

func (tg *target) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New("passthrough:///fleet", client.WithDialOptions(grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return tg.d.Load().DialContext(ctx)
	})))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newTarget(d *fleetDaemon) *target {
	tg := &target{}
	tg.d.Store(d)
	return tg
}

// errLog collects a Prefill's heartbeat errors with their times.
type errLog struct {
	mu   sync.Mutex
	errs []error
	at   []time.Time
}

func (l *errLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
	l.at = append(l.at, time.Now())
}

func (l *errLog) get() ([]error, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...), append([]time.Time(nil), l.at...)
}

// TestHeartbeatFailover: a rank beats through daemon A; A stops; the first
// beat that fails moves to daemon B at once (within one cadence of the
// stop, plus the failed beat's retries), registers there, and B's room for
// the rank is handed off through B. Then every beat goes to B, none to A;
// B's Prefill only ever holds B's incarnation; cancelling returns.
func TestHeartbeatFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		a, b := startFleetDaemon(t), startFleetDaemon(t)
		defer b.stop(t)
		cA, cB := newTarget(a).client(t), newTarget(b).client(t)
		defer cA.Close()
		defer cB.Close()
		var aErrs errLog
		reg := prefillRank(addr, 1, 0)
		pA := cA.Prefill(reg, client.OnHeartbeatError(aErrs.add))
		pB := cB.Prefill(reg, client.OnIncarnationChange(func(old, new uint64) {
			t.Errorf("B's Prefill learned incarnation %x -> %x: it may only hold B's (%x)", old, new, b.Incarnation())
		}))
		// B has a room for the rank before the rank ever registered there.
		if _, err := cB.Engine().OpenRoom(ctx, openReq(1, 100)); err != nil {
			t.Fatal(err)
		}

		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- client.RunHeartbeatFailover(runCtx, pA, pB) }()
		synctest.Wait()
		start := time.Now()
		if n := len(a.received(pb.Bootstrap_RegisterPrefill_FullMethodName)); n != 1 || pB.Registration() != nil {
			t.Fatalf("at start: %d registrations with A, B registered %v; want the rank registered through A only", n, pB.Registration() != nil)
		}
		time.Sleep(2*cadence + cadence/2)
		synctest.Wait()
		if hb := a.received(pb.Bootstrap_Heartbeat_FullMethodName); len(hb) != 2 || !hb[0].Equal(start.Add(cadence)) || !hb[1].Equal(start.Add(2*cadence)) {
			t.Fatalf("A's heartbeats at %v, want at +%s and +%s", hb, cadence, 2*cadence)
		}
		if len(b.received(pb.Bootstrap_RegisterPrefill_FullMethodName)) != 0 || len(b.received(pb.Bootstrap_Heartbeat_FullMethodName)) != 0 {
			t.Fatal("B heard from the rank while A was up")
		}

		a.stop(t)
		stopped := time.Now()
		time.Sleep(cadence)
		synctest.Wait()
		errs, at := aErrs.get()
		if len(errs) != 1 || !errors.Is(errs[0], client.ErrUnavailable) {
			t.Fatalf("A's Prefill saw %v; want one failed beat, ErrUnavailable", errs)
		}
		regs := b.received(pb.Bootstrap_RegisterPrefill_FullMethodName)
		if len(regs) != 1 || !regs[0].Equal(at[0]) {
			t.Fatalf("B's registrations at %v; want one, at once after A's failed beat (%s)", regs, at[0])
		}
		if moved := regs[0].Sub(stopped); moved > cadence+retryBudget {
			t.Errorf("the rank reached B %s after A stopped; want within one cadence (%s) plus the failed beat's retries (%s)", moved, cadence, retryBudget)
		}
		if pB.Incarnation() != b.Incarnation() || pA.Incarnation() != a.Incarnation() || a.Incarnation() == b.Incarnation() {
			t.Errorf("incarnations: B's Prefill %x (B %x), A's Prefill %x (A %x); each must hold its own daemon's", pB.Incarnation(), b.Incarnation(), pA.Incarnation(), a.Incarnation())
		}
		// B resolved its waiting room with the registration: it hands off.
		if dst, err := pB.SendRoom(ctx, 1, client.SendOptions{}); err != nil || dst.GetIncarnation() != b.Incarnation() {
			t.Fatalf("SendRoom through B = %v, %v; want B's destination (incarnation %x)", dst, err, b.Incarnation())
		}

		// From now on every beat goes to B, at the cadence; A hears nothing.
		base := len(b.received(pb.Bootstrap_Heartbeat_FullMethodName))
		time.Sleep(3 * cadence)
		synctest.Wait()
		if n := len(b.received(pb.Bootstrap_Heartbeat_FullMethodName)) - base; n != 3 {
			t.Errorf("B got %d heartbeats in 3 cadences, want 3", n)
		}
		if errs, _ := aErrs.get(); len(errs) != 1 {
			t.Errorf("A's Prefill beat again after the fail-over: %v", errs)
		}
		if pB.Incarnation() != b.Incarnation() {
			t.Errorf("B's Prefill holds %x, want B's %x", pB.Incarnation(), b.Incarnation())
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("RunHeartbeatFailover = %v, want context.Canceled", err)
		}
	})
}

// TestHeartbeatFailoverOnRestart: daemon A restarts between two beats (a
// new process behind the same target, a new incarnation): the next beat
// finds the rank unknown, registers again and learns the new incarnation,
// and the loop moves to B at once: A's rooms died with its process. B's
// Prefill never holds either of A's incarnations.
func TestHeartbeatFailoverOnRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		a, b := startFleetDaemon(t), startFleetDaemon(t)
		defer b.stop(t)
		tgA := newTarget(a)
		cA, cB := tgA.client(t), newTarget(b).client(t)
		defer cA.Close()
		defer cB.Close()
		var aErrs errLog
		var changes [][2]uint64
		var mu sync.Mutex
		reg := prefillRank(addr, 1, 0)
		pA := cA.Prefill(reg, client.OnHeartbeatError(aErrs.add), client.OnIncarnationChange(func(old, new uint64) {
			mu.Lock()
			changes = append(changes, [2]uint64{old, new})
			mu.Unlock()
		}))
		pB := cB.Prefill(reg)
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- client.RunHeartbeatFailover(runCtx, pA, pB) }()
		time.Sleep(cadence + cadence/2) // registered, one heartbeat
		synctest.Wait()
		if pA.Incarnation() != a.Incarnation() {
			t.Fatalf("A's Prefill holds %x, want A's %x", pA.Incarnation(), a.Incarnation())
		}

		a2 := startFleetDaemon(t)
		defer a2.stop(t)
		tgA.d.Store(a2)
		a.stop(t)
		time.Sleep(cadence)
		synctest.Wait()
		mu.Lock()
		got := changes
		mu.Unlock()
		if len(got) != 1 || got[0] != [2]uint64{a.Incarnation(), a2.Incarnation()} {
			t.Fatalf("A's Prefill learned %x, want one change %x -> %x", got, a.Incarnation(), a2.Incarnation())
		}
		errs, at := aErrs.get()
		var ic *client.IncarnationChangedError
		if len(errs) != 2 || !errors.Is(errs[0], client.ErrNotFound) || !errors.As(errs[1], &ic) || ic.Old != a.Incarnation() || ic.New != a2.Incarnation() {
			t.Fatalf("A's Prefill saw %v; want ErrNotFound (the new process), then the incarnation change", errs)
		}
		if regs := b.received(pb.Bootstrap_RegisterPrefill_FullMethodName); len(regs) != 1 || !regs[0].Equal(at[1]) {
			t.Fatalf("B's registrations at %v; want one, at once after A's change (%s)", regs, at[1])
		}
		if pB.Incarnation() != b.Incarnation() {
			t.Errorf("B's Prefill holds %x, want B's %x (A was %x, then %x)", pB.Incarnation(), b.Incarnation(), a.Incarnation(), a2.Incarnation())
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("RunHeartbeatFailover = %v, want context.Canceled", err)
		}
	})
}

// TestHeartbeatFailoverAllDown: with every daemon stopped the loop tries
// each once in a row, then waits a cadence: it never spins.
func TestHeartbeatFailoverAllDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := startFleetDaemon(t), startFleetDaemon(t)
		cA, cB := newTarget(a).client(t), newTarget(b).client(t)
		defer cA.Close()
		defer cB.Close()
		var errs errLog
		reg := prefillRank(addr, 1, 0)
		pA, pB := cA.Prefill(reg, client.OnHeartbeatError(errs.add)), cB.Prefill(reg, client.OnHeartbeatError(errs.add))
		a.stop(t)
		b.stop(t)
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- client.RunHeartbeatFailover(runCtx, pA, pB) }()
		const rounds = 10
		// Registration has not given an interval: the cadence is half of
		// SGLang's 5 s until a daemon answers.
		time.Sleep(rounds * 5 * time.Second / 2)
		synctest.Wait()
		got, _ := errs.get()
		// Each round: A fails, B fails at once, then one cadence.
		if len(got) < rounds || len(got) > 2*(rounds+1) {
			t.Errorf("%d failed beats in %d cadences, want 2 per round (%d..%d)", len(got), rounds, rounds, 2*(rounds+1))
		}
		for _, err := range got {
			if !errors.Is(err, client.ErrUnavailable) {
				t.Errorf("failed beat %v, want ErrUnavailable", err)
			}
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("RunHeartbeatFailover = %v, want context.Canceled", err)
		}
	})
}

// TestHeartbeatFailoverRefuses what it cannot run.
func TestHeartbeatFailoverRefuses(t *testing.T) {
	c, err := client.New("passthrough:///nowhere")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other := prefillRank(addr, 2, 1)
	otherInst := prefillRank(addr, 1, 0)
	otherInst.InstanceId = "another"
	p := c.Prefill(prefillRank(addr, 1, 0))
	for name, ps := range map[string][]*client.Prefill{
		"none":             nil,
		"nil":              {p, nil},
		"another rank":     {p, c.Prefill(other)},
		"another instance": {p, c.Prefill(otherInst)},
	} {
		if err := client.RunHeartbeatFailover(t.Context(), ps...); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("%s: RunHeartbeatFailover = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestGetFleet: the memory registry's fleet is the daemon itself and the
// prefill instances registered with it.
func TestGetFleet(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	registered(t, c)
	f, err := c.Admin().GetFleet(ctxT(t))
	if err != nil {
		t.Fatalf("GetFleet: %v", err)
	}
	if ds := f.GetDaemons(); len(ds) != 1 || !ds[0].GetSelf() || ds[0].GetIncarnation() != d.Incarnation() {
		t.Errorf("daemons %v, want this one (incarnation %x), self", ds, d.Incarnation())
	}
	if ps := f.GetPrefills(); len(ps) != 1 || ps[0].GetBootstrapAddr() != addr || ps[0].GetInstanceId() != "prefill-"+addr || ps[0].GetLiveness() != "heartbeat" {
		t.Errorf("prefills %v, want %s (instance prefill-%s), alive by heartbeat", ps, addr, addr)
	}
	if r := f.GetRegistry(); r.GetBackend() != "memory" || r.GetState() != "ok" {
		t.Errorf("registry %v, want memory, ok", r)
	}
}
