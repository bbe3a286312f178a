package client_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestEngineSessionPackingIsNegotiated: the daemon's header says it reads
// packed requests; it packs its replies only for a client whose metadata
// asks for it (pb.PackKey), so a client that ignores EngineEvent.more —
// one written before packing, or from the proto without reading it —
// loses nothing.
func TestEngineSessionPackingIsNegotiated(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()), d.dialer())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const messages = 20
	// burst sends messages × 65 aborts, packed (the daemon reads more
	// whatever the client asked), and reads their replies: in order, each
	// NOT_FOUND; it returns how many messages carried them.
	burst := func(t *testing.T, ctx context.Context) int {
		st, err := pb.NewEngineSessionClient(conn).Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		md, err := st.Header()
		if err != nil || !slices.Contains(md.Get(pb.PackKey), pb.PackMore) {
			t.Errorf("response header %v (%v), want %s: %s", md, err, pb.PackKey, pb.PackMore)
		}
		seq := uint64(0)
		abort := func() *pb.EngineRequest {
			seq++
			return &pb.EngineRequest{Seq: seq, Op: &pb.EngineRequest_Abort{Abort: &pb.AbortRoomRequest{Room: seq}}}
		}
		for range messages {
			m := abort()
			for range pb.MaxEngineRequestsPerMessage {
				m.More = append(m.More, abort())
			}
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		got, n := uint64(0), 0
		for got < seq {
			ev, err := st.Recv()
			if err != nil {
				t.Fatalf("Recv after %d replies: %v", got, err)
			}
			n++
			for _, e := range append([]*pb.EngineEvent{ev}, ev.GetMore()...) {
				got++
				if r := e.GetReply(); r.GetSeq() != got || len(r.GetResults()) != 1 || r.GetResults()[0].GetCode() != 5 {
					t.Fatalf("event %d = %v, want the reply NOT_FOUND of seq %d", got, e, got)
				}
			}
		}
		return n
	}
	replies := messages * (1 + pb.MaxEngineRequestsPerMessage)
	t.Run("not asked", func(t *testing.T) {
		if n := burst(t, ctxT(t)); n != replies {
			t.Errorf("%d replies came in %d messages, want one each (the client did not ask for packing)", replies, n)
		}
	})
	t.Run("asked", func(t *testing.T) {
		// 1,300 replies queued by a tight loop while the sender writes:
		// some share a message.
		if n := burst(t, metadata.AppendToOutgoingContext(ctxT(t), pb.PackKey, pb.PackMore)); n >= replies {
			t.Errorf("%d replies came in %d messages, want fewer (packed)", replies, n)
		}
	})
	t.Run("Go client", func(t *testing.T) {
		c := d.client(t)
		if s := session(t, c); !client.EngineSessionPacks(s) {
			t.Error("the Go client's engine session does not pack toward a daemon that reads packed requests")
		}
		ps, err := client.OpenSession(ctxT(t), registered(t, c))
		if err != nil {
			t.Fatal(err)
		}
		defer ps.Close()
		if !client.SessionPacks(ps) {
			t.Error("the Go client's prefill session does not pack toward a daemon that reads packed requests")
		}
	})
}

// fakeDaemon serves what register registers on a bufconn gRPC server (a
// peer that misbehaves in a way the daemon cannot be made to) and returns
// a Client of it; both are closed at cleanup.
func fakeDaemon(t *testing.T, register func(*grpc.Server), opts ...grpc.ServerOption) *client.Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///fake", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := client.NewFromConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// oldDaemon serves both sessions as a daemon from before packing did: no
// header until its first message, and every request's more dropped unread
// (counted: the client must never send one).
type oldDaemon struct {
	pb.UnimplementedEngineSessionServer
	pb.UnimplementedPrefillSessionServer
	packed atomic.Int64
}

func (o *oldDaemon) Session(st grpc.BidiStreamingServer[pb.EngineRequest, pb.EngineEvent]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if len(m.GetMore()) > 0 {
			o.packed.Add(1)
		}
		r := &pb.EngineResult{Room: m.GetAbort().GetRoom(), Answer: &pb.EngineResult_Abort{Abort: &pb.AbortRoomResponse{}}}
		if err := st.Send(&pb.EngineEvent{Event: &pb.EngineEvent_Reply{Reply: &pb.EngineReply{Seq: m.GetSeq(), Results: []*pb.EngineResult{r}}}}); err != nil {
			return err
		}
	}
}

type oldPrefillDaemon struct{ *oldDaemon }

func (o oldPrefillDaemon) Session(st grpc.BidiStreamingServer[pb.PrefillRequest, pb.PrefillEvent]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if len(m.GetMore()) > 0 {
			o.packed.Add(1)
		}
		ev := &pb.PrefillEvent{Event: &pb.PrefillEvent_Result{Result: &pb.PrefillResult{Seq: m.GetSeq(), Result: &pb.PrefillResult_Ack{Ack: &pb.AckRoomEndResponse{}}}}}
		if m.GetHello() != nil {
			ev = &pb.PrefillEvent{Event: &pb.PrefillEvent_Welcome{Welcome: &pb.PrefillWelcome{Incarnation: 7}}}
		}
		if err := st.Send(ev); err != nil {
			return err
		}
	}
}

// TestSessionsDoNotPackTowardAnOldDaemon: toward a daemon whose header does
// not say it reads packed requests, the Go client's sessions send one op
// per message, however many ops wait: none is dropped.
func TestSessionsDoNotPackTowardAnOldDaemon(t *testing.T) {
	old := &oldDaemon{}
	c := fakeDaemon(t, func(srv *grpc.Server) {
		pb.RegisterEngineSessionServer(srv, old)
		pb.RegisterPrefillSessionServer(srv, oldPrefillDaemon{old})
	})
	ctx := ctxT(t)
	es, err := client.OpenEngineSession(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	ps, err := client.OpenSession(ctx, c.Prefill(prefillRank(addr, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := range 20 {
				room := uint64(1 + i*20 + j)
				if _, err := es.Abort(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
					t.Errorf("Abort(%d): %v", room, err)
				}
				if _, err := ps.Ack(ctx, &pb.AckRoomEndRequest{Room: room}); err != nil {
					t.Errorf("Ack(%d): %v", room, err)
				}
			}
		})
	}
	wg.Wait()
	if n := old.packed.Load(); n != 0 {
		t.Errorf("%d packed messages sent to a daemon that did not say it reads them", n)
	}
	if client.EngineSessionPacks(es) || client.SessionPacks(ps) {
		t.Error("a session packs toward a daemon that did not say it reads packed requests")
	}
}

// stalledDaemon accepts an engine session and never reads from it: the
// client's writes stall once the stream's flow-control window is full.
type stalledDaemon struct {
	pb.UnimplementedEngineSessionServer
}

func (stalledDaemon) Session(st grpc.BidiStreamingServer[pb.EngineRequest, pb.EngineEvent]) error {
	<-st.Context().Done()
	return nil
}

// TestEngineSessionOpsReturnWhileTheStreamStalls: toward a daemon that
// stopped reading, every op returns when its context ends, the one whose
// push started the write included (none waits in a write it does for the
// others).
func TestEngineSessionOpsReturnWhileTheStreamStalls(t *testing.T) {
	// A fixed 64 KiB window (no BDP growth): the stall comes after ~64 KiB.
	c := fakeDaemon(t, func(srv *grpc.Server) { pb.RegisterEngineSessionServer(srv, stalledDaemon{}) },
		grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	watchdog := ctxT(t)
	// The stream's own context: the watchdog's end must not unstall it.
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	es, err := client.OpenEngineSession(sctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	reason := string(make([]byte, 1000)) // ~1 KiB per op: 1,000 ops are ~16 windows
	var wg sync.WaitGroup
	var expired atomic.Int64
	for range 50 {
		wg.Go(func() {
			for range 20 {
				ctx, cancel := context.WithTimeout(watchdog, 50*time.Millisecond)
				_, err := es.Abort(ctx, &pb.AbortRoomRequest{Room: 1, Reason: reason})
				cancel()
				if errors.Is(err, client.ErrDeadlineExceeded) {
					expired.Add(1)
				} else {
					t.Errorf("Abort toward a stalled daemon: %v, want deadline exceeded", err)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-watchdog.Done():
		scancel()
		t.Fatalf("ops still blocked after the test's timeout (%d of 1000 had returned): one waits in a stalled write", expired.Load())
	}
}
