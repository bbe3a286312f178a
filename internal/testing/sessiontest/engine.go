// Package sessiontest drives the daemon's two multiplexed sessions,
// EngineSession and PrefillSession, on the wire, one op at a time, for the
// tests that check what the daemon does with rooms carried on them (the
// transport parity suite of cmd/decodeplane, decodectl's view of such
// rooms). The Go client rides these sessions itself (OpenAndWait, SendRoom,
// ReportRoom, RunHeartbeat) and does not expose them; these tests need the
// single ops.
//
// A refused op is a gRPC status error with the daemon's code and message
// (field names prefixed with the op's path, "open.rooms[0].prompt_len", as
// the daemon sends them); the end of a stream is its status, or io.EOF
// after an OK end. Requests are sent one per message (no packing is asked
// for or offered). Only tests import it.
package sessiontest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// roomEvents bounds the room events an Engine holds that Next has not
// returned: a reader that falls further behind stalls the stream (and is
// eventually cut by the daemon as a slow consumer).
const roomEvents = 4096

// Engine is a decode engine's EngineSession stream. Its ops may be called
// from any goroutine; Next from one, and it must be read for the stream to
// go on.
type Engine struct {
	st     pb.EngineSession_SessionClient
	cancel context.CancelFunc

	sendMu sync.Mutex // orders the writes by seq
	seq    uint64     // under sendMu

	mu      sync.Mutex
	pending map[uint64]chan *pb.EngineReply
	err     error         // the stream's end
	done    chan struct{} // closed at the stream's end
	events  chan *pb.EngineRoomEvent
}

// OpenEngine opens an EngineSession on conn. opts are the call's (a token:
// grpc.PerRPCCredentials). ctx bounds the stream; Close ends it.
func OpenEngine(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) (*Engine, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := pb.NewEngineSessionClient(conn).Session(sctx, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	e := &Engine{st: st, cancel: cancel, pending: map[uint64]chan *pb.EngineReply{},
		done: make(chan struct{}), events: make(chan *pb.EngineRoomEvent, roomEvents)}
	go e.read()
	return e, nil
}

// read hands each reply to its op and each room event to Next until the
// stream ends.
func (e *Engine) read() {
	defer close(e.events)
	for {
		ev, err := e.st.Recv()
		if err != nil {
			e.mu.Lock()
			e.err = err
			e.mu.Unlock()
			close(e.done)
			return
		}
		switch x := ev.GetEvent().(type) {
		case *pb.EngineEvent_Reply:
			e.mu.Lock()
			ch := e.pending[x.Reply.GetSeq()]
			delete(e.pending, x.Reply.GetSeq())
			e.mu.Unlock()
			if ch != nil {
				ch <- x.Reply
			}
		case *pb.EngineEvent_Room:
			e.events <- x.Room
		}
	}
}

// Next returns the next event of a room the stream subscribed; after the
// stream's end, io.EOF (an OK end) or its status.
func (e *Engine) Next() (*pb.EngineRoomEvent, error) {
	if ev, ok := <-e.events; ok {
		return ev, nil
	}
	return nil, e.end()
}

// end is the stream's end.
func (e *Engine) end() error {
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// Close ends the stream and waits for its reader.
func (e *Engine) Close() {
	e.cancel()
	for range e.events { //nolint:revive // drain so that read returns
	}
	<-e.done
}

// Open opens one room and subscribes every event of it (EngineOpen of one
// room); its answer is OpenRoom's.
func (e *Engine) Open(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	r, err := e.one(ctx, &pb.EngineRequest{Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: []*pb.OpenRoomRequest{req}}}})
	return r.GetOpen(), err
}

// Release is ReleaseRoom on the stream.
func (e *Engine) Release(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	r, err := e.one(ctx, &pb.EngineRequest{Op: &pb.EngineRequest_Release{Release: req}})
	return r.GetRelease(), err
}

// Abort is AbortRoom on the stream.
func (e *Engine) Abort(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	r, err := e.one(ctx, &pb.EngineRequest{Op: &pb.EngineRequest_Abort{Abort: req}})
	return r.GetAbort(), err
}

// Watch subscribes a room the stream did not open, from the event after
// seq after (0: its whole timeline).
func (e *Engine) Watch(ctx context.Context, room uint64, after uint32) error {
	_, err := e.one(ctx, &pb.EngineRequest{Op: &pb.EngineRequest_Watch{Watch: &pb.EngineWatch{
		Rooms: []*pb.EngineWatchRoom{{Room: room, After: after}}}}})
	return err
}

// one sends an op about one room and returns that room's result, or its
// refusal (or the op's, or the stream's end) as an error.
func (e *Engine) one(ctx context.Context, req *pb.EngineRequest) (*pb.EngineResult, error) {
	reply, err := e.do(ctx, req)
	if err != nil {
		return nil, err
	}
	if c := codes.Code(reply.GetCode()); c != codes.OK {
		return nil, status.Error(c, reply.GetMessage())
	}
	if n := len(reply.GetResults()); n != 1 {
		return nil, fmt.Errorf("the daemon answered %d results for one room", n)
	}
	r := reply.GetResults()[0]
	if c := codes.Code(r.GetCode()); c != codes.OK {
		return r, status.Error(c, r.GetMessage())
	}
	return r, nil
}

// do sends an op, with ctx's trace context, and waits for its reply.
func (e *Engine) do(ctx context.Context, req *pb.EngineRequest) (*pb.EngineReply, error) {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	req.Traceparent = carrier.Get("traceparent")
	ch := make(chan *pb.EngineReply, 1)
	e.sendMu.Lock()
	e.mu.Lock()
	if e.err != nil {
		e.mu.Unlock()
		e.sendMu.Unlock()
		return nil, ended(e.err)
	}
	e.seq++
	req.Seq = e.seq
	e.pending[req.Seq] = ch
	e.mu.Unlock()
	_ = e.st.Send(req) // a failed send: read gets the stream's status
	e.sendMu.Unlock()
	select {
	case r := <-ch:
		return r, nil
	case <-e.done:
		select {
		case r := <-ch: // answered before the end
			return r, nil
		default:
			return nil, ended(e.end())
		}
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// ended is an op's error once its stream ended with err.
func ended(err error) error {
	if errors.Is(err, io.EOF) {
		return status.Error(codes.FailedPrecondition, "the session ended")
	}
	return err
}

// WithToken sends "authorization: Bearer <token>" with a session, as the Go
// client's WithToken does (in clear text on an insecure connection too).
func WithToken(token string) grpc.CallOption {
	return grpc.PerRPCCredentials(bearer(token))
}

// bearer is WithToken's credential.
type bearer string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (bearer) RequireTransportSecurity() bool { return false }
