package session_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/internal/config"
	daemonpkg "github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/internal/session"
)

// gatedStream holds every message a stream sends until gate is closed.
type gatedStream struct {
	grpc.ServerStream
	gate <-chan struct{}
}

func (s gatedStream) SendMsg(m any) error {
	<-s.gate
	return s.ServerStream.SendMsg(m)
}

// TestEngineSessionResumeBeyondTheQueueBound: a Watch resuming more
// missed events than the slow-consumer bound (2,112 rooms, each with two
// events to re-deliver: 4,224, and the Watch's reply) is not cut: its
// replay is queued whole while nothing can be written (the stream's sends
// are held), then written, every event once.
func TestEngineSessionResumeBeyondTheQueueBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	gate := make(chan struct{})
	d := daemontest.Start(t, daemontest.Options{
		Config: func(c *config.Config) { c.Timeouts.Bootstrap = 10 * time.Minute },
		Daemon: daemonpkg.Options{StreamInterceptors: []grpc.StreamServerInterceptor{
			func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if info.FullMethod == pb.EngineSession_Session_FullMethodName {
					ss = gatedStream{ServerStream: ss, gate: gate}
				}
				return h(srv, ss)
			}}},
	})
	conn := d.Conn(t)
	rooms := pb.NewRoomsClient(conn)
	const n = pb.MaxEngineSessionQueue/2 + 64 // rooms, with 2 events each: beyond the bound
	w := &pb.EngineWatch{}
	for i := range uint64(n) {
		room := 20000 + i
		// No prefill registers; aborted, each room has two events: its
		// opening and its failure.
		if _, err := rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint("r", room), Room: room, BootstrapAddr: "p9:1", PromptLen: 10, MaxNewTokens: 1}); err != nil {
			t.Fatalf("OpenRoom(%d): %v", room, err)
		}
		if _, err := rooms.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatalf("AbortRoom(%d): %v", room, err)
		}
		w.Rooms = append(w.Rooms, &pb.EngineWatchRoom{Room: room})
	}
	queued := make(chan int, 1)
	defer session.SetReplayQueuedHook(func(q int) {
		select {
		case queued <- q:
		default:
		}
	})()
	st, err := pb.NewEngineSessionClient(conn).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.EngineRequest{Seq: 1, Op: &pb.EngineRequest_Watch{Watch: w}}); err != nil {
		t.Fatal(err)
	}
	select {
	case q := <-queued:
		if q <= pb.MaxEngineSessionQueue {
			t.Fatalf("%d messages queued once the replay was, want more than the bound %d (the test's premise)", q, pb.MaxEngineSessionQueue)
		}
	case <-ctx.Done():
		t.Fatal("the Watch's replay was never queued")
	}
	close(gate)
	seen := map[uint64][]uint32{}
	events, replied := 0, false
	for events < 2*n || !replied {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d events (reply %v): %v, want the whole replay", events, replied, err)
		}
		for _, e := range append([]*pb.EngineEvent{ev}, ev.GetMore()...) {
			if r := e.GetReply(); r != nil {
				if r.GetCode() != 0 || len(r.GetResults()) != n {
					t.Fatalf("reply = code %d, %d results", r.GetCode(), len(r.GetResults()))
				}
				replied = true
			}
			if re := e.GetRoom(); re != nil {
				seqs := seen[re.GetRoom()]
				if re.GetSeq() != uint32(len(seqs)+1) {
					t.Fatalf("room %d: event seq %d after %v, want 1 then 2, once each", re.GetRoom(), re.GetSeq(), seqs)
				}
				seen[re.GetRoom()] = append(seqs, re.GetSeq())
				events++
			}
		}
	}
	if err := st.CloseSend(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(fmt.Errorf("CloseSend: %w", err))
	}
}
