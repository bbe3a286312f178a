package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// pagesAt is a declaration of 16 pages (a 1000-token prompt at 64 tokens
// a page) from first on, in row row.
func pagesAt(room uint64, first, row int32) *pb.DeclareDestinationRequest {
	req := &pb.DeclareDestinationRequest{Room: room, MetadataSlot: row}
	for p := first; p < first+16; p++ {
		req.PageIndices = append(req.PageIndices, p)
	}
	return req
}

// TestOpenDeclareAndWait: a decode engine that owns its pages opens a
// room, declares the destination it allocated once the room waits for it
// (at once, or once its prefill registered), and gets the room back when
// its KV landed, on either transport (under streams the declaration rides
// the shared session: no unary call); a declare function's error and a
// held page's refusal are returned, the room left open.
func TestOpenDeclareAndWait(t *testing.T) {
	for _, tr := range []client.Transport{client.TransportStreams, client.TransportUnary} {
		t.Run(tr.String(), func(t *testing.T) {
			tp := newEngineTap()
			d := tapDaemon(t, tp, daemonConfig{decode: func(c *kvlayout.Config) { c.Pool.Owner = kvlayout.OwnerEngine }})
			ctx := ctxT(t)
			c := d.client(t, client.WithTransport(tr))
			p := registered(t, c)
			var calls atomic.Int32
			declareAt := func(first, row int32) client.DeclareFunc {
				return func(_ context.Context, r *pb.Room) (*pb.DeclareDestinationRequest, error) {
					calls.Add(1)
					if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
						t.Errorf("declare called for room %d in %s; want QUEUED", r.GetRoom(), r.GetPhase())
					}
					return pagesAt(r.GetRoom(), first, row), nil
				}
			}
			sent := make(chan error, 1)
			go func() { _, err := p.SendRoom(ctx, 100, client.SendOptions{}); sent <- err }()
			r, err := c.Engine().OpenDeclareAndWait(ctx, openReq(100, 1000), declareAt(32, 3))
			if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || calls.Load() != 1 {
				t.Fatalf("OpenDeclareAndWait(100) = %v, %v after %d declare calls; want succeeded after one", r.GetPhase(), err, calls.Load())
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			got, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 100, IncludePages: true})
			if err != nil || got.GetPageIndices()[0] != 32 || got.GetMetadataSlot() != 3 {
				t.Fatalf("room 100 = pages %v row %d, %v; want the declared 32.., row 3", got.GetPageIndices(), got.GetMetadataSlot(), err)
			}

			// A room whose prefill registers after the open: declared once it
			// waits for its destination.
			const late = "10.0.0.2:8998"
			lateReq := openReq(101, 1000)
			lateReq.BootstrapAddr = late
			done := make(chan error, 1)
			go func() { _, err := c.Engine().OpenDeclareAndWait(ctx, lateReq, declareAt(64, 4)); done <- err }()
			// Opened and watched until it waits for its destination (the
			// unary transport watched room 100 too).
			watches := 1
			if tr == client.TransportUnary {
				watches = 2
			}
			tp.await(t, ctx, "room 101 opened and watched", func() bool { return tp.calls[pb.Rooms_WatchRoom_FullMethodName] >= watches })
			lp := c.Prefill(prefillRank(late, 1, 0))
			if _, err := lp.Register(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := lp.SendRoom(ctx, 101, client.SendOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil || calls.Load() != 2 {
				t.Fatalf("OpenDeclareAndWait(101, prefill registered later) = %v after %d declare calls", err, calls.Load())
			}

			// Refusals: the engine's own error, a held page.
			errNoPages := errors.New("no free pages")
			_, err = c.Engine().OpenDeclareAndWait(ctx, openReq(102, 1000), func(context.Context, *pb.Room) (*pb.DeclareDestinationRequest, error) {
				return nil, errNoPages
			})
			if !errors.Is(err, errNoPages) {
				t.Fatalf("OpenDeclareAndWait with a failing declare = %v; want its error", err)
			}
			if r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 102}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
				t.Fatalf("room 102 after the engine's error = %v, %v; want still QUEUED", r.GetPhase(), err)
			}
			if _, err := c.Engine().DeclareDestination(ctx, pagesAt(102, 200, 5)); err != nil { // admitted, never claimed: held
				t.Fatal(err)
			}
			_, err = c.Engine().OpenDeclareAndWait(ctx, openReq(103, 1000), declareAt(210, 6))
			if held, ok := client.PageHeld(err); !ok || held.Holder != 102 || held.Index != 210 {
				t.Fatalf("OpenDeclareAndWait into room 102's pages = %v; want PAGE_HELD naming page 210 and room 102", err)
			}
			// Four declarations (rooms 100, 101, 102, and 103's refused one):
			// unary calls, or all on the shared session.
			want := map[client.Transport]int{client.TransportUnary: 4, client.TransportStreams: 0}[tr]
			if n := tp.count(pb.Rooms_DeclareDestination_FullMethodName); n != want {
				t.Errorf("%d unary DeclareDestination calls under %s; want %d", n, tr, want)
			}
			for _, room := range []uint64{100, 101} {
				if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
					t.Fatal(err)
				}
			}
			for _, room := range []uint64{102, 103} {
				if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
