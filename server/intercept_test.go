package server

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// traceRecorder is a slog handler that keeps the trace id of each record's
// context ("" without a span context).
type traceRecorder struct {
	mu  sync.Mutex
	ids []string
}

func (r *traceRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *traceRecorder) Handle(ctx context.Context, rec slog.Record) error {
	id := ""
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		id = sc.TraceID().String()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, rec.Message+" "+id)
	return nil
}
func (r *traceRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *traceRecorder) WithGroup(string) slog.Handler      { return r }
func (r *traceRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ids
	r.ids = nil
	return out
}

// TestCallerTraceInLogsWithTracingOff: with tracing off the otelgrpc stats
// handler is not installed, yet the logs of a call (here a panicking
// handler: the panic and the failed call) still carry the trace id of the
// traceparent the caller sent, as they did with the handler and the no-op
// provider; a call without one logs no trace id.
func TestCallerTraceInLogsWithTracingOff(t *testing.T) {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tt := range []struct {
		name string
		md   metadata.MD
		want string
	}{
		{"with traceparent", metadata.Pairs("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01"), traceID},
		{"without", nil, ""},
	} {
		// A server each: the second panic of the same call within the storm
		// logger's interval would be counted, not logged on its own.
		rec, conn := tracingOffServer(t)
		ctx := ctxT(t)
		if tt.md != nil {
			ctx = metadata.NewOutgoingContext(ctx, tt.md)
		}
		err := conn.Invoke(ctx, "/"+probeService+"/Panic", &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != codes.Internal {
			t.Fatalf("%s: Panic = %v, want Internal", tt.name, err)
		}
		got := rec.take()
		want := []string{"panic in gRPC handler " + tt.want, "finished call " + tt.want}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("%s: logs (message, trace id) = %q, want %q", tt.name, got, want)
		}
	}
}

// tracingOffServer serves the probe service without tracing, its logs
// (INFO and above) recorded.
func tracingOffServer(t *testing.T) (*traceRecorder, *grpc.ClientConn) {
	rec := &traceRecorder{}
	// Info: the failed-call logger, not the debug middleware.
	log := slog.New(levelHandler{rec, slog.LevelInfo})
	s, err := New(DefaultConfig(), Deps{Logger: log, Layout: kvlayout.DefaultConfig().Layout(), TransferPath: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	if s.tracing {
		t.Fatal("a nil TracerProvider counts as tracing on")
	}
	p := &probe{streamStarted: make(chan struct{}), streamDone: make(chan error, 1)}
	s.GRPC().RegisterService(&probeDesc, p)
	rec.take() // the startup's readiness line
	lis := bufconn.Listen(1 << 20)
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		if err := s.Shutdown(context.Background(), nil); err != nil {
			t.Error(err)
		}
		<-served
	})
	return rec, conn
}

// levelHandler filters h's records by level.
type levelHandler struct {
	h     slog.Handler
	level slog.Level
}

func (l levelHandler) Enabled(_ context.Context, lv slog.Level) bool   { return lv >= l.level }
func (l levelHandler) Handle(ctx context.Context, r slog.Record) error { return l.h.Handle(ctx, r) }
func (l levelHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return levelHandler{l.h.WithAttrs(a), l.level}
}
func (l levelHandler) WithGroup(g string) slog.Handler {
	return levelHandler{l.h.WithGroup(g), l.level}
}
