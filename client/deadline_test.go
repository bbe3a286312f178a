package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestOpenAndWaitDeadline: OpenAndWait with a 2 s context whose room's
// prefill never claims returns, on both transports, the daemon's failure —
// FAILURE_CODE_DEADLINE_EXCEEDED naming the phase — before the context
// ends: the open carried what the deadline left less the reserve for the
// answer (2 s - 100 ms), and the room failed then.
func TestOpenAndWaitDeadline(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr client.Transport) {
		synctest.Test(t, func(t *testing.T) {
			d := newDaemon(t, daemonConfig{})
			c := d.client(t, client.WithTransport(tr))
			registered(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			r, err := c.Engine().OpenAndWait(ctx, openReq(91, 100))
			took := time.Since(start)
			var rf *client.RoomFailedError
			if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_DEADLINE_EXCEEDED ||
				!strings.Contains(rf.Message, "exceeded its deadline (timeout 1.9s from OpenRoom) in KVPoll.WaitingForInput, phase admitted") {
				t.Fatalf("OpenAndWait = %v, %v; want a RoomFailedError DEADLINE_EXCEEDED naming phase admitted", r, err)
			}
			if took != 1900*time.Millisecond || ctx.Err() != nil {
				t.Errorf("OpenAndWait returned after %s (context %v), want 1.9s, before the context's end", took, ctx.Err())
			}
			got, err := c.Admin().GetRoom(context.Background(), &pb.GetRoomRequest{Room: 91})
			if err != nil {
				t.Fatal(err)
			}
			if got.GetTimeout().AsDuration() != 1900*time.Millisecond {
				t.Errorf("the room's timeout %v, want 1.9s", got.GetTimeout())
			}
		})
	})
}

// TestOpenRoomSendsDeadline: OpenRoom sends what its context's deadline
// leaves (less the reserve), keeps a shorter timeout of the request's own,
// and sends none without a deadline.
func TestOpenRoomSendsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDaemon(t, daemonConfig{})
		c := d.client(t)
		for _, tc := range []struct {
			room uint64
			ctx  time.Duration // 0: no deadline
			own  time.Duration // the request's own timeout (0: none)
			want time.Duration
		}{
			{room: 1, ctx: 0, want: 0},
			{room: 2, ctx: 10 * time.Second, want: 9900 * time.Millisecond},
			{room: 3, ctx: time.Second, want: 950 * time.Millisecond},
			{room: 4, ctx: 10 * time.Second, own: 3 * time.Second, want: 3 * time.Second},
			{room: 5, ctx: 2 * time.Second, own: time.Minute, want: 1900 * time.Millisecond},
			{room: 6, ctx: 48 * time.Hour, want: pb.MaxRoomTimeout},
		} {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
			}
			req := openReq(tc.room, 100)
			if tc.own > 0 {
				req.Timeout = durationpb.New(tc.own)
			}
			resp, err := c.Engine().OpenRoom(ctx, req)
			cancel()
			if err != nil {
				t.Fatalf("room %d: %v", tc.room, err)
			}
			if got := resp.GetRoom().GetTimeout().AsDuration(); got != tc.want || (tc.want == 0) != (resp.GetRoom().GetTimeout() == nil) {
				t.Errorf("room %d (context %s, own %s): timeout %v, want %s", tc.room, tc.ctx, tc.own, resp.GetRoom().GetTimeout(), tc.want)
			}
			if tc.own > 0 && req.GetTimeout().AsDuration() != tc.own {
				t.Errorf("room %d: the caller's request was changed", tc.room)
			}
		}
	})
}
