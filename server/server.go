// Package server is decodeplane's inbound API, the adapter between
// decodeplane.v1 and the domain packages (the outbound agent protocol is
// transfer/, Prometheus is metrics/, the wiring internal/daemon). It
// builds the server and composes its surfaces, each in a package of its
// own under server/internal, over one operation table:
//
//   - ops: the operation table (every op's request checks, auth class,
//     span name and metrics label, domain call and the mapping of its
//     answer and errors) and the gRPC services built from it;
//   - session: EngineSession and PrefillSession, whose ops are the table's;
//   - gateway: the JSON gateway, which calls the table in process;
//   - httpboot: SGLang's bootstrap HTTP routes, over the table's Bootstrap
//     ops.
//
// This package holds the server's lifecycle (readiness, drain, shutdown,
// health), its configuration and TLS, and the gRPC transport's own
// interceptor (intercept.go: the decode check, the call metrics, logging,
// recovery and the table's authorization). The surfaces import the table,
// never each other nor this package. No business rule lives here.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/grpcdecode"
	"github.com/decodeplane/decodeplane/server/internal/ops"
	"github.com/decodeplane/decodeplane/server/internal/session"
)

// Deps are the server's collaborators, built by cmd.
type Deps struct {
	// Logger receives call logs and lifecycle events; nil means slog.Default().
	Logger *slog.Logger
	// TracerProvider feeds the otelgrpc stats handler, installed only when
	// it is not the no-op provider; nil means no-op.
	TracerProvider trace.TracerProvider
	// Propagator extracts W3C trace context; nil means TraceContext+Baggage.
	Propagator propagation.TextMapPropagator
	// Version is reported by Admin.GetStatus.
	Version string
	// Config is the effective configuration, secrets already redacted.
	Config []ConfigEntry
	// Layout is the decode KV layout.
	Layout kvlayout.Layout
	// TransferPath is "sim" or "delegate".
	TransferPath string
	// Manager is the room manager behind Bootstrap and Rooms; nil serves
	// only Admin and health (used by tests of the gRPC layer alone).
	Manager *kvmanager.Manager
	// ExtraServerOptions are appended to the grpc.Server options (TLS
	// credentials).
	ExtraServerOptions []grpc.ServerOption
	// Calls counts every call (the Prometheus gRPC server metrics); nil
	// counts nothing. The server's interceptor updates it (intercept.go).
	Calls CallMetrics
	// UnaryInterceptors and StreamInterceptors run outermost, right after
	// the decode check and before the call metrics and logging (fault
	// injection in tests).
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
	// Registrar records prefill registrations and heartbeats; nil is the
	// Manager itself (the memory registry). With registry.backend etcd it
	// is the fleet's shared registry (package fleet), which publishes each
	// registration to etcd before the Manager records it (registry.go).
	Registrar Registrar
	// Incarnation is the daemon process's incarnation (random, non-zero,
	// new at every start: internal/daemon draws it). It is returned by
	// registration, heartbeat, status and every destination, and requests
	// that name another one are refused (internal/ops/incarnation.go). 0 (tests of the
	// gRPC layer alone) reports 0 and checks nothing.
	Incarnation uint64
	// Stale counts the calls refused for a stale incarnation; nil counts
	// nothing.
	Stale StaleMetrics
	// Sessions counts the ops of EngineSession streams; nil counts nothing.
	Sessions SessionMetrics
	// PrefillSessions counts the ops of prefill sessions; nil counts
	// nothing.
	PrefillSessions PrefillSessionMetrics
	// Fleet is the shared registry's view that Fleet.GetFleet answers from
	// (fleet.go); nil is the memory registry: GetFleet answers from this
	// daemon alone.
	Fleet FleetView
	// AdvertiseAddress is the address this daemon goes by in its fleet
	// (registry.etcd.advertise_address); "" is the address it serves on
	// (Server.Address).
	AdvertiseAddress string
}

// Server is the daemon's gRPC server.
type Server struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	grpc    *grpc.Server
	health  *health.Server
	started time.Time
	// ops is the operation table every surface runs.
	ops *ops.Table
	// unary and stream are the interceptor chains the gRPC server runs,
	// which the JSON gateway runs too (surfaces.go).
	unary  []grpc.UnaryServerInterceptor
	stream []grpc.StreamServerInterceptor
	// tracing: the tracer provider is not the no-op one; without it the
	// otelgrpc stats handler is not installed (intercept.go).
	tracing bool
	// checkDecode: the server's interceptor makes grpcdecode's check (no
	// other interceptor runs before it).
	checkDecode bool
	// fullLogUnary and fullLogStream are the middleware call logger, used
	// when debug logging is on.
	fullLogUnary  grpc.UnaryServerInterceptor
	fullLogStream grpc.StreamServerInterceptor

	// stopCtx is cancelled when Shutdown stops serving: long-lived streams
	// with no natural end (WatchWatermark, WatchCapacity, the sessions)
	// return on it.
	stopCtx  context.Context
	stopServ context.CancelFunc

	mu        sync.Mutex
	served    string // the address Serve serves on (servedAddress), "" until then
	ready     bool
	readiness string
	draining  bool
	drainHook []func()
	// registryDegraded is why the fleet's shared registry is degraded
	// ("" when it is not, or with the memory registry): registry.go.
	registryDegraded string
}

// New builds the gRPC server and registers every service, the standard health
// service (NOT_SERVING until SetReady(true)) and, if configured, reflection.
// It starts nothing: call Serve.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	deps.Logger, deps.TracerProvider, deps.Propagator = telemetryDefaults(deps.Logger, deps.TracerProvider, deps.Propagator)
	s := &Server{cfg: cfg, deps: deps, log: deps.Logger, started: time.Now(), readiness: "starting", tracing: tracingOn(deps.TracerProvider)}
	s.stopCtx, s.stopServ = context.WithCancel(context.Background())

	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(ops.CallLevel),
		logging.WithFieldsFromContext(traceFields),
	}
	// The middleware logger logs every call (successes at debug), which costs
	// a fifth of a room's allocations; it runs only when debug logging is on
	// (intercept.go). Otherwise ops.Table.LogFailed logs just the failed calls, at the
	// same levels.
	s.fullLogUnary = logging.UnaryServerInterceptor(slogAdapter(s.log), logOpts...)
	s.fullLogStream = logging.StreamServerInterceptor(slogAdapter(s.log), logOpts...)
	// Undecodable requests are InvalidArgument (server/grpcdecode): the
	// check comes before anything else sees a request, in the server's own
	// interceptor when it is the only one, else in grpcdecode's, outermost.
	var opts []grpc.ServerOption
	if len(deps.UnaryInterceptors) == 0 && len(deps.StreamInterceptors) == 0 {
		s.checkDecode = true
		opts = append(opts, grpcdecode.Codec())
	} else {
		opts = grpcdecode.DecodeOptions()
	}
	s.unary = append(append([]grpc.UnaryServerInterceptor{}, deps.UnaryInterceptors...), s.unaryInterceptor)
	s.stream = append(append([]grpc.StreamServerInterceptor{}, deps.StreamInterceptors...), s.streamInterceptor)
	if s.tracing {
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(deps.TracerProvider),
			otelgrpc.WithPropagators(deps.Propagator), otelgrpc.WithFilter(traced))))
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(s.unary...), grpc.ChainStreamInterceptor(s.stream...))
	opts = append(opts, keepaliveOptions()...)
	opts = append(opts, deps.ExtraServerOptions...)
	s.grpc = grpc.NewServer(opts...)

	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, &healthService{Server: s.health, stop: s.stopCtx})
	if err := s.register(); err != nil {
		return nil, err
	}
	if cfg.Reflection {
		reflection.Register(s.grpc)
	}
	s.mu.Lock()
	s.setHealth(false, "starting")
	s.mu.Unlock()
	return s, nil
}

// register builds the operation table and registers its services and the
// sessions (those of the room manager only with one).
func (s *Server) register() error {
	d := &s.deps
	var m ops.Manager
	if d.Manager != nil {
		m = d.Manager
	}
	s.ops = ops.New(ops.Config{
		Logger: s.log, Incarnation: d.Incarnation, Token: s.cfg.AuthToken, Stale: d.Stale,
		Manager: m, Registrar: d.Registrar, Fleet: d.Fleet, Host: s,
		Version: d.Version, Entries: d.Config, Layout: d.Layout, TransferPath: d.TransferPath, Started: s.started,
	})
	services, err := s.ops.Services()
	if err != nil {
		return err
	}
	for _, sd := range services {
		s.grpc.RegisterService(sd, nil) // the table's handlers need no implementation
	}
	if d.Manager == nil {
		return nil
	}
	sc := session.Config{Ops: s.ops, Stop: s.stopCtx, Propagator: d.Propagator, Engine: d.Sessions, Prefill: d.PrefillSessions}
	if s.tracing {
		sc.Tracer = d.TracerProvider.Tracer("github.com/decodeplane/decodeplane/server")
	}
	pb.RegisterEngineSessionServer(s.grpc, session.NewEngine(sc))
	pb.RegisterPrefillSessionServer(s.grpc, session.NewPrefill(sc))
	s.OnDrain(d.Manager.Drain)
	return nil
}

// GRPC exposes the underlying server so that cmd and tests can register more
// services before Serve.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Stopping is done once Shutdown stops serving (ops.Host).
func (s *Server) Stopping() context.Context { return s.stopCtx }

// Serve serves on lis until Shutdown; it returns nil after a Shutdown.
func (s *Server) Serve(lis net.Listener) error {
	if a := servedAddress(lis); a != "" {
		s.mu.Lock()
		if s.served == "" {
			s.served = a
		}
		s.mu.Unlock()
	}
	err := s.grpc.Serve(lis)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// SetReady flips readiness (health SERVING / NOT_SERVING) with a reason. A
// draining server stays NOT_SERVING.
func (s *Server) SetReady(ready bool, reason string) {
	s.mu.Lock()
	if s.draining {
		ready, reason = false, "draining"
	}
	defer s.mu.Unlock()
	if s.ready != ready || s.readiness != reason {
		s.ready, s.readiness = ready, reason
		s.setHealth(ready, reason)
	}
}

// setHealth publishes readiness; called with s.mu held so that a concurrent
// SetReady cannot publish SERVING after Drain published NOT_SERVING.
func (s *Server) setHealth(ready bool, reason string) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	for name := range s.grpc.GetServiceInfo() {
		if name != healthpb.Health_ServiceDesc.ServiceName {
			s.health.SetServingStatus(name, st)
		}
	}
	s.log.Info("readiness changed", "status", st.String(), "reason", reason)
}

// Readiness reports the current readiness and its reason.
func (s *Server) Readiness() (bool, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready, s.readiness + registrySuffix(s.registryDegraded), s.draining
}

// OnDrain registers a function called once when the server starts draining
// (Admin.Drain or Shutdown): the domain stops admitting there.
func (s *Server) OnDrain(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainHook = append(s.drainHook, f)
}

// Drain flips health to NOT_SERVING and runs the drain hooks once.
func (s *Server) Drain() {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = true
	s.ready, s.readiness = false, "draining"
	s.setHealth(false, "draining")
	hooks := s.drainHook
	s.mu.Unlock()
	for _, h := range hooks {
		h()
	}
}

// Shutdown stops the gRPC layer, in this order:
//  1. drain: health NOT_SERVING, the domain stops admitting (OnDrain hooks);
//  2. beforeStop runs with ctx (cmd ends the rooms there: each room's
//     terminal event is queued on its claim and watch streams, and cmd keeps
//     part of ctx for step 3);
//  3. the streams with no natural end (WatchWatermark, health Watch) end
//     with the server, and GracefulStop waits for every handler to return:
//     the claim and watch handlers send the rooms' last events and end OK;
//  4. if ctx's deadline comes first, Stop cancels what is left (those
//     clients see UNAVAILABLE) and Shutdown returns ctx's error;
//  5. health.Shutdown.
//
// Closing the domain and flushing traces happen in cmd after Shutdown.
func (s *Server) Shutdown(ctx context.Context, beforeStop func(context.Context)) error {
	s.Drain()
	if beforeStop != nil {
		beforeStop(ctx)
	}
	s.stopServ()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("graceful stop did not finish before the deadline; cancelling in-flight RPCs")
		s.grpc.Stop()
		<-done
		err = ctx.Err()
	}
	s.health.Shutdown()
	s.ops.Close() // the pending summaries of failed calls
	return err
}

// healthService is the standard health service whose Watch streams end
// (OK, after NOT_SERVING) when Shutdown stops serving: a client's health
// watch has no natural end and would otherwise hold GracefulStop until the
// shutdown deadline.
type healthService struct {
	*health.Server
	stop context.Context
}

func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(h.stop, cancel)()
	err := h.Server.Watch(req, &healthWatchStream{Health_WatchServer: stream, ctx: ctx})
	if h.stop.Err() != nil && stream.Context().Err() == nil {
		return nil // the server stops, not the client: the stream ends OK
	}
	return err
}

// healthWatchStream is a health Watch stream whose context also ends with
// the server.
type healthWatchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (s *healthWatchStream) Context() context.Context { return s.ctx }

// tracingOn reports whether tp records anything (it is not the no-op
// provider).
func tracingOn(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return false
	}
	return true
}

// telemetryDefaults fills in what the caller left nil: the default logger, a
// no-op tracer provider, W3C trace context and baggage.
func telemetryDefaults(l *slog.Logger, tp trace.TracerProvider, p propagation.TextMapPropagator) (*slog.Logger, trace.TracerProvider, propagation.TextMapPropagator) {
	if l == nil {
		l = slog.Default()
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	if p == nil {
		p = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return l, tp, p
}

// traced keeps health checks and reflection out of traces.
func traced(info *stats.RPCTagInfo) bool {
	return !strings.HasPrefix(info.FullMethodName, "/grpc.health.") && !strings.HasPrefix(info.FullMethodName, "/grpc.reflection.")
}

func traceFields(ctx context.Context) logging.Fields {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return logging.Fields{"trace_id", sc.TraceID().String()}
	}
	return nil
}

func slogAdapter(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}
