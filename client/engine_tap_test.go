package client_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The engine tests' tap: a daemon whose EngineSession and unary room
// calls are observed (and cut) from the server side.

// forTransports runs f once per transport: OpenAndWait over the shared
// engine session (the default) and over OpenRoom + WatchRoom.
func forTransports(t *testing.T, f func(t *testing.T, tr client.Option)) {
	eachTransport(t, func(t *testing.T, tr client.Transport) { f(t, client.WithTransport(tr)) })
}

// engineTap watches the daemon's side of every call: how many of each
// method, and for each EngineSession stream (numbered in the order they
// opened) the rooms of each open op and the seq of each room event the
// daemon sent. It can fail a stream's next send (a cut), or hold the first
// stream's first reply until its gate is closed.
type engineTap struct {
	mu      sync.Mutex
	calls   map[string]int
	opens   [][]int                // per stream: rooms per open op
	sent    []map[uint64][]uint32  // per stream: seqs sent per room
	opened  []map[uint64]bool      // per stream: rooms whose open was answered OK
	cut     map[int]*status.Status // stream → its next send fails with it
	cutWhen map[int]func(any) bool // stream → which send fails (nil: the next)
	gate    chan struct{}          // holds stream 0's first reply while open
	changed chan struct{}          // cap 1: something was recorded
	gated   bool
}

func newEngineTap() *engineTap {
	return &engineTap{calls: map[string]int{}, cut: map[int]*status.Status{}, cutWhen: map[int]func(any) bool{}, changed: make(chan struct{}, 1)}
}

func (tp *engineTap) signal() {
	select {
	case tp.changed <- struct{}{}:
	default:
	}
}

func (tp *engineTap) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	tp.mu.Lock()
	tp.calls[info.FullMethod]++
	tp.mu.Unlock()
	tp.signal()
	return h(ctx, req)
}

func (tp *engineTap) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	tp.mu.Lock()
	tp.calls[info.FullMethod]++
	n := -1
	if info.FullMethod == pb.EngineSession_Session_FullMethodName {
		n = len(tp.opens)
		tp.opens = append(tp.opens, nil)
		tp.sent = append(tp.sent, map[uint64][]uint32{})
		tp.opened = append(tp.opened, map[uint64]bool{})
	}
	tp.mu.Unlock()
	tp.signal()
	if n < 0 {
		return h(srv, ss)
	}
	return h(srv, &tapStream{ServerStream: ss, tp: tp, n: n})
}

type tapStream struct {
	grpc.ServerStream
	tp *engineTap
	n  int
}

// packed returns m and the messages of its kind packed in it: a session
// message may carry more of its kind in a repeated field "more" (read by
// reflection: the field is the wire's, not this test's, business).
func packed[M proto.Message](m M) []M {
	out := []M{m}
	r := m.ProtoReflect()
	if fd := r.Descriptor().Fields().ByName("more"); fd != nil && fd.IsList() {
		l := r.Get(fd).List()
		for i := range l.Len() {
			if mm, ok := l.Get(i).Message().Interface().(M); ok {
				out = append(out, mm)
			}
		}
	}
	return out
}

func (s *tapStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	req, ok := m.(*pb.EngineRequest)
	if !ok || err != nil {
		return err
	}
	for _, r := range packed(req) {
		if r.GetOpen() != nil {
			s.tp.mu.Lock()
			s.tp.opens[s.n] = append(s.tp.opens[s.n], len(r.GetOpen().GetRooms()))
			s.tp.mu.Unlock()
			s.tp.signal()
		}
	}
	return err
}

// hasReply reports whether a session message carries a reply.
func hasReply(m any) bool {
	ev, ok := m.(*pb.EngineEvent)
	if !ok {
		return false
	}
	for _, e := range packed(ev) {
		if e.GetReply() != nil {
			return true
		}
	}
	return false
}

func (s *tapStream) SendMsg(m any) error {
	ev, _ := m.(*pb.EngineEvent)
	tp := s.tp
	tp.mu.Lock()
	if st := tp.cut[s.n]; st != nil && (tp.cutWhen[s.n] == nil || tp.cutWhen[s.n](m)) {
		tp.mu.Unlock()
		return st.Err()
	}
	gate := tp.gate
	hold := gate != nil && s.n == 0 && hasReply(m) && !tp.gated
	if hold {
		tp.gated = true
	}
	tp.mu.Unlock()
	if hold {
		<-gate
	}
	// Recorded before it is written: once written, the client may act on
	// it (and the test read the record) before SendMsg returns.
	if ev != nil {
		tp.mu.Lock()
		for _, e := range packed(ev) {
			if re := e.GetRoom(); re != nil {
				tp.sent[s.n][re.GetRoom()] = append(tp.sent[s.n][re.GetRoom()], re.GetSeq())
			}
			for _, r := range e.GetReply().GetResults() {
				if r.GetOpen() != nil && r.GetCode() == 0 {
					tp.opened[s.n][r.GetRoom()] = true
				}
			}
		}
		tp.mu.Unlock()
	}
	err := s.ServerStream.SendMsg(m)
	if ev != nil {
		tp.signal()
	}
	return err
}

// await waits until cond (read under the tap's lock) holds.
func (tp *engineTap) await(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for {
		tp.mu.Lock()
		ok := cond()
		tp.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-tp.changed:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

func (tp *engineTap) count(method string) int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.calls[method]
}

func (tp *engineTap) sessions() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return len(tp.opens)
}

func tapDaemon(t *testing.T, tp *engineTap, dc daemonConfig) *daemon {
	dc.unary = append(dc.unary, tp.unary)
	dc.stream = append(dc.stream, tp.stream)
	return newDaemon(t, dc)
}
