package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/kvmanager/kvcopy"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/server"
)

func cmdServe(args, environ []string, stdout, stderr io.Writer) int {
	cf := newConfigFlags("serve", stderr)
	if err := cf.parse(args, environ); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane serve: %v\n", err)
		return exitUsage
	}
	// Signals first, so that SIGTERM during a slow start is honoured.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	l, problems := loadConfig(cf, environ)
	if len(problems) > 0 {
		printProblems(stderr, l, problems)
		fmt.Fprintln(stderr, "decodeplane: refusing to start; fix the configuration (check it with 'decodeplane validate').")
		return exitUsage
	}
	cfg := l.Config
	log := newLogger(stderr, cfg.Log)
	for _, w := range l.Warnings() {
		log.Warn("configuration warning", "key", w.Key, "message", w.Message)
	}
	d, err := buildDaemon(ctx, l, log, environ)
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "decodeplane: %v\n", err)
			return exitUsage
		}
		log.Error("startup failed", "err", err)
		return exitFailure
	}
	if err := d.run(ctx); err != nil {
		var cut *cutShortError
		if errors.As(err, &cut) {
			log.Warn("decodeplane stopped; the graceful stop was cut short", "exit_code", exitCutShort, "reason", cut.Error())
			return exitCutShort
		}
		log.Error("daemon failed", "err", err)
		return exitFailure
	}
	log.Info("decodeplane stopped")
	return exitOK
}

// cutShortError: the daemon stopped on a signal, but the graceful stop did
// not finish its work (exit 3): rooms or claims were ended with
// FAILURE_CODE_SHUTDOWN, or GracefulStop hit server.shutdown_timeout.
type cutShortError struct {
	rooms    kvmanager.ShutdownSummary
	deadline error // GracefulStop's deadline error, nil if it finished
}

func (e *cutShortError) Error() string {
	var parts []string
	if e.rooms.Failed > 0 {
		parts = append(parts, fmt.Sprintf("%d rooms failed with FAILURE_CODE_SHUTDOWN", e.rooms.Failed))
	}
	if e.rooms.PendingClaims > 0 {
		parts = append(parts, fmt.Sprintf("%d claims on rooms never opened ended with FAILURE_CODE_SHUTDOWN", e.rooms.PendingClaims))
	}
	if e.deadline != nil {
		parts = append(parts, "GracefulStop did not finish before server.shutdown_timeout: the RPCs still open were cancelled ("+e.deadline.Error()+")")
	}
	return strings.Join(parts, "; ")
}

// flushReserve is the part of server.shutdown_timeout kept for the end of
// the shutdown: the rooms get the rest to finish; then the ones left fail,
// the stream handlers send each room's terminal event and GracefulStop
// waits for them. A fifth of the timeout, at most 2 s (a loopback flush
// takes milliseconds; a client that does not read is cut at the deadline).
func flushReserve(timeout time.Duration) time.Duration {
	return min(timeout/5, 2*time.Second)
}

// usageError is a startup problem the operator fixes in the configuration
// or environment (exit 2), e.g. a malformed OTEL_* variable.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// daemon is a built, not yet serving, decodeplane.
type daemon struct {
	cfg      Config
	log      *slog.Logger
	srv      *server.Server
	lis      net.Listener
	mlis     net.Listener
	hlis     net.Listener                  // server.http_listen (http.go)
	tracing  string                        // OTLP endpoint spans go to ("" = tracing off)
	closers  []func(context.Context) error // run in reverse order after the gRPC server stopped
	loops    []func(context.Context) error // background loops, run under the errgroup
	extra    []func(context.Context) error // other servers (metrics), stopped with ctx
	beforeGo func(context.Context)         // ends rooms in flight during shutdown
	// ended reports what beforeGo had to end (the exit status depends on it).
	ended func() kvmanager.ShutdownSummary
	// engineReady: readiness follows the transfer engine (the delegated
	// path flips it with the agent's reachability) instead of being set at
	// start.
	engineReady bool
}

// buildDaemon constructs every component; it starts nothing but the
// listeners (so that a busy port fails startup, not later).
func buildDaemon(ctx context.Context, l *Loaded, log *slog.Logger, environ []string) (*daemon, error) {
	cfg := l.Config
	d := &daemon{cfg: cfg, log: log}
	ok := false
	defer func() {
		if !ok {
			d.closeListeners()
		}
	}()

	tr, err := newTracing(ctx, environ, tracedAs{service: "decodeplane", component: "daemon"})
	if err != nil {
		return nil, err
	}
	otel.SetTracerProvider(tr.provider)
	otel.SetTextMapPropagator(tr.propagator)
	d.closers = append(d.closers, tr.shutdown) // closers run in reverse: spans flush last

	metrics := server.NewMetrics()
	serverTLS, agentTLS, err := buildTLS(cfg, log, metrics.Registry())
	if err != nil {
		return nil, err
	}
	d.loops = append(d.loops, serverTLS.loops()...)
	d.loops = append(d.loops, agentTLS.loops()...)
	dec := cfg.Decode()
	ledgers := make([]kvmanager.Ledger, max(1, cfg.Parallel.DP))
	for i := range ledgers {
		led, err := prealloc.NewLedger(dec, i, prealloc.RealClock{})
		if err != nil {
			return nil, fmt.Errorf("decode shard %d: %w", i, err)
		}
		ledgers[i] = led
	}
	var engine kvmanager.TransferEngine
	switch cfg.Transfer.Path {
	case kvmanager.PathSim:
		engine = kvmanager.NewSimEngine(cfg.Transfer.Sim, kvmanager.RealClock{})
	case kvmanager.PathDelegate:
		ac, err := server.DialAgent(cfg.Transfer.Delegate.Target, server.AgentClientOptions{Logger: log, TracerProvider: tr.provider, Propagator: tr.propagator, Credentials: agentTLS.credentials()})
		if err != nil {
			return nil, err
		}
		d.closers = append(d.closers, func(context.Context) error { return ac.Close() })
		de := kvmanager.NewDelegateEngine(cfg.Transfer.Delegate, ac, kvmanager.DelegateDeps{
			Buffers: kvcopy.DecodeBuffers(dec.Layout(), kvmanager.StagingRingBytes(dec), dec.Pool.Metadata()),
			Logger:  log,
			// The loops start after d.srv is set.
			OnReadiness: func(ready bool, reason string) { d.srv.SetReady(ready, reason) },
		})
		d.loops = append(d.loops, ac.Run, de.Run)
		d.engineReady = true
		engine = de
	default:
		return nil, &usageError{fmt.Errorf("transfer.path %q is not available in this build", cfg.Transfer.Path)}
	}
	mgr, err := kvmanager.New(cfg.Manager(), dec, kvmanager.Deps{
		Ledgers:        ledgers,
		Engine:         engine,
		Logger:         log,
		TracerProvider: tr.provider,
		Observer:       metrics,
	})
	if err != nil {
		return nil, err
	}
	metrics.Attach(mgr)
	var entries []server.ConfigEntry
	for _, k := range l.Keys() {
		entries = append(entries, server.ConfigEntry{Key: k, Value: l.Value(k), Source: l.Sources[k]})
	}
	unary, stream := metrics.Interceptors()
	srv, err := server.New(cfg.Server, server.Deps{
		Logger:             log,
		TracerProvider:     tr.provider,
		Propagator:         tr.propagator,
		Version:            version,
		Config:             entries,
		Layout:             dec.Layout(),
		TransferPath:       cfg.Transfer.Path,
		Manager:            mgr,
		UnaryInterceptors:  []grpc.UnaryServerInterceptor{unary},
		StreamInterceptors: []grpc.StreamServerInterceptor{stream},
		ExtraServerOptions: serverTLS.options(),
	})
	if err != nil {
		return nil, err
	}
	metrics.InitializeGRPC(srv.GRPC())
	d.srv = srv
	d.loops = append(d.loops, mgr.Run)
	d.beforeGo = mgr.Shutdown
	d.ended = mgr.ShutdownSummary
	d.tracing = tr.exporting

	network, address, err := server.ListenAddr(cfg.Server.Listen, true)
	if err != nil {
		return nil, &usageError{fmt.Errorf("server.listen: %w", err)}
	}
	lis, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (server.listen): %w", cfg.Server.Listen, err)
	}
	d.lis = lis
	if cfg.Server.MetricsListen != "" {
		mlis, err := net.Listen("tcp", cfg.Server.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("listen on %s (server.metrics_listen): %w", cfg.Server.MetricsListen, err)
		}
		d.mlis = mlis
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler())
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		d.extra = append(d.extra, func(ctx context.Context) error {
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = hs.Shutdown(sctx)
			}()
			if err := hs.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
	}
	if err := d.addHTTP(srv); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

func (d *daemon) closeListeners() {
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

// run serves until ctx is cancelled (SIGINT/SIGTERM), then shuts down within
// server.shutdown_timeout.
func (d *daemon) run(ctx context.Context) error {
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
	metricsAddr, traces := "off", "off"
	if d.mlis != nil {
		metricsAddr = "http://" + d.mlis.Addr().String() + "/metrics"
	}
	if d.tracing != "" {
		traces = d.tracing + " (OTLP gRPC; Jaeger UI/API on :16686)"
	}
	httpAddr := "off"
	if d.hlis != nil {
		httpAddr = "http://" + d.hlis.Addr().String()
	}
	log.Info("decodeplane serving", "listen", d.lis.Addr().String(), "metrics", metricsAddr, "http", httpAddr, "traces", traces,
		"version", version, "transfer_path", d.cfg.Transfer.Path, "layout", d.cfg.Decode().Layout().String())

	<-gctx.Done()
	if ctx.Err() != nil {
		log.Info("shutting down", "reason", context.Cause(ctx), "deadline", d.cfg.Server.ShutdownTimeout)
	}
	// Order: drain (no new rooms) → the rooms get shutdown_timeout less
	// flushReserve to finish → the rest fail with FAILURE_CODE_SHUTDOWN,
	// their terminal events queued on every claim and watch stream →
	// GracefulStop lets the handlers send them and end OK, bounded by the
	// deadline → Stop.
	timeout := d.cfg.Server.ShutdownTimeout
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	shutdownErr := d.srv.Shutdown(sctx, func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, timeout-flushReserve(timeout))
		defer cancel()
		d.beforeGo(rctx)
	})
	cancelLoops()
	runErr := g.Wait()
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](sctx); err != nil {
			log.Warn("shutdown step failed", "err", err)
		}
	}
	var ended kvmanager.ShutdownSummary
	if d.ended != nil {
		ended = d.ended()
	}
	log.Info("rooms ended by the shutdown", "failed", ended.Failed, "pending_claims_failed", ended.PendingClaims, "succeeded_released", ended.Released)
	if shutdownErr != nil {
		log.Warn("graceful stop cut short by the deadline", "err", shutdownErr)
	}
	if runErr != nil && ctx.Err() == nil {
		return runErr
	}
	if ended.CutShort() || shutdownErr != nil {
		return &cutShortError{rooms: ended, deadline: shutdownErr}
	}
	return nil
}
