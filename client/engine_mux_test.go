package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// TestOpenAndWaitSharesOneSession: concurrent OpenAndWaits of one Client
// run on one EngineSession stream (no OpenRoom call, no WatchRoom stream),
// every room succeeds, and nothing is left waiting.
func TestOpenAndWaitSharesOneSession(t *testing.T) {
	tp := newEngineTap()
	d := tapDaemon(t, tp, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	const rooms = 24
	var wg sync.WaitGroup
	for i := range uint64(rooms) {
		room := 3000 + i
		wg.Go(func() {
			if _, err := p.SendRoom(ctx, room, client.SendOptions{ChunkPages: 2}); err != nil {
				t.Errorf("SendRoom(%d): %v", room, err)
			}
		})
		wg.Go(func() {
			r, err := c.Engine().OpenAndWait(ctx, openReq(room, uint32(100+10*i)))
			if err != nil || r.GetRoom() != room || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				t.Errorf("OpenAndWait(%d) = %v, %v; want it SUCCEEDED", room, r, err)
				return
			}
			if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
				t.Errorf("ReleaseRoom(%d): %v", room, err)
			}
		})
	}
	wg.Wait()
	if n := tp.sessions(); n != 1 {
		t.Errorf("%d EngineSession streams for %d concurrent OpenAndWaits, want 1", n, rooms)
	}
	if n, m := tp.count(pb.Rooms_OpenRoom_FullMethodName), tp.count(pb.Rooms_WatchRoom_FullMethodName); n != 0 || m != 0 {
		t.Errorf("%d OpenRoom calls and %d WatchRoom streams, want none (the session carries them)", n, m)
	}
	tp.mu.Lock()
	opened := 0
	for _, n := range tp.opens[0] {
		opened += n
	}
	ops := len(tp.opens[0])
	tp.mu.Unlock()
	if opened != rooms || ops > rooms {
		t.Errorf("the session carried %d rooms in %d open ops, want %d rooms in at most %d ops", opened, ops, rooms, rooms)
	}
	if n := client.WaitingRooms(c); n != 0 {
		t.Errorf("%d rooms still waited on after every call returned", n)
	}
	assertPoolFull(t, c)
}

// TestOpenAndWaitBatchTracing: opens queued while a batch is in flight go
// in the next batch, as one op, and each room's span still joins its own
// caller's trace, as the child of the caller's span (one trace per
// request).
func TestOpenAndWaitBatchTracing(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tracer.Shutdown(context.Background()) })
	tp := newEngineTap()
	gate := make(chan struct{})
	tp.gate = gate
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	d := tapDaemon(t, tp, daemonConfig{tracer: tracer})
	c := d.client(t, client.WithTracerProvider(tracer))
	queued := make(chan int, 16)
	client.OnOpenQueued(c, func(n int) { queued <- n })
	ctx := ctxT(t)
	p := registered(t, c)

	rooms := []uint64{4001, 4002, 4003, 4004}
	callers := map[uint64]trace.SpanContext{}
	done := make(chan error, len(rooms))
	start := func(room uint64) {
		rctx, span := tracer.Tracer("decode-engine").Start(ctx, fmt.Sprintf("request %d", room))
		callers[room] = span.SpanContext()
		go func() {
			defer span.End()
			_, err := c.Engine().OpenAndWait(rctx, openReq(room, 100))
			done <- err
		}()
	}
	// The first room's batch is in flight (its reply held); the others
	// queue meanwhile.
	start(rooms[0])
	tp.await(t, ctx, "the first open", func() bool { return len(tp.opens) == 1 && len(tp.opens[0]) == 1 })
	for _, room := range rooms[1:] {
		start(room)
	}
	for n := 0; n < len(rooms)-1; {
		select {
		case n = <-queued:
		case <-ctx.Done():
			t.Fatal("the opens were not queued")
		}
	}
	open()
	for _, room := range rooms {
		go func() { _, err := p.SendRoom(ctx, room, client.SendOptions{}); done <- err }()
	}
	for range 2 * len(rooms) {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	tp.mu.Lock()
	got := slices.Clone(tp.opens[0])
	tp.mu.Unlock()
	if want := []int{1, len(rooms) - 1}; !slices.Equal(got, want) {
		t.Errorf("open ops carried %v rooms, want %v (the queued opens in one batch)", got, want)
	}
	for _, room := range rooms {
		if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
	for _, room := range rooms {
		var sp *tracetest.SpanStub
		for _, s := range spans.GetSpans() {
			for _, a := range s.Attributes {
				if s.Name == "room" && a.Key == "decodeplane.room" && a.Value.AsInt64() == int64(room) {
					sp = &s
				}
			}
		}
		want := callers[room]
		if sp == nil {
			t.Errorf("no room span for %d", room)
		} else if sp.SpanContext.TraceID() != want.TraceID() || sp.Parent.SpanID() != want.SpanID() {
			t.Errorf("room %d's span: trace %s parent %s; want its caller's trace %s, parent %s",
				room, sp.SpanContext.TraceID(), sp.Parent.SpanID(), want.TraceID(), want.SpanID())
		}
	}
}

// TestOpenAndWaitResumesAfterCut: the shared session is cut (a fault
// injected on the daemon's side, as a slow consumer is cut) while rooms
// wait; the waiting calls open a new session, resume their rooms, and
// succeed; across the two streams each room's outcome is sent once.
func TestOpenAndWaitResumesAfterCut(t *testing.T) {
	tp := newEngineTap()
	d := tapDaemon(t, tp, daemonConfig{})
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	p := registered(t, c)
	rooms := []uint64{4101, 4102, 4103, 4104}
	done := make(chan error, 2*len(rooms))
	for _, room := range rooms {
		go func() {
			r, err := c.Engine().OpenAndWait(ctx, openReq(room, 300))
			if err == nil && r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				err = fmt.Errorf("room %d: phase %s", room, r.GetPhase())
			}
			done <- err
		}()
	}
	// Every room's open was answered; the next send (a room's outcome)
	// cuts the stream.
	tp.await(t, ctx, "each room's open answered", func() bool {
		if len(tp.opened) == 0 {
			return false
		}
		for _, room := range rooms {
			if !tp.opened[0][room] {
				return false
			}
		}
		return true
	})
	tp.mu.Lock()
	tp.cut[0] = status.New(codes.ResourceExhausted, "slow consumer: injected")
	tp.mu.Unlock()
	for _, room := range rooms {
		go func() { _, err := p.SendRoom(ctx, room, client.SendOptions{ChunkPages: 1}); done <- err }()
	}
	for range 2 * len(rooms) {
		if err := <-done; err != nil {
			t.Fatalf("across the cut: %v", err)
		}
	}
	if n := tp.sessions(); n != 2 {
		t.Errorf("%d EngineSession streams, want 2 (the cut one, the resumed one)", n)
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	// OpenAndWait asks for each room's outcome alone
	// (ENGINE_EVENTS_OUTCOME): across the two streams each room's
	// SUCCEEDED event was sent exactly once, on the resumed stream (the cut
	// one failed to send the first outcome and ended).
	for _, room := range rooms {
		first, second := tp.sent[0][room], tp.sent[1][room]
		if len(first) != 0 || len(second) != 1 || second[0] < 3 {
			t.Errorf("room %d: seqs %v on the cut stream, %v on the new one: want its outcome once, on the new one", room, first, second)
		}
	}
}

// TestOpenAndWaitLostOpenAnswer: the session is cut as the open's reply is
// sent. Without an idempotency key OpenAndWait fails with ErrUnavailable
// (the room was opened: it is not opened twice); with one (here
// WithAutoIdempotencyKey) the open is sent again on a new session, the
// daemon answers the existing room, and the call succeeds.
func TestOpenAndWaitLostOpenAnswer(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			tp := newEngineTap()
			tp.cut[0] = status.New(codes.Unavailable, "connection reset (injected)")
			tp.cutWhen[0] = hasReply
			d := tapDaemon(t, tp, daemonConfig{})
			opts := []client.Option{fastRetry}
			if keyed {
				opts = append(opts, client.WithAutoIdempotencyKey())
			}
			c := d.client(t, opts...)
			ctx := ctxT(t)
			p := registered(t, c)
			sent := make(chan error, 1)
			go func() { _, err := p.SendRoom(ctx, 4201, client.SendOptions{}); sent <- err }()
			r, err := c.Engine().OpenAndWait(ctx, openReq(4201, 100))
			if !keyed {
				if !errors.Is(err, client.ErrUnavailable) || r != nil {
					t.Fatalf("OpenAndWait with its answer lost, no key = %v, %v; want ErrUnavailable", r, err)
				}
				if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 4201}); err != nil {
					t.Fatalf("the room the lost open made: %v", err)
				}
			} else if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				t.Fatalf("OpenAndWait with its answer lost, keyed = %v, %v; want it resent and SUCCEEDED", r, err)
			}
			<-sent
			live, err := c.Admin().ListRooms(ctx, &pb.ListRoomsRequest{})
			if err != nil || len(live.GetRooms()) != 1 {
				t.Errorf("ListRooms = %v, %v; want the one room, opened once", live, err)
			}
			if n := tp.sessions(); keyed && n != 2 {
				t.Errorf("%d EngineSession streams, want 2", n)
			}
		})
	}
}

// TestOpenAndWaitRefusals: a refused open is the same *Error on both
// transports (op OpenRoom, code, message naming the fields, retry delay,
// no room): bad input, a request that cannot be marshalled, a room already
// open, a full admission queue, a missing token.
func TestOpenAndWaitRefusals(t *testing.T) {
	d := newDaemon(t, daemonConfig{
		server: func(c *server.Config) { c.AuthToken = "tok" },
		decode: func(c *kvlayout.Config) { c.Admission.MaxQueued = 1 }, // room 4301 (no prefill) fills it
	})
	ctx := ctxT(t)
	bad := &pb.OpenRoomRequest{Rid: "r", BootstrapAddr: "not an address", PromptLen: 0}
	if _, err := d.client(t, client.WithToken("tok")).Engine().OpenRoom(ctx, openReq(4301, 10)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		req   *pb.OpenRoomRequest
		token bool
		want  error
	}{
		{"bad input", bad, true, client.ErrInvalidArgument},
		{"nil request", nil, true, client.ErrInvalidArgument},
		{"not UTF-8", &pb.OpenRoomRequest{Rid: "\xff", BootstrapAddr: addr, Room: 4304, PromptLen: 10, MaxNewTokens: 1}, true, client.ErrInternal},
		{"already open", openReq(4301, 10), true, client.ErrAlreadyExists},
		{"queue full", openReq(4303, 10), true, client.ErrResourceExhausted},
		{"no token", openReq(4302, 10), false, client.ErrUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [2]*client.Error
			for i, tr := range []client.Transport{client.TransportStreams, client.TransportUnary} {
				opts := []client.Option{client.WithTransport(tr)}
				if tc.token {
					opts = append(opts, client.WithToken("tok"))
				}
				c := d.client(t, opts...)
				r, err := c.Engine().OpenAndWait(ctx, tc.req)
				if r != nil || !errors.As(err, &got[i]) || !errors.Is(err, tc.want) {
					t.Fatalf("%s: OpenAndWait = %v, %v; want a nil room and %v", tr, r, err, tc.want)
				}
			}
			s, u := got[0], got[1]
			if tc.want == client.ErrResourceExhausted && u.RetryAfter() == 0 {
				t.Errorf("the unary refusal %v has no retry delay", u)
			}
			if s.Op() != u.Op() || s.Code() != u.Code() || s.Message() != u.Message() || s.RetryAfter() != u.RetryAfter() {
				t.Errorf("stream %q (%s, %s), unary %q (%s, %s): want the same", s.Message(), s.Op(), s.Code(), u.Message(), u.Op(), u.Code())
			}
		})
	}
}

// TestOpenAndWaitContextEnd: a call whose context ends while its room
// waits returns as the unary path does (ErrCanceled), leaves the room as it
// is, and the shared session forgets it (its later events are dropped) and
// goes on serving the next call. (The context is cancelled: a deadline
// would have been sent as the room's timeout, failing the room before the
// context ends: TestOpenAndWaitDeadline.)
func TestOpenAndWaitContextEnd(t *testing.T) {
	forTransports(t, func(t *testing.T, tr client.Option) {
		d := newDaemon(t, daemonConfig{})
		c := d.client(t, tr)
		ctx := ctxT(t)
		// Connected first: the short deadline is the open's and the wait's
		// alone, not the dial's too (on a loaded machine it was enough for
		// OpenRoom to miss it, leaving no room to find below).
		if _, err := c.Admin().Status(ctx); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithCancel(ctx) // no prefill: the room waits
		defer cancel()
		time.AfterFunc(50*time.Millisecond, cancel)
		r, err := c.Engine().OpenAndWait(short, openReq(4401, 100))
		if r != nil || !errors.Is(err, client.ErrCanceled) || status.Code(err) != codes.Canceled {
			t.Fatalf("OpenAndWait past its context's end = %v, %v; want ErrCanceled", r, err)
		}
		if n := client.WaitingRooms(c); n != 0 {
			t.Errorf("%d rooms waited on after the call returned", n)
		}
		got, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 4401})
		if err != nil || got.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED {
			t.Fatalf("the room after its caller left: %v, %v; want it left as it is", got, err)
		}
		// Its later events (the abort) reach nobody; the next call works.
		if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 4401}); err != nil {
			t.Fatal(err)
		}
		p := registered(t, c)
		go p.SendRoom(ctx, 4402, client.SendOptions{})
		if r, err := c.Engine().OpenAndWait(ctx, openReq(4402, 100)); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			t.Fatalf("the next OpenAndWait = %v, %v", r, err)
		}
	})
}

// TestOpenAndWaitClose: Close ends the shared session; the call waiting on
// it returns ErrCanceled (goleak, in TestMain, checks nothing is left).
func TestOpenAndWaitClose(t *testing.T) {
	tp := newEngineTap()
	d := tapDaemon(t, tp, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() { _, err := c.Engine().OpenAndWait(ctx, openReq(4501, 100)); done <- err }()
	// The room is open and waited on (no prefill) before Close.
	tp.await(t, ctx, "the room's open answered", func() bool { return len(tp.opened) == 1 && tp.opened[0][4501] })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, client.ErrCanceled) {
		t.Errorf("OpenAndWait across Close = %v, want ErrCanceled", err)
	}
}

// TestOpenAndWaitDaemonGone: with no daemon behind the address,
// OpenAndWait does not spin or hang: it tries MaxAttempts times, backing
// off as the RetryPolicy says, and fails with ErrUnavailable.
func TestOpenAndWaitDaemonGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lis := bufconn.Listen(1 << 16)
		lis.Close() // nothing serves: every dial fails at once
		dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
		policy := client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Second}
		c, err := client.New("passthrough:///gone", client.WithRetry(policy), client.WithDialOptions(dialer,
			grpc.WithTransportCredentials(insecure.NewCredentials())))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		r, err := c.Engine().OpenAndWait(ctx, openReq(4601, 100))
		took := time.Since(start)
		if r != nil || !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("OpenAndWait with no daemon = %v, %v; want ErrUnavailable", r, err)
		}
		// Two backoffs of [0.5s, 1s] between three attempts.
		if took < time.Second || took > 2*time.Second {
			t.Errorf("OpenAndWait gave up after %s, want two backoffs (1s..2s)", took)
		}
	})
}

// TestOpenAndWaitPermanentEnd: a session that ends with a code a new
// session would end with too (here PERMISSION_DENIED, as a proxy may say)
// fails the waiting call with it, without opening another session.
func TestOpenAndWaitPermanentEnd(t *testing.T) {
	tp := newEngineTap()
	d := tapDaemon(t, tp, daemonConfig{})
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() { _, err := c.Engine().OpenAndWait(ctx, openReq(4701, 100)); done <- err }()
	tp.await(t, ctx, "the room's open answered", func() bool { return len(tp.opened) == 1 && tp.opened[0][4701] })
	tp.mu.Lock()
	tp.cut[0] = status.New(codes.PermissionDenied, "denied by a proxy (injected)")
	tp.mu.Unlock()
	if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 4701}); err != nil { // an event to send: the cut
		t.Fatal(err)
	}
	err := <-done
	if !errors.Is(err, client.ErrPermissionDenied) || status.Convert(err).Message() != "denied by a proxy (injected)" {
		t.Fatalf("OpenAndWait across a PERMISSION_DENIED end = %v, want it", err)
	}
	if n := tp.sessions(); n != 1 {
		t.Errorf("%d EngineSession streams, want 1 (a permanent end is not retried)", n)
	}
}

// TestOpenAndWaitBatchBound: more opens queued than one batch may carry
// (pb.MaxEngineOpenRooms) go in consecutive batches of at most that many,
// none lost.
func TestOpenAndWaitBatchBound(t *testing.T) {
	tp := newEngineTap()
	gate := make(chan struct{})
	tp.gate = gate
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	d := tapDaemon(t, tp, daemonConfig{})
	c := d.client(t)
	queued := make(chan int, 1024)
	client.OnOpenQueued(c, func(n int) { queued <- n })
	ctx := ctxT(t)
	wctx, stop := context.WithCancel(ctx) // the rooms wait for no prefill: the test ends the waits
	const more = pb.MaxEngineOpenRooms + 44
	var wg sync.WaitGroup
	call := func(room uint64) {
		wg.Go(func() {
			if _, err := c.Engine().OpenAndWait(wctx, openReq(room, 10)); !errors.Is(err, client.ErrCanceled) {
				t.Errorf("OpenAndWait(%d) = %v, want the test's cancel", room, err)
			}
		})
	}
	call(5000)
	tp.await(t, ctx, "the first open", func() bool { return len(tp.opens) == 1 && len(tp.opens[0]) == 1 })
	for i := range uint64(more) {
		call(5001 + i)
	}
	for n := 0; n < more; {
		select {
		case n = <-queued:
		case <-ctx.Done():
			t.Fatal("the opens were not queued")
		}
	}
	open()
	tp.await(t, ctx, "every open", func() bool {
		total := 0
		for _, n := range tp.opens[0] {
			total += n
		}
		return total == 1+more
	})
	tp.mu.Lock()
	got := slices.Clone(tp.opens[0])
	tp.mu.Unlock()
	if want := []int{1, pb.MaxEngineOpenRooms, more - pb.MaxEngineOpenRooms}; !slices.Equal(got, want) {
		t.Errorf("open ops carried %v rooms, want %v", got, want)
	}
	stop()
	wg.Wait()
	if n := client.WaitingRooms(c); n != 0 {
		t.Errorf("%d rooms still waited on after every call returned", n)
	}
}

// TestOpenAndWaitSameRoomTwice: a second OpenAndWait of a room the
// Client's session already waits on (a caller's retry with the same
// idempotency key) runs on the unary path; both calls get the room.
func TestOpenAndWaitSameRoomTwice(t *testing.T) {
	tp := newEngineTap()
	d := tapDaemon(t, tp, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	req := openReq(4801, 100)
	req.IdempotencyKey = "retry-of-4801"
	done := make(chan error, 3)
	wait := func() {
		r, err := c.Engine().OpenAndWait(ctx, req)
		if err == nil && r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			err = fmt.Errorf("phase %s", r.GetPhase())
		}
		done <- err
	}
	go wait()
	tp.await(t, ctx, "the room's open answered", func() bool { return len(tp.opened) == 1 && tp.opened[0][4801] })
	go wait()
	tp.await(t, ctx, "the second call's watch", func() bool { return tp.calls[pb.Rooms_WatchRoom_FullMethodName] == 1 })
	go func() { _, err := p.SendRoom(ctx, 4801, client.SendOptions{}); done <- err }()
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n, s := tp.count(pb.Rooms_OpenRoom_FullMethodName), tp.sessions(); n != 1 || s != 1 {
		t.Errorf("%d OpenRoom calls and %d sessions, want 1 and 1", n, s)
	}
}

// TestOpenAndWaitFallsBackToUnary: toward a daemon that does not serve
// EngineSession (an older one: ErrUnimplemented), OpenAndWait opens and
// waits on the unary API, concurrent calls included, and later calls do
// not try the session again; ReleaseRoom goes unary too.
func TestOpenAndWaitFallsBackToUnary(t *testing.T) {
	in := newInjector()
	in.fail(pb.EngineSession_Session_FullMethodName, fault{n: 1000, code: codes.Unimplemented})
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	var wg sync.WaitGroup
	for room := uint64(41); room <= 48; room++ {
		wg.Go(func() {
			r, err := c.Engine().OpenAndWait(ctx, openReq(room, 300))
			if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				t.Errorf("OpenAndWait(%d) = %v, %v; want SUCCEEDED over the unary API", room, r, err)
			}
		})
		wg.Go(func() {
			if _, err := p.SendRoom(ctx, room, client.SendOptions{}); err != nil {
				t.Errorf("SendRoom(%d): %v", room, err)
			}
		})
	}
	wg.Wait()
	tried := in.count(pb.EngineSession_Session_FullMethodName)
	if tried == 0 || tried > 8 {
		t.Errorf("%d engine sessions tried, want at least one and at most one per early call", tried)
	}
	if n := in.count(pb.Rooms_OpenRoom_FullMethodName); n != 8 {
		t.Errorf("%d OpenRoom calls, want 8 (one per room, the unary path)", n)
	}
	// A later call goes straight to the unary path.
	if _, err := c.Engine().OpenRoom(ctx, openReq(49, 300)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := c.Engine().OpenAndWait(ctx, openReq(50, 300)); done <- err }()
	if _, err := p.SendRoom(ctx, 50, client.SendOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("OpenAndWait(50): %v", err)
	}
	if n := in.count(pb.EngineSession_Session_FullMethodName); n != tried {
		t.Errorf("%d engine sessions tried after the fallback, want none more than %d", n, tried)
	}
	for room := uint64(41); room <= 48; room++ {
		if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
			t.Errorf("ReleaseRoom(%d): %v", room, err)
		}
	}
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 50}); err != nil {
		t.Error(err)
	}
	if _, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 49}); err != nil {
		t.Error(err)
	}
	if n := in.count(pb.Rooms_ReleaseRoom_FullMethodName); n != 9 {
		t.Errorf("%d ReleaseRoom calls, want 9 (unary)", n)
	}
	assertPoolFull(t, c)
}
