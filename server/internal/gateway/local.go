package gateway

import (
	"context"
	"io"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxRecvMsgBytes is the gRPC server's limit on a request (grpc-go's
// default), which a transcoded request meets as a gRPC call's would.
const MaxRecvMsgBytes = 4 << 20

// Calls is what the gateway runs: the daemon's gRPC services and the
// server's interceptor chains, as the gRPC server runs them.
type Calls struct {
	// Services are the table's services (ops.Table.Services).
	Services []*grpc.ServiceDesc
	// Unary and Stream are the server's interceptor chains.
	Unary  grpc.UnaryServerInterceptor
	Stream grpc.StreamServerInterceptor
	// Tracer starts each call's span; nil when tracing is off.
	Tracer trace.Tracer
}

// localConn is a grpc.ClientConnInterface that runs each call in process:
// the generated clients the gateway is registered with call it.
type localConn struct {
	c       Calls
	unary   map[string]func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error)
	streams map[string]grpc.StreamHandler
}

var _ grpc.ClientConnInterface = (*localConn)(nil)

func newLocalConn(c Calls) *localConn {
	lc := &localConn{c: c, unary: map[string]func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error){},
		streams: map[string]grpc.StreamHandler{}}
	for _, sd := range c.Services {
		for _, m := range sd.Methods {
			lc.unary["/"+sd.ServiceName+"/"+m.MethodName] = m.Handler
		}
		for _, s := range sd.Streams {
			lc.streams["/"+sd.ServiceName+"/"+s.StreamName] = s.Handler
		}
	}
	return lc
}

// Invoke runs a unary call on the caller's goroutine.
func (lc *localConn) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) (err error) {
	h, ok := lc.unary[method]
	if !ok {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	in, out := args.(proto.Message), reply.(proto.Message)
	if n := proto.Size(in); n > MaxRecvMsgBytes {
		return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, MaxRecvMsgBytes)
	}
	ctx, end := lc.span(incoming(ctx), method)
	defer func() { end(err) }()
	resp, err := h(nil, ctx, func(m any) error { proto.Merge(m.(proto.Message), in); return nil }, lc.c.Unary)
	if err != nil {
		return err
	}
	proto.Merge(out, resp.(proto.Message))
	return nil
}

// NewStream starts a server stream: its op runs on one goroutine once the
// request is sent (CloseSend), each message handed to RecvMsg.
func (lc *localConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	h, ok := lc.streams[method]
	if !ok || desc.ClientStreams {
		return nil, status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	sctx, cancel := context.WithCancel(incoming(ctx))
	return &localStream{lc: lc, ctx: ctx, sctx: sctx, cancel: cancel, method: method, h: h, msgs: make(chan proto.Message), done: make(chan struct{})}, nil
}

// span starts a call's span, named as otelgrpc names a server call's;
// end records the call's code and ends it.
func (lc *localConn) span(ctx context.Context, method string) (context.Context, func(error)) {
	if lc.c.Tracer == nil {
		return ctx, func(error) {}
	}
	name := strings.TrimPrefix(method, "/")
	service, m, _ := strings.Cut(name, "/")
	ctx, sp := lc.c.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", m)))
	return ctx, func(err error) {
		st := status.Convert(err)
		sp.SetAttributes(attribute.Int64("rpc.grpc.status_code", int64(st.Code())))
		if err != nil {
			sp.SetStatus(otelcodes.Error, st.Message())
		}
		sp.End()
	}
}

// incoming is ctx with its outgoing metadata (what grpc-gateway made of the
// HTTP headers) as the incoming metadata a server handler reads.
func incoming(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	return metadata.NewIncomingContext(ctx, md)
}

// localStream is both ends of an in-process server stream: the client end
// the generated gateway handler reads, and (serverStream) the server end
// the op's handler writes.
type localStream struct {
	lc     *localConn
	ctx    context.Context // the client's
	sctx   context.Context // the handler's: the client's, with incoming metadata
	cancel context.CancelFunc
	method string
	h      grpc.StreamHandler

	req     proto.Message
	started sync.Once
	msgs    chan proto.Message // unbuffered: the handler's Send waits for the reader
	done    chan struct{}      // closed when the handler returned, with err
	err     error
}

var _ grpc.ClientStream = (*localStream)(nil)

func (s *localStream) Header() (metadata.MD, error) { return nil, nil }
func (s *localStream) Trailer() metadata.MD         { return nil }
func (s *localStream) Context() context.Context     { return s.ctx }

// SendMsg takes the request (a server stream's one message).
func (s *localStream) SendMsg(m any) error {
	in := m.(proto.Message)
	if n := proto.Size(in); n > MaxRecvMsgBytes {
		return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, MaxRecvMsgBytes)
	}
	s.req = in
	return nil
}

// CloseSend starts the handler.
func (s *localStream) CloseSend() error {
	s.started.Do(func() { go s.run() })
	return nil
}

// run runs the handler under the server's stream interceptor chain.
func (s *localStream) run() {
	defer close(s.done)
	defer s.cancel()
	ctx, end := s.lc.span(s.sctx, s.method)
	info := &grpc.StreamServerInfo{FullMethod: s.method, IsServerStream: true}
	s.err = s.lc.c.Stream(nil, &serverStream{s: s, ctx: ctx}, info, s.h)
	end(s.err)
}

// RecvMsg is the next message the handler sent, io.EOF after the last, or
// the handler's error.
func (s *localStream) RecvMsg(m any) error {
	select {
	case msg := <-s.msgs:
		proto.Merge(m.(proto.Message), msg)
		return nil
	case <-s.done:
		if s.err != nil {
			return s.err
		}
		return io.EOF
	case <-s.ctx.Done():
		return status.FromContextError(s.ctx.Err()).Err()
	}
}

// serverStream is the handler's end of a localStream.
type serverStream struct {
	s    *localStream
	ctx  context.Context
	recv bool
}

var _ grpc.ServerStream = (*serverStream)(nil)

func (ss *serverStream) SetHeader(metadata.MD) error  { return nil }
func (ss *serverStream) SendHeader(metadata.MD) error { return nil }
func (ss *serverStream) SetTrailer(metadata.MD)       {}
func (ss *serverStream) Context() context.Context     { return ss.ctx }

// SendMsg hands a copy of m to the reader.
func (ss *serverStream) SendMsg(m any) error {
	select {
	case ss.s.msgs <- proto.Clone(m.(proto.Message)):
		return nil
	case <-ss.ctx.Done():
		return status.FromContextError(ss.ctx.Err()).Err()
	}
}

// RecvMsg gives the request once, then io.EOF.
func (ss *serverStream) RecvMsg(m any) error {
	if ss.recv || ss.s.req == nil {
		return io.EOF
	}
	ss.recv = true
	proto.Merge(m.(proto.Message), ss.s.req)
	return nil
}
