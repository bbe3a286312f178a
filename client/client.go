package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Client talks to one decodeplane daemon. It owns the connection and every
// stream the package keeps open on it: the decode engine's shared
// EngineSession stream (OpenAndWait) and each prefill rank's shared
// PrefillSession stream (SendRoom, ReportRoom, RunHeartbeat). Its role
// views, Engine, Prefill and Admin, hold none of their own: they call
// through the Client, and Close ends everything.
//
// A Client is safe for concurrent use by any number of goroutines; build
// one per daemon and share it. Call Close when done.
type Client struct {
	conn     *grpc.ClientConn
	ownsConn bool
	callOpts []grpc.CallOption
	retry    RetryPolicy
	autoKey  bool
	// transport carries OpenAndWait, SendRoom and ReportRoom (transport.go).
	transport Transport
	// engineMux is OpenAndWait's shared engine session under
	// TransportStreams (engine_mux.go), opened at its first use.
	engineMux *engineMux
	// rankSessions are the prefill ranks' shared sessions in use, closed by
	// Close (prefill_mux.go).
	rankSessions rankSessions

	// The role views: they hold only the Client.
	engine Engine
	admin  Admin

	adminSvc pb.AdminClient
	boot     pb.BootstrapClient
	rooms    pb.RoomsClient
	fleet    pb.FleetClient
	capacity pb.CapacityClient
	// session is the prefill rank's multiplexed stream (prefill_session.go).
	session pb.PrefillSessionClient

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// New builds a client for target, a gRPC target such as "127.0.0.1:7600",
// "dns:///decodeplane.local:7600" or "unix:///run/decodeplane.sock". Like
// grpc.NewClient it does not connect: the first RPC does, and a daemon that
// cannot be reached shows up as ErrUnavailable there. The connection is
// insecure unless WithTLS is given; every RPC carries the caller's W3C trace
// context (otelgrpc client handler). While calls or streams are open the
// connection pings a daemon silent for KeepaliveTime and drops the
// connection KeepaliveTimeout after an unanswered ping: a daemon gone
// without closing it (a network partition, a frozen host) fails the calls
// on it with ErrUnavailable and the next call reconnects, instead of every
// call timing out on the dead connection until TCP gives up (~15 min).
// WithDialOptions(grpc.WithKeepaliveParams(...)) overrides it (the daemon
// accepts pings every 5 s or more; grpc-go raises anything below 10 s).
func New(target string, opts ...Option) (*Client, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if o.useTLS {
		cfg := o.tls
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		creds = credentials.NewTLS(cfg)
	}
	tp := o.tp
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := o.propagator
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
	}
	dial = append(dial, o.dialOpts...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: connect to %q: %w", target, err)
	}
	return newClient(conn, true, o), nil
}

// NewFromConn builds a client on a connection the caller made (tests over
// bufconn, programs sharing one connection between several clients). The
// caller keeps the connection: Close does not close it. Options that shape
// the connection (WithTLS, WithTracerProvider, WithPropagator,
// WithDialOptions) cannot apply to it and are refused; WithToken, WithRetry
// and WithAutoIdempotencyKey apply.
func NewFromConn(conn *grpc.ClientConn, opts ...Option) (*Client, error) {
	if conn == nil {
		return nil, errors.New("client: NewFromConn needs a connection")
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if len(o.dialOnlySet) > 0 {
		return nil, fmt.Errorf("client: %s cannot apply to an existing connection: give the equivalent grpc.DialOption when making it, or use New", strings.Join(o.dialOnlySet, ", "))
	}
	return newClient(conn, false, o), nil
}

func newClient(conn *grpc.ClientConn, owns bool, o *options) *Client {
	c := &Client{
		conn:      conn,
		ownsConn:  owns,
		retry:     o.retry,
		autoKey:   o.autoKey,
		transport: o.transport,
		adminSvc:  pb.NewAdminClient(conn),
		boot:      pb.NewBootstrapClient(conn),
		rooms:     pb.NewRoomsClient(conn),
		fleet:     pb.NewFleetClient(conn),
		capacity:  pb.NewCapacityClient(conn),
		session:   pb.NewPrefillSessionClient(conn),
	}
	if o.tokenSet {
		c.callOpts = append(c.callOpts, grpc.PerRPCCredentials(bearer(o.token)))
	}
	c.engineMux = newEngineMux(c)
	c.engine.c = c
	c.admin.c = c
	return c
}

// Engine returns the decode engine's view of the daemon: opening rooms and
// waiting for their KV, releasing, aborting, watching them, reporting
// running rooms, retracting, resuming and resyncing after a restart (see
// Engine). A router that only picks a decode instance needs Admin's
// WatchCapacity.
func (c *Client) Engine() *Engine { return &c.engine }

// Admin returns the operator's view of the daemon: its status, draining it,
// reading its rooms, its fleet and its capacity (see Admin).
func (c *Client) Admin() *Admin { return &c.admin }

// Conn returns the underlying connection, for services this package does not
// wrap (the standard health service, or a newer decodeplane service).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close releases the connection made by New (NewFromConn's connection is
// left to its owner) and ends every stream the Client keeps open, with
// NewFromConn too: OpenAndWait's shared engine session (its waiting calls
// end with ErrCanceled) and every prefill rank's shared session (its
// RunHeartbeat and hand-offs end with ErrCanceled). Later calls, through any
// view, fail with ErrCanceled; with New, calls and streams in flight end
// with ErrCanceled too. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.engineMux.close() // OpenAndWait's shared session
		c.rankSessions.closeAll()
		if c.ownsConn {
			c.closeErr = c.conn.Close()
		}
	})
	return c.closeErr
}

// errIfClosed refuses calls on a closed client.
func (c *Client) errIfClosed(op string) *Error {
	if c.closed.Load() {
		return localError(op, codes.Canceled, "the client is closed")
	}
	return nil
}

// bearer is the per-RPC credential of WithToken.
type bearer string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: false,
// so that a loopback daemon can be used without TLS (see WithToken).
func (bearer) RequireTransportSecurity() bool { return false }
