package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// listenNotify is a service manager's notification socket: a real unixgram
// socket at path (a leading '@': abstract).
func listenNotify(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readNotify returns the next datagram, failing after within.
func readNotify(t *testing.T, c *net.UnixConn, within time.Duration) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no notification within %s: %v", within, err)
	}
	return string(buf[:n])
}

func TestSDNotify(t *testing.T) {
	if err := sdNotify([]string{"HOME=/x"}, "READY=1"); err != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, want nil (nothing to do)", err)
	}
	if err := sdNotify([]string{"NOTIFY_SOCKET=relative/sock"}, "READY=1"); err == nil || !strings.Contains(err.Error(), "NOTIFY_SOCKET relative/sock") {
		t.Errorf("relative NOTIFY_SOCKET: %v, want an error naming it", err)
	}
	if err := sdNotify([]string{"NOTIFY_SOCKET=" + filepath.Join(t.TempDir(), "none")}, "READY=1"); err == nil {
		t.Error("NOTIFY_SOCKET with no socket there: nil error")
	}

	path := filepath.Join(t.TempDir(), "notify")
	c := listenNotify(t, path)
	// the last NOTIFY_SOCKET wins, as with any variable in an environment
	if err := sdNotify([]string{"NOTIFY_SOCKET=/nonexistent", "NOTIFY_SOCKET=" + path}, "READY=1"); err != nil {
		t.Fatal(err)
	}
	if got := readNotify(t, c, 5*time.Second); got != "READY=1" {
		t.Errorf("datagram %q, want READY=1", got)
	}

	abstract := "@decodeplane-test-" + filepath.Base(t.TempDir())
	ac := listenNotify(t, abstract)
	if err := sdNotify([]string{"NOTIFY_SOCKET=" + abstract}, "STOPPING=1"); err != nil {
		t.Fatal(err)
	}
	if got := readNotify(t, ac, 5*time.Second); got != "STOPPING=1" {
		t.Errorf("abstract socket: datagram %q, want STOPPING=1", got)
	}
}

// TestE2ESDNotify: the real binary under a notification socket says READY=1
// once its health is SERVING, and STOPPING=1 when SIGTERM starts the drain.
func TestE2ESDNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listenNotify(t, path)
	addr := freeAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen=", "--set", "server.shutdown_timeout=5s"},
		e2eEnviron("NOTIFY_SOCKET="+path))
	if got := readNotify(t, c, 60*time.Second); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	// READY=1 means serving: health answers SERVING at once.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health at READY=1: %v %v, want SERVING", resp.GetStatus(), err)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := readNotify(t, c, 60*time.Second); got != "STOPPING=1" { // bounded wait; a loaded 2-core CI machine once took over 10 s
		t.Fatalf("after SIGTERM: notification %q, want STOPPING=1", got)
	}
	if code := p.Wait(t, 20*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}
