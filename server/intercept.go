package server

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/decodeplane/decodeplane/server/grpcdecode"
)

// CallMetrics counts the calls the server handles: the Prometheus gRPC
// server metrics (metrics.Metrics, wired by internal/daemon). Method is
// called once per call, with the method's type ("unary", "server_stream",
// "client_stream", "bidi_stream").
type CallMetrics interface {
	Method(fullMethod, kind string) MethodMetrics
}

// MethodMetrics are one method's counters. As go-grpc-middleware's
// Prometheus interceptors count: a call is started; a unary call received
// its request and sent its answer when it succeeded; a stream counts each
// message received or sent without error; Handled ends the call with its
// error's status code and duration.
type MethodMetrics interface {
	Started()
	Received()
	Sent()
	Handled(err error, start time.Time)
}

// The server's own interceptor: one per call kind, instead of a chain of
// six (a chain allocates a closure per link per call, a stream wrapper
// per link per stream). In order, as the chain was:
//
//  1. the decode check (server/grpcdecode), when no other interceptor is
//     installed (else grpcdecode's own interceptors run it, outermost,
//     and Deps.UnaryInterceptors/StreamInterceptors come next);
//  2. the call metrics (Deps.Calls);
//  3. call logging: with debug logging on, go-grpc-middleware's logger
//     (every call but health checks, successes at debug); otherwise only the
//     failed calls, at ops.CallLevel's level (ops.Table.LogFailed);
//  4. recovery: a panicking handler is Internal, logged with its stack;
//  5. auth: the operation table's (ops.Table.Authorize: every op declares
//     its auth class).
//
// The handler then runs the op (ops: its request's checks — validation,
// the incarnation — and its call), so a call refused by a check reaches no
// domain code, whatever its transport: the JSON gateway runs this same
// chain in process.
//
// With tracing off (a no-op tracer provider) the otelgrpc stats handler is
// not installed (it built a span context, a metadata copy and its
// per-message events on every call for nothing); remoteTraceContext then
// keeps what it did for the logs: the caller's W3C trace context, when it
// sent one, is in the handler's context.

// isHealth reports whether a method belongs to the health service, which
// the full call logger skips.
func isHealth(fullMethod string) bool { return strings.HasPrefix(fullMethod, healthPrefix) }

var healthPrefix = "/" + healthpb.Health_ServiceDesc.ServiceName + "/"

// streamKind is a stream's method type as the gRPC metrics label it.
func streamKind(info *grpc.StreamServerInfo) string {
	switch {
	case info.IsClientStream && !info.IsServerStream:
		return "client_stream"
	case !info.IsClientStream && info.IsServerStream:
		return "server_stream"
	}
	return "bidi_stream"
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s.checkDecode {
		if err := grpcdecode.Check(req); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	var mm MethodMetrics
	if s.deps.Calls != nil {
		mm = s.deps.Calls.Method(info.FullMethod, "unary")
		mm.Started()
		mm.Received()
	}
	resp, err := s.loggedUnary(s.remoteTraceContext(ctx), req, info, h, start)
	if mm != nil {
		if err == nil {
			mm.Sent()
		}
		mm.Handled(err, start)
	}
	return resp, err
}

func (s *Server) loggedUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler, start time.Time) (any, error) {
	if s.log.Enabled(ctx, slog.LevelDebug) {
		if isHealth(info.FullMethod) {
			return s.guardUnary(ctx, req, info, h)
		}
		return s.fullLogUnary(ctx, req, info, func(ctx context.Context, req any) (any, error) { return s.guardUnary(ctx, req, info, h) })
	}
	resp, err := s.guardUnary(ctx, req, info, h)
	if err != nil {
		s.ops.LogFailed(ctx, info.FullMethod, "unary", start, err)
	}
	return resp, err
}

// guardUnary is recovery and auth around the handler.
func (s *Server) guardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = s.ops.Recovered(ctx, p)
		}
	}()
	if err := s.ops.Authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	kind := streamKind(info)
	cs := &checkedStream{ServerStream: ss, ctx: s.remoteTraceContext(ss.Context()), decode: s.checkDecode}
	if s.deps.Calls != nil {
		cs.mm = s.deps.Calls.Method(info.FullMethod, kind)
		cs.mm.Started()
	}
	err := s.loggedStream(srv, cs, info, h, kind, start)
	if cs.mm != nil {
		cs.mm.Handled(err, start)
	}
	return err
}

func (s *Server) loggedStream(srv any, cs *checkedStream, info *grpc.StreamServerInfo, h grpc.StreamHandler, kind string, start time.Time) error {
	if s.log.Enabled(cs.ctx, slog.LevelDebug) {
		if isHealth(info.FullMethod) {
			return s.guardStream(srv, cs, info, h)
		}
		return s.fullLogStream(srv, cs, info, func(srv any, ss grpc.ServerStream) error { return s.guardStream(srv, ss, info, h) })
	}
	err := s.guardStream(srv, cs, info, h)
	if err != nil {
		s.ops.LogFailed(cs.ctx, info.FullMethod, kind, start, err)
	}
	return err
}

// guardStream is recovery and auth around the handler.
func (s *Server) guardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = s.ops.Recovered(ss.Context(), p)
		}
	}()
	if err := s.ops.Authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// checkedStream is the one wrapper of a stream: each message received is
// decode-checked (when the server makes the check) and counted, each sent
// counted; its context carries the caller's trace context. (A server
// stream's request is checked by its op; a session's messages by the
// session, op by op.)
type checkedStream struct {
	grpc.ServerStream
	ctx    context.Context
	mm     MethodMetrics
	decode bool
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.decode {
		if err := grpcdecode.Check(m); err != nil {
			return err
		}
	}
	if s.mm != nil {
		s.mm.Received()
	}
	return nil
}

func (s *checkedStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err == nil && s.mm != nil {
		s.mm.Sent()
	}
	return err
}

// remoteTraceContext, with tracing off, puts the caller's W3C trace context
// (traceparent, tracestate, baggage) into ctx, as the otelgrpc handler did
// with the no-op provider, so that the logs of the call name the caller's
// trace. It looks for traceparent only: a call without one costs a lookup.
func (s *Server) remoteTraceContext(ctx context.Context) context.Context {
	if s.tracing {
		return ctx // the otelgrpc stats handler did it
	}
	if len(metadata.ValueFromIncomingContext(ctx, "traceparent")) == 0 {
		return ctx
	}
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return s.deps.Propagator.Extract(ctx, incomingCarrier{ctx})
}

// incomingCarrier reads a propagator's keys from the incoming metadata.
type incomingCarrier struct{ ctx context.Context }

var _ propagation.TextMapCarrier = incomingCarrier{}

func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c incomingCarrier) Set(string, string) {}

func (c incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}
