package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

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
