package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The client tests' harness: a real daemon per test over bufconn
// (example_test.go starts it), a client of it, a fault injector on the
// daemon's side, and both transports.

// testTimeout bounds every wait; nothing should come close.
const testTimeout = 10 * time.Second

// fastRetry keeps retry tests quick: the code paths are the same.
var fastRetry = client.WithRetry(client.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond})

const addr = "10.0.0.1:8998"

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newDaemon starts a daemon for one test and stops it at cleanup, checking
// that it shut down cleanly.
func newDaemon(t *testing.T, dc daemonConfig) *daemon {
	t.Helper()
	d, err := startDaemon(dc)
	if err != nil {
		t.Fatalf("startDaemon: %v", err)
	}
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	})
	return d
}

// client builds a client with New over the daemon's listener; it is closed
// at cleanup (before the daemon stops).
func (d *daemon) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New("passthrough:///bufnet", append([]client.Option{client.WithDialOptions(d.dialer())}, opts...)...)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func openReq(room uint64, promptLen uint32) *pb.OpenRoomRequest {
	return &pb.OpenRoomRequest{Rid: fmt.Sprintf("rid-%d", room), BootstrapAddr: addr, Room: room, PromptLen: promptLen, MaxNewTokens: 64}
}

// registered returns a registered TP-1 prefill rank at addr.
func registered(t *testing.T, c *client.Client) *client.Prefill {
	t.Helper()
	p := c.Prefill(prefillRank(addr, 1, 0))
	if _, err := p.Register(ctxT(t)); err != nil {
		t.Fatalf("Register: %v", err)
	}
	return p
}

// assertPoolFull checks through Admin.GetStatus that every shard's ledger is
// back to full.
func assertPoolFull(t *testing.T, c *client.Client) {
	t.Helper()
	st, err := c.Admin().Status(ctxT(t))
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if len(st.GetShards()) == 0 {
		t.Fatal("Status lists no shard")
	}
	for _, sh := range st.GetShards() {
		if sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() || sh.GetMetadataSlotsFree() != sh.GetMetadataSlotsTotal() {
			t.Errorf("shard %d: pages %d/%d, request slots %d/%d, metadata slots %d/%d free; want all free", sh.GetDpRank(),
				sh.GetPagesFree(), sh.GetPagesTotal(), sh.GetReqSlotsFree(), sh.GetReqSlotsTotal(), sh.GetMetadataSlotsFree(), sh.GetMetadataSlotsTotal())
		}
	}
}

// ---- fault injection and call recording (server side) ----

// fault makes the next n calls of a method fail with code. With after set,
// the handler runs first and its answer is lost (the call took effect).
type fault struct {
	n          int
	code       codes.Code
	retryAfter time.Duration // adds a RetryInfo when > 0
	after      bool
}

func (f fault) err() error {
	st := status.New(f.code, "injected "+f.code.String())
	if f.retryAfter > 0 {
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(f.retryAfter)})
	}
	return st.Err()
}

// injector counts and records calls per method and injects faults. Its
// interceptors run outermost on the server, before auth and validation.
type injector struct {
	mu      sync.Mutex
	calls   map[string]int
	reqs    map[string][]proto.Message
	faults  map[string]*fault
	changed chan struct{} // closed and replaced at every call
	// sent, when set, sees every message a server stream sends.
	sent func(method string, m any)
}

func newInjector() *injector {
	return &injector{calls: map[string]int{}, reqs: map[string][]proto.Message{}, faults: map[string]*fault{}, changed: make(chan struct{})}
}

func (in *injector) config() daemonConfig {
	return daemonConfig{unary: []grpc.UnaryServerInterceptor{in.unary}, stream: []grpc.StreamServerInterceptor{in.stream}}
}

func (in *injector) fail(method string, f fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults[method] = &f
}

// record counts a call and returns the fault to inject, if any.
func (in *injector) record(method string, req any) *fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.calls[method]++
	if m, ok := req.(proto.Message); ok {
		in.reqs[method] = append(in.reqs[method], proto.Clone(m))
	}
	close(in.changed)
	in.changed = make(chan struct{})
	if f := in.faults[method]; f != nil && f.n > 0 {
		f.n--
		inj := *f
		return &inj
	}
	return nil
}

func (in *injector) count(method string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.calls[method]
}

func (in *injector) requests(method string) []proto.Message {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]proto.Message(nil), in.reqs[method]...)
}

// waitCalls waits until method was called at least n times.
func (in *injector) waitCalls(t *testing.T, method string, n int) {
	t.Helper()
	ctx := ctxT(t)
	for {
		in.mu.Lock()
		got, ch := in.calls[method], in.changed
		in.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s called %d times, want >= %d", method, got, n)
		}
	}
}

func (in *injector) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	f := in.record(info.FullMethod, req)
	if f == nil {
		return h(ctx, req)
	}
	if f.after {
		if _, err := h(ctx, req); err != nil {
			return nil, err
		}
	}
	return nil, f.err()
}

func (in *injector) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	f := in.record(info.FullMethod, nil)
	if info.FullMethod == pb.PrefillSession_Session_FullMethodName {
		ss = &sessionRecorder{ServerStream: ss, record: func(m string, body proto.Message) *fault { return in.record(m, body) }}
	}
	if in.sent != nil {
		ss = &observed{ServerStream: ss, method: info.FullMethod, sent: in.sent}
	}
	switch {
	case f == nil:
		return h(srv, ss)
	case f.after:
		// Break the stream after its first message.
		return h(srv, &breakAfterOne{ServerStream: ss, err: f.err()})
	}
	return f.err()
}

// sessionOp is the name under which the injector records (and faults) a
// prefill session's ops: sessionOp("chunk") is a Transfer on the session.
func sessionOp(op string) string { return pb.PrefillSession_Session_FullMethodName + "/" + op }

// opMethod is where the injector records what the unary method carries
// under tr: the method itself, or its op on the prefill session.
func opMethod(tr client.Transport, method string) string {
	if tr == client.TransportUnary {
		return method
	}
	switch method {
	case pb.Rooms_AwaitDestination_FullMethodName:
		return sessionOp("claim")
	case pb.Rooms_Transfer_FullMethodName:
		return sessionOp("chunk")
	case pb.Rooms_ReportTransfer_FullMethodName:
		return sessionOp("report")
	case pb.Rooms_AckRoomEnd_FullMethodName:
		return sessionOp("ack")
	}
	return method
}

// sessionRecorder records every op a prefill session receives (its
// request, as sessionOp(op), packed ones included) and injects the op's
// fault: the session is cut with the fault's code before the message
// carrying the op reaches the daemon, or, with after set, at the next
// receive (the op was handled, its answer may be lost).
type sessionRecorder struct {
	grpc.ServerStream
	record func(method string, body proto.Message) *fault
	cut    error
}

func (r *sessionRecorder) RecvMsg(m any) error {
	if r.cut != nil {
		return r.cut
	}
	if err := r.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	var cut *fault
	for _, e := range unpacked(m.(proto.Message)) {
		req, _ := e.(*pb.PrefillRequest)
		var op string
		var body proto.Message
		switch o := req.GetOp().(type) {
		case *pb.PrefillRequest_Hello:
			op, body = "hello", o.Hello
		case *pb.PrefillRequest_Ping:
			op, body = "ping", o.Ping
		case *pb.PrefillRequest_Claim:
			op, body = "claim", o.Claim
		case *pb.PrefillRequest_Chunk:
			op, body = "chunk", o.Chunk
		case *pb.PrefillRequest_Report:
			op, body = "report", o.Report
		case *pb.PrefillRequest_Ack:
			op, body = "ack", o.Ack
		default:
			continue
		}
		if f := r.record(sessionOp(op), body); f != nil && cut == nil {
			cut = f
		}
	}
	switch {
	case cut == nil:
		return nil
	case cut.after:
		r.cut = cut.err()
		return nil
	}
	return cut.err()
}

// unpacked is a session message and the messages packed behind it (its
// repeated field "more", where the wire has one).
func unpacked(m proto.Message) []proto.Message {
	out := []proto.Message{m}
	r := m.ProtoReflect()
	if fd := r.Descriptor().Fields().ByName("more"); fd != nil && fd.IsList() && fd.Message() != nil {
		l := r.Get(fd).List()
		for i := range l.Len() {
			out = append(out, l.Get(i).Message().Interface())
		}
	}
	return out
}

// transports are the two ways a Client carries hand-offs.
var transports = []client.Transport{client.TransportStreams, client.TransportUnary}

// eachTransport runs f once per transport, as a subtest named after it.
func eachTransport(t *testing.T, f func(t *testing.T, tr client.Transport)) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) { f(t, tr) })
	}
}

// observed reports every message a server stream sends.
type observed struct {
	grpc.ServerStream
	method string
	sent   func(method string, m any)
}

func (o *observed) SendMsg(m any) error {
	err := o.ServerStream.SendMsg(m)
	if err == nil {
		o.sent(o.method, m)
	}
	return err
}

// breakAfterOne delivers the stream's first message and then fails it, as a
// connection cut mid-stream would: the handler's send reports the error and
// the call ends with it.
type breakAfterOne struct {
	grpc.ServerStream
	sent bool
	err  error
}

func (b *breakAfterOne) SendMsg(m any) error {
	if b.sent {
		return b.err
	}
	b.sent = true
	if err := b.ServerStream.SendMsg(m); err != nil {
		return err
	}
	return b.err
}

// ---- the room lifecycle ----
