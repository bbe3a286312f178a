package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// ---- heartbeats ----

// TestHeartbeatReregistersAfterNotFound: another instance takes the rank over
// (a new instance id), so the daemon answers the old one's heartbeat with
// NotFound; the loop registers again and the rank is alive.
// (Unary beats: TestRunHeartbeatStreams covers the session's.)
func TestHeartbeatReregistersAfterNotFound(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, client.WithTransport(client.TransportUnary))
	ctx := ctxT(t)
	hbErrs := make(chan error, 16)
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(2*time.Millisecond), client.OnHeartbeatError(func(err error) {
		select {
		case hbErrs <- err:
		default:
		}
	}))
	reg, err := p.Register(ctx)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	if reg.GetHeartbeatInterval().AsDuration() <= 0 {
		t.Fatalf("registration gives no heartbeat interval: %v", reg)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.RunHeartbeat(runCtx) }()
	in.waitCalls(t, pb.Bootstrap_Heartbeat_FullMethodName, 2)

	other := prefillRank(addr, 1, 0)
	other.InstanceId = "replacement"
	if resp, err := c.Prefill(other).Register(ctx); err != nil || !resp.GetReplaced() {
		t.Fatalf("RegisterPrefill(replacement) = %v, %v; want a replacement", resp, err)
	}
	select {
	case err := <-hbErrs:
		if !errors.Is(err, client.ErrNotFound) {
			t.Errorf("heartbeat error = %v, want ErrNotFound", err)
		}
	case <-ctx.Done():
		t.Fatal("the heartbeat loop never saw NotFound")
	}
	in.waitCalls(t, pb.Bootstrap_RegisterPrefill_FullMethodName, 3) // ours, the replacement's, ours again
	regs := in.requests(pb.Bootstrap_RegisterPrefill_FullMethodName)
	if got := regs[2].(*pb.RegisterPrefillRequest).GetInstanceId(); got != "prefill-"+addr {
		t.Errorf("third registration by %q, want the loop's instance", got)
	}
	// The loop goes on beating, successfully, as the original instance.
	hb := in.count(pb.Bootstrap_Heartbeat_FullMethodName)
	in.waitCalls(t, pb.Bootstrap_Heartbeat_FullMethodName, hb+2)
	if _, err := p.Heartbeat(ctx); err != nil {
		t.Errorf("Heartbeat as the re-registered instance: %v", err)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
	}
}

// TestRunHeartbeatRegistersFirst: a Prefill that never registered registers
// from the loop.
func TestRunHeartbeatRegistersFirst(t *testing.T) { eachTransport(t, testRunHeartbeatRegistersFirst) }

func testRunHeartbeatRegistersFirst(t *testing.T, tr client.Transport) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, client.WithTransport(tr))
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond))
	ctx, stop := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- p.RunHeartbeat(ctx) }()
	// A beat: a unary Heartbeat, or a ping on the rank's session.
	beat := pb.Bootstrap_Heartbeat_FullMethodName
	if tr == client.TransportStreams {
		beat = sessionOp("ping")
	}
	in.waitCalls(t, beat, 1)
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
	}
	if p.Registration() == nil || in.count(pb.Bootstrap_RegisterPrefill_FullMethodName) != 1 {
		t.Errorf("registration %v after %d RegisterPrefill calls, want one registration", p.Registration(), in.count(pb.Bootstrap_RegisterPrefill_FullMethodName))
	}
	if tr == client.TransportStreams && in.count(pb.Bootstrap_Heartbeat_FullMethodName) != 0 {
		t.Errorf("%d unary heartbeats under %s, want none: the session beats", in.count(pb.Bootstrap_Heartbeat_FullMethodName), tr)
	}
}
