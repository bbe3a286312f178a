package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/transfer"
)

func TestHappyPath(t *testing.T) { eachTransport(t, testHappyPath) }

func testHappyPath(t *testing.T, tr client.Transport) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t, client.WithTransport(tr))
	ctx := ctxT(t)
	p := registered(t, c)

	sent := make(chan error, 1)
	var dest *pb.Destination
	go func() {
		var err error
		dest, err = p.SendRoom(ctx, 100, client.SendOptions{})
		sent <- err
	}()
	room, err := c.Engine().OpenAndWait(ctx, openReq(100, 1000))
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

	rel, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 100})
	if err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	if rel.GetPagesReleased() != 16 || rel.GetAlreadyReleased() {
		t.Errorf("ReleaseRoom = %v, want 16 pages, not already released", rel)
	}
	// Idempotent.
	if rel, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 100}); err != nil || !rel.GetAlreadyReleased() {
		t.Errorf("second ReleaseRoom = %v, %v; want already released", rel, err)
	}
	got, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 100})
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
	list, err := c.Admin().ListRooms(ctx, &pb.ListRoomsRequest{BootstrapAddr: addr})
	if err != nil || list.GetTotal() != 1 || list.GetRooms()[0].GetRoom() != 100 {
		t.Errorf("ListRooms = %v, %v; want room 100 alone", list, err)
	}
	assertPoolFull(t, c)
}

func TestSendRoomChunks(t *testing.T) { eachTransport(t, testSendRoomChunks) }

func testSendRoomChunks(t *testing.T, tr client.Transport) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, client.WithTransport(tr))
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.Engine().OpenRoom(ctx, openReq(5, 1000)); err != nil { // 16 pages
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
		req := &pb.TransferRequest{Room: 5, Rank: rank, ChunkIndex: uint32(i), PageOffset: off, NumPages: n, Source: &pb.TransferSource{Buffer: "kv0"}, Attempt: 1, Incarnation: d.Incarnation()}
		for j := range n {
			req.Source.PageIndices = append(req.Source.PageIndices, int32(1000+off+j))
		}
		if i == 3 {
			req.Last = true
			req.Aux = &pb.Aux{RoomMarker: 5, OutputIds: []int32{1234}}
		}
		want = append(want, req)
	}
	if diff := cmp.Diff(want, in.requests(opMethod(tr, pb.Rooms_Transfer_FullMethodName)), protocmp.Transform()); diff != "" {
		t.Errorf("Transfer requests (-want +got):\n%s", diff)
	}
	if n := in.count(opMethod(client.TransportStreams+client.TransportUnary-tr, pb.Rooms_Transfer_FullMethodName)); n != 0 {
		t.Errorf("%d chunks on the other transport than %s, want none", n, tr)
	}
	for i, ch := range sources {
		if got, want := ch.Pages(), dest.GetPageIndices()[ch.PageOffset:ch.PageOffset+ch.NumPages]; !cmp.Equal(got, want) {
			t.Errorf("chunk %d Pages() = %v, want %v", i, got, want)
		}
	}
	room, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 5})
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
	// The race is the unary API's (a claim stream and a Transfer call); a
	// session's claim is recorded before its result is sent.
	c := d.client(t, fastRetry, client.WithTransport(client.TransportUnary))
	ctx := ctxT(t)
	p := registered(t, c)
	if _, err := c.Engine().OpenRoom(ctx, openReq(160, 300)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	if _, err := p.SendRoom(ctx, 160, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom: %v", err)
	}
	if n := transfers.Load(); n != 1 {
		t.Errorf("%d Transfer calls, want 1 (the daemon takes the first chunk as the rank's claim)", n)
	}
	if r, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 160}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("GetRoom = %v, %v; want SUCCEEDED", r, err)
	}
}

// TestDummyDestination: an MLA decode at TP 1 pulls from prefill TP rank 0
// only; prefill rank 1 gets a dummy destination, sends nothing and sees the
// room's end.
func TestDummyDestination(t *testing.T) { eachTransport(t, testDummyDestination) }

func testDummyDestination(t *testing.T, tr client.Transport) {
	// Rank 0's chunk waits until rank 1 has been sent its dummy destination:
	// otherwise the room could succeed before rank 1 claims it, and rank 1
	// would only see the end.
	dummySent := make(chan struct{})
	var once sync.Once
	in := newInjector()
	in.sent = func(_ string, m any) {
		for _, e := range unpacked(m.(proto.Message)) {
			ev, ok := e.(*pb.DestinationEvent)
			if pe, isSession := e.(*pb.PrefillEvent); isSession {
				ev, ok = pe.GetRoom().GetEvent(), pe.GetRoom() != nil
			}
			if ok && ev.GetDestination().GetDummy() {
				once.Do(func() { close(dummySent) })
			}
		}
	}
	dc := in.config()
	dc.decode = func(c *kvlayout.Config) {
		c.Pool.Kind = kvlayout.KindMLA
		c.Pool.KVHeads, c.Pool.HeadDim = 0, 0
		c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 512, 64
	}
	d := newDaemon(t, dc)
	c := d.client(t, client.WithTransport(tr))
	ctx := ctxT(t)
	d.engine.SetFault(func(transfer.ChunkOp) error {
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
	if _, err := c.Engine().OpenRoom(ctx, openReq(9, 700)); err != nil {
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
	chunks := in.requests(opMethod(tr, pb.Rooms_Transfer_FullMethodName))
	for _, m := range chunks {
		if req := m.(*pb.TransferRequest); req.GetRank().GetTpRank() != 0 {
			t.Errorf("a dummy rank sent a chunk: %v", req)
		}
	}
	if len(chunks) != 1 {
		t.Errorf("%d chunks sent over %s, want rank 0's one", len(chunks), tr)
	}
	room, err := c.Engine().WaitRoom(ctx, 9, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
	if err != nil || room.GetChunksDone() != 1 {
		t.Errorf("WaitRoom = %v, %v; want SUCCEEDED after 1 chunk", room, err)
	}
}

func TestReportRoom(t *testing.T) { eachTransport(t, testReportRoom) }

func testReportRoom(t *testing.T, tr client.Transport) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t, client.WithTransport(tr))
	ctx := ctxT(t)
	p := registered(t, c)

	t.Run("moved", func(t *testing.T) {
		if _, err := c.Engine().OpenRoom(ctx, openReq(11, 640)); err != nil { // 10 pages
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
		room, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 11})
		// 640 tokens x 2 (K, V) x 8 heads x 128 x 2 bytes x 32 layers (the
		// test pool's layout): what the layout says, not what a prefill claims.
		const want = 640 * 2 * 8 * 128 * 2 * 32
		if total != want || err != nil || room.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || room.GetBytesTransferred() != want {
			t.Errorf("GetRoom = %v, %v (moved %d); want SUCCEEDED with %d bytes", room, err, total, want)
		}
	})
	t.Run("move failed", func(t *testing.T) {
		if _, err := c.Engine().OpenRoom(ctx, openReq(12, 640)); err != nil {
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
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 11}); err != nil {
		t.Fatalf("ReleaseRoom: %v", err)
	}
	assertPoolFull(t, c)
}

func TestTransferFailureFailsTheRoom(t *testing.T) { eachTransport(t, testTransferFailureFailsTheRoom) }

func testTransferFailureFailsTheRoom(t *testing.T, tr client.Transport) {
	d := newDaemon(t, daemonConfig{})
	d.engine.SetFault(func(op transfer.ChunkOp) error {
		if op.ChunkIndex == 1 {
			return errors.New("nic down")
		}
		return nil
	})
	c := d.client(t, client.WithTransport(tr))
	ctx := ctxT(t)
	p := registered(t, c)

	waited := make(chan error, 1)
	var waitedRoom *pb.Room
	go func() {
		var err error
		waitedRoom, err = c.Engine().OpenAndWait(ctx, openReq(21, 1000))
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
	if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 21}); !errors.Is(err, client.ErrFailedPrecondition) {
		t.Errorf("ReleaseRoom(failed room) = %v, want ErrFailedPrecondition", err)
	}
	assertPoolFull(t, c)
}

func TestAbortEndsTheWait(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	// No prefill registers: the room waits for it.
	if _, err := c.Engine().OpenRoom(ctx, openReq(31, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := c.Engine().WaitRoom(ctx, 31, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
		waited <- err
	}()
	ab, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 31})
	if err != nil || ab.GetAlreadyTerminal() {
		t.Fatalf("AbortRoom = %v, %v", ab, err)
	}
	var rf *client.RoomFailedError
	if err := <-waited; !errors.As(err, &rf) || rf.Code != pb.FailureCode_FAILURE_CODE_ABORTED || rf.Message != "Aborted by AbortReq." {
		t.Errorf("WaitRoom = %v, want ABORTED \"Aborted by AbortReq.\"", err)
	}
	// Waiting for a phase the room is in, or went through, returns at once.
	for _, ph := range []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_FAILED, pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL} {
		if r, err := c.Engine().WaitRoom(ctx, 31, ph); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
			t.Errorf("WaitRoom(%s) = %v, %v; want the failed room, no error", ph, r, err)
		}
	}
	// A phase it never reached: the failure.
	if _, err := c.Engine().WaitRoom(ctx, 31, pb.RoomPhase_ROOM_PHASE_SUCCEEDED); !errors.Is(err, client.ErrRoomFailed) {
		t.Errorf("WaitRoom(SUCCEEDED) of a failed room = %v, want ErrRoomFailed", err)
	}
	// Aborting again is OK.
	if ab, err := c.Engine().AbortRoom(ctx, &pb.AbortRoomRequest{Room: 31}); err != nil || !ab.GetAlreadyTerminal() {
		t.Errorf("second AbortRoom = %v, %v; want already terminal", ab, err)
	}
}

func TestConcurrentRooms(t *testing.T) { eachTransport(t, testConcurrentRooms) }

func testConcurrentRooms(t *testing.T, tr client.Transport) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t, client.WithTransport(tr)) // one client shared by every goroutine
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
			if _, err := c.Engine().OpenAndWait(ctx, openReq(room, uint32(100+50*i))); err != nil {
				t.Errorf("OpenAndWait(%d): %v", room, err)
				return
			}
			if _, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
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
		resp, err := c.Engine().LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: addr, Rooms: []uint64{5, 6}, Hints: []*pb.RoomHint{{Room: 6, DpRank: 0}}})
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
