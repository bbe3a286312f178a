package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"go.uber.org/goleak"

	"github.com/decodeplane/decodeplane/prealloc"
)

// The end-to-end tests run the real binary, built once per test run.

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	// The in-process daemons (bench, config tests) must leave no goroutine.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// decodeplaneBinary builds the binary on first use.
func decodeplaneBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "decodeplane-e2e-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "decodeplane")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// e2eEnviron is the process environment without anything that configures
// decodeplane, plus extra.
func e2eEnviron(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SGLANG_") || strings.HasPrefix(name, "DECODEPLANE_") || name == "DISAGGREGATION_TEST_FAILURE_PROB" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// syncBuffer collects a child's output; safe to read while it writes.
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

type daemonProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{} // closed when the process exited
	err    error         // cmd.Wait's result, valid after exited
}

// startDaemon starts the binary; cleanup kills it if the test left it running.
func startDaemon(t *testing.T, args, env []string) *daemonProc {
	t.Helper()
	cmd := exec.Command(decodeplaneBinary(t), args...)
	cmd.Env = env
	p := &daemonProc{cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// wait waits up to d for the process to exit and returns its exit code.
func (p *daemonProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("the daemon did not exit within %s; output:\n%s", d, p.stderr.String())
	}
	if p.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		t.Fatalf("wait: %v", p.err)
	}
	return ee.ExitCode()
}

// freeAddr returns a loopback address nothing listens on (at the time).
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// busyAddr returns an address the test holds a listener on.
func busyAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return lis.Addr().String()
}

func TestE2EServeAndSIGTERM(t *testing.T) {
	const shutdownTimeout = 5 * time.Second
	addr := freeAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen=", "--set", "server.shutdown_timeout=" + shutdownTimeout.String()}, e2eEnviron())

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// Watch health until SERVING: WaitForReady waits for the port to open,
	// the stream delivers every status change; the context bounds it all.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	serving := make(chan error, 1)
	go func() {
		stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			serving <- err
			return
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				serving <- err
				return
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				serving <- nil
				return
			}
		}
	}()
	select {
	case err := <-serving:
		if err != nil {
			t.Fatalf("health never reached SERVING: %v\noutput:\n%s", err, p.stderr.String())
		}
	case <-p.exited:
		t.Fatalf("the daemon exited before serving (%v):\n%s", p.err, p.stderr.String())
	}

	// Reflection lists the API.
	rctx, rcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer rcancel()
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, "decodeplane.v1.Admin") {
		t.Errorf("reflection lists %q, want decodeplane.v1.Admin", names)
	}
	rcancel()

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The shutdown deadline plus slack for process exit.
	if code := p.wait(t, shutdownTimeout+5*time.Second); code != exitOK {
		t.Errorf("exit code %d after SIGTERM, want 0; output:\n%s", code, p.stderr.String())
	}
	for _, w := range []string{"decodeplane serving", "shutting down", "decodeplane stopped"} {
		if !strings.Contains(p.stderr.String(), w) {
			t.Errorf("output does not contain %q:\n%s", w, p.stderr.String())
		}
	}
}

func TestE2EServeRefusesStagingOnMLA(t *testing.T) {
	// The port is held by the test: had the daemon tried to listen it would
	// exit 1 naming server.listen; it must refuse the configuration first.
	addr := busyAddr(t)
	p := startDaemon(t, []string{"serve", "--config", filepath.Join(repoRoot, "deploy", "examples", "deepseek-v3-mla.yaml"), "--listen", addr, "--set", "server.metrics_listen="},
		e2eEnviron("SGLANG_DISAGG_STAGING_BUFFER=1"))
	if code := p.wait(t, 30*time.Second); code != exitUsage {
		t.Errorf("exit code %d, want %d", code, exitUsage)
	}
	out := p.stderr.String()
	if !strings.Contains(out, prealloc.MsgStagingMLA) {
		t.Errorf("output does not contain SGLang's message:\n%s", out)
	}
	if strings.Contains(out, "server.listen") || strings.Contains(out, "decodeplane serving") {
		t.Errorf("the daemon went past configuration:\n%s", out)
	}
}

func TestE2EServeBusyPort(t *testing.T) {
	addr := busyAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen="}, e2eEnviron())
	if code := p.wait(t, 30*time.Second); code != exitFailure {
		t.Errorf("exit code %d, want %d", code, exitFailure)
	}
	if out := p.stderr.String(); !strings.Contains(out, "server.listen") || !strings.Contains(out, addr) {
		t.Errorf("output does not name server.listen and %s:\n%s", addr, out)
	}
}
