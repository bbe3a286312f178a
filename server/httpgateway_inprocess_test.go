package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/server"
)

// callLog records the server's call metrics: per method and kind, the
// events in order ("started", "received", "sent", "handled <code>").
type callLog struct {
	mu     sync.Mutex
	events map[string][]string
}

func (c *callLog) Method(fullMethod, kind string) server.MethodMetrics {
	return &methodLog{c: c, key: fullMethod + " " + kind}
}

func (c *callLog) add(key, ev string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events[key] = append(c.events[key], ev)
}

func (c *callLog) get(key string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events[key])
}

type methodLog struct {
	c   *callLog
	key string
}

func (m *methodLog) Started()  { m.c.add(m.key, "started") }
func (m *methodLog) Received() { m.c.add(m.key, "received") }
func (m *methodLog) Sent()     { m.c.add(m.key, "sent") }
func (m *methodLog) Handled(err error, _ time.Time) {
	m.c.add(m.key, "handled "+status.Code(err).String())
}

// TestGatewayRunsTheCallsInProcess: the JSON gateway needs no listener (the
// server is never served): each HTTP call runs in process under the
// server's own interceptors, counted by the gRPC call metrics as the same
// call over gRPC (unary and server stream), authorized by the table, and
// traced with one server span named as otelgrpc names the call's.
func TestGatewayRunsTheCallsInProcess(t *testing.T) {
	m, dec := newManager(t, 1, nil)
	calls := &callLog{events: map[string][]string{}}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	cfg := server.DefaultConfig()
	cfg.AuthToken = "gw-token"
	srv, err := server.New(cfg, server.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Layout: dec.Layout(), TransferPath: "sim",
		Manager: m, Calls: calls, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetReady(true, "serving")
	gw, err := srv.NewJSONGateway()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	gw.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx, m.Shutdown); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	ctx := t.Context()
	if code, body, err := gwCall(t, ctx, "GET", hs.URL+"/v1/status", "", ""); err != nil || code != 200 {
		t.Fatalf("GET /v1/status = %d %s %v", code, body, err)
	}
	if code, body, _ := gwCall(t, ctx, "POST", hs.URL+"/decodeplane.v1.Rooms/OpenRoom", "", `{}`); code != 401 {
		t.Fatalf("OpenRoom without a token = %d %s, want 401", code, body)
	}
	open := `{"rid": "r", "bootstrap_addr": "10.0.0.1:8998", "room": 7, "prompt_len": 100, "max_new_tokens": 4}`
	if code, body, _ := gwCall(t, ctx, "POST", hs.URL+"/decodeplane.v1.Rooms/OpenRoom", "Bearer gw-token", open); code != 200 {
		t.Fatalf("OpenRoom = %d %s", code, body)
	}
	// A server stream: the room's first event, then the client goes.
	sctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(sctx, "GET", hs.URL+"/v1/rooms/7/watch?history=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, `{"result":`) {
		t.Fatalf("GET /v1/rooms/7/watch: %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()

	for _, tt := range []struct {
		key  string
		want []string
	}{
		{"/decodeplane.v1.Admin/GetStatus unary", []string{"started", "received", "sent", "handled OK"}},
		{"/decodeplane.v1.Rooms/OpenRoom unary", []string{"started", "received", "handled Unauthenticated", "started", "received", "sent", "handled OK"}},
	} {
		if got := calls.get(tt.key); !slices.Equal(got, tt.want) {
			t.Errorf("call metrics of %s = %q, want %q", tt.key, got, tt.want)
		}
	}
	// The stream's end is counted, and its span ended, once the handler
	// saw the client go.
	key := "/decodeplane.v1.Rooms/WatchRoom server_stream"
	for got := calls.get(key); len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "handled") || len(spans.GetSpans()) < 4; got = calls.get(key) {
		if ctx.Err() != nil {
			t.Fatalf("call metrics of %s = %q, want the stream handled", key, got)
		}
		runtime.Gosched()
	}
	if got := calls.get(key); len(got) < 4 || got[0] != "started" || got[1] != "received" || got[2] != "sent" {
		t.Errorf("call metrics of %s = %q, want started, received, sent..., handled", key, got)
	}
	names := map[string]int{}
	for _, sp := range spans.GetSpans() {
		if sp.SpanKind != trace.SpanKindServer || sp.Parent.IsValid() {
			t.Errorf("span %s: kind %v, parent %v; want a server span starting its own trace", sp.Name, sp.SpanKind, sp.Parent)
		}
		names[sp.Name]++
	}
	want := map[string]int{"decodeplane.v1.Admin/GetStatus": 1, "decodeplane.v1.Rooms/OpenRoom": 2, "decodeplane.v1.Rooms/WatchRoom": 1}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("spans = %v, want %v (one per call)", names, want)
	}
}
