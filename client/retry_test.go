package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// ---- retries ----

func TestRetry(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	if _, err := c.Engine().OpenRoom(ctx, openReq(70, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	calls := func(method string, f func() error) (int, error) {
		before := in.count(method)
		err := f()
		return in.count(method) - before, err
	}
	getRoom := func() error {
		_, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 70})
		return err
	}
	tests := []struct {
		name      string
		method    string
		fault     fault
		call      func() error
		wantCalls int
		wantErr   error
	}{
		{"GetRoom succeeds after two Unavailable", pb.Rooms_GetRoom_FullMethodName,
			fault{n: 2, code: codes.Unavailable}, getRoom, 3, nil},
		{"GetRoom gives up after MaxAttempts", pb.Rooms_GetRoom_FullMethodName,
			fault{n: 10, code: codes.Unavailable}, getRoom, 4, client.ErrUnavailable},
		{"ResourceExhausted with RetryInfo is retried after the delay", pb.Rooms_GetRoom_FullMethodName,
			fault{n: 1, code: codes.ResourceExhausted, retryAfter: 5 * time.Millisecond}, getRoom, 2, nil},
		{"ResourceExhausted without RetryInfo is not retried", pb.Rooms_GetRoom_FullMethodName,
			fault{n: 1, code: codes.ResourceExhausted}, getRoom, 1, client.ErrResourceExhausted},
		{"NotFound is not retried", pb.Rooms_GetRoom_FullMethodName,
			fault{}, func() error {
				_, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 404})
				return err
			}, 1, client.ErrNotFound},
		{"Internal is not retried", pb.Rooms_GetRoom_FullMethodName,
			fault{n: 1, code: codes.Internal}, getRoom, 1, client.ErrInternal},
		{"Transfer is retried", pb.Rooms_Transfer_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Prefill(&pb.RegisterPrefillRequest{BootstrapAddr: addr}).Transfer(ctx, &pb.TransferRequest{Room: 70, NumPages: 1})
				return err // the room has no destination yet
			}, 2, client.ErrFailedPrecondition},
		{"ReportRunning is never retried", pb.Rooms_ReportRunning_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Engine().ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 70, OutputLen: 3}}})
				return err
			}, 1, client.ErrUnavailable},
		{"RetractRoom is never retried", pb.Rooms_RetractRoom_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Engine().RetractRoom(ctx, &pb.RetractRoomRequest{Room: 70, Mode: pb.RetractMode_RETRACT_MODE_RETRACT})
				return err
			}, 1, client.ErrUnavailable},
		{"ContinueGeneration is never retried", pb.Rooms_ContinueGeneration_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Engine().ContinueGeneration(ctx)
				return err
			}, 1, client.ErrUnavailable},
		{"Drain is never retried", pb.Admin_Drain_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Admin().Drain(ctx)
				return err
			}, 1, client.ErrUnavailable},
		{"OpenRoom without a key is not retried", pb.Rooms_OpenRoom_FullMethodName,
			fault{n: 1, code: codes.Unavailable, after: true}, func() error {
				_, err := c.Engine().OpenRoom(ctx, openReq(71, 100))
				return err
			}, 1, client.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in.fail(tt.method, tt.fault)
			n, err := calls(tt.method, tt.call)
			if n != tt.wantCalls {
				t.Errorf("%d calls reached the daemon, want %d", n, tt.wantCalls)
			}
			if (tt.wantErr == nil) != (err == nil) || !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
	// The OpenRoom whose answer was lost did open the room.
	if _, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 71}); err != nil {
		t.Errorf("GetRoom(71) = %v: the first OpenRoom should have opened it", err)
	}
}

func TestOpenRoomRetryWithIdempotencyKey(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	ctx := ctxT(t)
	method := pb.Rooms_OpenRoom_FullMethodName

	t.Run("caller's key", func(t *testing.T) {
		c := d.client(t, fastRetry)
		in.fail(method, fault{n: 1, code: codes.Unavailable, after: true})
		before := in.count(method)
		req := openReq(80, 100)
		req.IdempotencyKey = "engine-80"
		resp, err := c.Engine().OpenRoom(ctx, req)
		if err != nil || !resp.GetExisting() || resp.GetRoom().GetRoom() != 80 {
			t.Fatalf("OpenRoom = %v, %v; want the existing room 80", resp, err)
		}
		if n := in.count(method) - before; n != 2 {
			t.Errorf("%d OpenRoom calls, want 2", n)
		}
	})
	t.Run("automatic key", func(t *testing.T) {
		c := d.client(t, fastRetry, client.WithAutoIdempotencyKey())
		in.fail(method, fault{n: 1, code: codes.Unavailable, after: true})
		before := in.count(method)
		req := openReq(81, 100)
		resp, err := c.Engine().OpenRoom(ctx, req)
		if err != nil || !resp.GetExisting() {
			t.Fatalf("OpenRoom = %v, %v; want the existing room", resp, err)
		}
		reqs := in.requests(method)[before:]
		if len(reqs) != 2 {
			t.Fatalf("%d OpenRoom calls, want 2", len(reqs))
		}
		k1, k2 := reqs[0].(*pb.OpenRoomRequest).GetIdempotencyKey(), reqs[1].(*pb.OpenRoomRequest).GetIdempotencyKey()
		if k1 == "" || k1 != k2 {
			t.Errorf("idempotency keys %q, %q: want one non-empty key for both attempts", k1, k2)
		}
		if req.GetIdempotencyKey() != "" {
			t.Errorf("the caller's request was modified: key %q", req.GetIdempotencyKey())
		}
		// Another call gets another key: a second open of the room is a
		// duplicate, not a retry.
		if _, err := c.Engine().OpenRoom(ctx, req); !errors.Is(err, client.ErrAlreadyExists) {
			t.Errorf("second OpenRoom = %v, want ErrAlreadyExists", err)
		}
	})
}

func TestResourceExhaustedRetryAfter(t *testing.T) {
	in := newInjector()
	dc := in.config()
	dc.decode = func(c *kvlayout.Config) { c.Admission.MaxQueued = 1 }
	d := newDaemon(t, dc)
	c := d.client(t)
	ctx := ctxT(t)
	// The first room waits for its prefill and fills the queue.
	if _, err := c.Engine().OpenRoom(ctx, openReq(90, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	before := in.count(pb.Rooms_OpenRoom_FullMethodName)
	_, err := c.Engine().OpenRoom(ctx, openReq(91, 100))
	var e *client.Error
	if !errors.As(err, &e) || !errors.Is(err, client.ErrResourceExhausted) {
		t.Fatalf("OpenRoom on a full queue = %v, want ErrResourceExhausted", err)
	}
	if e.RetryAfter() != time.Second {
		t.Errorf("RetryAfter() = %s, want the daemon's 1s", e.RetryAfter())
	}
	if d, ok := client.RetryAfter(fmt.Errorf("wrapped: %w", err)); !ok || d != time.Second {
		t.Errorf("client.RetryAfter(wrapped) = %s, %v; want 1s, true", d, ok)
	}
	if !strings.Contains(e.Message(), "admission queue is full") {
		t.Errorf("message %q does not say why", e.Message())
	}
	if n := in.count(pb.Rooms_OpenRoom_FullMethodName) - before; n != 1 {
		t.Errorf("%d OpenRoom calls, want 1 (no key: not retried)", n)
	}
}

func TestDrainingIsUnavailable(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	if _, err := c.Admin().Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	_, err := c.Engine().OpenRoom(ctx, openReq(95, 100))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("OpenRoom while draining = %v, want ErrUnavailable", err)
	}
	if d, ok := client.RetryAfter(err); !ok || d <= 0 {
		t.Errorf("RetryAfter = %s, %v; want the daemon's hint", d, ok)
	}
	st, err := c.Admin().Status(ctx)
	if err != nil || !st.GetDraining() || st.GetReady() {
		t.Errorf("Status = %v, %v; want draining and not ready", st, err)
	}
}

// TestWatchRoomResumes cuts the watch stream after its first event: the
// client re-opens it and returns every transition exactly once.
func TestWatchRoomResumes(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	if _, err := c.Engine().OpenRoom(ctx, openReq(110, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	in.fail(pb.Rooms_WatchRoom_FullMethodName, fault{n: 1, code: codes.Unavailable, after: true})
	w, err := c.Engine().WatchRoom(ctx, &pb.WatchRoomRequest{Room: 110})
	if err != nil {
		t.Fatalf("WatchRoom: %v", err)
	}
	defer w.Close()
	first, err := w.Next()
	if err != nil || first.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL {
		t.Fatalf("first event = %v, %v; want WAITING_PREFILL", first, err)
	}

	// The room goes through its whole life while the stream is broken.
	p := registered(t, c)
	if _, err := p.SendRoom(ctx, 110, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 110}); err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}

	got := []pb.RoomPhase{first.GetTransition().GetPhase()}
	for {
		ev, err := w.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		ph := ev.GetTransition().GetPhase()
		got = append(got, ph)
		if ev.GetTerminal() != (ph == pb.RoomPhase_ROOM_PHASE_RELEASED) {
			t.Errorf("event %v: terminal = %v", ph, ev.GetTerminal())
		}
	}
	room, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 110})
	if err != nil {
		t.Fatalf("GetRoom: %v", err)
	}
	var want []pb.RoomPhase
	for _, tr := range room.GetTransitions() {
		want = append(want, tr.GetPhase())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("watched phases (-timeline +watched):\n%s", diff)
	}
	if n := in.count(pb.Rooms_WatchRoom_FullMethodName); n != 2 {
		t.Errorf("%d WatchRoom calls, want 2 (one re-open)", n)
	}
	if _, err := w.Next(); err != io.EOF {
		t.Errorf("Next after the end = %v, want io.EOF", err)
	}
}

// TestWatchRoomGivesUpWithoutProgress: a stream that breaks after every
// replay brings nothing new; it is re-opened MaxAttempts-1 times, then Next
// fails with ErrUnavailable instead of looping until the context ends.
func TestWatchRoomGivesUpWithoutProgress(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	if _, err := c.Engine().OpenRoom(ctx, openReq(115, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	in.fail(pb.Rooms_WatchRoom_FullMethodName, fault{n: 100, code: codes.Unavailable, after: true})
	w, err := c.Engine().WatchRoom(ctx, &pb.WatchRoomRequest{Room: 115})
	if err != nil {
		t.Fatalf("WatchRoom: %v", err)
	}
	defer w.Close()
	if _, err := w.Next(); err != nil {
		t.Fatalf("first Next: %v", err)
	}
	if ev, err := w.Next(); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("second Next = %v, %v; want ErrUnavailable", ev, err)
	}
	if n := in.count(pb.Rooms_WatchRoom_FullMethodName); n != 4 {
		t.Errorf("%d WatchRoom calls, want 4 (MaxAttempts)", n)
	}
	if _, err := w.Next(); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("Next after the failure = %v, want the same error", err)
	}
}

// TestAwaitDestinationResumes cuts the claim stream on the client side after
// the destination arrived: the re-opened stream's replay of the destination
// is not returned twice, and the room's end still arrives.
func TestAwaitDestinationResumes(t *testing.T) {
	// replayed is closed when the daemon sends the destination a second
	// time: to the re-opened stream.
	replayed := make(chan struct{})
	var sends atomic.Int32
	in := newInjector()
	in.sent = func(_ string, m any) {
		if ev, ok := m.(*pb.DestinationEvent); ok && ev.GetDestination() != nil {
			if sends.Add(1) == 2 {
				close(replayed)
			}
		}
	}
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry, client.WithDialOptions(grpc.WithChainStreamInterceptor(cutFirst(pb.Rooms_AwaitDestination_FullMethodName, nil))))
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.Engine().OpenRoom(ctx, openReq(120, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	s, err := p.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 120})
	if err != nil {
		t.Fatalf("AwaitDestination: %v", err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Destination == nil {
		t.Fatalf("first event = %v, %v; want the destination", ev, err)
	}
	dest := ev.Destination

	next := make(chan *client.Event, 1)
	go func() {
		ev, err := s.Next() // cut, re-opened, replayed destination skipped
		if err != nil {
			t.Errorf("second Next: %v", err)
		}
		next <- ev
	}()
	// The re-opened claim must have been sent the destination again before
	// the room ends, or the replay would be Done at once and prove nothing.
	select {
	case <-replayed:
	case <-ctx.Done():
		t.Fatal("the re-opened stream was not sent the destination")
	}
	n := uint32(len(dest.GetPageIndices()))
	if _, err := p.Transfer(ctx, &pb.TransferRequest{Room: 120, NumPages: n, Last: true, Aux: &pb.Aux{RoomMarker: 120}}); err != nil {
		t.Fatalf("Transfer: %v", err)
	}
	if ev := <-next; ev == nil || ev.Done == nil || ev.Done.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("second event = %v, want Done(SUCCEEDED)", ev)
	}
	if _, err := s.Next(); err != io.EOF {
		t.Errorf("Next after Done = %v, want io.EOF", err)
	}
}

// cutAfterOne is a client stream whose connection "breaks" after its first
// message. With a gate, the break waits for the gate to close.
type cutAfterOne struct {
	grpc.ClientStream
	got  int
	gate <-chan struct{}
}

func (c *cutAfterOne) RecvMsg(m any) error {
	if c.got++; c.got > 1 {
		if c.gate != nil {
			<-c.gate
		}
		return status.Error(codes.Unavailable, "injected: connection reset")
	}
	return c.ClientStream.RecvMsg(m)
}

// cutFirst returns a client stream interceptor that cuts the first stream of
// method after its first message (when gate closes, if given).
func cutFirst(method string, gate <-chan struct{}) grpc.StreamClientInterceptor {
	var once sync.Once
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, m string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, m, opts...)
		if err != nil || m != method {
			return s, err
		}
		cut := false
		once.Do(func() { cut = true })
		if !cut {
			return s, nil
		}
		return &cutAfterOne{ClientStream: s, gate: gate}, nil
	}
}

// TestWaitRoomAcrossACut: the room reaches SUCCEEDED (and is even released)
// while the watch is cut; the re-opened watch replays the timeline, and
// WaitRoom recognises SUCCEEDED in it.
func TestWaitRoomAcrossACut(t *testing.T) {
	gate := make(chan struct{})
	watching := make(chan struct{}) // the first watch event was sent
	var once sync.Once
	in := newInjector()
	in.sent = func(method string, _ any) {
		if method == pb.Rooms_WatchRoom_FullMethodName {
			once.Do(func() { close(watching) })
		}
	}
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry, client.WithDialOptions(grpc.WithChainStreamInterceptor(cutFirst(pb.Rooms_WatchRoom_FullMethodName, gate))))
	ctx := ctxT(t)
	if _, err := c.Engine().OpenRoom(ctx, openReq(140, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	type result struct {
		room *pb.Room
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		r, err := c.Engine().WaitRoom(ctx, 140, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
		waited <- result{r, err}
	}()
	select {
	case <-watching:
	case <-ctx.Done():
		t.Fatal("WaitRoom never watched")
	}
	p := registered(t, c)
	if _, err := p.SendRoom(ctx, 140, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 140}); err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	close(gate) // now the first watch breaks
	if res := <-waited; res.err != nil || res.room.GetRoom() != 140 {
		t.Errorf("WaitRoom(SUCCEEDED) = %v, %v; want room 140, which did succeed", res.room, res.err)
	}
}

// TestAwaitDestinationReopensAfterRefusal: the first AwaitDestination is
// refused with Unavailable; SendRoom still completes.
func TestAwaitDestinationReopensAfterRefusal(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry, client.WithTransport(client.TransportUnary)) // the session's cut: TestSessionCutMidHandOff
	ctx := ctxT(t)
	p := registered(t, c)
	in.fail(pb.Rooms_AwaitDestination_FullMethodName, fault{n: 1, code: codes.Unavailable})
	if _, err := c.Engine().OpenRoom(ctx, openReq(130, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	if _, err := p.SendRoom(ctx, 130, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if n := in.count(pb.Rooms_AwaitDestination_FullMethodName); n != 2 {
		t.Errorf("%d AwaitDestination calls, want 2", n)
	}
}
