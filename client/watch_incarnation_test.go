package client_test

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	daemonpkg "github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// sentStream signals sent on every message the server sends; once crashed
// is set it sends nothing more (the stream is cut as by a crash: no terminal
// event, such as the shutdown's room failure, reaches the client).
type sentStream struct {
	grpc.ServerStream
	sent    chan<- struct{}
	crashed *atomic.Bool
}

func (s sentStream) SendMsg(m any) error {
	if s.crashed.Load() {
		return status.Error(codes.Unavailable, "simulated crash")
	}
	err := s.ServerStream.SendMsg(m)
	// An engine session's message counts once it carries a room event or
	// an open's answer (OpenAndWait subscribes the room's outcome alone:
	// the answer is the sign that its room is open and waited on).
	if ev, ok := m.(*pb.EngineEvent); ok && !slices.ContainsFunc(packed(ev), func(e *pb.EngineEvent) bool {
		return e.GetRoom() != nil || slices.ContainsFunc(e.GetReply().GetResults(), func(r *pb.EngineResult) bool { return r.GetOpen() != nil })
	}) {
		return err // a reply of another op: no room open yet
	}
	select {
	case s.sent <- struct{}{}:
	default:
	}
	return err
}

// TestRoomWatchEndsOnDaemonRestart: a decode engine's watch of a room
// mid-hand-off, whose daemon crashes (its streams cut with no terminal
// event) and restarts on the same address, ends with an
// *IncarnationChangedError naming the room and both incarnations: when the
// new daemon does not know the room (its NOT_FOUND; OpenAndWait on either
// transport, its shared engine session resuming the room on the new daemon,
// and a bare WatchRoom), and when it has a room of that number (an event of
// the new incarnation).
func TestRoomWatchEndsOnDaemonRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		// reopen: a room of the same number is opened on the new daemon
		// before the watch re-opens.
		reopen bool
		// wait: OpenAndWait (over transport), else WatchRoom and Next.
		wait      bool
		transport client.Transport
	}{
		{"OpenAndWait stream, room unknown after the restart", false, true, client.TransportStreams},
		{"OpenAndWait unary, room unknown after the restart", false, true, client.TransportUnary},
		{"WatchRoom, room unknown after the restart", false, false, client.TransportUnary},
		{"WatchRoom, room reopened after the restart", true, false, client.TransportUnary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			sent := make(chan struct{}, 1)
			var crashed atomic.Bool
			first, err := daemontest.New(daemontest.Options{TCP: true, Daemon: daemonpkg.Options{
				StreamInterceptors: []grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
					if info.FullMethod == pb.Rooms_WatchRoom_FullMethodName || info.FullMethod == pb.EngineSession_Session_FullMethodName {
						if crashed.Load() {
							return status.Error(codes.Unavailable, "simulated crash")
						}
						ss = sentStream{ServerStream: ss, sent: sent, crashed: &crashed}
					}
					return h(srv, ss)
				}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			r := &restartable{t: t, addr: first.Addr, cur: first}
			t.Cleanup(func() {
				if r.cur != nil {
					if err := r.cur.Stop(); err != nil {
						t.Errorf("daemon stop: %v", err)
					}
				}
			})
			oldInc := first.Incarnation()
			c := fastClient(t, r.addr, client.WithTransport(tc.transport))
			const room = 21
			// No prefill registered: the room waits for its prefill (mid-hand-off).
			var w *client.RoomWatch
			done := make(chan error, 1)
			if tc.wait {
				go func() {
					_, err := c.Engine().OpenAndWait(ctx, openReq(room, 100))
					done <- err
				}()
			} else {
				if _, err := c.Engine().OpenRoom(ctx, openReq(room, 100)); err != nil {
					t.Fatal(err)
				}
				w, err = c.Engine().WatchRoom(ctx, &pb.WatchRoomRequest{Room: room, History: true})
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				ev, err := w.Next()
				if err != nil || ev.GetIncarnation() != oldInc {
					t.Fatalf("first event = %v, %v; want one of incarnation %x", ev, err, oldInc)
				}
			}
			select { // the watch has its first event (or the open its answer): it knows the incarnation
			case <-sent:
			case <-ctx.Done():
				t.Fatal("no room event sent")
			}
			crashed.Store(true) // a crash: the watch gets no terminal event from this daemon
			r.restart(newRecorder())
			newInc := r.cur.Incarnation()
			if newInc == oldInc {
				t.Fatalf("the restarted daemon kept incarnation %x", oldInc)
			}
			if tc.reopen {
				waitConnected(t, ctx, c)
				if _, err := c.Engine().OpenRoom(ctx, openReq(room, 100)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.wait {
				err = <-done
			} else {
				var ev *pb.RoomEvent
				for err == nil {
					ev, err = w.Next()
					if err == nil && ev.GetIncarnation() != oldInc {
						t.Fatalf("Next returned an event of incarnation %x; want an error", ev.GetIncarnation())
					}
				}
			}
			var ic *client.IncarnationChangedError
			if !errors.As(err, &ic) || !errors.Is(err, client.ErrIncarnationChanged) || ic.Room != room || ic.Old != oldInc || ic.New != newInc || !ic.Watch {
				t.Fatalf("watch across the restart ended with %v; want IncarnationChangedError{room %d, %x → %x, Watch}", err, room, oldInc, newInc)
			}
			if !tc.reopen && !errors.Is(err, client.ErrNotFound) {
				t.Errorf("%v does not wrap the new daemon's NOT_FOUND", err)
			}
		})
	}
}
