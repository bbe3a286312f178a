package ops

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// op is what every operation has whatever its kind: its gRPC method, which
// names it in the call metrics, the spans and the stale-incarnation
// counter, and its auth class.
type op struct {
	t      *Table
	method string
	// read: the op changes nothing and needs no token (auth.go).
	read bool
}

// Method is the op's gRPC method ("/decodeplane.v1.Rooms/Transfer").
func (o *op) Method() string { return o.method }

// SpanName is the op's span name as otelgrpc names a call's: the method
// without its leading slash.
func (o *op) SpanName() string { return strings.TrimPrefix(o.method, "/") }

// Check is the op's check of a request: its bounds (the message's Validate:
// INVALID_ARGUMENT whose lines name the fields) and its incarnation
// (FAILED_PRECONDITION STALE_INCARNATION, counted under the op's method).
func (o *op) Check(req any) error {
	if err := validate(req); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return o.CheckIncarnation(req)
}

// CheckAs is Check for the op carried by a session: the fields of a bounds
// error are prefixed with the op's name in the session ("chunk.",
// "open.rooms[3].").
func (o *op) CheckAs(prefix string, req any) error {
	if err := validate(req); err != nil {
		return status.Error(codes.InvalidArgument, pb.PrefixFields(prefix, err).Error())
	}
	return o.CheckIncarnation(req)
}

// CheckIncarnation refuses a request that names another daemon
// incarnation (incarnation.go).
func (o *op) CheckIncarnation(req any) error { return o.t.checkIncarnation(o.method, req) }

// Unary is a unary operation: the checks of op, then call, whose errors
// are statuses already (the domain's mapped by Table.Status).
type Unary[Req, Resp any] struct {
	op
	call func(context.Context, *Req) (*Resp, error)
}

// Serve is the op as a unary call runs it once authorized: Check, then the
// call.
func (u *Unary[Req, Resp]) Serve(ctx context.Context, req *Req) (*Resp, error) {
	if err := u.Check(req); err != nil {
		return nil, err
	}
	return u.call(ctx, req)
}

// Call is the domain call and the mapping of its answer, for a transport
// that made the checks itself (a session op, after CheckAs).
func (u *Unary[Req, Resp]) Call(ctx context.Context, req *Req) (*Resp, error) {
	return u.call(ctx, req)
}

// Stream is a server-streaming operation: the checks of op, then call,
// which sends its answers with send until the stream's natural end.
type Stream[Req, Resp any] struct {
	op
	call func(ctx context.Context, req *Req, send func(*Resp) error) error
}

// Serve is the op as a server stream runs it once authorized: Check, then
// the call.
func (s *Stream[Req, Resp]) Serve(ctx context.Context, req *Req, send func(*Resp) error) error {
	if err := s.Check(req); err != nil {
		return err
	}
	return s.call(ctx, req, send)
}

// Session is a bidirectional session (EngineSession, PrefillSession): the
// table knows its method and auth class; its ops are the table's unary and
// stream ops, run by package session.
type Session struct{ op }

// validate calls a message's validation as go-grpc-middleware's validator
// interceptor does (not fail-fast): ValidateAll, Validate(true) or
// Validate().
func validate(m any) error {
	switch v := m.(type) {
	case interface{ ValidateAll() error }:
		return v.ValidateAll()
	case interface{ Validate(all bool) error }:
		return v.Validate(true)
	case interface{ Validate() error }:
		return v.Validate()
	}
	return nil
}
