package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// validate reports what serve would refuse at startup: the OTEL_* variables
// and listen addresses serve cannot bind, with every other problem.
func TestValidateReportsTracingAndListenProblems(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"validate", "--listen", "127.0.0.1:99999", "--set", "kv_pool.page_size=48"},
		[]string{"OTEL_TRACES_SAMPLER=bogus", "OTEL_EXPORTER_OTLP_ENDPOINT=http://[::1"}, &stdout, &stderr)
	if code != exitUsage {
		t.Fatalf("validate exit = %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
	}
	for _, want := range []string{"the configuration has 4 problems", `server.listen = "127.0.0.1:99999"`, `port "99999" is not a number in 0..65535`,
		"kv_pool.page_size = 48", `env OTEL_TRACES_SAMPLER="bogus"`, "env OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestE2EServeOnUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "dp.sock")
	p := startDaemon(t, []string{"serve", "--listen", "unix://" + sock, "--set", "server.metrics_listen="}, e2eEnviron())
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health watch over the Unix socket: %v; output:\n%s", err, p.Out.String())
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.Out.String())
	}
}
