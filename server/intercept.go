package server

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The server's own interceptor: one per call kind, instead of a chain of
// six (a chain allocates a closure per link per call, a stream wrapper per
// link per stream). In order, as the chain was:
//
//  1. call logging: with debug logging on, go-grpc-middleware's logger
//     (every call but health checks, successes at debug); otherwise only the
//     failed calls, at callLevel's level (logFailed);
//  2. recovery: a panicking handler is Internal, logged with its stack;
//  3. auth (checkToken);
//  4. validation: the request's ValidateAll/Validate methods, as
//     go-grpc-middleware's validator interceptor calls them
//     (InvalidArgument with the error's text).
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

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx = s.remoteTraceContext(ctx)
	if s.log.Enabled(ctx, slog.LevelDebug) {
		if isHealth(info.FullMethod) {
			return s.guardUnary(ctx, req, info, h)
		}
		return s.fullLogUnary(ctx, req, info, func(ctx context.Context, req any) (any, error) { return s.guardUnary(ctx, req, info, h) })
	}
	start := time.Now()
	resp, err := s.guardUnary(ctx, req, info, h)
	if err != nil {
		s.logFailed(ctx, info.FullMethod, "unary", start, err)
	}
	return resp, err
}

// guardUnary is recovery, auth and validation around the handler.
func (s *Server) guardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = s.recoverPanic(ctx, p)
		}
	}()
	if err := s.checkToken(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	if err := validateMessage(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx := s.remoteTraceContext(ss.Context())
	cs := &checkedStream{ServerStream: ss, ctx: ctx}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		if isHealth(info.FullMethod) {
			return s.guardStream(srv, cs, info, h)
		}
		return s.fullLogStream(srv, cs, info, func(srv any, ss grpc.ServerStream) error { return s.guardStream(srv, ss, info, h) })
	}
	start := time.Now()
	err := s.guardStream(srv, cs, info, h)
	if err != nil {
		s.logFailed(ctx, info.FullMethod, "server_stream", start, err)
	}
	return err
}

// guardStream is recovery and auth around the handler; checkedStream
// validates what the handler receives.
func (s *Server) guardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = s.recoverPanic(ss.Context(), p)
		}
	}()
	if err := s.checkToken(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// checkedStream validates every message received, and carries the
// context with the caller's trace context.
type checkedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return validateMessage(m)
}

// validateMessage calls a message's validation as go-grpc-middleware's
// validator interceptor does (not fail-fast): ValidateAll, Validate(true)
// or Validate(); an error is InvalidArgument with its text.
func validateMessage(m any) error {
	var err error
	switch v := m.(type) {
	case interface{ ValidateAll() error }:
		err = v.ValidateAll()
	case interface{ Validate(all bool) error }:
		err = v.Validate(true)
	case interface{ Validate() error }:
		err = v.Validate()
	}
	if err == nil {
		return nil
	}
	return status.Error(codes.InvalidArgument, err.Error())
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
