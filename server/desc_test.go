package server

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// recordingRooms answers OpenRoom with the room it was asked for.
type recordingRooms struct{ pb.UnimplementedRoomsServer }

func (recordingRooms) OpenRoom(_ context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	return &pb.OpenRoomResponse{Room: &pb.Room{Room: req.GetRoom()}}, nil
}

// TestRoomsDescIsTheGenerated: roomsDesc serves the generated service's
// methods and streams, under the same names and kinds (the streams' handlers
// run in every WatchRoom and AwaitDestination test of the package and of
// the daemon); a replaced unary handler decodes the
// request, hands the interceptor the method's info and the request, and
// reaches the service, allocating nothing but the request.
func TestRoomsDescIsTheGenerated(t *testing.T) {
	rs := recordingRooms{}
	desc := roomsDesc(rs)
	gen := pb.Rooms_ServiceDesc
	if desc.ServiceName != gen.ServiceName || len(desc.Methods) != len(gen.Methods) || len(desc.Streams) != len(gen.Streams) {
		t.Fatalf("roomsDesc: %s with %d methods and %d streams, want %s with %d and %d",
			desc.ServiceName, len(desc.Methods), len(desc.Streams), gen.ServiceName, len(gen.Methods), len(gen.Streams))
	}
	for i, sd := range desc.Streams {
		if g := gen.Streams[i]; sd.StreamName != g.StreamName || sd.ServerStreams != g.ServerStreams || sd.ClientStreams != g.ClientStreams {
			t.Errorf("stream %d is %s (server %v, client %v), want %s (server %v, client %v)", i,
				sd.StreamName, sd.ServerStreams, sd.ClientStreams, g.StreamName, g.ServerStreams, g.ClientStreams)
		}
	}
	var open func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error)
	for i, m := range desc.Methods {
		if m.MethodName != gen.Methods[i].MethodName {
			t.Errorf("method %d is %s, want %s", i, m.MethodName, gen.Methods[i].MethodName)
		}
		if m.MethodName == "OpenRoom" {
			open = m.Handler
		}
	}
	dec := func(v any) error { v.(*pb.OpenRoomRequest).Room = 42; return nil }
	var seen string
	icpt := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = info.FullMethod
		if info.Server != rs {
			t.Errorf("info.Server = %v, want the service", info.Server)
		}
		return h(ctx, req)
	}
	for _, ic := range []grpc.UnaryServerInterceptor{nil, icpt} {
		resp, err := open(rs, context.Background(), dec, ic)
		if err != nil || resp.(*pb.OpenRoomResponse).GetRoom().GetRoom() != 42 {
			t.Errorf("OpenRoom through roomsDesc = %v, %v; want room 42", resp, err)
		}
	}
	if seen != pb.Rooms_OpenRoom_FullMethodName {
		t.Errorf("the interceptor saw %q, want %q", seen, pb.Rooms_OpenRoom_FullMethodName)
	}
	// The request, the answer and its Room: nothing per call besides.
	if a := testing.AllocsPerRun(100, func() { _, _ = open(rs, context.Background(), dec, icpt) }); a > 3 {
		t.Errorf("%.0f allocations per OpenRoom call through the handler, want at most 3 (request, answer, room)", a)
	}
}
