package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"go.uber.org/goleak"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	"github.com/decodeplane/decodeplane/kvlayout"
)

// The end-to-end tests run the real binary, built once per test run
// (internal/testing/e2e holds the helpers shared with the other commands' tests).

func TestMain(m *testing.M) {
	benchChild()
	cleanupBench := useTestBinaryAsBench()
	code := m.Run()
	cleanupBench()
	e2e.Cleanup()
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
	return e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane")
}

// e2eEnviron is the process environment without anything that configures
// decodeplane, plus extra.
func e2eEnviron(extra ...string) []string { return e2e.Environ(extra...) }

// daemonProc is a running daemon binary.
type daemonProc = e2e.Proc

// startDaemon starts the binary; cleanup kills it if the test left it running.
func startDaemon(t *testing.T, args, env []string) *daemonProc {
	t.Helper()
	return e2e.Start(t, "decodeplane", decodeplaneBinary(t), env, args...)
}

// freeAddr returns a loopback address nothing listens on (at the time).
func freeAddr(t *testing.T) string { return e2e.FreeAddr(t) }

// busyAddr returns an address the test holds a listener on.
func busyAddr(t *testing.T) string { return e2e.BusyAddr(t) }

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
			t.Fatalf("health never reached SERVING: %v\noutput:\n%s", err, p.Out.String())
		}
	case <-p.Exited():
		t.Fatalf("the daemon exited before serving (%v):\n%s", p.Err(), p.Out.String())
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

	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The shutdown deadline plus slack for process exit.
	if code := p.Wait(t, shutdownTimeout+5*time.Second); code != exitOK {
		t.Errorf("exit code %d after SIGTERM, want 0; output:\n%s", code, p.Out.String())
	}
	for _, w := range []string{"decodeplane serving", "shutting down", "decodeplane stopped"} {
		if !strings.Contains(p.Out.String(), w) {
			t.Errorf("output does not contain %q:\n%s", w, p.Out.String())
		}
	}
}

func TestE2EServeRefusesStagingOnMLA(t *testing.T) {
	// The port is held by the test: had the daemon tried to listen it would
	// exit 1 naming server.listen; it must refuse the configuration first.
	addr := busyAddr(t)
	p := startDaemon(t, []string{"serve", "--config", filepath.Join(repoRoot, "deploy", "examples", "deepseek-v3-mla.yaml"), "--listen", addr, "--set", "server.metrics_listen="},
		e2eEnviron("SGLANG_DISAGG_STAGING_BUFFER=1"))
	if code := p.Wait(t, 30*time.Second); code != exitUsage {
		t.Errorf("exit code %d, want %d", code, exitUsage)
	}
	out := p.Out.String()
	if !strings.Contains(out, kvlayout.MsgStagingMLA) {
		t.Errorf("output does not contain SGLang's message:\n%s", out)
	}
	if strings.Contains(out, "server.listen") || strings.Contains(out, "decodeplane serving") {
		t.Errorf("the daemon went past configuration:\n%s", out)
	}
}

func TestE2EServeBusyPort(t *testing.T) {
	addr := busyAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen="}, e2eEnviron())
	if code := p.Wait(t, 30*time.Second); code != exitFailure {
		t.Errorf("exit code %d, want %d", code, exitFailure)
	}
	if out := p.Out.String(); !strings.Contains(out, "server.listen") || !strings.Contains(out, addr) {
		t.Errorf("output does not name server.listen and %s:\n%s", addr, out)
	}
}
