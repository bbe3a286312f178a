package client_test

import (
	"errors"
	"testing"

	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestReleaseAndAbortRideTheSession: under TransportStreams, once
// OpenAndWait's shared session is up, ReleaseRoom and AbortRoom go over it
// (no unary call) with the unary RPC's answers: the response, and for a
// refusal the same code and message; a client with no session up (the
// unary transport, or streams before any OpenAndWait) calls the RPC.
func TestReleaseAndAbortRideTheSession(t *testing.T) {
	tp := newEngineTap()
	d := tapDaemon(t, tp, daemonConfig{})
	ctx := ctxT(t)
	c := d.client(t)
	u := d.client(t, client.WithTransport(client.TransportUnary))
	p := registered(t, c)

	// Streams, no session yet: unary.
	if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 9901}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("AbortRoom(unknown) = %v", err)
	}
	if n := tp.count(pb.Rooms_AbortRoom_FullMethodName); n != 1 || tp.sessions() != 0 {
		t.Fatalf("%d unary AbortRoom calls and %d sessions before any OpenAndWait, want 1 and 0", n, tp.sessions())
	}

	sent := make(chan error, 1)
	go func() { _, err := p.SendRoom(ctx, 9902, client.SendOptions{}); sent <- err }()
	if _, err := c.Engine().OpenAndWait(ctx, openReq(9902, 100)); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	rel, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 9902})
	if err != nil || rel.GetAlreadyReleased() || rel.GetPagesReleased() == 0 {
		t.Fatalf("ReleaseRoom = %v, %v", rel, err)
	}
	again, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 9902})
	if err != nil || !again.GetAlreadyReleased() {
		t.Fatalf("second ReleaseRoom = %v, %v; want already released", again, err)
	}
	// Refusals read as the unary RPC's.
	for _, tc := range []struct {
		name           string
		session, unary func() error
	}{
		{"release of an unknown room", func() error { _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 9903}); return err },
			func() error { _, err := u.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 9903}); return err }},
		{"release of room 0", func() error { _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{}); return err },
			func() error { _, err := u.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{}); return err }},
		{"nil release", func() error { _, err := c.Engine().ReleaseRoom(ctx, nil); return err },
			func() error { _, err := u.Engine().ReleaseRoom(ctx, nil); return err }},
		{"abort of room 0", func() error { _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{}); return err },
			func() error { _, err := u.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{}); return err }},
		{"abort of an unknown room", func() error { _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 9904}); return err },
			func() error { _, err := u.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 9904}); return err }},
	} {
		se, ue := tc.session(), tc.unary()
		var sErr, uErr *client.Error
		if !errors.As(se, &sErr) || !errors.As(ue, &uErr) || sErr.Code() != uErr.Code() || sErr.Message() != uErr.Message() || sErr.Op() != uErr.Op() {
			t.Errorf("%s: session %v (%s), unary %v (%s): want the same op, code and message", tc.name, se, status.Code(se), ue, status.Code(ue))
		}
	}
	if _, err := c.Engine().OpenRoom(ctx, openReq(9905, 100)); err != nil {
		t.Fatal(err)
	}
	ab, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 9905, Reason: "test"})
	if err != nil || ab.GetAlreadyTerminal() {
		t.Fatalf("AbortRoom = %v, %v", ab, err)
	}
	// The streams client made no release or abort call after its session
	// was up (the unary client's are the comparison's, counted too).
	if n, want := tp.count(pb.Rooms_ReleaseRoom_FullMethodName), 3; n != want {
		t.Errorf("%d unary ReleaseRoom calls, want %d (the unary client's only)", n, want)
	}
	if n, want := tp.count(pb.Rooms_AbortRoom_FullMethodName), 1+2; n != want {
		t.Errorf("%d unary AbortRoom calls, want %d (the first, before any session, and the unary client's)", n, want)
	}
	assertPoolFull(t, c)
}
