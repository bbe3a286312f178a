// Package daemontest starts a whole in-process decodeplane for tests: the
// real daemon.Build (ledgers, the simulated transfer engine, the room
// manager, the gRPC server with its metrics), served on an in-memory
// listener (bufconn) or on loopback TCP, and stopped at once at cleanup.
// Tests that need a daemon use it instead of retyping the wiring.
package daemontest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// Target is the gRPC target of a bufconn daemon; dial it with Dialer.
const Target = "passthrough:///bufnet"

// Options adjust a test daemon.
type Options struct {
	// Config adjusts the configuration after the test defaults (the
	// embedded defaults, instant simulated transfers, no /metrics
	// listener, a 10-minute heartbeat interval).
	Config func(*config.Config)
	// TCP serves on a loopback TCP port instead of bufconn.
	TCP bool
	// Daemon are the daemon's options (interceptors, tracer, server
	// options, version, entries); Listener is set by daemontest.
	Daemon daemon.Options
}

// Daemon is a running test daemon.
type Daemon struct {
	*daemon.Daemon
	// Addr is the loopback address with TCP, Target otherwise.
	Addr string
	lis  *bufconn.Listener
	done chan error
}

// config returns the test defaults with o.Config applied.
func (o Options) config() config.Config {
	cfg := config.DefaultConfig()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.MetricsListen = ""
	cfg.Transfer.Sim = sim.SimConfig{}
	// No test may lose its prefill to a missed heartbeat.
	cfg.Timeouts.HeartbeatInterval = 10 * time.Minute
	if o.Config != nil {
		o.Config(&cfg)
	}
	return cfg
}

// New builds and runs a daemon; Stop ends it. Start is New for a test.
func New(o Options) (*Daemon, error) {
	cfg := o.config()
	d := &Daemon{Addr: Target, done: make(chan error, 1)}
	opts := o.Daemon
	if !o.TCP {
		d.lis = bufconn.Listen(1 << 20)
		opts.Listener = d.lis
	}
	built, err := daemon.Build(context.Background(), cfg, opts)
	if err != nil {
		return nil, err
	}
	d.Daemon = built
	if o.TCP {
		d.Addr = built.Addr().String()
	}
	go func() { d.done <- built.Run(context.Background()) }()
	select {
	case <-built.Started():
	case err := <-d.done:
		return nil, errors.Join(errors.New("daemon stopped at start"), err)
	}
	return d, nil
}

// Start starts a daemon for t and stops it at cleanup, failing t if the
// stop failed.
func Start(t testing.TB, o Options) *Daemon {
	t.Helper()
	d, err := New(o)
	if err != nil {
		t.Fatalf("daemontest: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	})
	return d
}

// Stop shuts the daemon down at once: rooms still handing off fail (a real
// daemon gives them server.shutdown_timeout to finish), their streams end,
// every ledger is full again. Rooms failed by the stop are not an error;
// a GracefulStop cut by its deadline or a failed component is.
func (d *Daemon) Stop() error {
	now, cancel := context.WithCancel(context.Background())
	cancel()
	err := d.Shutdown(now)
	if cut := (*daemon.CutShortError)(nil); errors.As(err, &cut) && cut.Deadline == nil {
		err = nil
	}
	return err
}

// Dialer connects to the daemon's listener (bufconn or TCP).
func (d *Daemon) Dialer() grpc.DialOption {
	if d.lis == nil {
		return grpc.EmptyDialOption{}
	}
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return d.lis.DialContext(ctx) })
}

// DialContext connects to the daemon's bufconn listener (nil with TCP: dial
// Addr), for a dialer that moves to another daemon (a restart in a test).
func (d *Daemon) DialContext(ctx context.Context) (net.Conn, error) {
	if d.lis == nil {
		return nil, errors.New("daemontest: a TCP daemon: dial its Addr")
	}
	return d.lis.DialContext(ctx)
}

// Conn dials the daemon in plaintext; the connection closes at cleanup
// (before the daemon stops).
func (d *Daemon) Conn(t testing.TB) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(d.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), d.Dialer())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// SimEngine is the daemon's simulated transfer engine (fault injection).
func (d *Daemon) SimEngine() *sim.SimEngine {
	e, _ := d.Engine().(*sim.SimEngine)
	return e
}
