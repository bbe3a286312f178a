package server

import (
	"context"
	"errors"

	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/server/internal/gateway"
	"github.com/decodeplane/decodeplane/server/internal/httpboot"
	"github.com/decodeplane/decodeplane/server/internal/ops"
	"github.com/decodeplane/decodeplane/server/internal/session"
)

// The names the daemon and clients of the API use, defined by the packages
// that own them.

// ConfigEntry is one effective configuration value for Admin.GetStatus.
type ConfigEntry = ops.ConfigEntry

// Registrar records prefill registrations and heartbeats (Deps.Registrar):
// the Manager itself with the memory registry, the fleet's shared registry
// with etcd.
type Registrar = ops.Registrar

// FleetView is the shared registry's view of the fleet (registry.backend
// etcd): every decode daemon and prefill instance it knows, read from its
// cached view without waiting on etcd. Fleet.GetFleet answers from it when
// Deps.Fleet is set, after sorting and bounding its lists (MaxFleetEntries).
type FleetView = ops.FleetView

// StaleMetrics counts the calls refused for naming another incarnation
// (metrics.Metrics: decodeplane_stale_incarnation_total{method}).
type StaleMetrics = ops.StaleMetrics

// SessionMetrics counts the ops of EngineSession streams
// (metrics.Metrics: decodeplane_engine_session_ops_total{op, code}).
type SessionMetrics = session.EngineMetrics

// PrefillSessionMetrics counts the ops of prefill sessions
// (metrics.Metrics: decodeplane_prefill_session_ops_total{op, code}).
type PrefillSessionMetrics = session.PrefillMetrics

const (
	// ReasonStaleIncarnation is the ErrorInfo reason of a refused stale call.
	ReasonStaleIncarnation = ops.ReasonStaleIncarnation
	// ReasonStaleAttempt is the ErrorInfo reason of an AckRoomEnd that names
	// an attempt other than the room's current one.
	ReasonStaleAttempt = ops.ReasonStaleAttempt
	// ReasonPageHeld is the ErrorInfo reason of a declaration naming a
	// page, row or slot another room's hand-off still holds.
	ReasonPageHeld = ops.ReasonPageHeld
	// ErrorDomain is the ErrorInfo domain of decodeplane's error details.
	ErrorDomain = ops.ErrorDomain
	// ReadinessShuttingDown is the readiness of the last update of a
	// capacity feed, sent when the server shuts down.
	ReadinessShuttingDown = ops.ReadinessShuttingDown
	// MaxFleetEntries bounds each list of a GetFleet answer.
	MaxFleetEntries = ops.MaxFleetEntries
	// SessionQueue bounds a prefill session's outgoing queue; a client that
	// lets it fill is cut RESOURCE_EXHAUSTED "slow consumer".
	SessionQueue = session.Queue
	// MaxGatewayBodyBytes bounds a JSON-over-HTTP request body.
	MaxGatewayBodyBytes = gateway.MaxBodyBytes
	// InstanceIDHeader carries a prefill process's instance id on the
	// bootstrap HTTP routes.
	InstanceIDHeader = httpboot.InstanceIDHeader
)

// JSONGateway serves every decodeplane.v1 RPC but the sessions as JSON over
// HTTP, calling the operation table in process (package gateway).
type JSONGateway = gateway.Gateway

// NewJSONGateway builds the JSON gateway over this server's operations:
// each call runs in process under the server's own interceptors (auth,
// the ops' checks, recovery, logging, metrics), as a gRPC call does. It
// refuses a server with TLS on: the HTTP listener has no TLS, and the
// gateway would bypass the (mutual) TLS of the gRPC listener.
func (s *Server) NewJSONGateway() (*JSONGateway, error) {
	if s.cfg.TLS.Enabled() {
		return nil, errors.New("the JSON gateway is not available with server.tls on")
	}
	services, err := s.ops.Services()
	if err != nil {
		return nil, err
	}
	c := gateway.Calls{Services: services, Unary: chainUnary(s.unary), Stream: chainStream(s.stream)}
	if s.tracing {
		c.Tracer = s.deps.TracerProvider.Tracer("github.com/decodeplane/decodeplane/server")
	}
	return gateway.New(c)
}

// BootstrapHTTP serves SGLang's bootstrap routes (package httpboot).
type BootstrapHTTP = httpboot.Routes

// BootstrapHTTPOptions configure NewBootstrapHTTP.
type BootstrapHTTPOptions = httpboot.Options

// NewBootstrapHTTP builds SGLang's bootstrap routes over the server's
// Bootstrap operations. The server must have a Manager.
func (s *Server) NewBootstrapHTTP(opts BootstrapHTTPOptions) (*BootstrapHTTP, error) {
	if s.deps.Manager == nil {
		return nil, errors.New("the bootstrap HTTP routes need a room manager")
	}
	return httpboot.New(s.ops, s.deps.Manager, s.cfg.AuthToken, opts), nil
}

// chainUnary runs ics as one interceptor, the first outermost, as
// grpc.ChainUnaryInterceptor runs them.
func chainUnary(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		for i := len(ics) - 1; i >= 0; i-- {
			ic, next := ics[i], h
			h = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, next) }
		}
		return h(ctx, req)
	}
}

// chainStream is chainUnary for streams.
func chainStream(ics []grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		for i := len(ics) - 1; i >= 0; i-- {
			ic, next := ics[i], h
			h = func(srv any, ss grpc.ServerStream) error { return ic(srv, ss, info, next) }
		}
		return h(srv, ss)
	}
}
