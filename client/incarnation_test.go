package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	daemonpkg "github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// recorder records the requests a daemon receives, by method (a test
// interceptor: it sees every request, refused ones included).
type recorder struct {
	mu   sync.Mutex
	reqs map[string][]any
	// registered is signalled on every RegisterPrefill.
	registered chan struct{}
}

func newRecorder() *recorder {
	return &recorder{reqs: map[string][]any{}, registered: make(chan struct{}, 16)}
}

func (r *recorder) add(method string, req any) {
	r.mu.Lock()
	r.reqs[method] = append(r.reqs[method], req)
	r.mu.Unlock()
	if method == pb.Bootstrap_RegisterPrefill_FullMethodName {
		select {
		case r.registered <- struct{}{}:
		default:
		}
	}
}

func (r *recorder) count(method string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs[method])
}

func (r *recorder) first(method string) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs[method]) == 0 {
		return nil
	}
	return r.reqs[method][0]
}

func (r *recorder) options() daemonpkg.Options {
	return daemonpkg.Options{
		UnaryInterceptors: []grpc.UnaryServerInterceptor{func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			r.add(info.FullMethod, req)
			return h(ctx, req)
		}},
		StreamInterceptors: []grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			r.add(info.FullMethod, nil)
			if info.FullMethod == pb.PrefillSession_Session_FullMethodName {
				ss = &sessionRecorder{ServerStream: ss, record: func(m string, body proto.Message) *fault { r.add(m, body); return nil }}
			}
			return h(srv, ss)
		}},
	}
}

// destinationMethods are the RPCs that name a destination.
var destinationMethods = []string{pb.Rooms_AwaitDestination_FullMethodName, pb.Rooms_Transfer_FullMethodName,
	pb.Rooms_ReportTransfer_FullMethodName, pb.Staging_AllocateStaging_FullMethodName, pb.Staging_ChunkReady_FullMethodName}

// restartable is a daemon on a loopback TCP address that a test stops and
// starts again on the same address (a daemon restart: a new incarnation).
type restartable struct {
	t    *testing.T
	addr string
	cur  *daemontest.Daemon
}

func startRestartable(t *testing.T) *restartable {
	t.Helper()
	d, err := daemontest.New(daemontest.Options{TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	r := &restartable{t: t, addr: d.Addr, cur: d}
	t.Cleanup(func() {
		if r.cur != nil {
			if err := r.cur.Stop(); err != nil {
				t.Errorf("daemon stop: %v", err)
			}
		}
	})
	return r
}

// restart stops the daemon and starts a new one on the same address, with
// rec's interceptors.
func (r *restartable) restart(rec *recorder) {
	r.t.Helper()
	if err := r.cur.Stop(); err != nil {
		r.t.Fatalf("daemon stop: %v", err)
	}
	r.cur = nil
	d, err := daemontest.New(daemontest.Options{TCP: true, Config: func(c *config.Config) { c.Server.Listen = r.addr }, Daemon: rec.options()})
	if err != nil {
		r.t.Fatalf("restart on %s: %v", r.addr, err)
	}
	r.cur = d
}

// fastClient is a client whose connection comes back quickly after the
// daemon restarted.
func fastClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, append([]client.Option{client.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitConnected waits (on connectivity events) until the client's
// connection is ready again.
func waitConnected(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	conn := c.Conn()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("connection not ready again: %v", ctx.Err())
		}
		conn.Connect()
	}
}

// TestPrefillStopsOnDaemonRestart: a prefill mid-hand-off whose daemon
// restarts on the same address learns the new incarnation (from its
// registration, or from the new daemon's refusal) and stops the hand-off
// with ErrIncarnationChanged, sending nothing more for the old destination.
//
// Under TransportStreams the hand-off's session ends with the old daemon;
// its re-open names the old incarnation and the new daemon refuses it
// (STALE_INCARNATION): the hand-off learns the change there, and no op
// about the old destination reaches the new daemon at all.
func TestPrefillStopsOnDaemonRestart(t *testing.T) { eachTransport(t, testPrefillStopsOnDaemonRestart) }

func testPrefillStopsOnDaemonRestart(t *testing.T, tr client.Transport) {
	for _, tc := range []struct {
		name string
		// report: ReportRoom (the prefill writes by itself), else SendRoom.
		report bool
		// register: the prefill re-registers before the blocked chunk
		// resumes; else it learns the change from the refusal.
		register bool
	}{
		{"ReportRoom, learned by Register", true, true},
		{"SendRoom, learned by Register", false, true},
		{"SendRoom, learned from the refusal", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			r := startRestartable(t)
			oldInc := r.cur.Incarnation()
			c := fastClient(t, r.addr, client.WithTransport(tr))
			changes := make(chan [2]uint64, 4)
			p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond), client.OnIncarnationChange(func(o, n uint64) { changes <- [2]uint64{o, n} }))
			if _, err := p.Register(ctx); err != nil {
				t.Fatal(err)
			}
			if p.Incarnation() != oldInc {
				t.Fatalf("Prefill.Incarnation() = %x after Register, want the daemon's %x", p.Incarnation(), oldInc)
			}
			if _, err := c.Engine().OpenRoom(ctx, openReq(5, 1000)); err != nil { // 16 pages
				t.Fatal(err)
			}

			// Chunk 1 of 4 blocks in the prefill's own code (Move, or
			// Source before the Transfer) until the test releases it.
			blocked, release := make(chan struct{}), make(chan struct{})
			var moves []int
			hold := func(ch client.Chunk) {
				moves = append(moves, ch.Index)
				if ch.Index == 1 {
					close(blocked)
					<-release
				}
			}
			o := client.SendOptions{ChunkPages: 4}
			if tc.report {
				o.Move = func(_ context.Context, ch client.Chunk) (uint64, error) { hold(ch); return ch.Bytes(), nil }
			} else {
				o.Source = func(ch client.Chunk) *pb.TransferSource { hold(ch); return nil }
			}
			done := make(chan error, 1)
			go func() {
				var err error
				if tc.report {
					_, err = p.ReportRoom(ctx, 5, o)
				} else {
					_, err = p.SendRoom(ctx, 5, o)
				}
				done <- err
			}()
			<-blocked

			rec := newRecorder()
			r.restart(rec)
			newInc := r.cur.Incarnation()
			if newInc == oldInc {
				t.Fatalf("the restarted daemon has the same incarnation %x", newInc)
			}
			waitConnected(t, ctx, c)
			if tc.register {
				resp, err := p.Register(ctx)
				if err != nil || resp.GetIncarnation() != newInc {
					t.Fatalf("Register at the new daemon = %v, %v; want incarnation %x", resp, err, newInc)
				}
				select {
				case got := <-changes:
					if got != [2]uint64{oldInc, newInc} {
						t.Errorf("OnIncarnationChange(%x, %x), want (%x, %x)", got[0], got[1], oldInc, newInc)
					}
				default:
					t.Errorf("Register learned a new incarnation without calling OnIncarnationChange")
				}
			}
			close(release)
			err := <-done

			var ic *client.IncarnationChangedError
			if !errors.Is(err, client.ErrIncarnationChanged) || !errors.As(err, &ic) {
				t.Fatalf("hand-off after the restart = %v; want ErrIncarnationChanged", err)
			}
			if ic.Room != 5 || ic.Old != oldInc || ic.New != newInc {
				t.Errorf("IncarnationChangedError{Room %d, Old %x, New %x}; want {5, %x, %x}", ic.Room, ic.Old, ic.New, oldInc, newInc)
			}
			if len(moves) != 2 {
				t.Errorf("chunks moved: %v; want 0 and 1 (nothing after the change)", moves)
			}
			// What the new daemon received about the old destination.
			wantRefused := 0
			if !tc.register && tr == client.TransportStreams {
				// The refusal is the re-opened session's hello: it
				// carries the daemon's STALE_INCARNATION.
				if named, daemonInc, ok := client.StaleIncarnation(err); ok && (named != oldInc || daemonInc != newInc) {
					t.Errorf("StaleIncarnation(%v) = %x, %x; want %x, %x", err, named, daemonInc, oldInc, newInc)
				}
				for _, op := range []string{"claim", "chunk", "report", "ack"} {
					if n := rec.count(sessionOp(op)); n != 0 {
						t.Errorf("the new daemon received %d session %s ops; want none", n, op)
					}
				}
			}
			if !tc.register && tr == client.TransportUnary {
				// The prefill learned it from the refusal of its one
				// Transfer, which changed nothing.
				wantRefused = 1
				var stale *client.Error
				if !errors.As(err, &stale) {
					t.Errorf("the change learned from a refusal does not carry it: %v", err)
				} else if named, daemonInc, ok := client.StaleIncarnation(stale); !ok || named != oldInc || daemonInc != newInc {
					t.Errorf("StaleIncarnation(%v) = %x, %x, %v; want %x, %x, true", stale, named, daemonInc, ok, oldInc, newInc)
				}
			}
			for _, m := range destinationMethods {
				want := 0
				if m == pb.Rooms_Transfer_FullMethodName {
					want = wantRefused
				}
				if got := rec.count(m); got != want {
					t.Errorf("the new daemon received %d %s requests; want %d", got, m, want)
				}
			}
			if !tc.register {
				if req, _ := rec.first(pb.Rooms_Transfer_FullMethodName).(*pb.TransferRequest); wantRefused == 1 && (req.GetIncarnation() != oldInc || req.GetChunkIndex() != 1) {
					t.Errorf("the refused Transfer = %v; want chunk 1 naming incarnation %x", req, oldInc)
				}
				// Learned elsewhere than by Register: the next beat
				// registers again with the new daemon.
				hctx, cancel := context.WithCancel(ctx)
				beat := make(chan error, 1)
				before := rec.count(pb.Bootstrap_RegisterPrefill_FullMethodName)
				go func() { beat <- p.RunHeartbeat(hctx) }()
				<-rec.registered
				cancel()
				<-beat
				if rec.count(pb.Bootstrap_RegisterPrefill_FullMethodName) <= before || rec.count(pb.Bootstrap_Heartbeat_FullMethodName) != 0 {
					t.Errorf("after a change learned from a refusal the heartbeat sent %d registrations and %d heartbeats; want a registration first",
						rec.count(pb.Bootstrap_RegisterPrefill_FullMethodName)-before, rec.count(pb.Bootstrap_Heartbeat_FullMethodName))
				}
			}
			if p.Incarnation() != newInc {
				t.Errorf("Prefill.Incarnation() = %x, want %x", p.Incarnation(), newInc)
			}
		})
	}
}

// TestDestinationStreamOfAnotherIncarnation: a claim naming an earlier
// incarnation ends with ErrIncarnationChanged (the daemon's refusal), one
// naming the daemon's gets the destination.
func TestDestinationStreamOfAnotherIncarnation(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.Engine().OpenRoom(ctx, openReq(9, 100)); err != nil {
		t.Fatal(err)
	}
	own := d.Incarnation()
	s, err := p.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 9, Incarnation: own + 1})
	if err == nil {
		_, err = s.Next()
		s.Close()
	}
	var ic *client.IncarnationChangedError
	if !errors.As(err, &ic) || !errors.Is(err, client.ErrIncarnationChanged) || ic.Room != 9 || ic.Old != own+1 || ic.New != own {
		t.Fatalf("claim naming incarnation %x = %v; want IncarnationChangedError{9, %x, %x}", own+1, err, own+1, own)
	}
	s, err = p.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 9, Incarnation: own})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Destination.GetIncarnation() != own {
		t.Fatalf("claim naming the daemon's incarnation = %v, %v; want a destination of %x", ev, err, own)
	}
}

// TestHeartbeatLearnsIncarnation: a heartbeat answered OK by a restarted
// daemon (another caller registered the rank there) carries the new
// incarnation; the Prefill learns it, calls OnIncarnationChange and
// registers again on its next beat.
//
// (Unary beats: a session to the new daemon is refused by its incarnation
// instead, TestRunHeartbeatStreams.)
func TestHeartbeatLearnsIncarnation(t *testing.T) {
	ctx := ctxT(t)
	r := startRestartable(t)
	oldInc := r.cur.Incarnation()
	c := fastClient(t, r.addr, client.WithTransport(client.TransportUnary))
	changes := make(chan [2]uint64, 4)
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond),
		client.OnIncarnationChange(func(o, n uint64) { changes <- [2]uint64{o, n} }))
	if _, err := p.Register(ctx); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	r.restart(rec)
	newInc := r.cur.Incarnation()
	waitConnected(t, ctx, c)
	// Another Prefill of the same rank registers with the new daemon.
	if _, err := c.Prefill(prefillRank(addr, 1, 0)).Register(ctx); err != nil {
		t.Fatal(err)
	}
	<-rec.registered
	hctx, cancel := context.WithCancel(ctx)
	beat := make(chan error, 1)
	go func() { beat <- p.RunHeartbeat(hctx) }()
	select {
	case got := <-changes:
		if got != [2]uint64{oldInc, newInc} {
			t.Errorf("OnIncarnationChange(%x, %x), want (%x, %x)", got[0], got[1], oldInc, newInc)
		}
	case <-ctx.Done():
		t.Fatal("the heartbeat never learned the new incarnation")
	}
	<-rec.registered // the next beat registers again
	cancel()
	<-beat
	if rec.count(pb.Bootstrap_Heartbeat_FullMethodName) == 0 || rec.count(pb.Bootstrap_RegisterPrefill_FullMethodName) < 2 {
		t.Errorf("heartbeats %d, registrations %d at the new daemon; want a heartbeat, then a registration of its own",
			rec.count(pb.Bootstrap_Heartbeat_FullMethodName), rec.count(pb.Bootstrap_RegisterPrefill_FullMethodName))
	}
	// (The registration's answer may have been cut by the cancel: the
	// incarnation came from the heartbeat.)
	if p.Incarnation() != newInc {
		t.Errorf("Prefill holds %x; want %x", p.Incarnation(), newInc)
	}
}
