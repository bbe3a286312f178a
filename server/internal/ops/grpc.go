package ops

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The gRPC services: each generated ServiceDesc with every handler from
// the table. A unary handler's UnaryServerInfo and the handler it passes
// to the interceptor are made once per op, not on every call as the
// generated handlers make them (two allocations per call), and a server
// stream's request and typed stream are allocated together (one
// allocation instead of two). The server's interceptor authorizes each
// call (Authorize) before the handler runs the op (Serve: its checks, then
// its call).

// methodHandler is a unary method's grpc handler.
type methodHandler = func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error)

// handler is one method of a service: a unary or a stream handler.
type handler struct {
	name   string // the method's full name
	unary  methodHandler
	stream grpc.StreamHandler
}

// serviceOps is a generated service and the table's handlers of its
// methods.
type serviceOps struct {
	gen      *grpc.ServiceDesc
	handlers []handler
	// manager: the service needs the room manager.
	manager bool
}

func (t *Table) serviceOps() []*serviceOps {
	return []*serviceOps{
		{gen: &pb.Admin_ServiceDesc, handlers: []handler{t.GetStatus.handler(), t.Drain.handler()}},
		{gen: &pb.Fleet_ServiceDesc, handlers: []handler{t.GetFleet.handler()}},
		{gen: &pb.Capacity_ServiceDesc, handlers: []handler{t.WatchCapacity.handler(), t.ReportCapacity.handler()}},
		{gen: &pb.Bootstrap_ServiceDesc, manager: true, handlers: []handler{t.RegisterPrefill.handler(), t.Heartbeat.handler(),
			t.DeregisterPrefill.handler(), t.BindRoom.handler(), t.LookupDPRanks.handler()}},
		{gen: &pb.Rooms_ServiceDesc, manager: true, handlers: []handler{t.OpenRoom.handler(), t.AwaitDestination.handler(),
			t.Transfer.handler(), t.ReportTransfer.handler(), t.WatchRoom.handler(), t.GetRoom.handler(), t.AbortRoom.handler(),
			t.ReleaseRoom.handler(), t.ListRooms.handler(), t.ReportRunning.handler(), t.RetractRoom.handler(),
			t.ContinueGeneration.handler(), t.Resync.handler(), t.AckRoomEnd.handler(), t.DeclareDestination.handler(),
			t.RegisterEngineLayout.handler()}},
		{gen: &pb.Staging_ServiceDesc, manager: true, handlers: []handler{t.SetupStaging.handler(), t.AllocateStaging.handler(),
			t.ChunkReady.handler(), t.WatchWatermark.handler()}},
	}
}

// Services are the gRPC services the table serves (those of the room
// manager only with one): the generated ServiceDescs with the table's
// handlers. Register them with a nil implementation (grpc.Server's
// RegisterService(desc, nil)): the handlers need none.
func (t *Table) Services() ([]*grpc.ServiceDesc, error) {
	var out []*grpc.ServiceDesc
	for _, so := range t.services {
		if so.manager && !t.HasManager() {
			continue
		}
		d, err := so.desc()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// desc is the generated ServiceDesc with the table's handlers; every
// method of the generated service must have one.
func (so *serviceOps) desc() (*grpc.ServiceDesc, error) {
	d := *so.gen
	d.Methods = append([]grpc.MethodDesc(nil), so.gen.Methods...)
	d.Streams = append([]grpc.StreamDesc(nil), so.gen.Streams...)
	byName := make(map[string]handler, len(so.handlers))
	for _, h := range so.handlers {
		byName[h.name] = h
	}
	full := func(m string) string { return "/" + d.ServiceName + "/" + m }
	for i, m := range d.Methods {
		h, ok := byName[full(m.MethodName)]
		if !ok || h.unary == nil {
			return nil, fmt.Errorf("the operation table has no unary op for %s", full(m.MethodName))
		}
		d.Methods[i].Handler = h.unary
		delete(byName, h.name)
	}
	for i, sd := range d.Streams {
		h, ok := byName[full(sd.StreamName)]
		if !ok || h.stream == nil {
			return nil, fmt.Errorf("the operation table has no stream op for %s", full(sd.StreamName))
		}
		d.Streams[i].Handler = h.stream
		delete(byName, h.name)
	}
	for name := range byName {
		return nil, fmt.Errorf("the operation table's op %s is not a method of %s", name, d.ServiceName)
	}
	return &d, nil
}

// handler is the op's unary handler: it decodes the request, then runs the
// interceptor (when there is one) with the method's info (whose Server is
// the op) and Serve.
func (u *Unary[Req, Resp]) handler() handler {
	info := &grpc.UnaryServerInfo{Server: u, FullMethod: u.method}
	serve := func(ctx context.Context, req any) (any, error) { return u.Serve(ctx, req.(*Req)) }
	return handler{name: u.method, unary: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := new(Req)
		if err := dec(in); err != nil {
			return nil, err
		}
		if interceptor == nil {
			return u.Serve(ctx, in)
		}
		return interceptor(ctx, in, info, serve)
	}}
}

// streamBlock is a server stream's request and its typed stream, in one
// allocation.
type streamBlock[Req, Resp any] struct {
	req    Req
	stream grpc.GenericServerStream[Req, Resp]
}

// handler is the op's server-stream handler: it receives the request, then
// runs Serve, sending on the stream.
func (s *Stream[Req, Resp]) handler() handler {
	return handler{name: s.method, stream: func(_ any, stream grpc.ServerStream) error {
		b := &streamBlock[Req, Resp]{}
		if err := stream.RecvMsg(&b.req); err != nil {
			return err
		}
		b.stream.ServerStream = stream
		return s.Serve(stream.Context(), &b.req, b.stream.Send)
	}}
}
