package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

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
	st, err := c.Status(ctxT(t))
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

func TestHappyPath(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)

	sent := make(chan error, 1)
	var dest *pb.Destination
	go func() {
		var err error
		dest, err = p.SendRoom(ctx, 100, client.SendOptions{})
		sent <- err
	}()
	room, err := c.OpenAndWait(ctx, openReq(100, 1000))
	if err != nil {
		t.Fatalf("OpenAndWait: %v", err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if room.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || room.GetPoll() != pb.KVPoll_KV_POLL_SUCCESS {
		t.Errorf("OpenAndWait = %s/%s, want SUCCEEDED/SUCCESS", room.GetPhase(), room.GetPoll())
	}
	if got, want := len(dest.GetPageIndices()), 16; got != want || dest.GetDummy() || dest.GetFillLen() != 1000 {
		t.Errorf("destination: %d pages, fill_len %d, dummy %v; want %d, 1000, false", got, dest.GetFillLen(), dest.GetDummy(), want)
	}
	if room.GetChunksDone() != 1 || room.GetBytesTransferred() == 0 {
		t.Errorf("room: %d chunks, %d bytes; want 1 chunk and some bytes", room.GetChunksDone(), room.GetBytesTransferred())
	}

	rel, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 100})
	if err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	if rel.GetPagesReleased() != 16 || rel.GetAlreadyReleased() {
		t.Errorf("ReleaseRoom = %v, want 16 pages, not already released", rel)
	}
	// Idempotent.
	if rel, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 100}); err != nil || !rel.GetAlreadyReleased() {
		t.Errorf("second ReleaseRoom = %v, %v; want already released", rel, err)
	}
	got, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 100})
	if err != nil {
		t.Fatalf("GetRoom: %v", err)
	}
	var phases []pb.RoomPhase
	for _, tr := range got.GetTransitions() {
		phases = append(phases, tr.GetPhase())
	}
	wantPhases := []pb.RoomPhase{
		pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, pb.RoomPhase_ROOM_PHASE_QUEUED, pb.RoomPhase_ROOM_PHASE_ADMITTED,
		pb.RoomPhase_ROOM_PHASE_CLAIMED, pb.RoomPhase_ROOM_PHASE_TRANSFERRING, pb.RoomPhase_ROOM_PHASE_SUCCEEDED,
		pb.RoomPhase_ROOM_PHASE_RELEASED,
	}
	if diff := cmp.Diff(wantPhases, phases); diff != "" {
		t.Errorf("room timeline (-want +got):\n%s", diff)
	}
	list, err := c.ListRooms(ctx, &pb.ListRoomsRequest{BootstrapAddr: addr})
	if err != nil || list.GetTotal() != 1 || list.GetRooms()[0].GetRoom() != 100 {
		t.Errorf("ListRooms = %v, %v; want room 100 alone", list, err)
	}
	assertPoolFull(t, c)
}

func TestSendRoomChunks(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.OpenRoom(ctx, openReq(5, 1000)); err != nil { // 16 pages
		t.Fatalf("OpenRoom: %v", err)
	}

	var sources []client.Chunk
	dest, err := p.SendRoom(ctx, 5, client.SendOptions{
		ChunkPages: 5,
		OutputIDs:  []int32{1234},
		Source: func(ch client.Chunk) *pb.TransferSource {
			sources = append(sources, ch)
			src := &pb.TransferSource{Buffer: "kv0"}
			for i := range ch.NumPages {
				src.PageIndices = append(src.PageIndices, int32(1000+ch.PageOffset+i))
			}
			return src
		},
	})
	if err != nil {
		t.Fatalf("SendRoom: %v", err)
	}

	// 16 pages in chunks of 5: 5, 5, 5, 1; only the last carries the marker.
	rank := p.Rank()
	var want []proto.Message
	for i, off := range []uint32{0, 5, 10, 15} {
		n := min(5, 16-off)
		req := &pb.TransferRequest{Room: 5, Rank: rank, ChunkIndex: uint32(i), PageOffset: off, NumPages: n, Source: &pb.TransferSource{Buffer: "kv0"}, Attempt: 1}
		for j := range n {
			req.Source.PageIndices = append(req.Source.PageIndices, int32(1000+off+j))
		}
		if i == 3 {
			req.Last = true
			req.Aux = &pb.Aux{RoomMarker: 5, OutputIds: []int32{1234}}
		}
		want = append(want, req)
	}
	if diff := cmp.Diff(want, in.requests(pb.Rooms_Transfer_FullMethodName), protocmp.Transform()); diff != "" {
		t.Errorf("Transfer requests (-want +got):\n%s", diff)
	}
	for i, ch := range sources {
		if got, want := ch.Pages(), dest.GetPageIndices()[ch.PageOffset:ch.PageOffset+ch.NumPages]; !cmp.Equal(got, want) {
			t.Errorf("chunk %d Pages() = %v, want %v", i, got, want)
		}
	}
	room, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 5})
	if err != nil {
		t.Fatalf("GetRoom: %v", err)
	}
	if room.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || room.GetChunksDone() != 4 {
		t.Errorf("room = %s with %d chunks, want SUCCEEDED with 4", room.GetPhase(), room.GetChunksDone())
	}
}

// TestSendRoomBeforeTheClaimIsRecorded forces a race of the daemon: it
// records a rank's claim only after its stream sent the destination, so the
// rank's first Transfer can arrive before the claim exists and be refused
// (FailedPrecondition). Here the stream is held after sending the destination
// until that first Transfer has been answered; SendRoom sends the chunk again
// and the room succeeds.
func TestSendRoomBeforeTheClaimIsRecorded(t *testing.T) {
	firstTransfer := make(chan struct{})
	var once sync.Once
	var transfers atomic.Int32
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod != pb.Rooms_Transfer_FullMethodName {
			return h(ctx, req)
		}
		transfers.Add(1)
		resp, err := h(ctx, req)
		once.Do(func() { close(firstTransfer) })
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != pb.Rooms_AwaitDestination_FullMethodName {
			return h(srv, ss)
		}
		return h(srv, &observed{ServerStream: ss, method: info.FullMethod, sent: func(_ string, m any) {
			if m.(*pb.DestinationEvent).GetDestination() != nil {
				select { // hold the claim's recording until the rank has sent its first chunk
				case <-firstTransfer:
				case <-ss.Context().Done():
				}
			}
		}})
	}
	d := newDaemon(t, daemonConfig{unary: []grpc.UnaryServerInterceptor{unary}, stream: []grpc.StreamServerInterceptor{stream}})
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.OpenRoom(ctx, openReq(160, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	if _, err := p.SendRoom(ctx, 160, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if n := transfers.Load(); n != 1 {
		t.Errorf("%d Transfer calls, want 1 (the daemon takes the first chunk as the rank's claim)", n)
	}
	if r, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 160}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("GetRoom = %v, %v; want SUCCEEDED", r, err)
	}
}

// TestDummyDestination: an MLA decode at TP 1 pulls from prefill TP rank 0
// only; prefill rank 1 gets a dummy destination, sends nothing and sees the
// room's end.
func TestDummyDestination(t *testing.T) {
	// Rank 0's chunk waits until rank 1 has been sent its dummy destination:
	// otherwise the room could succeed before rank 1 claims it, and rank 1
	// would only see the end.
	dummySent := make(chan struct{})
	var once sync.Once
	in := newInjector()
	in.sent = func(_ string, m any) {
		if ev, ok := m.(*pb.DestinationEvent); ok && ev.GetDestination().GetDummy() {
			once.Do(func() { close(dummySent) })
		}
	}
	dc := in.config()
	dc.decode = func(c *prealloc.Config) {
		c.Pool.Kind = prealloc.KindMLA
		c.Pool.KVHeads, c.Pool.HeadDim = 0, 0
		c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 512, 64
	}
	d := newDaemon(t, dc)
	c := d.client(t)
	ctx := ctxT(t)
	d.engine.SetFault(func(kvmanager.ChunkOp) error {
		select {
		case <-dummySent:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})

	ranks := []*client.Prefill{c.Prefill(prefillRank(addr, 2, 0)), c.Prefill(prefillRank(addr, 2, 1))}
	for i, p := range ranks {
		reg, err := p.Register(ctx)
		if err != nil {
			t.Fatalf("Register rank %d: %v", i, err)
		}
		if got, want := reg.GetMapping().GetDummy(), i == 1; got != want {
			t.Errorf("rank %d: mapping dummy = %v, want %v", i, got, want)
		}
	}
	if _, err := c.OpenRoom(ctx, openReq(9, 700)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	dests := make([]*pb.Destination, 2)
	var wg sync.WaitGroup
	for i, p := range ranks {
		wg.Go(func() {
			var err error
			if dests[i], err = p.SendRoom(ctx, 9, client.SendOptions{}); err != nil {
				t.Errorf("rank %d SendRoom: %v", i, err)
			}
		})
	}
	wg.Wait()
	if dests[0].GetDummy() || len(dests[0].GetPageIndices()) != 11 {
		t.Errorf("rank 0 destination: dummy %v, %d pages; want a real one with 11 pages", dests[0].GetDummy(), len(dests[0].GetPageIndices()))
	}
	if !dests[1].GetDummy() || len(dests[1].GetPageIndices()) != 0 {
		t.Errorf("rank 1 destination: dummy %v, %d pages; want a dummy without pages", dests[1].GetDummy(), len(dests[1].GetPageIndices()))
	}
	for _, m := range in.requests(pb.Rooms_Transfer_FullMethodName) {
		if tr := m.(*pb.TransferRequest); tr.GetRank().GetTpRank() != 0 {
			t.Errorf("a dummy rank sent a chunk: %v", tr)
		}
	}
	room, err := c.WaitRoom(ctx, 9, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
	if err != nil || room.GetChunksDone() != 1 {
		t.Errorf("WaitRoom = %v, %v; want SUCCEEDED after 1 chunk", room, err)
	}
}

func TestReportRoom(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)

	t.Run("moved", func(t *testing.T) {
		if _, err := c.OpenRoom(ctx, openReq(11, 640)); err != nil { // 10 pages
			t.Fatalf("OpenRoom: %v", err)
		}
		var moved []int
		var total uint64
		_, err := p.ReportRoom(ctx, 11, client.SendOptions{ChunkPages: 4, Move: func(_ context.Context, ch client.Chunk) (uint64, error) {
			moved = append(moved, ch.NumPages)
			total += ch.Bytes()
			return ch.Bytes(), nil
		}})
		if err != nil {
			t.Fatalf("ReportRoom: %v", err)
		}
		if diff := cmp.Diff([]int{4, 4, 2}, moved); diff != "" {
			t.Errorf("moved chunks (-want +got):\n%s", diff)
		}
		room, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 11})
		// 640 tokens x 2 (K, V) x 8 heads x 128 x 2 bytes x 32 layers (the
		// test pool's layout): what the layout says, not what a prefill claims.
		const want = 640 * 2 * 8 * 128 * 2 * 32
		if total != want || err != nil || room.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || room.GetBytesTransferred() != want {
			t.Errorf("GetRoom = %v, %v (moved %d); want SUCCEEDED with %d bytes", room, err, total, want)
		}
	})
	t.Run("move failed", func(t *testing.T) {
		if _, err := c.OpenRoom(ctx, openReq(12, 640)); err != nil {
			t.Fatalf("OpenRoom: %v", err)
		}
		rdmaDown := errors.New("rdma write failed: qp error")
		_, err := p.ReportRoom(ctx, 12, client.SendOptions{Move: func(context.Context, client.Chunk) (uint64, error) { return 0, rdmaDown }})
		var rf *client.RoomFailedError
		if !errors.As(err, &rf) || !errors.Is(err, client.ErrRoomFailed) || !errors.Is(err, rdmaDown) {
			t.Fatalf("ReportRoom = %v, want a *RoomFailedError wrapping the Move error", err)
		}
		if rf.Room != 12 || rf.Code != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(rf.Message, "rdma write failed") {
			t.Errorf("RoomFailedError = %+v, want room 12, TRANSFER_FAILED, the prefill's reason", rf)
		}
	})
	if _, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 11}); err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	assertPoolFull(t, c)
}

func TestTransferFailureFailsTheRoom(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	d.engine.SetFault(func(op kvmanager.ChunkOp) error {
		if op.ChunkIndex == 1 {
			return errors.New("nic down")
		}
		return nil
	})
	c := d.client(t)
	ctx := ctxT(t)
	p := registered(t, c)

	waited := make(chan error, 1)
	var waitedRoom *pb.Room
	go func() {
		var err error
		waitedRoom, err = c.OpenAndWait(ctx, openReq(21, 1000))
		waited <- err
	}()
	_, err := p.SendRoom(ctx, 21, client.SendOptions{ChunkPages: 4})
	var rf *client.RoomFailedError
	if !errors.As(err, &rf) {
		t.Fatalf("SendRoom = %v, want a *RoomFailedError", err)
	}
	if !errors.Is(err, client.ErrRoomFailed) || !errors.Is(err, client.ErrAborted) || status.Code(err) != codes.Aborted {
		t.Errorf("SendRoom = %v (code %s): want ErrRoomFailed, ErrAborted and code Aborted", err, status.Code(err))
	}
	if rf.Code != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(rf.Message, "nic down") {
		t.Errorf("RoomFailedError = %+v, want TRANSFER_FAILED naming the fault", rf)
	}

	err = <-waited
	if !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED {
		t.Errorf("OpenAndWait = %v, want a TRANSFER_FAILED *RoomFailedError", err)
	}
	if waitedRoom.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Errorf("OpenAndWait room phase = %s, want FAILED", waitedRoom.GetPhase())
	}
	// A failed room cannot be released; its pages are already back.
	if _, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 21}); !errors.Is(err, client.ErrFailedPrecondition) {
		t.Errorf("ReleaseRoom(failed room) = %v, want ErrFailedPrecondition", err)
	}
	assertPoolFull(t, c)
}

func TestAbortEndsTheWait(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	// No prefill registers: the room waits for it.
	if _, err := c.OpenRoom(ctx, openReq(31, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := c.WaitRoom(ctx, 31, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
		waited <- err
	}()
	ab, err := c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 31})
	if err != nil || ab.GetAlreadyTerminal() {
		t.Fatalf("AbortRoom = %v, %v", ab, err)
	}
	var rf *client.RoomFailedError
	if err := <-waited; !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_ABORTED || rf.Message != "Aborted by AbortReq." {
		t.Errorf("WaitRoom = %v, want ABORTED \"Aborted by AbortReq.\"", err)
	}
	// Waiting for a phase the room is in, or went through, returns at once.
	for _, ph := range []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_FAILED, pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL} {
		if r, err := c.WaitRoom(ctx, 31, ph); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
			t.Errorf("WaitRoom(%s) = %v, %v; want the failed room, no error", ph, r, err)
		}
	}
	// A phase it never reached: the failure.
	if _, err := c.WaitRoom(ctx, 31, pb.RoomPhase_ROOM_PHASE_SUCCEEDED); !errors.Is(err, client.ErrRoomFailed) {
		t.Errorf("WaitRoom(SUCCEEDED) of a failed room = %v, want ErrRoomFailed", err)
	}
	// Aborting again is OK.
	if ab, err := c.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 31}); err != nil || !ab.GetAlreadyTerminal() {
		t.Errorf("second AbortRoom = %v, %v; want already terminal", ab, err)
	}
}

func TestConcurrentRooms(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t) // one client shared by every goroutine
	ctx := ctxT(t)
	p := registered(t, c)
	const rooms = 16
	var wg sync.WaitGroup
	for i := range uint64(rooms) {
		room := 1000 + i
		wg.Go(func() {
			if _, err := p.SendRoom(ctx, room, client.SendOptions{ChunkPages: 2}); err != nil {
				t.Errorf("SendRoom(%d): %v", room, err)
			}
		})
		wg.Go(func() {
			if _, err := c.OpenAndWait(ctx, openReq(room, uint32(100+50*i))); err != nil {
				t.Errorf("OpenAndWait(%d): %v", room, err)
				return
			}
			if _, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
				t.Errorf("ReleaseRoom(%d): %v", room, err)
			}
		})
	}
	wg.Wait()
	assertPoolFull(t, c)
}

func TestLookupAndBindDPRanks(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	var ranks []*client.Prefill
	for dp := range uint32(2) {
		reg := prefillRank(addr, 1, 0)
		reg.Parallel.AttnDpSize, reg.Parallel.AttnDpRank = 2, dp
		reg.LoadBalanceMethod = "round_robin" // the DP rank is not room % dp_size
		reg.RankEndpoint = fmt.Sprintf("10.0.0.1:%d", 17100+dp)
		p := c.Prefill(reg)
		if _, err := p.Register(ctx); err != nil {
			t.Fatalf("Register dp %d: %v", dp, err)
		}
		ranks = append(ranks, p)
	}
	if got := ranks[1].Rank().GetDpRank(); got != 1 {
		t.Fatalf("Rank().DpRank = %d, want 1", got)
	}
	lookup := func() *pb.LookupDPRanksResponse {
		t.Helper()
		resp, err := c.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: addr, Rooms: []uint64{5, 6}, Hints: []*pb.RoomHint{{Room: 6, DpRank: 0}}})
		if err != nil {
			t.Fatalf("LookupDPRanks: %v", err)
		}
		return resp
	}
	want := &pb.LookupDPRanksResponse{Resolved: []*pb.DPRankResult{{Room: 6, DpRank: 0, Rule: pb.DPRankRule_DP_RANK_RULE_HINT}}, Unresolved: []uint64{5}}
	if diff := cmp.Diff(want, lookup(), protocmp.Transform()); diff != "" {
		t.Errorf("LookupDPRanks before BindRoom (-want +got):\n%s", diff)
	}
	if replaced, err := ranks[1].BindRoom(ctx, 5); err != nil || replaced {
		t.Fatalf("BindRoom = %v, %v; want a first binding", replaced, err)
	}
	want = &pb.LookupDPRanksResponse{Resolved: []*pb.DPRankResult{
		{Room: 5, DpRank: 1, Rule: pb.DPRankRule_DP_RANK_RULE_BINDING},
		{Room: 6, DpRank: 0, Rule: pb.DPRankRule_DP_RANK_RULE_HINT},
	}}
	if diff := cmp.Diff(want, lookup(), protocmp.Transform(), protocmp.SortRepeated(func(a, b *pb.DPRankResult) bool { return a.GetRoom() < b.GetRoom() })); diff != "" {
		t.Errorf("LookupDPRanks after BindRoom (-want +got):\n%s", diff)
	}
}

// ---- errors ----

// TestErrorFamilies checks each family against the real daemon and domain:
// errors.Is on the client sentinel, status.Code, and the message.
func TestErrorFamilies(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	if _, err := c.OpenRoom(ctx, openReq(1, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	tests := []struct {
		name     string
		call     func() error
		family   error
		code     codes.Code
		inMsg    string
		retrying bool // the family is retried by retryable RPCs
	}{
		{"unknown room", func() error {
			_, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 404})
			return err
		}, client.ErrNotFound, codes.NotFound, "404", false},
		{"heartbeat of an unregistered rank", func() error {
			_, err := c.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: &pb.PrefillRank{BootstrapAddr: "10.9.9.9:1"}})
			return err
		}, client.ErrNotFound, codes.NotFound, "register again", false},
		{"duplicate room", func() error {
			_, err := c.OpenRoom(ctx, openReq(1, 100))
			return err
		}, client.ErrAlreadyExists, codes.AlreadyExists, "room already exists", false},
		{"missing field", func() error {
			req := openReq(2, 100)
			req.PromptLen = 0
			_, err := c.OpenRoom(ctx, req)
			return err
		}, client.ErrInvalidArgument, codes.InvalidArgument, "prompt_len: must be > 0", false},
		{"request that can never fit", func() error {
			_, err := c.OpenRoom(ctx, openReq(3, 1<<30))
			return err
		}, client.ErrInvalidArgument, codes.InvalidArgument, "exceeds the maximum number of tokens", false},
		{"page size mismatch", func() error {
			reg := prefillRank("10.0.0.2:8998", 1, 0)
			reg.PageSize = 32
			_, err := c.RegisterPrefill(ctx, reg)
			return err
		}, client.ErrFailedPrecondition, codes.FailedPrecondition, "Page size mismatch: prefill server has page_size=32, but decode server has page_size=64", false},
		{"release before success", func() error {
			_, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 1})
			return err
		}, client.ErrFailedPrecondition, codes.FailedPrecondition, "has not succeeded", false},
		{"bad send options", func() error {
			_, err := c.Prefill(prefillRank(addr, 1, 0)).SendRoom(ctx, 1, client.SendOptions{ChunkPages: -1})
			return err
		}, client.ErrInvalidArgument, codes.InvalidArgument, "ChunkPages", false},
	}
	families := []error{client.ErrNotFound, client.ErrAlreadyExists, client.ErrInvalidArgument, client.ErrFailedPrecondition,
		client.ErrResourceExhausted, client.ErrUnavailable, client.ErrUnauthenticated, client.ErrAborted,
		client.ErrDeadlineExceeded, client.ErrCanceled, client.ErrInternal, client.ErrRoomFailed}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want a *client.Error", err, err)
			}
			for _, f := range families {
				if got, want := errors.Is(err, f), f == tt.family; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, f, got, want)
				}
			}
			if got := status.Code(err); got != tt.code || e.Code() != tt.code {
				t.Errorf("status.Code = %s, (*Error).Code = %s, want %s", got, e.Code(), tt.code)
			}
			if !strings.Contains(e.Message(), tt.inMsg) || !strings.Contains(err.Error(), tt.inMsg) {
				t.Errorf("err = %q, want it to contain %q", err, tt.inMsg)
			}
			if e.RetryAfter() != 0 {
				t.Errorf("RetryAfter = %s, want 0", e.RetryAfter())
			}
		})
	}
}

// TestEveryCodeHasAFamily maps every code the gRPC stack can return.
func TestEveryCodeHasAFamily(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	tests := []struct {
		code   codes.Code
		family error
	}{
		{codes.Canceled, client.ErrCanceled},
		{codes.Unknown, client.ErrInternal},
		{codes.InvalidArgument, client.ErrInvalidArgument},
		{codes.DeadlineExceeded, client.ErrDeadlineExceeded},
		{codes.NotFound, client.ErrNotFound},
		{codes.AlreadyExists, client.ErrAlreadyExists},
		{codes.PermissionDenied, client.ErrPermissionDenied},
		{codes.ResourceExhausted, client.ErrResourceExhausted},
		{codes.FailedPrecondition, client.ErrFailedPrecondition},
		{codes.Aborted, client.ErrAborted},
		{codes.OutOfRange, client.ErrInvalidArgument},
		{codes.Unimplemented, client.ErrUnimplemented},
		{codes.Internal, client.ErrInternal},
		{codes.Unavailable, client.ErrUnavailable},
		{codes.DataLoss, client.ErrInternal},
		{codes.Unauthenticated, client.ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			in.fail(pb.Admin_GetStatus_FullMethodName, fault{n: 1, code: tt.code})
			_, err := c.Status(ctxT(t))
			if !errors.Is(err, tt.family) || status.Code(err) != tt.code {
				t.Errorf("Status() with %s = %v (code %s), want family %v", tt.code, err, status.Code(err), tt.family)
			}
			if got, want := errors.Is(err, context.Canceled), tt.code == codes.Canceled; got != want {
				t.Errorf("errors.Is(err, context.Canceled) = %v, want %v", got, want)
			}
			if got, want := errors.Is(err, context.DeadlineExceeded), tt.code == codes.DeadlineExceeded; got != want {
				t.Errorf("errors.Is(err, context.DeadlineExceeded) = %v, want %v", got, want)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	const token = "tok-5c1e"
	d := newDaemon(t, daemonConfig{server: func(c *server.Config) { c.AuthToken = token }})
	ctx := ctxT(t)
	tests := []struct {
		name string
		opts []client.Option
		want error
	}{
		{"no token", nil, client.ErrUnauthenticated},
		{"wrong token", []client.Option{client.WithToken("tok-wrong")}, client.ErrUnauthenticated},
		{"token", []client.Option{client.WithToken(token)}, nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := d.client(t, tt.opts...)
			_, err := c.OpenRoom(ctx, openReq(uint64(50+i), 100))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("OpenRoom = %v, want %v", err, tt.want)
			}
			if err != nil && status.Code(err) != codes.Unauthenticated {
				t.Errorf("status.Code = %s, want Unauthenticated", status.Code(err))
			}
			// A refused call stored nothing; reads need no token.
			_, err = c.GetRoom(ctx, &pb.GetRoomRequest{Room: uint64(50 + i)})
			if got, want := err == nil, tt.want == nil; got != want {
				t.Errorf("GetRoom after OpenRoom: %v; room stored = %v, want %v", err, got, want)
			}
			// RunHeartbeat stops on an error that repeating cannot fix.
			p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond))
			hctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if tt.want != nil {
				if err := p.RunHeartbeat(hctx); !errors.Is(err, client.ErrUnauthenticated) {
					t.Errorf("RunHeartbeat = %v, want ErrUnauthenticated", err)
				}
			}
		})
	}
}

func TestContextErrors(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	if _, err := c.OpenRoom(ctxT(t), openReq(61, 100)); err != nil { // waits for a prefill that never comes
		t.Fatalf("OpenRoom: %v", err)
	}
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
		defer cancel()
		room, err := c.WaitRoom(ctx, 61, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
		if room != nil || !errors.Is(err, client.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("WaitRoom = %v, %v; want ErrDeadlineExceeded", room, err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctxT(t))
		cancel()
		_, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 61})
		if !errors.Is(err, client.ErrCanceled) || !errors.Is(err, context.Canceled) || status.Code(err) != codes.Canceled {
			t.Errorf("GetRoom = %v, want ErrCanceled", err)
		}
	})
}

// ---- retries ----

func TestRetry(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	if _, err := c.OpenRoom(ctx, openReq(70, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	calls := func(method string, f func() error) (int, error) {
		before := in.count(method)
		err := f()
		return in.count(method) - before, err
	}
	getRoom := func() error {
		_, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 70})
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
				_, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 404})
				return err
			}, 1, client.ErrNotFound},
		{"Internal is not retried", pb.Rooms_GetRoom_FullMethodName,
			fault{n: 1, code: codes.Internal}, getRoom, 1, client.ErrInternal},
		{"Transfer is retried", pb.Rooms_Transfer_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Transfer(ctx, &pb.TransferRequest{Room: 70, Rank: &pb.PrefillRank{BootstrapAddr: addr}, NumPages: 1})
				return err // the room has no destination yet
			}, 2, client.ErrFailedPrecondition},
		{"ReportRunning is never retried", pb.Rooms_ReportRunning_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: []*pb.RunningUsage{{Room: 70, OutputLen: 3}}})
				return err
			}, 1, client.ErrUnavailable},
		{"RetractRoom is never retried", pb.Rooms_RetractRoom_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.RetractRoom(ctx, &pb.RetractRoomRequest{Room: 70, Mode: pb.RetractMode_RETRACT_MODE_RETRACT})
				return err
			}, 1, client.ErrUnavailable},
		{"ContinueGeneration is never retried", pb.Rooms_ContinueGeneration_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.ContinueGeneration(ctx)
				return err
			}, 1, client.ErrUnavailable},
		{"Drain is never retried", pb.Admin_Drain_FullMethodName,
			fault{n: 1, code: codes.Unavailable}, func() error {
				_, err := c.Drain(ctx)
				return err
			}, 1, client.ErrUnavailable},
		{"OpenRoom without a key is not retried", pb.Rooms_OpenRoom_FullMethodName,
			fault{n: 1, code: codes.Unavailable, after: true}, func() error {
				_, err := c.OpenRoom(ctx, openReq(71, 100))
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
	if _, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 71}); err != nil {
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
		resp, err := c.OpenRoom(ctx, req)
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
		resp, err := c.OpenRoom(ctx, req)
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
		if _, err := c.OpenRoom(ctx, req); !errors.Is(err, client.ErrAlreadyExists) {
			t.Errorf("second OpenRoom = %v, want ErrAlreadyExists", err)
		}
	})
}

func TestResourceExhaustedRetryAfter(t *testing.T) {
	in := newInjector()
	dc := in.config()
	dc.decode = func(c *prealloc.Config) { c.Admission.MaxQueued = 1 }
	d := newDaemon(t, dc)
	c := d.client(t)
	ctx := ctxT(t)
	// The first room waits for its prefill and fills the queue.
	if _, err := c.OpenRoom(ctx, openReq(90, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	before := in.count(pb.Rooms_OpenRoom_FullMethodName)
	_, err := c.OpenRoom(ctx, openReq(91, 100))
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
	if _, err := c.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	_, err := c.OpenRoom(ctx, openReq(95, 100))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("OpenRoom while draining = %v, want ErrUnavailable", err)
	}
	if d, ok := client.RetryAfter(err); !ok || d <= 0 {
		t.Errorf("RetryAfter = %s, %v; want the daemon's hint", d, ok)
	}
	st, err := c.Status(ctx)
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
	if _, err := c.OpenRoom(ctx, openReq(110, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	in.fail(pb.Rooms_WatchRoom_FullMethodName, fault{n: 1, code: codes.Unavailable, after: true})
	w, err := c.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 110})
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
	if _, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 110}); err != nil {
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
	room, err := c.GetRoom(ctx, &pb.GetRoomRequest{Room: 110})
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
	if _, err := c.OpenRoom(ctx, openReq(115, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	in.fail(pb.Rooms_WatchRoom_FullMethodName, fault{n: 100, code: codes.Unavailable, after: true})
	w, err := c.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 115})
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
	if _, err := c.OpenRoom(ctx, openReq(120, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	s, err := c.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 120, Rank: p.Rank()})
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
	if _, err := c.Transfer(ctx, &pb.TransferRequest{Room: 120, Rank: p.Rank(), NumPages: n, Last: true, Aux: &pb.Aux{RoomMarker: 120}}); err != nil {
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
	if _, err := c.OpenRoom(ctx, openReq(140, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	type result struct {
		room *pb.Room
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		r, err := c.WaitRoom(ctx, 140, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
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
	if _, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 140}); err != nil {
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
	c := d.client(t, fastRetry)
	ctx := ctxT(t)
	p := registered(t, c)
	in.fail(pb.Rooms_AwaitDestination_FullMethodName, fault{n: 1, code: codes.Unavailable})
	if _, err := c.OpenRoom(ctx, openReq(130, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	if _, err := p.SendRoom(ctx, 130, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if n := in.count(pb.Rooms_AwaitDestination_FullMethodName); n != 2 {
		t.Errorf("%d AwaitDestination calls, want 2", n)
	}
}

// ---- heartbeats ----

// TestHeartbeatReregistersAfterNotFound: another instance takes the rank over
// (a new instance id), so the daemon answers the old one's heartbeat with
// NotFound; the loop registers again and the rank is alive.
func TestHeartbeatReregistersAfterNotFound(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t)
	ctx := ctxT(t)
	hbErrs := make(chan error, 16)
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(2*time.Millisecond), client.OnHeartbeatError(func(err error) {
		select {
		case hbErrs <- err:
		default:
		}
	}))
	reg, err := p.Register(ctx)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	if reg.GetHeartbeatInterval().AsDuration() <= 0 {
		t.Fatalf("registration gives no heartbeat interval: %v", reg)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.RunHeartbeat(runCtx) }()
	in.waitCalls(t, pb.Bootstrap_Heartbeat_FullMethodName, 2)

	other := prefillRank(addr, 1, 0)
	other.InstanceId = "replacement"
	if resp, err := c.RegisterPrefill(ctx, other); err != nil || !resp.GetReplaced() {
		t.Fatalf("RegisterPrefill(replacement) = %v, %v; want a replacement", resp, err)
	}
	select {
	case err := <-hbErrs:
		if !errors.Is(err, client.ErrNotFound) {
			t.Errorf("heartbeat error = %v, want ErrNotFound", err)
		}
	case <-ctx.Done():
		t.Fatal("the heartbeat loop never saw NotFound")
	}
	in.waitCalls(t, pb.Bootstrap_RegisterPrefill_FullMethodName, 3) // ours, the replacement's, ours again
	regs := in.requests(pb.Bootstrap_RegisterPrefill_FullMethodName)
	if got := regs[2].(*pb.RegisterPrefillRequest).GetInstanceId(); got != "prefill-"+addr {
		t.Errorf("third registration by %q, want the loop's instance", got)
	}
	// The loop goes on beating, successfully, as the original instance.
	hb := in.count(pb.Bootstrap_Heartbeat_FullMethodName)
	in.waitCalls(t, pb.Bootstrap_Heartbeat_FullMethodName, hb+2)
	if _, err := c.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: p.Rank(), InstanceId: "prefill-" + addr}); err != nil {
		t.Errorf("Heartbeat as the re-registered instance: %v", err)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
	}
}

// TestRunHeartbeatRegistersFirst: a Prefill that never registered registers
// from the loop.
func TestRunHeartbeatRegistersFirst(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t)
	p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond))
	ctx, stop := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- p.RunHeartbeat(ctx) }()
	in.waitCalls(t, pb.Bootstrap_Heartbeat_FullMethodName, 1)
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("RunHeartbeat = %v, want context.Canceled", err)
	}
	if p.Registration() == nil || in.count(pb.Bootstrap_RegisterPrefill_FullMethodName) != 1 {
		t.Errorf("registration %v after %d RegisterPrefill calls, want one registration", p.Registration(), in.count(pb.Bootstrap_RegisterPrefill_FullMethodName))
	}
}

// ---- construction, tracing, Close ----

func TestTracePropagation(t *testing.T) {
	var mu sync.Mutex
	var traceparent []string
	capture := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		traceparent = md.Get("traceparent")
		mu.Unlock()
		return h(ctx, req)
	}
	d := newDaemon(t, daemonConfig{unary: []grpc.UnaryServerInterceptor{capture}})
	tid := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(ctxT(t), sc)
	tests := []struct {
		name string
		opts []client.Option
		want bool
	}{
		{"W3C by default", nil, true},
		{"propagator replaced", []client.Option{client.WithPropagator(propagation.Baggage{})}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := d.client(t, tt.opts...)
			if _, err := c.Status(ctx); err != nil {
				t.Fatalf("Status: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			got := len(traceparent) == 1 && strings.HasPrefix(traceparent[0], "00-"+tid.String()+"-")
			if got != tt.want {
				t.Errorf("traceparent = %q, want the caller's trace %s: %v", traceparent, tid, tt.want)
			}
		})
	}
}

// TestSpans: the client's span is a child of the caller's, and the daemon's
// server span and room span join the caller's trace.
func TestSpans(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	d := newDaemon(t, daemonConfig{tracer: tp})
	c := d.client(t, client.WithTracerProvider(tp))
	p := registered(t, c)

	ctx, step := tp.Tracer("decode-engine").Start(ctxT(t), "schedule request")
	sent := make(chan error, 1)
	go func() {
		_, err := p.SendRoom(ctxT(t), 150, client.SendOptions{})
		sent <- err
	}()
	if _, err := c.OpenAndWait(ctx, openReq(150, 100)); err != nil {
		t.Fatalf("OpenAndWait: %v", err)
	}
	if _, err := c.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 150}); err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	step.End()
	if err := <-sent; err != nil {
		t.Fatalf("SendRoom: %v", err)
	}

	want := step.SpanContext().TraceID()
	find := func(name string, kind trace.SpanKind) tracetest.SpanStub {
		t.Helper()
		for _, s := range spans.GetSpans() {
			if s.Name == name && s.SpanKind == kind && s.SpanContext.TraceID() == want {
				return s
			}
		}
		t.Fatalf("no %s span %q in the caller's trace %s", kind, name, want)
		return tracetest.SpanStub{}
	}
	cli := find("decodeplane.v1.Rooms/OpenRoom", trace.SpanKindClient)
	if cli.Parent.SpanID() != step.SpanContext().SpanID() {
		t.Errorf("client span's parent = %s, want the caller's span %s", cli.Parent.SpanID(), step.SpanContext().SpanID())
	}
	srv := find("decodeplane.v1.Rooms/OpenRoom", trace.SpanKindServer)
	if srv.Parent.SpanID() != cli.SpanContext.SpanID() || !srv.Parent.IsRemote() {
		t.Errorf("server span's parent = %v, want the client span %s (remote)", srv.Parent, cli.SpanContext.SpanID())
	}
	find("room", trace.SpanKindInternal)
}

func TestNewFromConn(t *testing.T) {
	d := newDaemon(t, daemonConfig{server: func(c *server.Config) { c.AuthToken = "tok" }})
	conn, err := grpc.NewClient("passthrough:///bufnet", d.dialer(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := ctxT(t)

	c, err := client.NewFromConn(conn, client.WithToken("tok"), fastRetry)
	if err != nil {
		t.Fatalf("NewFromConn: %v", err)
	}
	if c.Conn() != conn {
		t.Error("Conn() is not the given connection")
	}
	if _, err := c.Drain(ctx); err != nil { // needs the token
		t.Fatalf("Drain with WithToken over NewFromConn: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Status(ctx); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("Status after Close = %v, want ErrCanceled", err)
	}
	if _, err := c.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 1}); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("WatchRoom after Close = %v, want ErrCanceled", err)
	}
	// The connection is the caller's: still open.
	if _, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{}); err != nil {
		t.Errorf("the connection was closed by Client.Close: %v", err)
	}

	for _, opt := range []struct {
		name string
		opt  client.Option
	}{
		{"WithTLS", client.WithTLS(nil)},
		{"WithDialOptions", client.WithDialOptions()},
		{"WithTracerProvider", client.WithTracerProvider(nil)},
		{"WithPropagator", client.WithPropagator(propagation.TraceContext{})},
	} {
		if _, err := client.NewFromConn(conn, opt.opt); err == nil || !strings.Contains(err.Error(), opt.name) {
			t.Errorf("NewFromConn(%s) = %v, want an error naming it", opt.name, err)
		}
	}
	if _, err := client.NewFromConn(nil); err == nil {
		t.Error("NewFromConn(nil) succeeded")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  client.Option
		want string
	}{
		{"empty token", client.WithToken(""), "WithToken"},
		{"token with a space", client.WithToken("a b"), "WithToken"},
		{"negative attempts", client.WithRetry(client.RetryPolicy{MaxAttempts: -1}), "MaxAttempts"},
		{"negative backoff", client.WithRetry(client.RetryPolicy{InitialBackoff: -time.Second}), "negative"},
		{"max below initial", client.WithRetry(client.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}), "MaxBackoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := client.New("127.0.0.1:7600", tt.opt)
			if err == nil {
				c.Close()
				t.Fatalf("New succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want it to name %s", err, tt.want)
			}
		})
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	if _, err := c.Status(ctxT(t)); err != nil {
		t.Fatalf("Status: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.Status(ctxT(t)); !errors.Is(err, client.ErrCanceled) {
		t.Errorf("Status after Close = %v, want ErrCanceled", err)
	}
}

// TestUnreachableDaemonIsUnavailable: a daemon that is not there is
// ErrUnavailable, after the retries.
func TestUnreachableDaemonIsUnavailable(t *testing.T) {
	lis := bufconn.Listen(1 << 10)
	if err := lis.Close(); err != nil { // nobody accepts
		t.Fatal(err)
	}
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(dialer), fastRetry)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Status(ctxT(t))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("Status = %v, want ErrUnavailable", err)
	}
}
