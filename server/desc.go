package server

import (
	"context"

	"google.golang.org/grpc"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// roomsDesc is pb.Rooms_ServiceDesc with the unary methods of a room's path
// (OpenRoom, Transfer, ReportTransfer, ReleaseRoom) served by handlers whose
// UnaryServerInfo and handler closure are made once, here, instead of on
// every call as the generated handlers make them (two allocations per call),
// and its two streams (AwaitDestination, WatchRoom) by handlers that
// allocate the request and the typed stream together (one allocation instead
// of two). Everything else, and what the interceptor sees, is the generated
// service's.
func roomsDesc(rs pb.RoomsServer) *grpc.ServiceDesc {
	desc := pb.Rooms_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), pb.Rooms_ServiceDesc.Methods...)
	hot := map[string]func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error){
		"OpenRoom":       unaryHandler(rs, pb.Rooms_OpenRoom_FullMethodName, rs.OpenRoom),
		"Transfer":       unaryHandler(rs, pb.Rooms_Transfer_FullMethodName, rs.Transfer),
		"ReportTransfer": unaryHandler(rs, pb.Rooms_ReportTransfer_FullMethodName, rs.ReportTransfer),
		"ReleaseRoom":    unaryHandler(rs, pb.Rooms_ReleaseRoom_FullMethodName, rs.ReleaseRoom),
	}
	for i, m := range desc.Methods {
		if h := hot[m.MethodName]; h != nil {
			desc.Methods[i].Handler = h
		}
	}
	desc.Streams = append([]grpc.StreamDesc(nil), pb.Rooms_ServiceDesc.Streams...)
	hotStreams := map[string]grpc.StreamHandler{
		"AwaitDestination": serverStreamHandler(rs.AwaitDestination),
		"WatchRoom":        serverStreamHandler(rs.WatchRoom),
	}
	for i, sd := range desc.Streams {
		if h := hotStreams[sd.StreamName]; h != nil {
			desc.Streams[i].Handler = h
		}
	}
	return &desc
}

// streamBlock is a server stream's request and its typed stream, in one
// allocation.
type streamBlock[Req, Resp any] struct {
	req    Req
	stream grpc.GenericServerStream[Req, Resp]
}

// serverStreamHandler is a generated server-stream handler for call, with
// the request and the typed stream allocated together.
func serverStreamHandler[Req, Resp any](call func(*Req, grpc.ServerStreamingServer[Resp]) error) grpc.StreamHandler {
	return func(_ any, stream grpc.ServerStream) error {
		b := &streamBlock[Req, Resp]{}
		if err := stream.RecvMsg(&b.req); err != nil {
			return err
		}
		b.stream.ServerStream = stream
		return call(&b.req, &b.stream)
	}
}

// unaryHandler is a generated unary handler for call, with its
// UnaryServerInfo and the handler passed to the interceptor made once.
func unaryHandler[Req any, PReq interface{ *Req }, Resp any](srv any, fullMethod string, call func(context.Context, PReq) (Resp, error)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod}
	handler := func(ctx context.Context, req any) (any, error) { return call(ctx, req.(PReq)) }
	return func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := PReq(new(Req))
		if err := dec(in); err != nil {
			return nil, err
		}
		if interceptor == nil {
			return call(ctx, in)
		}
		return interceptor(ctx, in, info, handler)
	}
}
