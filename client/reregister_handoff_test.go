package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	daemonpkg "github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestHandOffWaitsForReregistration: the daemon restarts; a hand-off made
// before the rank's RunHeartbeat registered it with the new daemon (the
// new daemon refuses its session NOT_FOUND) waits for that registration and
// goes through, instead of failing NotFound at once (rooms the engine
// opened in that window were then never claimed).
func TestHandOffWaitsForReregistration(t *testing.T) {
	ctx := ctxT(t)
	r := startRestartable(t)
	c := fastClient(t, r.addr)
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(20*time.Millisecond))
	if _, err := p.Register(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithCancel(ctx)
	beating := make(chan error, 1)
	go func() { beating <- p.RunHeartbeat(hctx) }()
	defer func() { stop(); <-beating }()

	// The new daemon holds every RegisterPrefill until gate opens, and
	// says when one arrived and when a prefill session was opened.
	gate, registering, sessions := make(chan struct{}), make(chan struct{}, 16), make(chan struct{}, 64)
	if err := r.cur.Stop(); err != nil {
		t.Fatal(err)
	}
	r.cur = nil
	d, err := daemontest.New(daemontest.Options{TCP: true, Config: func(c *config.Config) { c.Server.Listen = r.addr }, Daemon: daemonpkg.Options{
		UnaryInterceptors: []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod == pb.Bootstrap_RegisterPrefill_FullMethodName {
				registering <- struct{}{}
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return h(ctx, req)
		}},
		StreamInterceptors: []grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if info.FullMethod == pb.PrefillSession_Session_FullMethodName {
				select {
				case sessions <- struct{}{}:
				default:
				}
			}
			return h(srv, ss)
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.cur = d
	waitConnected(t, ctx, c)
	<-registering // RunHeartbeat learned the restart and registers again: held
	for len(sessions) > 0 {
		<-sessions // RunHeartbeat's own opens, before it registers
	}
	if _, err := c.Engine().OpenRoom(ctx, openReq(6, 100)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.SendRoom(ctx, 6, client.SendOptions{}); done <- err }()
	<-sessions // the hand-off's session open: refused NOT_FOUND (the rank is not registered yet)
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("SendRoom in the window before the re-registration = %v, want it to wait for the registration and succeed", err)
	}
	if r, err := c.Engine().WaitRoom(ctx, 6, pb.RoomPhase_ROOM_PHASE_SUCCEEDED); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("room 6 = %v, %v; want SUCCEEDED", r, err)
	}
}
