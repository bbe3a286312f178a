// Package server is decodeplane's inbound API, the adapter between
// decodeplane.v1 and the domain packages (the outbound agent protocol is
// transfer/, Prometheus is metrics/, the wiring internal/daemon). Each
// handler validates the request (through the server's interceptor,
// intercept.go, and the messages' Validate methods), converts it to domain
// types, calls the domain, maps the error with toStatus and converts the
// answer back. No business rule lives here. The prefill session
// (prefill_session.go) is a second transport over the same handlers: it
// validates and incarnation-checks each op itself, as the interceptor does
// a unary request, so that one bad op does not end the stream. The HTTP surface lives here too: SGLang's
// bootstrap routes (httpbootstrap.go, over the same Bootstrap handlers and
// Validate methods) and the JSON gateway (httpgateway.go, grpc-gateway over
// an in-memory connection to this gRPC server).
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/grpcdecode"
)

// ConfigEntry is one effective configuration value for Admin.GetStatus.
type ConfigEntry struct {
	Key, Value, Source string
}

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
	// that name another one are refused (incarnation.go). 0 (tests of the
	// gRPC layer alone) reports 0 and checks nothing.
	Incarnation uint64
	// Stale counts the calls refused for a stale incarnation; nil counts
	// nothing.
	Stale StaleMetrics
	// Sessions counts the ops of EngineSession streams (engine_session.go);
	// nil counts nothing.
	Sessions SessionMetrics
	// PrefillSessions counts the ops of prefill sessions
	// (prefill_session.go); nil counts nothing.
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
	// with no natural end (WatchWatermark, WatchCapacity) return on it.
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
		logging.WithLevels(callLevel),
		logging.WithFieldsFromContext(traceFields),
	}
	// The middleware logger logs every call (successes at debug), which costs
	// a fifth of a room's allocations; it runs only when debug logging is on
	// (intercept.go). Otherwise logFailed logs just the failed calls, at the
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
	unary := append(append([]grpc.UnaryServerInterceptor{}, deps.UnaryInterceptors...), s.unaryInterceptor)
	stream := append(append([]grpc.StreamServerInterceptor{}, deps.StreamInterceptors...), s.streamInterceptor)
	if s.tracing {
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(deps.TracerProvider),
			otelgrpc.WithPropagators(deps.Propagator), otelgrpc.WithFilter(traced))))
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	opts = append(opts, keepaliveOptions()...)
	opts = append(opts, deps.ExtraServerOptions...)
	s.grpc = grpc.NewServer(opts...)

	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, &healthService{Server: s.health, stop: s.stopCtx})
	pb.RegisterAdminServer(s.grpc, &adminService{s: s})
	pb.RegisterFleetServer(s.grpc, &fleetService{s: s})
	pb.RegisterCapacityServer(s.grpc, &capacityService{s: s})
	if m := deps.Manager; m != nil {
		pb.RegisterBootstrapServer(s.grpc, &bootstrapService{s: s, m: m, reg: s.registrar()})
		rs := &roomsService{s: s, m: m}
		s.grpc.RegisterService(roomsDesc(rs), rs)
		pb.RegisterEngineSessionServer(s.grpc, &engineSessionService{s: s, rs: rs})
		pb.RegisterStagingServer(s.grpc, &stagingService{s: s, m: m})
		pb.RegisterPrefillSessionServer(s.grpc, &prefillSessionService{s: s, rooms: rs, reg: s.registrar()})
		s.OnDrain(m.Drain)
	}
	if cfg.Reflection {
		reflection.Register(s.grpc)
	}
	s.mu.Lock()
	s.setHealth(false, "starting")
	s.mu.Unlock()
	return s, nil
}

// GRPC exposes the underlying server so that cmd and tests can register more
// services before Serve.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

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

func (s *Server) recoverPanic(ctx context.Context, p any) error {
	s.log.ErrorContext(ctx, "panic in gRPC handler", "panic", p, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error (logged by the daemon)")
}

// callLevel logs successful calls at debug (the control path is hot) and
// failures by severity.
func callLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK, codes.NotFound, codes.Canceled, codes.AlreadyExists:
		return logging.LevelDebug
	case codes.InvalidArgument, codes.FailedPrecondition, codes.ResourceExhausted, codes.Unauthenticated,
		codes.PermissionDenied, codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.OutOfRange:
		return logging.LevelWarn
	}
	return logging.LevelError
}

func (s *Server) logFailed(ctx context.Context, method, kind string, start time.Time, err error) {
	st, _ := status.FromError(err)
	lvl := slog.Level(callLevel(st.Code()))
	if !s.log.Enabled(ctx, lvl) {
		return
	}
	service, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	s.log.Log(ctx, lvl, "finished call", "protocol", "grpc", "grpc.component", "server",
		"grpc.service", service, "grpc.method", name, "grpc.method_type", kind,
		"grpc.code", st.Code().String(), "grpc.error", st.Message(), "grpc.time_ms", time.Since(start).Milliseconds())
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
