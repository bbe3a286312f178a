package main

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

// startForRestart starts the daemon binary with args (which listen on addr)
// for a test that kills and restarts it on the same address: a health
// connection, the first process once SERVING, and a Go client whose
// reconnect back-off is short enough to find the restarted daemon at once.
// The connections close with the test.
func startForRestart(t *testing.T, addr string, args []string) (hc *grpc.ClientConn, first *daemonProc, c *client.Client) {
	t.Helper()
	hc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Close() })
	first = startDaemon(t, args, e2eEnviron())
	e2e.WaitHealth(t, hc, first, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	c, err = client.New(addr, client.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: 2 * time.Second})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return hc, first, c
}
