package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// The engine session's protocol, seen from a raw stream: what the daemon
// does with a client that breaks it or has no token.

// rawSession opens the stream with the generated client.
func rawSession(t *testing.T, d *daemon, opts ...grpc.DialOption) pb.EngineSession_SessionClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), d.dialer()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	st, err := pb.NewEngineSessionClient(conn).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// heldEvents keeps, per raw stream, the events of a message read but not
// yet looked at (a message carries its own event, then those packed in its
// more).
var heldEvents sync.Map // pb.EngineSession_SessionClient -> []*pb.EngineEvent

// recvEvent returns st's next event: the rest of the last message read, or
// the first of the next one.
func recvEvent(st pb.EngineSession_SessionClient) (*pb.EngineEvent, error) {
	held, _ := heldEvents.Load(st)
	evs, _ := held.([]*pb.EngineEvent)
	if len(evs) == 0 {
		ev, err := st.Recv()
		if err != nil {
			return nil, err
		}
		evs = append([]*pb.EngineEvent{ev}, ev.GetMore()...)
	}
	heldEvents.Store(st, evs[1:])
	return evs[0], nil
}

// recvReply reads st until the reply of seq (room events skipped).
func recvReply(t *testing.T, st pb.EngineSession_SessionClient, seq uint64) *pb.EngineReply {
	t.Helper()
	for {
		ev, err := recvEvent(st)
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if r := ev.GetReply(); r != nil {
			if r.GetSeq() != seq {
				t.Fatalf("reply seq %d, want %d", r.GetSeq(), seq)
			}
			return r
		}
	}
}

// recvEnd reads st until it ends and returns its status.
func recvEnd(st pb.EngineSession_SessionClient) error {
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

// TestEngineSessionProtocolViolation: a seq that does not increase, or a
// request without an op, ends the stream with INVALID_ARGUMENT naming it.
func TestEngineSessionProtocolViolation(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	open := &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{openReq(801, 10)}}}
	for _, tc := range []struct {
		name   string
		second *pb.EngineRequest
		field  string
	}{
		{"seq not increasing", &pb.EngineRequest{Seq: 5, Op: open}, "seq: 5 is not above"},
		{"seq 0", &pb.EngineRequest{Seq: 0, Op: open}, "seq: must be > 0"},
		{"no op", &pb.EngineRequest{Seq: 9}, "op: is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := rawSession(t, d)
			abort := &pb.EngineRequest_Abort{Abort: &pb.AbortRoomRequest{Room: 1}}
			if err := st.Send(&pb.EngineRequest{Seq: 5, Op: abort}); err != nil {
				t.Fatal(err)
			}
			if r := recvReply(t, st, 5); codes.Code(r.GetResults()[0].GetCode()) != codes.NotFound {
				t.Fatalf("first reply = %v, want NOT_FOUND for the unknown room", r)
			}
			if err := st.Send(tc.second); err != nil {
				t.Fatal(err)
			}
			err := recvEnd(st)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Errorf("stream ended with %v, want INVALID_ARGUMENT %q", err, tc.field)
			}
		})
	}
}

// TestEngineSessionNeedsToken: with a token configured the stream needs it,
// as the mutating unary calls do.
func TestEngineSessionNeedsToken(t *testing.T) {
	d := newDaemon(t, daemonConfig{server: func(c *server.Config) { c.AuthToken = "tok" }})
	ctx := ctxT(t)
	s := session(t, d.client(t))
	if _, err := s.Open(ctx, openReq(811, 10)); !errors.Is(err, client.ErrUnauthenticated) {
		t.Errorf("Open without the token = %v, want ErrUnauthenticated", err)
	}
	if _, err := d.client(t).Engine().OpenRoom(ctx, openReq(811, 10)); !errors.Is(err, client.ErrUnauthenticated) {
		t.Errorf("OpenRoom without the token = %v, want ErrUnauthenticated", err)
	}
	s = session(t, d.client(t, client.WithToken("tok")))
	if res, err := s.Open(ctx, openReq(811, 10)); err != nil || res[0].Err != nil {
		t.Errorf("Open with the token = %+v, %v", res, err)
	}
}
