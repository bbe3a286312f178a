// Package daemon is decodeplane's one composition root: Build wires a daemon
// from a config.Config, Run serves it, Shutdown stops it. `decodeplane serve`,
// the bench's in-process daemon (internal/bench) and every test that needs a
// whole daemon (internal/testing/daemontest) go through it, so the wiring and the
// shutdown order exist once.
//
// Build constructs, in this order, and starts nothing but the listeners (so
// that a busy port fails startup, not later):
//
//  1. tracing (internal/telemetry, from the OTEL_* variables, or the
//     provider the caller gives);
//  2. Prometheus (metrics.New) and the TLS of the listener and of the agent
//     link, whose reloads it counts;
//  3. one prealloc ledger per decode DP shard;
//  4. the transfer engine: the simulated one, or the delegate engine over
//     transfer/agentclient (readiness then follows the agent);
//  5. the room manager (kvmanager.New) with the metrics as its Observer;
//  6. the gRPC server (server.New) counting its calls in the metrics, with
//     the daemon's incarnation: a random non-zero 64-bit value drawn from
//     crypto/rand at every Build, returned by registration, heartbeat,
//     status and every destination, logged at startup; requests naming
//     another one are refused (server/internal/ops/incarnation.go);
//  7. the gRPC listener (server.listen) and the /metrics listener
//     (server.metrics_listen).
//
// Run starts the loops (TLS reloads, the agent client, the delegate engine,
// the manager's run loop), the /metrics server and Serve, then reports ready
// (unless readiness follows the agent). Shutdown order, when Run's context
// ends or Shutdown is called:
//
//  1. drain: no new rooms, health NOT_SERVING;
//  2. the rooms in flight get server.shutdown_timeout less a flush reserve
//     (a fifth, at most 2 s) to finish — or, from Shutdown, until its
//     context ends;
//  3. the rooms left fail with FAILURE_CODE_SHUTDOWN, their terminal events
//     queued on every claim and watch stream;
//  4. GracefulStop lets the handlers send them, bounded by
//     server.shutdown_timeout, then Stop;
//  5. the loops and the /metrics server stop;
//  6. the closers run in reverse order of Build: the agent connection,
//     then the tracer (spans flush last).
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/fleet"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/telemetry"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/metrics"
	"github.com/decodeplane/decodeplane/prealloc"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/agentclient"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// Options are what Build takes besides the configuration.
type Options struct {
	// Logger receives the daemon's logs; nil discards them.
	Logger *slog.Logger
	// Version is reported by Admin.GetStatus and in traces.
	Version string
	// Entries is the effective configuration Admin.GetStatus reports
	// (Entries(l) from a config.Loaded); nil reports none.
	Entries []server.ConfigEntry
	// Environ holds the OTEL_* variables tracing is built from; nil means
	// tracing off. Ignored when TracerProvider is set.
	Environ []string
	// TracerProvider, when set, records the daemon's spans (gRPC and rooms)
	// instead of a provider built from Environ; the caller shuts it down.
	TracerProvider trace.TracerProvider
	// Listener, when set, is served instead of listening on server.listen
	// (bufconn in tests); the daemon closes it.
	Listener net.Listener
	// UnaryInterceptors and StreamInterceptors run outermost, before the
	// metrics' (fault injection in tests).
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
	// ServerOptions are appended to the gRPC server's options.
	ServerOptions []grpc.ServerOption
}

// Entries lists l's effective configuration, secrets already redacted, for
// Admin.GetStatus.
func Entries(l *config.Loaded) []server.ConfigEntry {
	var entries []server.ConfigEntry
	for _, k := range l.Keys() {
		entries = append(entries, server.ConfigEntry{Key: k, Value: l.Value(k), Source: l.Sources[k]})
	}
	return entries
}

// CutShortError: the daemon stopped, but the graceful stop did not finish
// its work (serve exits 3): rooms or claims were ended with
// FAILURE_CODE_SHUTDOWN, or GracefulStop hit server.shutdown_timeout.
type CutShortError struct {
	Rooms    kvmanager.ShutdownSummary
	Deadline error // GracefulStop's deadline error, nil if it finished
}

func (e *CutShortError) Error() string {
	var parts []string
	if e.Rooms.Failed > 0 {
		parts = append(parts, fmt.Sprintf("%d rooms failed with FAILURE_CODE_SHUTDOWN", e.Rooms.Failed))
	}
	if e.Rooms.PendingClaims > 0 {
		parts = append(parts, fmt.Sprintf("%d claims on rooms never opened ended with FAILURE_CODE_SHUTDOWN", e.Rooms.PendingClaims))
	}
	if e.Deadline != nil {
		parts = append(parts, "GracefulStop did not finish before server.shutdown_timeout: the RPCs still open were cancelled ("+e.Deadline.Error()+")")
	}
	return strings.Join(parts, "; ")
}

// FlushReserve is the part of server.shutdown_timeout kept for the end of
// the shutdown: the rooms get the rest to finish; then the ones left fail,
// the stream handlers send each room's terminal event and GracefulStop
// waits for them. A fifth of the timeout, at most 2 s (a loopback flush
// takes milliseconds; a client that does not read is cut at the deadline).
func FlushReserve(timeout time.Duration) time.Duration {
	return min(timeout/5, 2*time.Second)
}

// Daemon is a built decodeplane: Run serves it, Shutdown stops it.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	version string
	// incarnation is this process's incarnation (newIncarnation).
	incarnation uint64
	srv         *server.Server
	mgr         *kvmanager.Manager
	fleet       *fleet.Etcd // registry.backend etcd; nil for memory
	engine      transfer.Engine
	metrics     *metrics.Metrics
	lis         net.Listener
	mlis        net.Listener
	hlis        net.Listener                  // server.http_listen (http.go)
	tracing     string                        // OTLP endpoint spans go to ("" = tracing off)
	closers     []func(context.Context) error // run in reverse order after the gRPC server stopped
	loops       []func(context.Context) error // background loops, run under the errgroup
	extra       []func(context.Context) error // other servers (metrics), stopped with ctx
	tp          trace.TracerProvider
	prop        propagation.TextMapPropagator
	// engineReady: readiness follows the transfer engine (the delegated
	// path flips it with the agent's reachability) instead of being set at
	// start.
	engineReady bool

	mu       sync.Mutex
	running  bool
	stopReq  chan struct{}   // closed by Shutdown
	roomsCtx context.Context // Shutdown's context: the rooms' deadline
	done     chan struct{}   // closed when Run has returned
	runErr   error
	started  chan struct{} // closed once Run serves and readiness is set
}

// Build constructs every component in the order of the package comment; it
// starts nothing but the listeners. A configuration the caller did not
// validate may fail here; a problem the operator fixes is a
// *config.UsageError.
func Build(ctx context.Context, cfg config.Config, opts Options) (*Daemon, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Daemon{cfg: cfg, log: log, version: opts.Version, stopReq: make(chan struct{}), done: make(chan struct{}), started: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			d.closeListeners()
			d.runClosers(context.Background())
		}
	}()
	if opts.Listener != nil {
		d.lis = opts.Listener
	}

	if err := d.buildTracing(ctx, opts); err != nil {
		return nil, err
	}
	d.metrics = metrics.New()
	if cfg.Server.SGLangMetrics {
		d.metrics.EnableSGLang(metrics.SGLangLabels{ModelName: cfg.Model.Name, DPShards: cfg.Parallel.DP})
	}
	serverTLS, agentTLS, err := buildTLS(cfg, log, d.metrics.Registry())
	if err != nil {
		return nil, err
	}
	d.loops = append(d.loops, serverTLS.loops()...)
	d.loops = append(d.loops, agentTLS.loops()...)
	dec := cfg.Decode()
	if err := d.buildEngine(cfg, dec, agentTLS); err != nil {
		return nil, err
	}
	if err := d.buildManager(cfg, dec); err != nil {
		return nil, err
	}
	if err := d.buildServer(cfg, dec, opts, serverTLS); err != nil {
		return nil, err
	}
	if err := d.listen(cfg); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

// buildTracing sets up the tracer provider and propagator: the caller's,
// or OpenTelemetry's from the environment (OTEL_*).
func (d *Daemon) buildTracing(ctx context.Context, opts Options) error {
	if opts.TracerProvider != nil {
		d.tp = opts.TracerProvider
		d.prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		return nil
	}
	tr, err := telemetry.NewTracing(ctx, opts.Environ, telemetry.As{Service: "decodeplane", Component: "daemon", Version: opts.Version})
	if err != nil {
		return err
	}
	d.tp, d.prop, d.tracing = tr.Provider, tr.Propagator, tr.Exporting
	d.closers = append(d.closers, tr.Shutdown) // closers run in reverse: spans flush last
	return nil
}

// buildEngine builds the transfer engine transfer.path names.
func (d *Daemon) buildEngine(cfg config.Config, dec kvlayout.Config, agentTLS daemonAgentTLS) error {
	log := d.log
	switch cfg.Transfer.Path {
	case config.PathSim:
		d.engine = sim.NewSimEngine(cfg.Transfer.Sim, kvlayout.RealClock{})
	case config.PathDelegate:
		ac, err := agentclient.Dial(cfg.Transfer.Delegate.Target, agentclient.Options{Logger: log, TracerProvider: d.tp, Propagator: d.prop, Credentials: agentTLS.credentials()})
		if err != nil {
			return err
		}
		d.closers = append(d.closers, func(context.Context) error { return ac.Close() })
		de := delegate.NewDelegateEngine(cfg.Transfer.Delegate, ac, delegate.DelegateDeps{
			Buffers: kvcopy.DecodeBuffers(dec.Layout(), kvmanager.StagingRingBytes(dec), dec.Pool.Metadata()),
			Logger:  log,
			// The loops start after d.srv is set.
			OnReadiness: func(ready bool, reason string) { d.srv.SetReady(ready, reason) },
		})
		d.loops = append(d.loops, ac.Run, de.Run)
		d.engineReady = true
		d.engine = de
	default:
		return &config.UsageError{Err: fmt.Errorf("transfer.path %q is not available in this build", cfg.Transfer.Path)}
	}
	return nil
}

// buildManager builds the decode DP shards' ledgers and the room manager
// over them.
func (d *Daemon) buildManager(cfg config.Config, dec kvlayout.Config) error {
	// kvmanager.New checks its own section; the transfer section is the
	// composition root's, checked here with it (same problems, same order).
	if err := errors.Join(cfg.Manager().Validate(), cfg.Transfer.Validate(), cfg.Transfer.ValidateFor(dec)); err != nil {
		return err
	}
	ledgers := make([]*prealloc.Ledger, max(1, cfg.Parallel.DP))
	for i := range ledgers {
		led, err := prealloc.NewLedger(dec, i)
		if err != nil {
			return fmt.Errorf("decode shard %d: %w", i, err)
		}
		ledgers[i] = led
	}
	log := d.log
	mgr, err := kvmanager.New(cfg.Manager(), dec, kvmanager.Deps{
		Ledgers:        ledgers,
		Engine:         d.engine,
		Logger:         log,
		TracerProvider: d.tp,
		Observer:       d.metrics,
		LeaseLiveness:  cfg.Registry.Backend == fleet.BackendEtcd,
	})
	if err != nil {
		return err
	}
	d.mgr = mgr
	d.metrics.Attach(mgr)
	mgr.HoldForResync(cfg.Engine.ResyncTimeout) // engine.resync_timeout: no admission until the engine's resync (kvmanager/resync.go)
	d.loops = append(d.loops, mgr.Run)
	return nil
}

// buildServer builds the inbound API (and the fleet registry it serves,
// registry.backend etcd) over the manager.
func (d *Daemon) buildServer(cfg config.Config, dec kvlayout.Config, opts Options, serverTLS daemonServerTLS) error {
	log, mgr := d.log, d.mgr
	inc, err := newIncarnation()
	if err != nil {
		return err
	}
	d.incarnation = inc
	var registrar server.Registrar
	var fleetView server.FleetView
	// The advertised address names this daemon in GetFleet and
	// WatchCapacity with either registry (memory: optional).
	advertise := cfg.Registry.Etcd.AdvertiseAddress
	if cfg.Registry.Backend == fleet.BackendEtcd {
		fl, err := d.buildFleet(cfg, opts)
		if err != nil {
			return err
		}
		registrar, fleetView = fl, fl
	}
	srv, err := server.New(cfg.Server, server.Deps{
		Registrar:          registrar,
		Fleet:              fleetView,
		AdvertiseAddress:   advertise,
		Incarnation:        inc,
		Stale:              d.metrics,
		Sessions:           d.metrics,
		PrefillSessions:    d.metrics,
		Logger:             log,
		TracerProvider:     d.tp,
		Propagator:         d.prop,
		Version:            opts.Version,
		Config:             opts.Entries,
		Layout:             dec.Layout(),
		TransferPath:       cfg.Transfer.Path,
		Manager:            mgr,
		Calls:              callMetrics{d.metrics},
		UnaryInterceptors:  opts.UnaryInterceptors,
		StreamInterceptors: opts.StreamInterceptors,
		ExtraServerOptions: append(serverTLS.options(), opts.ServerOptions...),
	})
	if err != nil {
		return err
	}
	d.metrics.InitializeGRPC(srv.GRPC())
	d.srv = srv
	if d.fleet != nil {
		degraded, reason, _ := d.fleet.State()
		srv.SetRegistryState(degraded, reason)
	}
	return nil
}

// listen opens the gRPC listener (unless the caller gave one), the metrics
// listener and the HTTP surfaces.
func (d *Daemon) listen(cfg config.Config) error {
	if d.lis == nil {
		network, address, err := server.ListenAddr(cfg.Server.Listen, true)
		if err != nil {
			return &config.UsageError{Err: fmt.Errorf("server.listen: %w", err)}
		}
		lis, err := net.Listen(network, address)
		if err != nil {
			return fmt.Errorf("listen on %s (server.listen): %w", cfg.Server.Listen, err)
		}
		d.lis = lis
	}
	if cfg.Server.MetricsListen != "" {
		mlis, err := net.Listen("tcp", cfg.Server.MetricsListen)
		if err != nil {
			return fmt.Errorf("listen on %s (server.metrics_listen): %w", cfg.Server.MetricsListen, err)
		}
		d.mlis = mlis
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.metrics.Handler())
		d.serveHTTP("metrics server", &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, mlis)
	}
	return d.addHTTP(d.srv)
}

// buildFleet builds the registry shared through etcd (registry.backend
// etcd): it publishes registrations, keeps this daemon's record, the view
// and the leases (its Run is one of the loops), and reports its state into
// the readiness text. New does not wait for etcd: a daemon whose etcd is
// down starts degraded.
func (d *Daemon) buildFleet(cfg config.Config, opts Options) (*fleet.Etcd, error) {
	fl, err := fleet.New(cfg.Registry.Etcd, fleet.Deps{
		Rooms: d.mgr,
		Self: fleet.Self{Incarnation: d.incarnation, Version: opts.Version, StartedAt: time.Now(), Layout: server.LayoutProto(cfg.Decode().Layout()),
			Fingerprint: server.FingerprintProto(cfg.Decode().Layout().Fingerprint())},
		Logger:   d.log,
		Observer: d.metrics,
		// The capacity feed of the server (built after the registry; the
		// registry's loops start in Run, once it is).
		Capacity: func(ctx context.Context, minInterval, keepalive time.Duration, send func(*pb.CapacityUpdate) error) error {
			return d.srv.FeedCapacity(ctx, minInterval, keepalive, send)
		},
		OnState: func(degraded bool, reason string) {
			if d.srv != nil {
				d.srv.SetRegistryState(degraded, reason)
			}
		},
	})
	if err != nil {
		return nil, &config.UsageError{Err: err}
	}
	d.fleet = fl
	d.loops = append(d.loops, fl.Run)
	d.closers = append(d.closers, func(context.Context) error { return fl.Close() })
	return fl, nil
}

// Fleet is the shared registry (nil with the memory registry).
func (d *Daemon) Fleet() *fleet.Etcd { return d.fleet }

// newIncarnation draws a daemon incarnation: 64 random bits from
// crypto/rand, never 0 (0 means "not checked" on the wire).
func newIncarnation() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("draw the daemon incarnation: %w", err)
		}
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v, nil
		}
	}
}

// Incarnation is this daemon's incarnation, new at every Build.
func (d *Daemon) Incarnation() uint64 { return d.incarnation }

// callMetrics gives the server the metrics' per-method gRPC series.
type callMetrics struct{ m *metrics.Metrics }

func (c callMetrics) Method(fullMethod, kind string) server.MethodMetrics {
	return c.m.GRPCMethod(fullMethod, kind)
}

// serveHTTP runs hs on lis among the daemon's other servers: it serves until
// Run's context ends, then shuts down within 2 s.
func (d *Daemon) serveHTTP(what string, hs *http.Server, lis net.Listener) {
	d.extra = append(d.extra, func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		}()
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

// HTTPAddr is the server.http_listen address, "" when it is off.
func (d *Daemon) HTTPAddr() string {
	if d.hlis == nil {
		return ""
	}
	return d.hlis.Addr().String()
}

// Started is closed once Run serves and, unless readiness follows the
// transfer agent, reports ready.
func (d *Daemon) Started() <-chan struct{} { return d.started }

// Addr is the gRPC listener's address.
func (d *Daemon) Addr() net.Addr { return d.lis.Addr() }

// MetricsURL is the /metrics URL, "" without server.metrics_listen.
func (d *Daemon) MetricsURL() string {
	if d.mlis == nil {
		return ""
	}
	return "http://" + d.mlis.Addr().String() + "/metrics"
}

// Metrics is the daemon's Prometheus instrumentation (its Handler serves
// /metrics).
func (d *Daemon) Metrics() *metrics.Metrics { return d.metrics }

// Manager is the room manager.
func (d *Daemon) Manager() *kvmanager.Manager { return d.mgr }

// Server is the gRPC server.
func (d *Daemon) Server() *server.Server { return d.srv }

// Engine is the transfer engine (*sim.SimEngine on the sim path).
func (d *Daemon) Engine() transfer.Engine { return d.engine }

// TracerProvider is the provider the daemon's spans go to.
func (d *Daemon) TracerProvider() trace.TracerProvider { return d.tp }

// Propagator is the daemon's W3C trace-context propagator.
func (d *Daemon) Propagator() propagation.TextMapPropagator { return d.prop }

func (d *Daemon) closeListeners() {
	if d.lis != nil {
		d.lis.Close()
	}
	if d.mlis != nil {
		d.mlis.Close()
	}
	if d.hlis != nil {
		d.hlis.Close()
	}
}

func (d *Daemon) runClosers(ctx context.Context) {
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](ctx); err != nil {
			d.log.Warn("shutdown step failed", "err", err)
		}
	}
	d.closers = nil
}

// Run serves until ctx is cancelled (serve: SIGINT/SIGTERM), Shutdown is
// called or a component fails, then stops the daemon in the order of the
// package comment. It returns nil after a clean stop, a *CutShortError when
// the stop had to fail rooms or GracefulStop hit its deadline, or the error
// of the component that failed. Run may be called once.
func (d *Daemon) Run(ctx context.Context) error {
	d.mu.Lock()
	if d.running {
		d.mu.Unlock()
		return errors.New("daemon: Run called twice")
	}
	d.running = true
	d.mu.Unlock()
	defer close(d.done)
	d.runErr = d.run(ctx)
	return d.runErr
}

// Shutdown stops a running daemon and returns Run's result once Run has
// returned; the rooms in flight get until ctx ends to finish (an already
// cancelled ctx fails them at once), and GracefulStop is bounded by
// server.shutdown_timeout. A daemon that was built but never run releases
// its listeners and closers.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.mu.Lock()
	if !d.running {
		d.running = true
		d.mu.Unlock()
		d.closeListeners()
		d.runClosers(ctx)
		close(d.done)
		return nil
	}
	select {
	case <-d.stopReq:
	default:
		d.roomsCtx = ctx
		close(d.stopReq)
	}
	d.mu.Unlock()
	<-d.done
	return d.runErr
}

func (d *Daemon) run(ctx context.Context) error {
	log := d.log
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.srv.Serve(d.lis) })
	loopCtx, cancelLoops := context.WithCancel(context.Background())
	defer cancelLoops()
	for _, loop := range d.loops {
		g.Go(func() error {
			if err := loop(loopCtx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		})
	}
	for _, x := range d.extra {
		g.Go(func() error { return x(loopCtx) })
	}
	if !d.engineReady {
		d.srv.SetReady(true, "serving")
	}
	close(d.started)
	metricsAddr, traces := "off", "off"
	if d.mlis != nil {
		metricsAddr = d.MetricsURL()
	}
	if d.tracing != "" {
		traces = d.tracing + " (OTLP gRPC; Jaeger UI/API on :16686)"
	}
	httpAddr := "off"
	if d.hlis != nil {
		httpAddr = "http://" + d.hlis.Addr().String()
	}
	log.Info("decodeplane serving", "listen", d.lis.Addr().String(), "metrics", metricsAddr, "http", httpAddr, "traces", traces,
		"version", d.version, "incarnation", fmt.Sprintf("%x", d.incarnation), "transfer_path", d.cfg.Transfer.Path, "layout", d.cfg.Decode().Layout().String())

	select {
	case <-gctx.Done():
	case <-d.stopReq:
	}
	if ctx.Err() != nil {
		log.Info("shutting down", "reason", context.Cause(ctx), "deadline", d.cfg.Server.ShutdownTimeout)
	}
	timeout := d.cfg.Server.ShutdownTimeout
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d.mu.Lock()
	roomsCtx := d.roomsCtx
	d.mu.Unlock()
	shutdownErr := d.srv.Shutdown(sctx, func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, timeout-FlushReserve(timeout))
		defer cancel()
		if roomsCtx != nil { // Shutdown's deadline for the rooms
			if roomsCtx.Err() != nil {
				cancel()
			}
			defer context.AfterFunc(roomsCtx, cancel)()
		}
		d.mgr.Shutdown(rctx)
	})
	cancelLoops()
	runErr := g.Wait()
	if d.mlis != nil {
		d.mlis.Close()
	}
	d.runClosers(sctx)
	ended := d.mgr.ShutdownSummary()
	log.Info("rooms ended by the shutdown", "failed", ended.Failed, "pending_claims_failed", ended.PendingClaims, "succeeded_released", ended.Released)
	if shutdownErr != nil {
		log.Warn("graceful stop cut short by the deadline", "err", shutdownErr)
	}
	if runErr != nil && ctx.Err() == nil && !stopRequested(d.stopReq) {
		return runErr
	}
	if ended.CutShort() || shutdownErr != nil {
		return &CutShortError{Rooms: ended, Deadline: shutdownErr}
	}
	return nil
}

func stopRequested(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
