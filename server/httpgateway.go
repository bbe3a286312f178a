package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/internal/pipenet"
)

// MaxGatewayBodyBytes bounds a JSON-over-HTTP request body. The gRPC
// server's own 4 MiB message limit still applies after transcoding.
const MaxGatewayBodyBytes = 8 << 20

// JSONGateway serves every decodeplane.v1 RPC as JSON over HTTP
// (grpc-gateway, bound by proto/decodeplane/v1/decodeplane_http.yaml), but
// EngineSession.Session: a bidirectional stream, which grpc-gateway cannot
// map (use gRPC, or the unary Rooms RPCs it multiplexes). It
// reaches this server's gRPC handlers through an in-memory connection, so a
// call runs the same interceptors as a gRPC call: auth (Authorization
// travels as the "authorization" metadata), validation, recovery, logging,
// metrics. Errors are the gRPC status as HTTP status and a JSON body
// {"code", "message", "details"}; server streams are newline-delimited JSON,
// one {"result": ...} per message and a final {"error": ...} on failure.
type JSONGateway struct {
	mux  *runtime.ServeMux
	conn *grpc.ClientConn
	lis  *pipenet.Listener
	done chan struct{}
}

// NewJSONGateway starts serving the gRPC server on an in-memory listener and
// builds the gateway over it. It refuses a server with TLS on (the
// in-memory connection carries no certificate). Close it after Shutdown.
func (s *Server) NewJSONGateway() (*JSONGateway, error) {
	if s.cfg.TLS.Enabled() {
		return nil, errors.New("the JSON gateway is not available with server.tls on")
	}
	g := &JSONGateway{lis: pipenet.Listen("in-process"), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		_ = s.grpc.Serve(g.lis)
	}()
	conn, err := grpc.NewClient("passthrough:///in-process",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return g.lis.Dial(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		g.lis.Close()
		<-g.done
		return nil, err
	}
	g.conn = conn
	g.mux = runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true},
			UnmarshalOptions: protojson.UnmarshalOptions{},
		}),
	)
	ctx := context.Background()
	for name, reg := range map[string]func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		"Admin": pb.RegisterAdminHandler, "Bootstrap": pb.RegisterBootstrapHandler,
		"Rooms": pb.RegisterRoomsHandler, "Staging": pb.RegisterStagingHandler, "Fleet": pb.RegisterFleetHandler,
		"Capacity": pb.RegisterCapacityHandler,
	} {
		if err := reg(ctx, g.mux, conn); err != nil {
			g.Close()
			return nil, fmt.Errorf("gateway for %s: %w", name, err)
		}
	}
	return g, nil
}

// Register mounts the gateway's paths on mux: POST /decodeplane.v1.<Service>/<Method>
// and the GET routes under /v1/.
func (g *JSONGateway) Register(mux *http.ServeMux) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, MaxGatewayBodyBytes)
		g.mux.ServeHTTP(w, r)
	})
	for _, p := range []string{"/decodeplane.v1.Admin/", "/decodeplane.v1.Bootstrap/", "/decodeplane.v1.Rooms/", "/decodeplane.v1.Staging/", "/decodeplane.v1.Fleet/", "/decodeplane.v1.Capacity/", "/v1/"} {
		mux.Handle(p, h)
	}
}

// Close closes the in-memory connection and listener; the gRPC server's
// Shutdown (or Stop) ends its Serve on it.
func (g *JSONGateway) Close() error {
	err := g.conn.Close()
	g.lis.Close()
	<-g.done
	return err
}
