package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// ---- construction, tracing, Close ----

func TestTracePropagation(t *testing.T) {
	var mu sync.Mutex
	var traceparent []string
	capture := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		traceparent = md.Get("traceparent")
		mu.Unlock()
		return h(ctx, req)
	}
	d := newDaemon(t, daemonConfig{unary: []grpc.UnaryServerInterceptor{capture}})
	tid := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(ctxT(t), sc)
	tests := []struct {
		name string
		opts []client.Option
		want bool
	}{
		{"W3C by default", nil, true},
		{"propagator replaced", []client.Option{client.WithPropagator(propagation.Baggage{})}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := d.client(t, tt.opts...)
			if _, err := c.Admin().Status(ctx); err != nil {
				t.Fatalf("Status: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			got := len(traceparent) == 1 && strings.HasPrefix(traceparent[0], "00-"+tid.String()+"-")
			if got != tt.want {
				t.Errorf("traceparent = %q, want the caller's trace %s: %v", traceparent, tid, tt.want)
			}
		})
	}
}

// TestSpans: the client's span is a child of the caller's, and the daemon's
// server span and room span join the caller's trace (OpenAndWait over
// OpenRoom; over the shared engine session: TestOpenAndWaitBatchTracing).
func TestSpans(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	ended := spanEnds{make(chan struct{}, 1)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithSpanProcessor(ended))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	d := newDaemon(t, daemonConfig{tracer: tp})
	c := d.client(t, client.WithTracerProvider(tp), client.WithTransport(client.TransportUnary))
	p := registered(t, c)

	ctx, step := tp.Tracer("decode-engine").Start(ctxT(t), "schedule request")
	sent := make(chan error, 1)
	go func() {
		_, err := p.SendRoom(ctxT(t), 150, client.SendOptions{})
		sent <- err
	}()
	if _, err := c.Engine().OpenAndWait(ctx, openReq(150, 100)); err != nil {
		t.Fatalf("OpenAndWait: %v", err)
	}
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 150}); err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	step.End()
	if err := <-sent; err != nil {
		t.Fatalf("SendRoom: %v", err)
	}

	want := step.SpanContext().TraceID()
	// A server span ends once its answer was sent, maybe after the call
	// returned: find waits for it (each span's end is signalled).
	wait := ctxT(t)
	find := func(name string, kind trace.SpanKind) tracetest.SpanStub {
		t.Helper()
		for {
			for _, s := range spans.GetSpans() {
				if s.Name == name && s.SpanKind == kind && s.SpanContext.TraceID() == want {
					return s
				}
			}
			select {
			case <-ended.ch:
			case <-wait.Done():
				t.Fatalf("no %s span %q in the caller's trace %s", kind, name, want)
				return tracetest.SpanStub{}
			}
		}
	}
	cli := find("decodeplane.v1.Rooms/OpenRoom", trace.SpanKindClient)
	if cli.Parent.SpanID() != step.SpanContext().SpanID() {
		t.Errorf("client span's parent = %s, want the caller's span %s", cli.Parent.SpanID(), step.SpanContext().SpanID())
	}
	srv := find("decodeplane.v1.Rooms/OpenRoom", trace.SpanKindServer)
	if srv.Parent.SpanID() != cli.SpanContext.SpanID() || !srv.Parent.IsRemote() {
		t.Errorf("server span's parent = %v, want the client span %s (remote)", srv.Parent, cli.SpanContext.SpanID())
	}
	find("room", trace.SpanKindInternal)
}

// spanEnds signals each span's end (after the exporters registered before
// it saw the span).
type spanEnds struct{ ch chan struct{} } // cap 1

func (e spanEnds) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e spanEnds) OnEnd(sdktrace.ReadOnlySpan) {
	select {
	case e.ch <- struct{}{}:
	default:
	}
}
func (e spanEnds) Shutdown(context.Context) error   { return nil }
func (e spanEnds) ForceFlush(context.Context) error { return nil }

func TestNewFromConn(t *testing.T) {
	d := newDaemon(t, daemonConfig{server: func(c *server.Config) { c.AuthToken = "tok" }})
	conn, err := grpc.NewClient("passthrough:///bufnet", d.dialer(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := ctxT(t)

	c, err := client.NewFromConn(conn, client.WithToken("tok"), fastRetry)
	if err != nil {
		t.Fatalf("NewFromConn: %v", err)
	}
	if c.Conn() != conn {
		t.Error("Conn() is not the given connection")
	}
	if _, err := c.Admin().Drain(ctx); err != nil { // needs the token
		t.Fatalf("Drain with WithToken over NewFromConn: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Admin().Status(ctx); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("Status after Close = %v, want ErrCanceled", err)
	}
	if _, err := c.Engine().WatchRoom(ctx, &pb.WatchRoomRequest{Room: 1}); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("WatchRoom after Close = %v, want ErrCanceled", err)
	}
	// The connection is the caller's: still open.
	if _, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{}); err != nil {
		t.Errorf("the connection was closed by Client.Close: %v", err)
	}

	for _, opt := range []struct {
		name string
		opt  client.Option
	}{
		{"WithTLS", client.WithTLS(nil)},
		{"WithDialOptions", client.WithDialOptions()},
		{"WithTracerProvider", client.WithTracerProvider(nil)},
		{"WithPropagator", client.WithPropagator(propagation.TraceContext{})},
	} {
		if _, err := client.NewFromConn(conn, opt.opt); err == nil || !strings.Contains(err.Error(), opt.name) {
			t.Errorf("NewFromConn(%s) = %v, want an error naming it", opt.name, err)
		}
	}
	if _, err := client.NewFromConn(nil); err == nil {
		t.Error("NewFromConn(nil) succeeded")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  client.Option
		want string
	}{
		{"empty token", client.WithToken(""), "WithToken"},
		{"token with a space", client.WithToken("a b"), "WithToken"},
		{"negative attempts", client.WithRetry(client.RetryPolicy{MaxAttempts: -1}), "MaxAttempts"},
		{"negative backoff", client.WithRetry(client.RetryPolicy{InitialBackoff: -time.Second}), "negative"},
		{"max below initial", client.WithRetry(client.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}), "MaxBackoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := client.New("127.0.0.1:7600", tt.opt)
			if err == nil {
				c.Close()
				t.Fatalf("New succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want it to name %s", err, tt.want)
			}
		})
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	if _, err := c.Admin().Status(ctxT(t)); err != nil {
		t.Fatalf("Status: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.Admin().Status(ctxT(t)); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("Status after Close = %v, want ErrCanceled", err)
	}
}

// TestUnreachableDaemonIsUnavailable: a daemon that is not there is
// ErrUnavailable, after the retries.
func TestUnreachableDaemonIsUnavailable(t *testing.T) {
	lis := bufconn.Listen(1 << 10)
	if err := lis.Close(); err != nil { // nobody accepts
		t.Fatal(err)
	}
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(dialer), fastRetry)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Admin().Status(ctxT(t))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("Status = %v, want ErrUnavailable", err)
	}
}
