package ops

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestServicesAreTheGenerated: every service the table serves is the
// generated one, its methods and streams under the same names and kinds,
// each with the table's handler (the streams' handlers run in every
// WatchRoom and AwaitDestination test of the server and the daemon).
func TestServicesAreTheGenerated(t *testing.T) {
	tb := New(Config{Manager: newTestManager(t)})
	services, err := tb.Services()
	if err != nil {
		t.Fatal(err)
	}
	gens := map[string]*grpc.ServiceDesc{}
	for _, g := range []*grpc.ServiceDesc{&pb.Admin_ServiceDesc, &pb.Fleet_ServiceDesc, &pb.Capacity_ServiceDesc,
		&pb.Bootstrap_ServiceDesc, &pb.Rooms_ServiceDesc, &pb.Staging_ServiceDesc} {
		gens[g.ServiceName] = g
	}
	if len(services) != len(gens) {
		t.Fatalf("the table serves %d services, want %d", len(services), len(gens))
	}
	for _, desc := range services {
		gen := gens[desc.ServiceName]
		if gen == nil || len(desc.Methods) != len(gen.Methods) || len(desc.Streams) != len(gen.Streams) || desc.Metadata != gen.Metadata {
			t.Fatalf("service %s does not match the generated one", desc.ServiceName)
		}
		for i, m := range desc.Methods {
			if m.MethodName != gen.Methods[i].MethodName || m.Handler == nil {
				t.Errorf("%s method %d is %s (handler %v), want %s", desc.ServiceName, i, m.MethodName, m.Handler != nil, gen.Methods[i].MethodName)
			}
		}
		for i, sd := range desc.Streams {
			if g := gen.Streams[i]; sd.StreamName != g.StreamName || sd.ServerStreams != g.ServerStreams || sd.ClientStreams != g.ClientStreams || sd.Handler == nil {
				t.Errorf("stream %d is %s (server %v, client %v), want %s (server %v, client %v)", i,
					sd.StreamName, sd.ServerStreams, sd.ClientStreams, g.StreamName, g.ServerStreams, g.ClientStreams)
			}
		}
	}
	if got, err := New(Config{}).Services(); err != nil || len(got) != 3 {
		t.Errorf("without a manager the table serves %d services (%v), want Admin, Fleet and Capacity", len(got), err)
	}
}

// TestUnaryHandler: an op's unary handler decodes the request, hands the
// interceptor the method's info and the request, and reaches the op,
// allocating nothing but the request and what the op allocates.
func TestUnaryHandler(t *testing.T) {
	tb := New(Config{})
	op := unary(tb, pb.Rooms_OpenRoom_FullMethodName, mutating, func(_ context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
		return &pb.OpenRoomResponse{Room: &pb.Room{Room: req.GetRoom()}}, nil
	})
	open := op.handler().unary
	dec := func(v any) error {
		r := v.(*pb.OpenRoomRequest)
		r.Room, r.Rid, r.BootstrapAddr, r.PromptLen, r.MaxNewTokens = 42, "r", "10.0.0.1:8998", 1, 1
		return nil
	}
	var seen string
	icpt := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = info.FullMethod
		if info.Server != &op {
			t.Errorf("info.Server = %v, want the op", info.Server)
		}
		return h(ctx, req)
	}
	for _, ic := range []grpc.UnaryServerInterceptor{nil, icpt} {
		resp, err := open(nil, context.Background(), dec, ic)
		if err != nil || resp.(*pb.OpenRoomResponse).GetRoom().GetRoom() != 42 {
			t.Errorf("OpenRoom through its handler = %v, %v; want room 42", resp, err)
		}
	}
	if seen != pb.Rooms_OpenRoom_FullMethodName {
		t.Errorf("the interceptor saw %q, want %q", seen, pb.Rooms_OpenRoom_FullMethodName)
	}
	// The request, the answer and its Room: nothing per call besides.
	if a := testing.AllocsPerRun(100, func() { _, _ = open(nil, context.Background(), dec, icpt) }); a > 3 {
		t.Errorf("%.0f allocations per OpenRoom call through the handler, want at most 3 (request, answer, room)", a)
	}
}
