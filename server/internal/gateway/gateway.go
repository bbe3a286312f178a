// Package gateway serves every decodeplane.v1 RPC as JSON over HTTP
// (grpc-gateway, bound by proto/decodeplane/v1/decodeplane_http.yaml), but
// the two sessions (bidirectional streams, which grpc-gateway cannot map:
// use gRPC, or the unary Rooms RPCs they multiplex).
//
// # In process
//
// The gateway calls the operation table in process: it dials nothing and
// serves nothing but HTTP. grpc-gateway's generated handlers take either a
// gRPC client (RegisterXxxHandlerClient) or the service itself
// (RegisterXxxHandlerServer); the second answers every server stream
// UNIMPLEMENTED, so the gateway registers the first over a client
// connection of its own (local.go) that dispatches each call by its method
// to the handler the gRPC server registered for it (ops.Table.Services),
// run under the server's own interceptor chain: a call through the
// gateway is authorized (Authorization is the "authorization" metadata),
// checked, counted, logged and recovered exactly as a gRPC call, and with
// tracing on it has one span, named as otelgrpc names a call's. A unary
// call runs on the HTTP handler's goroutine; a server stream runs its op
// on one goroutine that hands each message to the HTTP response.
//
// Errors are the gRPC status as HTTP status and a JSON body {"code",
// "message", "details"}; server streams are newline-delimited JSON, one
// {"result": ...} per message and a final {"error": ...} on failure.
package gateway

import (
	"context"
	"fmt"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// MaxBodyBytes bounds a JSON-over-HTTP request body. The gRPC server's
// message limit (MaxRecvMsgBytes) still applies after transcoding.
const MaxBodyBytes = 8 << 20

// Gateway is the JSON gateway.
type Gateway struct {
	mux *runtime.ServeMux
}

// New builds the gateway over the daemon's calls.
func New(c Calls) (*Gateway, error) {
	conn := newLocalConn(c)
	g := &Gateway{mux: runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true},
			UnmarshalOptions: protojson.UnmarshalOptions{},
		}),
	)}
	ctx := context.Background()
	for _, s := range []struct {
		name string
		reg  func(context.Context, *runtime.ServeMux, grpc.ClientConnInterface) error
	}{
		{"Admin", func(ctx context.Context, mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
			return pb.RegisterAdminHandlerClient(ctx, mux, pb.NewAdminClient(cc))
		}},
		{"Bootstrap", func(ctx context.Context, mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
			return pb.RegisterBootstrapHandlerClient(ctx, mux, pb.NewBootstrapClient(cc))
		}},
		{"Rooms", func(ctx context.Context, mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
			return pb.RegisterRoomsHandlerClient(ctx, mux, pb.NewRoomsClient(cc))
		}},
		{"Staging", func(ctx context.Context, mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
			return pb.RegisterStagingHandlerClient(ctx, mux, pb.NewStagingClient(cc))
		}},
		{"Fleet", func(ctx context.Context, mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
			return pb.RegisterFleetHandlerClient(ctx, mux, pb.NewFleetClient(cc))
		}},
		{"Capacity", func(ctx context.Context, mux *runtime.ServeMux, cc grpc.ClientConnInterface) error {
			return pb.RegisterCapacityHandlerClient(ctx, mux, pb.NewCapacityClient(cc))
		}},
	} {
		if err := s.reg(ctx, g.mux, conn); err != nil {
			return nil, fmt.Errorf("gateway for %s: %w", s.name, err)
		}
	}
	return g, nil
}

// Register mounts the gateway's paths on mux: POST
// /decodeplane.v1.<Service>/<Method> and the GET routes under /v1/.
func (g *Gateway) Register(mux *http.ServeMux) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		g.mux.ServeHTTP(w, r)
	})
	for _, p := range []string{"/decodeplane.v1.Admin/", "/decodeplane.v1.Bootstrap/", "/decodeplane.v1.Rooms/", "/decodeplane.v1.Staging/", "/decodeplane.v1.Fleet/", "/decodeplane.v1.Capacity/", "/v1/"} {
		mux.Handle(p, h)
	}
}
