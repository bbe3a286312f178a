package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestCloseDeregisters: a prefill rank that stops cleanly (Prefill.Close)
// takes its instance out of the registry at once: its admitted room fails
// with PREFILL_LOST naming the deregistration (not after the heartbeat
// bound), its RunHeartbeat stops without registering it again, a second
// deregistration finds nothing, and a new Prefill registers the instance
// afresh.
func TestCloseDeregisters(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr client.Transport) {
		d := newDaemon(t, daemonConfig{})
		c := d.client(t, client.WithTransport(tr))
		ctx := ctxT(t)
		p := registered(t, c)
		beat := make(chan error, 1)
		go func() { beat <- p.RunHeartbeat(ctx) }()
		if _, err := c.Engine().OpenRoom(ctx, openReq(1, 256)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Engine().WaitRoom(ctx, 1, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
			t.Fatal(err)
		}

		resp, err := p.Deregister(ctx, "scaled down")
		if err != nil || !resp.GetDeregistered() || resp.GetRoomsFailed() != 1 {
			t.Fatalf("Deregister = %v, %v; want deregistered, 1 room failed", resp, err)
		}
		r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 1})
		if err != nil {
			t.Fatal(err)
		}
		f := r.GetFailure()
		if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || f.GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST ||
			!strings.Contains(f.GetMessage(), "Lost connection with prefill instance (bootstrap_addr: "+addr+"), 1 requests affected: it deregistered (Bootstrap.DeregisterPrefill through ") ||
			!strings.HasSuffix(f.GetMessage(), "): scaled down") {
			t.Fatalf("room 1 = %v %v; want failed PREFILL_LOST naming the deregistration", r.GetPhase(), f)
		}
		if err := <-beat; !errors.Is(err, client.ErrCanceled) {
			t.Fatalf("RunHeartbeat after Close = %v; want ErrCanceled", err)
		}
		st, err := c.Admin().Status(ctx)
		if err != nil || len(st.GetPrefills()) != 0 {
			t.Fatalf("prefills after Close = %v, %v; want none (no beat registered it again)", st.GetPrefills(), err)
		}

		if err := p.Close(ctx); err != nil {
			t.Fatalf("a second Close = %v; want nil (idempotent)", err)
		}
		again, err := pb.NewBootstrapClient(c.Conn()).DeregisterPrefill(ctx, &pb.DeregisterPrefillRequest{BootstrapAddr: addr})
		if err != nil || again.GetDeregistered() {
			t.Fatalf("DeregisterPrefill of a gone instance = %v, %v; want OK, deregistered false", again, err)
		}
		if _, err := p.Register(ctx); !errors.Is(err, client.ErrCanceled) {
			t.Fatalf("Register after Close = %v; want ErrCanceled", err)
		}
		registered(t, c) // a new Prefill registers the instance again
	})
}

// TestDeregisterOtherInstanceChangesNothing: a late goodbye of an instance
// that was replaced since does not remove its replacement.
func TestDeregisterOtherInstanceChangesNothing(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	registered(t, c)
	resp, err := pb.NewBootstrapClient(c.Conn()).DeregisterPrefill(ctx, &pb.DeregisterPrefillRequest{BootstrapAddr: addr, InstanceId: "an-earlier-instance"})
	if err != nil || resp.GetDeregistered() {
		t.Fatalf("DeregisterPrefill of another instance id = %v, %v; want OK, deregistered false", resp, err)
	}
	st, err := c.Admin().Status(ctx)
	if err != nil || len(st.GetPrefills()) != 1 {
		t.Fatalf("prefills = %v, %v; want the registered instance still there", st.GetPrefills(), err)
	}
}
