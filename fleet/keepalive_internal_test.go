package fleet

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// lockedBuffer is a log sink safe for the registry's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newTestEtcd is a registry on a real embedded etcd, over a real room
// manager, whose loops are not running: the test drives keepSession itself.
func newTestEtcd(t *testing.T) (*Etcd, *lockedBuffer) {
	t.Helper()
	return newEtcdOn(t, etcdtest.Start(t).Endpoint(), nil)
}

// newEtcdOn is newTestEtcd on endpoint, with onState as Deps.OnState.
func newEtcdOn(t *testing.T, endpoint string, onState func(bool, string)) (*Etcd, *lockedBuffer) {
	t.Helper()
	dec := kvlayout.DefaultConfig()
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := kvmanager.New(kvmanager.DefaultConfig(), dec, kvmanager.Deps{Ledgers: []*prealloc.Ledger{led},
		Engine: sim.NewSimEngine(sim.SimConfig{}, nil), Logger: slog.New(slog.DiscardHandler), LeaseLiveness: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mgr.Shutdown(context.Background()) })
	cfg := DefaultConfig().Etcd
	cfg.Endpoints, cfg.AdvertiseAddress, cfg.Prefix = endpoint, "10.9.0.1:7600", "/race/"
	cfg.RequestTimeout, cfg.DialTimeout = time.Second, time.Second
	logs := &lockedBuffer{}
	e, err := New(cfg, Deps{Rooms: mgr, Self: Self{Incarnation: 7, Version: "test", StartedAt: time.Now()},
		Logger: slog.New(slog.NewTextHandler(logs, nil)), OnState: onState})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, logs
}

func resyncAsked(e *Etcd) bool {
	select {
	case <-e.resync:
		return true
	default:
		return false
	}
}

// TestKeepAliveRaceWithPublishIsNoRevisionLoss: a registration published
// by this daemon while its own keepalive is in flight advances the view
// past the revision etcd answered the keepalive at. That is the normal
// order of events on a live etcd, not etcd going back: no warning, no
// rebuild. (The hook runs the publication at the one moment that shows
// the race, between the keepalive's answer and its check.)
func TestKeepAliveRaceWithPublishIsNoRevisionLoss(t *testing.T) {
	e, logs := newTestEtcd(t)
	ctx := context.Background()
	var last time.Time
	if err := e.keepSession(ctx, &last); err != nil { // grants the lease, puts the record
		t.Fatal(err)
	}
	reg := kvmanager.Registration{Addr: "10.0.0.1:8998", Endpoint: "10.0.0.1:17000", InstanceID: "p1",
		Parallel: kvmanager.ParallelInfo{AttnTP: 1, PP: 1}, PageSize: 64, KVDType: "bf16"}
	var published int64
	e.afterKeepAlive = func() {
		if err := e.publish(ctx, reg); err != nil {
			t.Errorf("publish: %v", err)
		}
		e.mu.Lock()
		published = e.view.rev
		e.mu.Unlock()
	}
	if err := e.keepSession(ctx, &last); err != nil {
		t.Fatal(err)
	}
	if published == 0 {
		t.Fatal("the hook did not run: the keepalive was not sent")
	}
	if resyncAsked(e) || strings.Contains(logs.String(), "behind the view") {
		t.Fatalf("a publication during the keepalive was taken for etcd losing its data (view at %d):\n%s", published, logs.String())
	}
}

// TestKeepAliveBehindViewRebuilds: etcd answering below a revision the
// view had reached before the keepalive was sent has lost its data: the
// view is rebuilt.
func TestKeepAliveBehindViewRebuilds(t *testing.T) {
	e, logs := newTestEtcd(t)
	ctx := context.Background()
	var last time.Time
	if err := e.keepSession(ctx, &last); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.view.rev = 1 << 40 // as if etcd had been restored from an old backup since
	e.mu.Unlock()
	if err := e.keepSession(ctx, &last); err != nil {
		t.Fatal(err)
	}
	if !resyncAsked(e) || !strings.Contains(logs.String(), "behind the view") {
		t.Fatalf("etcd behind the view did not rebuild it:\n%s", logs.String())
	}
}

// TestUnreachableAtStartup: a daemon whose etcd does not answer from the
// start logs a warning with the fix, and its readiness reason says that
// etcd has been unreachable since startup and what to check; once etcd
// answers, the registry is ok.
func TestUnreachableAtStartup(t *testing.T) {
	srv, err := etcdtest.New(etcdtest.Options{Dir: t.TempDir(), NoFsync: true, LogLevel: "fatal"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	type state struct {
		degraded bool
		reason   string
	}
	states := make(chan state, 1024) // never full: a state change is a failed request (1 s each) or a recovery
	e, logs := newEtcdOn(t, srv.Endpoint(), func(d bool, r string) {
		select {
		case states <- state{d, r}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for s := range states {
		if !s.degraded {
			t.Fatalf("registry ok with etcd down: %+v", s)
		}
		if strings.Contains(s.reason, "unreachable since startup at registry.etcd.endpoints "+srv.Endpoint()) {
			if !strings.Contains(s.reason, "check that etcd runs") {
				t.Fatalf("the reason names no fix: %q", s.reason)
			}
			break
		}
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "unreachable since startup") || !strings.Contains(l, "fix=") {
		t.Fatalf("no warning with the fix:\n%s", l)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	for s := range states {
		if !s.degraded {
			break
		}
	}
}
