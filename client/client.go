package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Client talks to one decodeplane daemon. It is safe for concurrent use by
// any number of goroutines; build one per daemon and share it. Call Close
// when done.
type Client struct {
	conn     *grpc.ClientConn
	ownsConn bool
	callOpts []grpc.CallOption
	retry    RetryPolicy
	autoKey  bool
	// transport carries OpenAndWait, SendRoom and ReportRoom (transport.go).
	transport Transport
	// engine is OpenAndWait's shared EngineSession under TransportStreams
	// (engine_mux.go), opened at its first use.
	engine *engineMux

	admin pb.AdminClient
	boot  pb.BootstrapClient
	rooms pb.RoomsClient
	fleet pb.FleetClient
	// capacity is the router-facing capacity stream (capacity.go).
	capacity pb.CapacityClient
	// session is the prefill rank's multiplexed stream (prefill_session.go).
	session pb.PrefillSessionClient
	// pmux are the Prefills' shared sessions, closed by Close (prefill_mux.go).
	pmux prefillMuxes

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Option configures a Client.
type Option func(*options)

type options struct {
	tls         *tls.Config
	useTLS      bool
	token       string
	tokenSet    bool
	tp          trace.TracerProvider
	propagator  propagation.TextMapPropagator
	dialOpts    []grpc.DialOption
	retry       RetryPolicy
	autoKey     bool
	transport   Transport
	dialOnlySet []string // dial-time options given, refused by NewFromConn
}

// WithTLS dials with TLS. A nil config uses the system roots and the
// target's host name. Without WithTLS the connection is insecure (plaintext),
// which suits a daemon on loopback or behind a local proxy.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		o.useTLS = true
		if cfg != nil {
			o.tls = cfg.Clone()
		}
		o.dialOnlySet = append(o.dialOnlySet, "WithTLS")
	}
}

// WithToken sends "authorization: Bearer <token>" with every call: the
// daemon's bootstrap token (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN),
// required by mutating RPCs when the daemon has one.
//
// The token is sent on an insecure connection too, in clear text, so that a
// daemon on loopback (127.0.0.1, a Unix socket, an in-process bufconn) can
// require it without TLS. Across a network, combine it with WithTLS.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithTracerProvider sets the provider of the client spans (one per RPC,
// otelgrpc). The default is the global provider (otel.GetTracerProvider),
// which is a no-op until the program sets one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		o.tp = tp
		o.dialOnlySet = append(o.dialOnlySet, "WithTracerProvider")
	}
}

// WithPropagator sets how the trace context travels in the request metadata.
// The default is W3C trace context plus baggage, whatever the global
// propagator is, so that the daemon's spans join the caller's trace.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(o *options) {
		o.propagator = p
		o.dialOnlySet = append(o.dialOnlySet, "WithPropagator")
	}
}

// WithDialOptions appends raw gRPC dial options (a context dialer, keepalive,
// interceptors, ...). They are applied after the client's own, so they win.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) {
		o.dialOpts = append(o.dialOpts, opts...)
		o.dialOnlySet = append(o.dialOnlySet, "WithDialOptions")
	}
}

// WithRetry replaces the retry policy (DefaultRetryPolicy). Which RPCs are
// retried, and on which codes, is fixed by the package (see the package
// documentation); the policy bounds how often and how long.
func WithRetry(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
}

// WithAutoIdempotencyKey makes OpenRoom fill in a random idempotency key when
// the request has none, one per OpenRoom call (kept across that call's
// retries), so that OpenRoom is retried on Unavailable like the other RPCs.
// The caller's request is not modified.
func WithAutoIdempotencyKey() Option {
	return func(o *options) { o.autoKey = true }
}

func buildOptions(opts []Option) (*options, error) {
	o := &options{}
	for _, opt := range opts {
		if opt != nil {
			opt(o)
		}
	}
	if o.tokenSet && (o.token == "" || strings.ContainsAny(o.token, " \t\r\n")) {
		return nil, errors.New("client: WithToken needs a non-empty token without whitespace")
	}
	if err := o.retry.validate(); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	o.retry = o.retry.withDefaults()
	if o.transport > TransportUnary {
		return nil, fmt.Errorf("client: WithTransport(%d): not a Transport (TransportStreams or TransportUnary)", o.transport)
	}
	return o, nil
}

// Keepalive of the connections New makes (see New).
const (
	KeepaliveTime    = 30 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

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
		admin:     pb.NewAdminClient(conn),
		boot:      pb.NewBootstrapClient(conn),
		rooms:     pb.NewRoomsClient(conn),
		fleet:     pb.NewFleetClient(conn),
		capacity:  pb.NewCapacityClient(conn),
		session:   pb.NewPrefillSessionClient(conn),
	}
	if o.tokenSet {
		c.callOpts = append(c.callOpts, grpc.PerRPCCredentials(bearer(o.token)))
	}
	c.engine = newEngineMux(c)
	return c
}

// Conn returns the underlying connection, for services this package does not
// wrap (the standard health service, or a newer decodeplane service).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close releases the connection made by New (NewFromConn's connection is
// left to its owner) and ends OpenAndWait's shared engine session (its
// waiting calls end with ErrCanceled) and every Prefill's shared session
// (TransportStreams; see Prefill.Close), with NewFromConn too. Later calls
// fail with ErrCanceled; with New, calls and streams in flight end with
// ErrCanceled too. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.engine.close() // OpenAndWait's shared session
		c.pmux.closeAll()
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
