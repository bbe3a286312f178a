package bench

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"

	benchv1 "github.com/decodeplane/decodeplane/proto/decodeplane/bench/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The RPCs the bench counts, per method: calls (every attempt of a unary
// call, every stream opened) and the messages received on streams.
const (
	benchOpenRoom = iota
	benchWatchRoom
	benchAwaitDestination
	benchTransfer
	benchReleaseRoom
	benchGetRoom
	benchAbortRoom
	benchDeclareDestination
	benchRegisterPrefill
	benchHeartbeat
	benchGetStatus
	benchBareUnary
	benchBareStream
	benchEngineSessionMethod
	benchPrefillSessionMethod
	benchBareSession
	benchOtherMethod
	benchNumMethods
)

var benchMethodNames = [benchNumMethods]string{
	"OpenRoom", "WatchRoom", "AwaitDestination", "Transfer", "ReleaseRoom", "GetRoom", "AbortRoom", "DeclareDestination",
	"RegisterPrefill", "Heartbeat", "GetStatus", "Bench/Unary", "Bench/Stream",
	"EngineSession", "PrefillSession", "Bench/Session", "other",
}

var benchMethodIndex = map[string]int{
	pb.Rooms_OpenRoom_FullMethodName:            benchOpenRoom,
	pb.Rooms_WatchRoom_FullMethodName:           benchWatchRoom,
	pb.Rooms_AwaitDestination_FullMethodName:    benchAwaitDestination,
	pb.Rooms_Transfer_FullMethodName:            benchTransfer,
	pb.Rooms_ReleaseRoom_FullMethodName:         benchReleaseRoom,
	pb.Rooms_GetRoom_FullMethodName:             benchGetRoom,
	pb.Rooms_AbortRoom_FullMethodName:           benchAbortRoom,
	pb.Rooms_DeclareDestination_FullMethodName:  benchDeclareDestination,
	pb.Bootstrap_RegisterPrefill_FullMethodName: benchRegisterPrefill,
	pb.Bootstrap_Heartbeat_FullMethodName:       benchHeartbeat,
	pb.Admin_GetStatus_FullMethodName:           benchGetStatus,
	benchv1.Bench_Unary_FullMethodName:          benchBareUnary,
	benchv1.Bench_Stream_FullMethodName:         benchBareStream,
	pb.EngineSession_Session_FullMethodName:     benchEngineSessionMethod,
	pb.PrefillSession_Session_FullMethodName:    benchPrefillSessionMethod,
	benchv1.Bench_Session_FullMethodName:        benchBareSession,
}

// The lifecycle's share of the counted RPCs: what one room costs on the wire.
var (
	benchRoomUnary   = []int{benchOpenRoom, benchTransfer, benchReleaseRoom, benchGetRoom, benchAbortRoom, benchDeclareDestination}
	benchRoomStreams = []int{benchWatchRoom, benchAwaitDestination}
	// benchRoomSessions are the --api stream sessions: bidirectional, so
	// the messages the client sends are counted too.
	benchRoomSessions = []int{benchEngineSessionMethod, benchPrefillSessionMethod}
)

func benchMethodOf(full string) int {
	if i, ok := benchMethodIndex[full]; ok {
		return i
	}
	return benchOtherMethod
}

type benchCounters struct {
	calls [benchNumMethods]atomic.Int64
	msgs  [benchNumMethods]atomic.Int64
	// sent counts the messages sent on the sessions (benchRoomSessions,
	// and the bare phase's Bench/Session) only: a unary call or a server
	// stream's request is its call. sentBytes and recvBytes are the
	// sessions' messages' sizes (proto.Size), both ways.
	sent      [benchNumMethods]atomic.Int64
	sentBytes [benchNumMethods]atomic.Int64
	recvBytes [benchNumMethods]atomic.Int64
}

type benchCounts struct {
	Calls     [benchNumMethods]int64
	Msgs      [benchNumMethods]int64
	Sent      [benchNumMethods]int64
	SentBytes [benchNumMethods]int64
	RecvBytes [benchNumMethods]int64
}

func (c *benchCounters) snapshot() benchCounts {
	var s benchCounts
	for i := range benchNumMethods {
		s.Calls[i] = c.calls[i].Load()
		s.Msgs[i] = c.msgs[i].Load()
		s.Sent[i] = c.sent[i].Load()
		s.SentBytes[i] = c.sentBytes[i].Load()
		s.RecvBytes[i] = c.recvBytes[i].Load()
	}
	return s
}

func (a benchCounts) sub(b benchCounts) benchCounts {
	for i := range benchNumMethods {
		a.Calls[i] -= b.Calls[i]
		a.Msgs[i] -= b.Msgs[i]
		a.Sent[i] -= b.Sent[i]
		a.SentBytes[i] -= b.SentBytes[i]
		a.RecvBytes[i] -= b.RecvBytes[i]
	}
	return a
}

// dialOptions are the counting interceptors (the same on the daemon's
// connections and on the bare-gRPC ones). onDest, when set, sees every
// destination an AwaitDestination stream or a prefill session delivers.
func (c *benchCounters) dialOptions(onDest func(*pb.Destination)) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.calls[benchMethodOf(method)].Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			m := benchMethodOf(method)
			c.calls[m].Add(1)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			bs := &benchStream{ClientStream: s, recv: &c.msgs[m]}
			if m == benchAwaitDestination || m == benchPrefillSessionMethod {
				bs.onDest = onDest
			}
			if m == benchEngineSessionMethod || m == benchPrefillSessionMethod || m == benchBareSession {
				bs.sent, bs.sentBytes, bs.recvBytes = &c.sent[m], &c.sentBytes[m], &c.recvBytes[m]
			}
			return bs, nil
		}),
	}
}

// benchStream counts a stream's messages and reports destinations.
type benchStream struct {
	grpc.ClientStream
	recv *atomic.Int64
	sent *atomic.Int64 // nil: not counted (a server stream's request)
	// sentBytes and recvBytes (set with sent) add up the messages' sizes,
	// estimated from one message in benchSizeEvery (sized, counted
	// benchSizeEvery times): sizing every message would cost the measured
	// run a tenth of the client's CPU. sentN and recvN count the messages
	// (each written by one goroutine at a time: a stream's sends are
	// serialised, and so are its receives).
	sentBytes, recvBytes *atomic.Int64
	sentN, recvN         uint32
	onDest               func(*pb.Destination)
}

// benchSizeEvery is how many session messages one sized message stands for.
const benchSizeEvery = 8

func (s *benchStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.recv.Add(1)
		if s.recvBytes != nil {
			if s.recvN%benchSizeEvery == 0 {
				s.recvBytes.Add(benchSizeEvery * benchSize(m))
			}
			s.recvN++
		}
		if s.onDest != nil {
			switch ev := m.(type) {
			case *pb.DestinationEvent:
				if ev.GetDestination() != nil {
					s.onDest(ev.GetDestination())
				}
			case *pb.PrefillEvent:
				if d := ev.GetRoom().GetEvent().GetDestination(); d != nil {
					s.onDest(d)
				}
				for _, m := range ev.GetMore() { // the events packed in the message
					if d := m.GetRoom().GetEvent().GetDestination(); d != nil {
						s.onDest(d)
					}
				}
			}
		}
	}
	return err
}

func (s *benchStream) SendMsg(m any) error {
	if s.sent == nil {
		return s.ClientStream.SendMsg(m)
	}
	// Sized before it is sent: the message is not to be read once gRPC has
	// it.
	var n int64
	if s.sentN%benchSizeEvery == 0 {
		n = benchSizeEvery * benchSize(m)
	}
	s.sentN++
	err := s.ClientStream.SendMsg(m)
	if err == nil {
		s.sent.Add(1)
		s.sentBytes.Add(n)
	}
	return err
}
