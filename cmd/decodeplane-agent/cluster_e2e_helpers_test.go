package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The end-to-end cluster: one daemon and its agent, the prefill instances
// the tests play, and the waits and checks on its rooms.

// cluster is one daemon and its agent.
type cluster struct {
	t        *testing.T
	m        model
	dtp      int
	daemon   *proc
	agent    *proc
	dconn    *grpc.ClientConn
	aconn    *grpc.ClientConn
	agentAt  string
	agentBin string
	staged   bool // staging.enabled
	boot     pb.BootstrapClient
	rooms    pb.RoomsClient
	staging  pb.StagingClient
	admin    pb.AdminClient
	xfer     transferv1.TransferAgentClient
}

func startAgent(t *testing.T, bin, addr string, extra ...string) (*proc, *grpc.ClientConn) {
	t.Helper()
	p := start(t, "agent", bin, append([]string{"--listen", addr, "--log-level", "debug"}, extra...)...)
	conn := dial(t, addr)
	waitHealth(t, conn, p, healthpb.HealthCheckResponse_SERVING)
	return p, conn
}

// newCluster starts an agent and a daemon on the delegated path.
func newCluster(t *testing.T, m model, dtp int, agentArgs []string, daemonSets ...string) *cluster {
	t.Helper()
	dbin, abin := binaries(t)
	c := &cluster{t: t, m: m, dtp: dtp, agentAt: freeAddr(t), agentBin: abin}
	c.agent, c.aconn = startAgent(t, abin, c.agentAt, agentArgs...)
	daddr := freeAddr(t)
	args := []string{"serve", "--listen", daddr, "--set", "server.metrics_listen=", "--transfer-path", "delegate", "--agent", c.agentAt,
		"--log-level", "debug",
		"--set", "transfer.delegate.health_interval=200ms", "--set", "transfer.delegate.batch_timeout=20s",
		"--set", "timeouts.heartbeat_interval=10m", "--set", "transfer.backend=mooncake",
		"--set", fmt.Sprintf("kv_pool.num_layers=%d", m.layers), "--set", "kv_pool.dtype=bf16",
		"--set", fmt.Sprintf("kv_pool.page_size=%d", m.pageSize), "--set", "kv_pool.total_tokens=8192",
		"--set", "kv_pool.request_slots=16", "--set", fmt.Sprintf("parallel.attn_tp=%d", dtp)}
	if m.mla {
		args = append(args, "--set", "kv_pool.kind=mla", "--set", "kv_pool.kv_lora_rank=32", "--set", "kv_pool.qk_rope_head_dim=16")
	} else {
		args = append(args, "--set", "kv_pool.kind=gqa", "--set", fmt.Sprintf("kv_pool.kv_heads=%d", m.heads), "--set", fmt.Sprintf("kv_pool.head_dim=%d", m.headDim))
	}
	for _, s := range daemonSets {
		args = append(args, "--set", s)
		c.staged = c.staged || s == "staging.enabled=true"
	}
	c.daemon = start(t, "daemon", dbin, args...)
	c.dconn = dial(t, daddr)
	waitHealth(t, c.dconn, c.daemon, healthpb.HealthCheckResponse_SERVING)
	c.boot, c.rooms, c.staging, c.admin = pb.NewBootstrapClient(c.dconn), pb.NewRoomsClient(c.dconn), pb.NewStagingClient(c.dconn), pb.NewAdminClient(c.dconn)
	c.xfer = transferv1.NewTransferAgentClient(c.aconn)
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	t.Cleanup(cancel)
	return ctx
}

// prefill is one prefill instance played by the test.
type prefill struct {
	c     *cluster
	addr  string
	tp    int
	pages int // pages of each rank's KV buffer
}

func (p *prefill) rank(r int) *pb.PrefillRank {
	return &pb.PrefillRank{BootstrapAddr: p.addr, TpRank: uint32(r)}
}
func (p *prefill) buffer(r int) string { return fmt.Sprintf("prefill/%s/tp%d/kv", p.addr, r) }

// newPrefill registers a prefill instance's ranks with the daemon and their
// KV buffers with the agent.
func (c *cluster) newPrefill(addr string, tp int) *prefill {
	t := c.t
	t.Helper()
	p := &prefill{c: c, addr: addr, tp: tp, pages: 128}
	p.registerBuffers()
	for r := range tp {
		req := &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: fmt.Sprintf("10.9.0.%d:%d", r+1, 17000+r),
			Parallel: &pb.ParallelInfo{AttnTpSize: uint32(tp), AttnTpRank: uint32(r), AttnCpSize: 1, AttnDpSize: 1, PpSize: 1},
			PageSize: uint32(c.m.pageSize), KvCacheDtype: "bf16", InstanceId: "prefill-" + addr}
		if _, err := c.boot.RegisterPrefill(ctxT(t), req); err != nil {
			t.Fatalf("RegisterPrefill(%s rank %d): %v", addr, r, err)
		}
	}
	return p
}

func (p *prefill) registerBuffers() {
	t := p.c.t
	t.Helper()
	req := &transferv1.RegisterBuffersRequest{}
	for r := range p.tp {
		req.Buffers = append(req.Buffers, &transferv1.Buffer{Name: p.buffer(r), Kind: transferv1.BufferKind_BUFFER_KIND_PREFILL_KV,
			Length: uint64(p.pages * p.c.m.pageBytes(p.tp)), ItemSize: uint64(p.c.m.pageBytes(p.tp))})
	}
	if _, err := p.c.xfer.RegisterBuffers(ctxT(t), req); err != nil {
		t.Fatalf("RegisterBuffers: %v", err)
	}
}

// srcPage is where the prefill keeps logical page i of a room: its own page
// numbering, deliberately unlike the decode's.
func (p *prefill) srcPage(i int) int32 { return int32(p.pages - 1 - i) }

// fill writes the room's KV into every rank's buffer (WriteBuffer).
func (p *prefill) fill(room uint64, numPages int) {
	t := p.c.t
	t.Helper()
	pb := p.c.m.pageBytes(p.tp)
	for r := range p.tp {
		for i := range numPages {
			if _, err := p.c.xfer.WriteBuffer(ctxT(t), &transferv1.WriteBufferRequest{Name: p.buffer(r), Offset: uint64(int(p.srcPage(i)) * pb),
				Data: p.c.m.page(room, p.tp, r, i)}); err != nil {
				t.Fatalf("WriteBuffer(%s page %d): %v", p.buffer(r), p.srcPage(i), err)
			}
		}
	}
}

// open opens a room of promptLen tokens, fills the prefill's KV, claims the
// destination from every rank and waits until the room is claimed. It
// returns each rank's destination.
func (c *cluster) open(p *prefill, room uint64, promptLen int) []*pb.Destination {
	t := c.t
	t.Helper()
	if _, err := c.rooms.OpenRoom(ctxT(t), &pb.OpenRoomRequest{Rid: fmt.Sprintf("req-%d", room), BootstrapAddr: p.addr, Room: room,
		PromptLen: uint32(promptLen), MaxNewTokens: 8}); err != nil {
		t.Fatalf("OpenRoom(%d): %v", room, err)
	}
	dests := make([]*pb.Destination, p.tp)
	for r := range p.tp {
		ctx, cancel := context.WithCancel(ctxT(t))
		stream, err := c.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: p.rank(r)})
		if err != nil {
			t.Fatalf("AwaitDestination(%d, rank %d): %v", room, r, err)
		}
		ev, err := stream.Recv()
		cancel()
		if err != nil || ev.GetDestination() == nil {
			t.Fatalf("AwaitDestination(%d, rank %d) = %v, %v; want a destination", room, r, ev, err)
		}
		dests[r] = ev.GetDestination()
	}
	pages := 0
	for _, d := range dests {
		pages = max(pages, len(d.GetPageIndices()))
	}
	p.fill(room, pages)
	c.waitPhase(room, func(ph pb.RoomPhase) bool {
		return ph == pb.RoomPhase_ROOM_PHASE_CLAIMED || ph == pb.RoomPhase_ROOM_PHASE_TRANSFERRING
	}, "claimed")
	return dests
}

// waitPhase watches the room until pred holds for its phase.
func (c *cluster) waitPhase(room uint64, pred func(pb.RoomPhase) bool, what string) *pb.Room {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	stream, err := c.rooms.WatchRoom(ctx, &pb.WatchRoomRequest{Room: room})
	if err != nil {
		t.Fatalf("WatchRoom(%d): %v", room, err)
	}
	var last *pb.Room
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("room %d never became %s (last %v): %v", room, what, last, err)
		}
		last = ev.GetRoom()
		if pred(last.GetPhase()) {
			return last
		}
		if ev.GetTerminal() {
			t.Fatalf("room %d ended %s (%v) before becoming %s", room, last.GetPhase(), last.GetFailure(), what)
		}
	}
}

func (c *cluster) waitSucceeded(room uint64) {
	c.t.Helper()
	c.waitPhase(room, func(ph pb.RoomPhase) bool { return ph == pb.RoomPhase_ROOM_PHASE_SUCCEEDED }, "succeeded")
}

// verify reads every destination page of every decode rank back from the
// agent and compares every byte (each decode rank's own head range), then
// the metadata slot. It returns the first difference.
func (c *cluster) verify(room uint64, d *pb.Destination, outputIDs []int32) error {
	t := c.t
	t.Helper()
	pbytes := c.m.pageBytes(c.dtp)
	for e := range c.dtp {
		name := fmt.Sprintf("decode/dp%d/tp%d/kv", d.GetDecodeDpRank(), e)
		for i, page := range d.GetPageIndices() {
			resp, err := c.xfer.ReadBuffer(ctxT(t), &transferv1.ReadBufferRequest{Name: name, Offset: uint64(int(page) * pbytes), Length: uint64(pbytes)})
			if err != nil {
				return fmt.Errorf("ReadBuffer(%s page %d): %v", name, page, err)
			}
			if err := c.m.mismatch(c.dtp, e, int(page), i, resp.GetData(), c.m.page(room, c.dtp, e, i)); err != nil {
				return err
			}
		}
	}
	meta := fmt.Sprintf("decode/dp%d/meta", d.GetDecodeDpRank())
	resp, err := c.xfer.ReadBuffer(ctxT(t), &transferv1.ReadBufferRequest{Name: meta, Offset: uint64(d.GetMetadataSlot()) * 64, Length: 64})
	if err != nil {
		return fmt.Errorf("ReadBuffer(%s slot %d): %v", meta, d.GetMetadataSlot(), err)
	}
	slot := resp.GetData()
	if got := binary.LittleEndian.Uint64(slot); got != room {
		return fmt.Errorf("metadata slot %d holds room marker %d, want %d", d.GetMetadataSlot(), got, room)
	}
	for i, id := range outputIDs {
		if got := int32(binary.LittleEndian.Uint32(slot[8+4*i:])); got != id {
			return fmt.Errorf("metadata slot %d output id %d = %d, want %d", d.GetMetadataSlot(), i, got, id)
		}
	}
	return nil
}

// settled checks the daemon is back to idle: no live room, every shard's
// ledger full, every staging ring empty.
// ledgerFull reports whether every shard's pages and slots are all free.
func (c *cluster) ledgerFull() bool {
	st, err := c.admin.GetStatus(ctxT(c.t), &pb.GetStatusRequest{})
	if err != nil {
		c.t.Fatalf("GetStatus: %v", err)
	}
	for _, sh := range st.GetShards() {
		if sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() || sh.GetMetadataSlotsFree() != sh.GetMetadataSlotsTotal() {
			return false
		}
	}
	return true
}

// waitAWhile blocks for d on a timer (a poll interval, not a synchronisation).
func waitAWhile(t *testing.T, d time.Duration) {
	select {
	case <-time.After(d):
	case <-t.Context().Done():
	}
}

func (c *cluster) settled() {
	t := c.t
	t.Helper()
	st, err := c.admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	if err != nil {
		t.Fatalf("GetStatus: %v", err)
	}
	for phase, n := range st.GetRoomsByPhase() {
		if n > 0 && phase != "released" && phase != "failed" {
			t.Errorf("%d rooms still %s", n, phase)
		}
	}
	for _, sh := range st.GetShards() {
		if sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() || sh.GetMetadataSlotsFree() != sh.GetMetadataSlotsTotal() {
			t.Errorf("shard %d ledger not full: pages %d/%d, req slots %d/%d, metadata slots %d/%d", sh.GetDpRank(),
				sh.GetPagesFree(), sh.GetPagesTotal(), sh.GetReqSlotsFree(), sh.GetReqSlotsTotal(), sh.GetMetadataSlotsFree(), sh.GetMetadataSlotsTotal())
		}
	}
	if !c.staged {
		return
	}
	for _, wm := range c.watermarks() {
		if wm.GetLiveAllocations() != 0 || wm.GetRound() != wm.GetHeadRound() || wm.GetTail() != wm.GetHead() {
			t.Errorf("staging ring of decode tp %d not empty: %v", wm.GetDecodeTpRank(), wm)
		}
	}
}

// watermarks returns the current watermark of every decode TP rank's ring.
func (c *cluster) watermarks() []*pb.Watermark {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	stream, err := c.staging.WatchWatermark(ctx, &pb.WatchWatermarkRequest{DecodeDpRank: 0})
	if err != nil {
		t.Fatalf("WatchWatermark: %v", err)
	}
	got := map[uint32]*pb.Watermark{}
	for len(got) < c.dtp {
		wm, err := stream.Recv()
		if err != nil {
			t.Fatalf("WatchWatermark: %v", err)
		}
		got[wm.GetDecodeTpRank()] = wm
	}
	out := make([]*pb.Watermark, 0, len(got))
	for e := range c.dtp {
		out = append(out, got[uint32(e)])
	}
	return out
}

// transferRoom moves a room with Rooms.Transfer (the daemon's engine copies
// from the prefill buffers): chunks of chunkPages pages, aux with the last.
func (c *cluster) transferRoom(p *prefill, room uint64, dests []*pb.Destination, chunkPages int, outputIDs []int32) {
	t := c.t
	t.Helper()
	for r := range p.tp {
		if dests[r].GetDummy() {
			continue
		}
		n := len(dests[r].GetPageIndices())
		for ci, off := 0, 0; off < n; ci, off = ci+1, off+chunkPages {
			k := min(chunkPages, n-off)
			req := &pb.TransferRequest{Room: room, Rank: p.rank(r), ChunkIndex: uint32(ci), PageOffset: uint32(off), NumPages: uint32(k),
				Last: off+k == n, Source: &pb.TransferSource{Buffer: p.buffer(r)}}
			for i := off; i < off+k; i++ {
				req.Source.PageIndices = append(req.Source.PageIndices, p.srcPage(i))
			}
			if req.Last {
				req.Aux = &pb.Aux{RoomMarker: room, OutputIds: outputIDs}
			}
			if _, err := c.rooms.Transfer(ctxT(t), req); err != nil {
				t.Fatalf("Transfer(room %d rank %d chunk %d): %v", room, r, ci, err)
			}
		}
	}
}

func (c *cluster) release(room uint64) {
	c.t.Helper()
	if _, err := c.rooms.ReleaseRoom(ctxT(c.t), &pb.ReleaseRoomRequest{Room: room}); err != nil {
		c.t.Fatalf("ReleaseRoom(%d): %v", room, err)
	}
}

func (c *cluster) failed(room uint64) *pb.Room {
	c.t.Helper()
	return c.waitPhase(room, func(ph pb.RoomPhase) bool { return ph == pb.RoomPhase_ROOM_PHASE_FAILED }, "failed")
}
