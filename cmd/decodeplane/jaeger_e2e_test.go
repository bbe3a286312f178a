package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The tracing claim is tested against a real Jaeger v2 (built from
// tools/jaeger by `make jaeger-build`): a router, a decode engine and a
// prefill rank (the Go client, each with its own tracer provider) and the
// daemon binary all export OTLP to it, and Jaeger's query API must show one
// trace per request holding the prefill's calls and the daemon's work.

// jaegerBinary finds the Jaeger binary, or skips (fails in CI, where
// DECODEPLANE_REQUIRE_JAEGER=1).
func jaegerBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs Jaeger and the daemon binary; skipped with -short")
	}
	path := os.Getenv("DECODEPLANE_JAEGER_BIN")
	if path == "" {
		path, _ = filepath.Abs("../../bin/jaeger")
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("DECODEPLANE_REQUIRE_JAEGER") == "1" {
			t.Fatalf("Jaeger binary %s: %v (build it with 'make jaeger-build')", path, err)
		}
		t.Skipf("no Jaeger binary at %s (build it with 'make jaeger-build'; CI sets DECODEPLANE_REQUIRE_JAEGER=1)", path)
	}
	return path
}

type jaeger struct {
	otlp, query string // host:port
}

// startJaeger runs Jaeger all-in-one with memory storage on free loopback ports.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := jaegerBinary(t)
	j := &jaeger{otlp: freeAddr(t), query: freeAddr(t)}
	health := freeAddr(t)
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %s
    grpc:
      endpoint: %s
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
processors:
  batch:
    timeout: 50ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, j.query, freeAddr(t), health, j.otlp)
	path := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", path)
	out := e2e.NewOutput()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill() // memory storage: nothing to flush, and SIGTERM takes Jaeger ~10s
		<-exited
	})
	poll(t, 30*time.Second, "Jaeger to become healthy:\n"+out.String(), func() bool {
		resp, err := http.Get("http://" + health + "/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return j
}

// poll checks cond on a ticker until it holds or the deadline passes.
func poll(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
	}
}

// tracerProvider exports a service's spans to Jaeger.
func (j *jaeger) tracerProvider(t *testing.T, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(j.otlp), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", service))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp
}

// jaegerTrace is the part of Jaeger's /api/traces answer the test reads.
type jaegerTrace struct {
	Spans []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		StartTime int64 `json:"startTime"`
		Tags      []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
		ProcessID string `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// span is one span of a fetched trace, resolved.
type span struct {
	id, parent, service, name string
	start                     int64
	tags                      map[string]string
}

func (j *jaeger) trace(t *testing.T, id trace.TraceID) []span {
	t.Helper()
	resp, err := http.Get("http://" + j.query + "/api/traces/" + id.String())
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var body struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Data) == 0 {
		return nil
	}
	tr := body.Data[0]
	var out []span
	for _, s := range tr.Spans {
		sp := span{id: s.SpanID, service: tr.Processes[s.ProcessID].ServiceName, name: s.OperationName, start: s.StartTime, tags: map[string]string{}}
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				sp.parent = r.SpanID
			}
		}
		for _, tg := range s.Tags {
			sp.tags[tg.Key] = fmt.Sprint(tg.Value)
		}
		out = append(out, sp)
	}
	return out
}

func find(spans []span, service, name string) []span {
	var out []span
	for _, s := range spans {
		if s.service == service && s.name == name {
			out = append(out, s)
		}
	}
	return out
}

func byID(spans []span, id string) (span, bool) {
	for _, s := range spans {
		if s.id == id {
			return s, true
		}
	}
	return span{}, false
}

func describe(spans []span) string {
	var lines []string
	for _, s := range spans {
		lines = append(lines, fmt.Sprintf("  %s %s/%s parent=%s", s.id, s.service, s.name, s.parent))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// tracedFleet is a daemon exporting its spans to a Jaeger, the router's
// tracer provider, the decode engine's client and a registered TP-1
// prefill rank (each client with its own service name), on one transport.
type tracedFleet struct {
	p        *daemonProc
	routerTP *sdktrace.TracerProvider
	decode   *client.Client
	prefill  *client.Prefill
}

// startTracedFleet starts it, the prefill instance at bootstrap (its rank
// endpoint on port 9000 of the same host); the clients close at cleanup.
func startTracedFleet(t *testing.T, ctx context.Context, j *jaeger, tr client.Transport, bootstrap string) tracedFleet {
	t.Helper()
	addr := freeAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen="},
		e2eEnviron("OTEL_EXPORTER_OTLP_ENDPOINT=http://"+j.otlp, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=decodeplane"))
	f := tracedFleet{p: p, routerTP: j.tracerProvider(t, "router")}
	var err error
	if f.decode, err = client.New(addr, client.WithTracerProvider(j.tracerProvider(t, "decode-engine")), client.WithTransport(tr)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.decode.Close() })
	prefillConn, err := client.New(addr, client.WithTracerProvider(j.tracerProvider(t, "prefill")), client.WithTransport(tr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prefillConn.Close() })
	poll(t, 30*time.Second, "the daemon to serve:\n"+p.Out.String(), func() bool {
		st, err := f.decode.Admin().Status(ctx)
		return err == nil && st.GetReady()
	})
	host, _, _ := strings.Cut(bootstrap, ":")
	f.prefill = prefillConn.Prefill(&pb.RegisterPrefillRequest{BootstrapAddr: bootstrap, RankEndpoint: host + ":9000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16"})
	if _, err := f.prefill.Register(ctx); err != nil {
		t.Fatalf("register (is the daemon up? output:\n%s): %v", p.Out.String(), err)
	}
	return f
}

func TestE2EJaegerOneTracePerRoom(t *testing.T) {
	j := startJaeger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// OpenAndWait on the unary path: the test follows the OpenRoom span
	// chain (on the shared engine session the room span's parent is the
	// caller's span itself: client.TestOpenAndWaitBatchTracing).
	const bootstrap = "10.9.0.1:8998"
	f := startTracedFleet(t, ctx, j, client.TransportUnary, bootstrap)
	p, routerTP, decode, prefill := f.p, f.routerTP, f.decode, f.prefill

	// A successful room: the router's span is the root of the request; the
	// decode engine and the prefill rank both work under it.
	rctx, root := routerTP.Tracer("router").Start(ctx, "router.request")
	okID := root.SpanContext().TraceID()
	sent := make(chan error, 1)
	go func() {
		_, err := prefill.SendRoom(rctx, 101, client.SendOptions{ChunkPages: 2})
		sent <- err
	}()
	if _, err := decode.Engine().OpenAndWait(rctx, &pb.OpenRoomRequest{Rid: "traced-ok", BootstrapAddr: bootstrap, Room: 101, PromptLen: 300, MaxNewTokens: 16}); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if _, err := decode.Engine().ReleaseRoom(rctx, &pb.ReleaseRoomRequest{Room: 101}); err != nil {
		t.Fatal(err)
	}
	root.End()

	// A failed room: aborted after admission, before any prefill claimed it.
	fctx, froot := routerTP.Tracer("router").Start(ctx, "router.request")
	failID := froot.SpanContext().TraceID()
	if _, err := decode.Engine().OpenRoom(fctx, &pb.OpenRoomRequest{Rid: "traced-abort", BootstrapAddr: bootstrap, Room: 102, PromptLen: 100, MaxNewTokens: 16}); err != nil {
		t.Fatal(err)
	}
	if _, err := decode.Engine().AbortRoom(fctx, &pb.AbortRoomRequest{Room: 102, Reason: "client went away"}); err != nil {
		t.Fatal(err)
	}
	froot.End()

	// SIGTERM flushes the daemon's spans.
	p.Cmd.Process.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("daemon exit code %d; output:\n%s", code, p.Out.String())
	}

	var spans []span
	poll(t, 30*time.Second, "the successful room's trace in Jaeger", func() bool {
		spans = j.trace(t, okID)
		return len(find(spans, "decodeplane", "chunk")) > 0 && len(find(spans, "decodeplane", "room")) == 1 &&
			len(find(spans, "prefill", "decodeplane.v1.Rooms/Transfer")) > 0
	})

	// The prefill's Transfer client span → the daemon's Transfer server span
	// → the daemon's chunk span: the daemon's work is inside the prefill's trace.
	chunks := find(spans, "decodeplane", "chunk")
	if len(chunks) != 3 { // 300 tokens = 5 pages in chunks of 2
		t.Errorf("%d chunk spans, want 3:\n%s", len(chunks), describe(spans))
	}
	for _, c := range chunks {
		srv, ok := byID(spans, c.parent)
		if !ok || srv.service != "decodeplane" || srv.name != "decodeplane.v1.Rooms/Transfer" {
			t.Fatalf("chunk span's parent is %+v, want the daemon's Transfer server span:\n%s", srv, describe(spans))
		}
		cli, ok := byID(spans, srv.parent)
		if !ok || cli.service != "prefill" || cli.name != "decodeplane.v1.Rooms/Transfer" {
			t.Fatalf("the daemon's Transfer span's parent is %+v, want the prefill's Transfer client span:\n%s", cli, describe(spans))
		}
	}
	// The room's lifecycle span hangs under the decode engine's OpenRoom and
	// the router's request; its phases are children, in lifecycle order.
	room := find(spans, "decodeplane", "room")[0]
	openSrv, _ := byID(spans, room.parent)
	openCli, _ := byID(spans, openSrv.parent)
	if openSrv.name != "decodeplane.v1.Rooms/OpenRoom" || openCli.service != "decode-engine" {
		t.Errorf("room span's ancestry: %s/%s ← %s/%s, want the daemon's OpenRoom under the decode engine's", openSrv.service, openSrv.name, openCli.service, openCli.name)
	}
	if r := find(spans, "router", "router.request"); len(r) != 1 || openCli.parent != r[0].id {
		t.Errorf("the decode engine's OpenRoom is not under the router's request span:\n%s", describe(spans))
	}
	var phases []span
	for _, s := range spans {
		if s.parent == room.id && strings.HasPrefix(s.name, "room.") {
			phases = append(phases, s)
		}
	}
	sort.Slice(phases, func(a, b int) bool { return phases[a].start < phases[b].start })
	order := []string{"room.bootstrap", "room.dp_rank", "room.admission", "room.claim", "room.transfer"}
	last := -1
	var names []string
	for _, ph := range phases {
		names = append(names, ph.name)
		i := slices.Index(order, ph.name)
		if i < last {
			t.Errorf("phase spans out of order: %v", names)
		}
		last = max(last, i)
	}
	for _, want := range []string{"room.claim", "room.transfer"} {
		if !slices.Contains(names, want) {
			t.Errorf("phase spans %v lack %s", names, want)
		}
	}
	if room.tags["decodeplane.rid"] != "traced-ok" || room.tags["decodeplane.dp_rank_rule"] != "single_dp" || room.tags["otel.status_code"] != "OK" {
		t.Errorf("room span tags = %v, want rid traced-ok, dp_rank_rule single_dp, status OK", room.tags)
	}

	// The aborted room's span carries the failure.
	var fspans []span
	poll(t, 30*time.Second, "the aborted room's trace in Jaeger", func() bool {
		fspans = j.trace(t, failID)
		return len(find(fspans, "decodeplane", "room")) == 1
	})
	froom := find(fspans, "decodeplane", "room")[0]
	if froom.tags["otel.status_code"] != "ERROR" || froom.tags["failure.code"] != "aborted" || froom.tags["failure.reason"] != "client went away" {
		t.Errorf("aborted room span tags = %v, want status ERROR, failure.code aborted, reason", froom.tags)
	}
}
