// Package e2e holds the helpers of the end-to-end tests that run the real
// binaries (cmd/decodeplane, cmd/decodeplane-agent, cmd/decodectl): build a
// binary once per test process, start it with a clean environment, collect
// its output, wait for its health or its exit, and pick loopback ports.
// Only tests import it.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]string{} // import path → binary
	failed   = map[string]error{}
)

// Binary builds the command pkg (an import path such as
// "github.com/decodeplane/decodeplane/cmd/decodeplane") on first use and
// returns the binary's path; the test is skipped with -short. Call Cleanup
// from TestMain to remove the binaries.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped with -short")
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built[pkg]; ok {
		return bin
	}
	if err, ok := failed[pkg]; ok {
		t.Fatal(err)
	}
	if buildDir == "" {
		dir, err := os.MkdirTemp("", "decodeplane-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = dir
	}
	bin := filepath.Join(buildDir, path.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		failed[pkg] = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		t.Fatal(failed[pkg])
	}
	built[pkg] = bin
	return bin
}

// Cleanup removes the binaries Binary built.
func Cleanup() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// Environ is the process environment without anything that configures
// decodeplane or its tracing (SGLANG_*, DECODEPLANE_*, OTEL_*,
// DISAGGREGATION_TEST_FAILURE_PROB), plus extra.
func Environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SGLANG_") || strings.HasPrefix(name, "DECODEPLANE_") || strings.HasPrefix(name, "OTEL_") || name == "DISAGGREGATION_TEST_FAILURE_PROB" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// Output collects a child's output; safe to read while it writes, and it
// signals every write.
type Output struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // closed (and replaced) on every write
}

// NewOutput returns an empty Output.
func NewOutput() *Output { return &Output{changed: make(chan struct{})} }

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.changed)
	o.changed = make(chan struct{})
	return o.b.Write(p)
}

// Snapshot returns the output so far and a channel closed on the next write.
func (o *Output) Snapshot() (string, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String(), o.changed
}

func (o *Output) String() string {
	out, _ := o.Snapshot()
	return out
}

// Proc is a running binary.
type Proc struct {
	Name   string
	Cmd    *exec.Cmd
	Out    *Output // stdout and stderr
	exited chan struct{}
	err    error // cmd.Wait's result, valid after exited
}

// Start runs bin with env (Environ() if nil) and args. Cleanup kills it if
// the test left it running, and logs its output when the test failed (or
// with DECODEPLANE_E2E_LOGS set).
func Start(t testing.TB, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	if env == nil {
		env = Environ()
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	p := &Proc{Name: name, Cmd: cmd, Out: NewOutput(), exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
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
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() || os.Getenv("DECODEPLANE_E2E_LOGS") != "" {
			t.Logf("%s output:\n%s", name, p.Out.String())
		}
	})
	return p
}

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is cmd.Wait's result; valid once Exited is closed.
func (p *Proc) Err() error { return p.err }

// Wait waits up to d for the process to exit and returns its exit code.
func (p *Proc) Wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("%s did not exit within %s; output:\n%s", p.Name, d, p.Out.String())
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

// Kill stops the process at once (SIGKILL) and waits up to d for it.
func (p *Proc) Kill(t testing.TB, d time.Duration) {
	t.Helper()
	_ = p.Cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("%s did not exit after SIGKILL", p.Name)
	}
}

// FreeAddr returns a loopback address nothing listens on (at the time).
func FreeAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// BusyAddr returns an address the test holds a listener on until it ends.
func BusyAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return lis.Addr().String()
}

// WaitHealth waits up to within until the server's health is want,
// watching the health stream (no polling); it fails the test if p exits
// first.
func WaitHealth(t testing.TB, conn *grpc.ClientConn, p *Proc, want healthpb.HealthCheckResponse_ServingStatus, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			got <- err
			return
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				got <- err
				return
			}
			if resp.GetStatus() == want {
				got <- nil
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("%s never reported health %s: %v", p.Name, want, err)
		}
	case <-p.exited:
		cancel()
		<-got
		t.Fatalf("%s exited before reporting health %s", p.Name, want)
	}
}
