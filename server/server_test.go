package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// testTimeout bounds every wait in these tests; nothing should come close.
const testTimeout = 10 * time.Second

// syncBuffer is a bytes.Buffer safe for concurrent writers (the server logs
// from its goroutines while the test reads).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// probe is a test-only service: a unary method that panics and a server
// stream that blocks until its context ends.
type probe struct {
	streamStarted chan struct{}
	streamDone    chan error
}

const (
	probeService = "decodeplane.test.Probe"
	panicText    = "probe panic: secret detail 8d1f"
)

var probeDesc = grpc.ServiceDesc{
	ServiceName: probeService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Panic",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(context.Context, any) (any, error) { panic(panicText) }
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + probeService + "/Panic"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Block",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			p := srv.(*probe)
			if err := stream.RecvMsg(new(emptypb.Empty)); err != nil {
				return err
			}
			close(p.streamStarted)
			<-stream.Context().Done()
			err := stream.Context().Err()
			p.streamDone <- err
			return err
		},
	}},
}

type testServer struct {
	s     *Server
	conn  *grpc.ClientConn
	log   *syncBuffer
	probe *probe
	serve chan error
}

var testEntries = []ConfigEntry{
	{Key: "kv_pool.kind", Value: "gqa", Source: "default"},
	{Key: "server.auth_token", Value: "<redacted>", Source: "env SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"},
	{Key: "timeouts.waiting", Value: "1m0s", Source: "file /etc/decodeplane.yaml:12"},
}

// start builds a server with the real New, registers the probe service,
// serves it over bufconn and dials it. Cleanup shuts it down and checks that
// Serve returned nil.
func start(t *testing.T, mod func(*Config)) *testServer {
	t.Helper()
	return startAt(t, mod, slog.LevelDebug)
}

// startAt is start with the logger at level.
func startAt(t *testing.T, mod func(*Config), level slog.Level) *testServer {
	t.Helper()
	cfg := DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	logs := &syncBuffer{}
	pc := kvlayout.DefaultConfig()
	s, err := New(cfg, Deps{
		Logger:       slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level})),
		Version:      "v1.2.3-test",
		Config:       testEntries,
		Layout:       pc.Layout(),
		TransferPath: "sim",
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &probe{streamStarted: make(chan struct{}), streamDone: make(chan error, 1)}
	s.GRPC().RegisterService(&probeDesc, p)

	lis := bufconn.Listen(1 << 20)
	ts := &testServer{s: s, log: logs, probe: p, serve: make(chan error, 1)}
	go func() { ts.serve <- s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ts.conn = conn
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := s.Shutdown(ctx, nil); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		select {
		case err := <-ts.serve:
			if err != nil {
				t.Errorf("Serve returned %v after Shutdown, want nil", err)
			}
		case <-ctx.Done():
			t.Error("Serve did not return after Shutdown")
		}
	})
	return ts
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func (ts *testServer) health(t *testing.T, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(ts.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return resp.GetStatus()
}

func TestHealthFollowsReadiness(t *testing.T) {
	ts := start(t, nil)
	services := []string{"", "decodeplane.v1.Admin"}
	want := func(step string, st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, svc := range services {
			if got := ts.health(t, svc); got != st {
				t.Errorf("%s: health(%q) = %s, want %s", step, svc, got, st)
			}
		}
	}
	want("before SetReady", healthpb.HealthCheckResponse_NOT_SERVING)
	ts.s.SetReady(true, "serving")
	want("after SetReady(true)", healthpb.HealthCheckResponse_SERVING)
	ts.s.SetReady(false, "transfer agent unreachable")
	want("after SetReady(false)", healthpb.HealthCheckResponse_NOT_SERVING)
	ts.s.SetReady(true, "serving")
	want("ready again", healthpb.HealthCheckResponse_SERVING)
	ts.s.Drain()
	want("after Drain", healthpb.HealthCheckResponse_NOT_SERVING)
	ts.s.SetReady(true, "serving")
	want("SetReady(true) while draining", healthpb.HealthCheckResponse_NOT_SERVING)
	if ready, reason, draining := ts.s.Readiness(); ready || reason != "draining" || !draining {
		t.Errorf("Readiness() = %v, %q, %v; want false, draining, true", ready, reason, draining)
	}
}

func TestDrainRunsHooksOnce(t *testing.T) {
	ts := start(t, nil)
	var calls int
	ts.s.OnDrain(func() { calls++ })
	ts.s.Drain()
	ts.s.Drain()
	if _, err := pb.NewAdminClient(ts.conn).Drain(ctxT(t), &pb.DrainRequest{}); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("drain hook ran %d times, want 1", calls)
	}
}

func listServices(t *testing.T, conn *grpc.ClientConn) ([]string, error) {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"},
	}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	} // io.EOF: the server already ended the stream; Recv has its status (grpc-go's SendMsg contract)
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names, stream.CloseSend()
}

func TestReflection(t *testing.T) {
	t.Run("on", func(t *testing.T) {
		ts := start(t, nil)
		names, err := listServices(t, ts.conn)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"decodeplane.v1.Admin", "decodeplane.v1.Fleet", "decodeplane.v1.Capacity", "grpc.health.v1.Health", probeService} {
			if !slices.Contains(names, want) {
				t.Errorf("reflection lists %q, missing %s", names, want)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		ts := start(t, func(c *Config) { c.Reflection = false })
		names, err := listServices(t, ts.conn)
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("reflection with Reflection=false: services %q, err %v; want Unimplemented", names, err)
		}
		// The rest still works.
		if _, err := pb.NewAdminClient(ts.conn).GetStatus(ctxT(t), &pb.GetStatusRequest{}); err != nil {
			t.Errorf("GetStatus: %v", err)
		}
	})
}

func TestGetStatus(t *testing.T) {
	before := time.Now()
	ts := start(t, nil)
	admin := pb.NewAdminClient(ts.conn)

	resp, err := admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVersion() != "v1.2.3-test" {
		t.Errorf("version = %q", resp.GetVersion())
	}
	if resp.GetReady() || resp.GetReadiness() != "starting" || resp.GetDraining() {
		t.Errorf("before SetReady: ready %v (%q), draining %v; want false (starting), false", resp.GetReady(), resp.GetReadiness(), resp.GetDraining())
	}
	if resp.GetTransferPath() != "sim" {
		t.Errorf("transfer path = %q", resp.GetTransferPath())
	}
	if resp.GetStartedAt() == nil || resp.GetUptime() == nil {
		t.Fatalf("started_at %v, uptime %v: want both", resp.GetStartedAt(), resp.GetUptime())
	}
	started := resp.GetStartedAt().AsTime()
	if started.Before(before.Truncate(time.Microsecond)) || started.After(after) {
		t.Errorf("started_at %s not within [%s, %s]", started, before, after)
	}
	if up := resp.GetUptime().AsDuration(); up < 0 || up > after.Sub(before)+time.Millisecond {
		t.Errorf("uptime %s not within [0, %s]", up, after.Sub(before))
	}
	var got []ConfigEntry
	for _, c := range resp.GetConfig() {
		got = append(got, ConfigEntry{Key: c.GetKey(), Value: c.GetValue(), Source: c.GetSource()})
	}
	if diff := cmp.Diff(testEntries, got); diff != "" {
		t.Errorf("config entries (-want +got):\n%s", diff)
	}
	if l := resp.GetLayout(); l.GetKind() != "gqa" || l.GetNumLayers() != 32 || l.GetPageSize() != 64 {
		t.Errorf("layout = %v", l)
	}

	ts.s.SetReady(true, "serving")
	resp, err = admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetReady() || resp.GetReadiness() != "serving" {
		t.Errorf("after SetReady: ready %v (%q)", resp.GetReady(), resp.GetReadiness())
	}

	if _, err := admin.Drain(ctxT(t), &pb.DrainRequest{}); err != nil {
		t.Fatal(err)
	}
	resp, err = admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetReady() || !resp.GetDraining() || resp.GetReadiness() != "draining" {
		t.Errorf("after Drain: ready %v (%q), draining %v", resp.GetReady(), resp.GetReadiness(), resp.GetDraining())
	}
}

func TestAuth(t *testing.T) {
	const token = "tok-3e7a"
	tests := []struct {
		name         string
		header       []string // authorization values
		wantCode     codes.Code
		wantDraining bool
	}{
		{"no token", nil, codes.Unauthenticated, false},
		{"wrong token", []string{"Bearer tok-wrong"}, codes.Unauthenticated, false},
		{"token prefix", []string{"Bearer tok-3e7"}, codes.Unauthenticated, false},
		{"token without scheme", []string{token}, codes.Unauthenticated, false},
		{"wrong scheme", []string{"Basic " + token}, codes.Unauthenticated, false},
		{"scheme only", []string{"Bearer"}, codes.Unauthenticated, false},
		{"empty token", []string{"Bearer "}, codes.Unauthenticated, false},
		{"Bearer", []string{"Bearer " + token}, codes.OK, true},
		{"bearer", []string{"bearer " + token}, codes.OK, true},
		{"BEARER", []string{"BEARER " + token}, codes.OK, true},
		{"bEaReR", []string{"bEaReR " + token}, codes.OK, true},
		{"right among wrong", []string{"Bearer nope", "Bearer " + token}, codes.OK, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := start(t, func(c *Config) { c.AuthToken = token })
			ts.s.SetReady(true, "serving")
			ctx := ctxT(t)
			for _, h := range tt.header {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", h)
			}
			admin := pb.NewAdminClient(ts.conn)
			_, err := admin.Drain(ctx, &pb.DrainRequest{})
			if code := status.Code(err); code != tt.wantCode {
				t.Fatalf("Drain: %v, want %s", err, tt.wantCode)
			}
			if err != nil && strings.Contains(status.Convert(err).Message(), token) {
				t.Errorf("the error echoes the token: %v", err)
			}
			// Nothing changed on a refused call.
			if _, _, draining := ts.s.Readiness(); draining != tt.wantDraining {
				t.Errorf("draining = %v, want %v", draining, tt.wantDraining)
			}
			wantHealth := healthpb.HealthCheckResponse_SERVING
			if tt.wantDraining {
				wantHealth = healthpb.HealthCheckResponse_NOT_SERVING
			}
			if got := ts.health(t, ""); got != wantHealth {
				t.Errorf("health = %s, want %s", got, wantHealth)
			}
			// Reads need no token.
			resp, err := admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
			if err != nil {
				t.Fatalf("GetStatus without a token: %v", err)
			}
			if resp.GetDraining() != tt.wantDraining {
				t.Errorf("GetStatus draining = %v, want %v", resp.GetDraining(), tt.wantDraining)
			}
		})
	}
}

func TestNoTokenConfiguredNeedsNoToken(t *testing.T) {
	ts := start(t, nil)
	if _, err := pb.NewAdminClient(ts.conn).Drain(ctxT(t), &pb.DrainRequest{}); err != nil {
		t.Fatalf("Drain without a configured token: %v", err)
	}
	if _, _, draining := ts.s.Readiness(); !draining {
		t.Error("not draining after Drain")
	}
}

func TestPanicIsInternalWithoutDetails(t *testing.T) {
	ts := start(t, nil)
	err := ts.conn.Invoke(ctxT(t), "/"+probeService+"/Panic", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Internal {
		t.Fatalf("Panic: %v, want Internal", err)
	}
	if msg := status.Convert(err).Message(); strings.Contains(msg, "secret detail") || strings.Contains(msg, "probe panic") {
		t.Errorf("the status leaks the panic: %q", msg)
	}
	// The panic is logged for the operator.
	if !strings.Contains(ts.log.String(), panicText) {
		t.Errorf("the panic was not logged:\n%s", ts.log.String())
	}
	// The server survived.
	if _, err := pb.NewAdminClient(ts.conn).GetStatus(ctxT(t), &pb.GetStatusRequest{}); err != nil {
		t.Errorf("GetStatus after a panic: %v", err)
	}
}

// openBlockingStream opens the probe's server stream and waits until its
// handler runs.
func openBlockingStream(t *testing.T, ts *testServer) grpc.ClientStream {
	t.Helper()
	stream, err := ts.conn.NewStream(ctxT(t), &grpc.StreamDesc{ServerStreams: true}, "/"+probeService+"/Block")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ts.probe.streamStarted:
	case <-time.After(testTimeout):
		t.Fatal("the stream handler did not start")
	}
	return stream
}

func TestShutdownDeadlineWithOpenStream(t *testing.T) {
	ts := start(t, nil)
	ts.s.SetReady(true, "serving")
	stream := openBlockingStream(t, ts)

	const deadline = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var beforeStopCtx context.Context
	done := make(chan error, 1)
	go func() {
		done <- ts.s.Shutdown(ctx, func(c context.Context) { beforeStopCtx = c })
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown = %v, want DeadlineExceeded (the stream outlived the deadline)", err)
		}
	case <-time.After(testTimeout):
		t.Fatalf("Shutdown did not return within %s of a %s deadline", testTimeout, deadline)
	}
	if beforeStopCtx != ctx {
		t.Error("beforeStop did not get Shutdown's context")
	}
	// The blocked handler was cancelled and the client saw the stream end.
	select {
	case err := <-ts.probe.streamDone:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("stream handler ended with %v, want Canceled", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("the stream handler was not cancelled")
	}
	if err := stream.RecvMsg(new(emptypb.Empty)); err == nil || err == io.EOF {
		t.Errorf("client stream: %v, want an error status", err)
	}
	select {
	case err := <-ts.serve:
		if err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
		ts.serve <- nil // for the cleanup
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return")
	}
	if _, _, draining := ts.s.Readiness(); !draining {
		t.Error("not draining after Shutdown")
	}
}

func TestShutdownWithoutStreamsIsGraceful(t *testing.T) {
	ts := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := ts.s.Shutdown(ctx, nil); err != nil {
		t.Errorf("Shutdown = %v, want nil", err)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Listen = "nope"
	cfg.ShutdownTimeout = 0
	_, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("New = %v, want the joined problems", err)
	}
	var keys []string
	for _, e := range joined.Unwrap() {
		var ce *kvlayout.ConfigError
		if errors.As(e, &ce) {
			keys = append(keys, ce.Key)
		}
	}
	if diff := cmp.Diff([]string{"server.listen", "server.shutdown_timeout"}, keys); diff != "" {
		t.Errorf("problem keys (-want +got):\n%s", diff)
	}
}

// Call logs: with debug on, the middleware logs every call; with debug off
// only failed calls are logged, at their code's level (the cheap path).
func TestCallLogs(t *testing.T) {
	for _, tt := range []struct {
		name          string
		level         slog.Level
		wantSuccesses bool
	}{
		{"debug: every call", slog.LevelDebug, true},
		{"info: failures only", slog.LevelInfo, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ts := startAt(t, nil, tt.level)
			if _, err := pb.NewAdminClient(ts.conn).GetStatus(ctxT(t), &pb.GetStatusRequest{}); err != nil {
				t.Fatal(err)
			}
			if err := ts.conn.Invoke(ctxT(t), "/"+probeService+"/Panic", &emptypb.Empty{}, &emptypb.Empty{}); status.Code(err) != codes.Internal {
				t.Fatalf("Panic: %v, want Internal", err)
			}
			logs := ts.log.String()
			var calls []string
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, "finished call") {
					calls = append(calls, line)
				}
			}
			var sawStatus, sawPanic bool
			for _, l := range calls {
				sawStatus = sawStatus || strings.Contains(l, "grpc.method=GetStatus")
				if strings.Contains(l, "grpc.method=Panic") {
					sawPanic = true
					if !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "grpc.code=Internal") {
						t.Errorf("failed call logged as %q, want level ERROR with grpc.code=Internal", l)
					}
				}
			}
			if sawStatus != tt.wantSuccesses {
				t.Errorf("successful GetStatus logged = %v, want %v:\n%s", sawStatus, tt.wantSuccesses, logs)
			}
			if !sawPanic {
				t.Errorf("the failed call was not logged:\n%s", logs)
			}
		})
	}
}

func TestListenAddr(t *testing.T) {
	for _, tt := range []struct {
		addr          string
		unix          bool
		network, dest string
		err           string
	}{
		{"127.0.0.1:7600", false, "tcp", "127.0.0.1:7600", ""},
		{":0", false, "tcp", ":0", ""},
		{"[::1]:65535", false, "tcp", "[::1]:65535", ""},
		{"127.0.0.1:99999", false, "", "", `port "99999" is not a number in 0..65535`},
		{"127.0.0.1:http", false, "", "", `port "http" is not a number`},
		{"localhost", false, "", "", "not a host:port address"},
		{"unix:///run/dp.sock", true, "unix", "/run/dp.sock", ""},
		{"unix://run/dp.sock", true, "", "", "needs an absolute path"},
		{"unix:///run/dp.sock", false, "", "", "a Unix socket is not supported here"},
	} {
		network, dest, err := ListenAddr(tt.addr, tt.unix)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ListenAddr(%q, %v) = %v, want an error containing %q", tt.addr, tt.unix, err, tt.err)
			}
			continue
		}
		if err != nil || network != tt.network || dest != tt.dest {
			t.Errorf("ListenAddr(%q, %v) = %q, %q, %v; want %q, %q", tt.addr, tt.unix, network, dest, err, tt.network, tt.dest)
		}
	}
}

// TestShutdownEndsHealthWatch: a client's health Watch (client-side health
// checking keeps one open) does not hold the graceful stop until its
// deadline: it sees NOT_SERVING, then ends OK when the server stops.
func TestShutdownEndsHealthWatch(t *testing.T) {
	ts := start(t, nil)
	ts.s.SetReady(true, "serving")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	watch, err := healthpb.NewHealthClient(ts.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first health status %v, %v; want SERVING", resp, err)
	}
	start := time.Now()
	if err := ts.s.Shutdown(ctx, nil); err != nil {
		t.Errorf("Shutdown = %v, want nil (the health watch must not hold the graceful stop)", err)
	}
	if el := time.Since(start); el >= testTimeout {
		t.Errorf("Shutdown took %s", el)
	}
	var got []healthpb.HealthCheckResponse_ServingStatus
	for {
		resp, err := watch.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("health watch ended with %v (statuses %v), want OK after NOT_SERVING", err, got)
		}
		got = append(got, resp.GetStatus())
	}
	if !slices.Equal(got, []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_NOT_SERVING}) {
		t.Errorf("health statuses after SERVING = %v, want [NOT_SERVING]", got)
	}
}
