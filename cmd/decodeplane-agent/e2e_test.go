package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The end-to-end tests run the daemon binary (transfer.path delegate) against
// the reference agent binary. The test plays the prefill ranks with the raw
// generated stubs: it registers and fills their KV buffers at the agent with
// a deterministic pattern, drives rooms through the daemon, and reads the
// decode KV pages back from the agent to check every byte of every page in
// the expected head ranges.

// e2eTimeout bounds every wait; nothing should come close.
const e2eTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	e2e.Cleanup()
	os.Exit(code)
}

// binaries builds the daemon and the agent once per test run
// (internal/testing/e2e).
func binaries(t *testing.T) (daemon, agent string) {
	t.Helper()
	return e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane"), e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-agent")
}

// proc is a running binary.
type proc = e2e.Proc

// start runs a binary with a clean environment; cleanup kills it if it is
// still running and prints its output when the test failed.
func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	return e2e.Start(t, name, bin, nil, args...)
}

func freeAddr(t *testing.T) string { return e2e.FreeAddr(t) }

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitHealth waits until the daemon's or agent's health is want, watching
// the stream (no polling).
func waitHealth(t *testing.T, conn *grpc.ClientConn, p *proc, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	e2e.WaitHealth(t, conn, p, want, e2eTimeout)
}

// model is the KV geometry shared by prefill and decode.
type model struct {
	layers, heads, headDim, dtype, pageSize int
	mla                                     bool
	rowBytes                                int // MLA: (kv_lora_rank + qk_rope_head_dim) × dtype
}

func (m model) headBytes() int { return m.headDim * m.dtype }

// headsPerRank is max(1, heads / tp).
func (m model) headsPerRank(tp int) int { return max(1, m.heads/tp) }

// pageBytes is one page of a rank's buffer: every layer, K and V.
func (m model) pageBytes(tp int) int {
	if m.mla {
		return m.layers * m.pageSize * m.rowBytes
	}
	return m.layers * 2 * m.pageSize * m.headsPerRank(tp) * m.headBytes()
}

// value is the byte every rank must hold for (room, layer, kv, token, global
// head, byte within the head row): a mix of all of them.
func value(room uint64, layer, kv, token, head, b int) byte {
	x := room*0x9e3779b97f4a7c15 ^ uint64(layer)<<52 ^ uint64(kv)<<50 ^ uint64(token)<<24 ^ uint64(head)<<12 ^ uint64(b)
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return byte(x)
}

// page renders logical page i of room as rank `rank` of attention TP `tp`
// holds it: heads [rank·hp, (rank+1)·hp) (MHA/GQA, tp <= heads), or the
// latent rows (MLA, identical on every rank).
func (m model) page(room uint64, tp, rank, i int) []byte {
	out := make([]byte, m.pageBytes(tp))
	if m.mla {
		for l := range m.layers {
			for s := range m.pageSize {
				for b := range m.rowBytes {
					out[(l*m.pageSize+s)*m.rowBytes+b] = value(room, l, 0, i*m.pageSize+s, 0, b)
				}
			}
		}
		return out
	}
	hp, hb := m.headsPerRank(tp), m.headBytes()
	for l := range m.layers {
		for kv := range 2 {
			for s := range m.pageSize {
				for h := range hp {
					base := (((l*2+kv)*m.pageSize+s)*hp + h) * hb
					for b := range hb {
						out[base+b] = value(room, l, kv, i*m.pageSize+s, rank*hp+h, b)
					}
				}
			}
		}
	}
	return out
}

// mismatch describes the first differing byte of a decode page.
func (m model) mismatch(tp, rank, page, logical int, got, want []byte) error {
	for off := range want {
		if got[off] == want[off] {
			continue
		}
		if m.mla {
			row, b := off/m.rowBytes, off%m.rowBytes
			return fmt.Errorf("decode tp %d page %d (logical page %d): layer %d token %d byte %d = %#02x, want %#02x",
				rank, page, logical, row/m.pageSize, logical*m.pageSize+row%m.pageSize, b, got[off], want[off])
		}
		hp, hb := m.headsPerRank(tp), m.headBytes()
		row, b := off/hb, off%hb
		h, row := row%hp, row/hp
		s, row := row%m.pageSize, row/m.pageSize
		kv, l := row%2, row/2
		return fmt.Errorf("decode tp %d page %d (logical page %d): layer %d %s token %d head %d byte %d = %#02x, want %#02x",
			rank, page, logical, l, [2]string{"K", "V"}[kv], logical*m.pageSize+s, rank*hp+h, b, got[off], want[off])
	}
	if len(got) != len(want) {
		return fmt.Errorf("decode tp %d page %d: read %d bytes, want %d", rank, page, len(got), len(want))
	}
	return nil
}

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

// setup calls SetupStaging for every rank.
func (c *cluster) setup(p *prefill) []*pb.SetupStagingResponse {
	t := c.t
	t.Helper()
	plans := make([]*pb.SetupStagingResponse, p.tp)
	for r := range p.tp {
		plan, err := c.staging.SetupStaging(ctxT(t), &pb.SetupStagingRequest{Rank: p.rank(r)})
		if err != nil {
			t.Fatalf("SetupStaging(rank %d): %v", r, err)
		}
		if !plan.GetStagingRequired() {
			t.Fatalf("SetupStaging(rank %d) = not required, want required (prefill TP %d, decode TP %d)", r, p.tp, c.dtp)
		}
		plans[r] = plan
	}
	return plans
}

// allocate is AllocateStaging for one rank and chunk.
func (c *cluster) allocate(p *prefill, room uint64, r, chunk, n int) []*pb.StagingRegion {
	t := c.t
	t.Helper()
	resp, err := c.staging.AllocateStaging(ctxT(t), &pb.AllocateStagingRequest{Room: room, Rank: p.rank(r), ChunkIndex: uint32(chunk), NumPages: uint32(n)})
	if err != nil {
		t.Fatalf("AllocateStaging(room %d rank %d chunk %d): %v", room, r, chunk, err)
	}
	return resp.GetRegions()
}

// gather builds what prefill rank r writes into a region for its target:
// its heads [src_head_start, +num_heads) of pages [off, off+n), laid out
// [K layer 0..L-1][V layer 0..L-1], each layer block token-major. It reads
// the rank's own KV back from the agent, as a GPU gather would.
func (c *cluster) gather(p *prefill, r int, slice *pb.HeadSlice, off, n int) []byte {
	t := c.t
	t.Helper()
	m := c.m
	hp, hb, nh := m.headsPerRank(p.tp), m.headBytes(), int(slice.GetNumHeads())
	pbytes := m.pageBytes(p.tp)
	pages := make([][]byte, n)
	for i := range n {
		resp, err := c.xfer.ReadBuffer(ctxT(t), &transferv1.ReadBufferRequest{Name: p.buffer(r), Offset: uint64(int(p.srcPage(off+i)) * pbytes), Length: uint64(pbytes)})
		if err != nil {
			t.Fatalf("ReadBuffer(prefill rank %d): %v", r, err)
		}
		pages[i] = resp.GetData()
	}
	tokens := n * m.pageSize
	out := make([]byte, 0, 2*m.layers*tokens*nh*hb)
	for kv := range 2 {
		for l := range m.layers {
			for tok := range tokens {
				pg, s := pages[tok/m.pageSize], tok%m.pageSize
				for h := range nh {
					src := (((l*2+kv)*m.pageSize+s)*hp + int(slice.GetSrcHeadStart()) + h) * hb
					out = append(out, pg[src:src+hb]...)
				}
			}
		}
	}
	return out
}

// waitWritable waits on WatchWatermark until region is writable
// (is_watermark_ready).
func (c *cluster) waitWritable(dp uint32, reg *pb.StagingRegion) {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	stream, err := c.staging.WatchWatermark(ctx, &pb.WatchWatermarkRequest{DecodeDpRank: dp, DecodeTpRanks: []uint32{reg.GetDecodeTpRank()}})
	if err != nil {
		t.Fatalf("WatchWatermark: %v", err)
	}
	for {
		wm, err := stream.Recv()
		if err != nil {
			t.Fatalf("region %v never became writable: %v", reg, err)
		}
		if watermarkReady(wm, reg) {
			return
		}
	}
}

// watermarkReady is SGLang's is_watermark_ready, written from the spec.
func watermarkReady(wm *pb.Watermark, reg *pb.StagingRegion) bool {
	if reg.GetRound() == 0 {
		return true
	}
	prev := reg.GetRound() - 1
	return prev < wm.GetRound() || (prev == wm.GetRound() && reg.GetEnd() <= wm.GetTail())
}

// stageChunk writes rank r's part of a chunk into its regions and reports it.
func (c *cluster) stageChunk(p *prefill, room uint64, dest *pb.Destination, plan *pb.SetupStagingResponse, r, chunk, off, n int, regs []*pb.StagingRegion, last bool, outputIDs []int32) *pb.ChunkReadyResponse {
	t := c.t
	t.Helper()
	for _, reg := range regs {
		var slice *pb.HeadSlice
		for _, tg := range plan.GetTargets() {
			if tg.GetDecodeTpRank() == reg.GetDecodeTpRank() {
				slice = tg.GetSlice()
			}
		}
		if slice == nil {
			t.Fatalf("no staging target for decode tp %d in %v", reg.GetDecodeTpRank(), plan)
		}
		if !reg.GetWritable() {
			c.waitWritable(dest.GetDecodeDpRank(), reg)
		}
		data := c.gather(p, r, slice, off, n)
		if uint64(len(data)) != reg.GetWriterBytes() {
			t.Fatalf("rank %d gathered %d bytes for decode tp %d, the region gives the writer %d", r, len(data), reg.GetDecodeTpRank(), reg.GetWriterBytes())
		}
		for o := 0; o < len(data); o += transferv1.MaxBufferIO {
			end := min(o+transferv1.MaxBufferIO, len(data))
			if _, err := c.xfer.WriteBuffer(ctxT(t), &transferv1.WriteBufferRequest{Name: reg.GetBuffer(), Offset: reg.GetOffset() + reg.GetWriterOffset() + uint64(o), Data: data[o:end]}); err != nil {
				t.Fatalf("WriteBuffer(%s): %v", reg.GetBuffer(), err)
			}
		}
	}
	req := &pb.ChunkReadyRequest{Room: room, Rank: p.rank(r), ChunkIndex: uint32(chunk), PageOffset: uint32(off), NumPages: uint32(n), Last: last}
	if last {
		req.Aux = &pb.Aux{RoomMarker: room, OutputIds: outputIDs}
	}
	resp, err := c.staging.ChunkReady(ctxT(t), req)
	if err != nil {
		t.Fatalf("ChunkReady(room %d rank %d chunk %d): %v", room, r, chunk, err)
	}
	return resp
}

// stageRoom moves a room through staging: every rank allocates every chunk
// first (SGLang sends all STAGING_REQs up front), then writes and reports
// chunk by chunk, waiting for the watermark where the ring is full.
func (c *cluster) stageRoom(p *prefill, room uint64, dests []*pb.Destination, chunkPages int, outputIDs []int32) {
	t := c.t
	t.Helper()
	plans := c.setup(p)
	n := len(dests[0].GetPageIndices())
	type chunk struct{ off, k int }
	var chunks []chunk
	for off := 0; off < n; off += chunkPages {
		chunks = append(chunks, chunk{off, min(chunkPages, n-off)})
	}
	regs := make([][][]*pb.StagingRegion, p.tp)
	for r := range p.tp {
		for ci, ch := range chunks {
			regs[r] = append(regs[r], c.allocate(p, room, r, ci, ch.k))
		}
	}
	for ci, ch := range chunks {
		for r := range p.tp {
			c.stageChunk(p, room, dests[r], plans[r], r, ci, ch.off, ch.k, regs[r][ci], ci == len(chunks)-1, outputIDs)
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

var gqa = model{layers: 4, heads: 8, headDim: 16, dtype: 2, pageSize: 16}

// Rooms whose batches the agent holds (accepted, never run until cancelled).
const (
	roomHeldTransfer = 901
	roomHeldScatter  = 902
)

func TestE2EDelegatedBytes(t *testing.T) {
	c := newCluster(t, gqa, 2, []string{"--fault-hold-rooms", fmt.Sprintf("%d,%d", roomHeldTransfer, roomHeldScatter)},
		"staging.enabled=true", "staging.pool_size_mb=1")
	ids := []int32{7, 8, 9}

	t.Run("same TP 2 to 2: direct page copies", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.1:8998", 2)
		const room = 101
		dests := c.open(p, room, 100) // fill 99 tokens: 7 pages
		if dests[0].GetStaging() {
			t.Fatalf("destination has staging = true for equal TP")
		}
		c.transferRoom(p, room, dests, 4, ids)
		c.waitSucceeded(room)
		if err := c.verify(room, dests[0], ids); err != nil {
			t.Fatal(err)
		}
		c.release(room)
		c.settled()
	})

	t.Run("the verifier catches one corrupted byte", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.2:8998", 2)
		const room = 102
		dests := c.open(p, room, 40) // 3 pages
		c.transferRoom(p, room, dests, 8, ids)
		c.waitSucceeded(room)
		d := dests[0]
		if err := c.verify(room, d, ids); err != nil {
			t.Fatalf("before corruption: %v", err)
		}
		// Flip one byte: decode tp 1, second page, layer 2, V, slot 5, local
		// head 3 (global 7), byte 9.
		m := c.m
		page := int(d.GetPageIndices()[1])
		off := page*m.pageBytes(2) + ((((2*2+1)*m.pageSize+5)*m.headsPerRank(2))+3)*m.headBytes() + 9
		want := m.page(room, 2, 1, 1)[off-page*m.pageBytes(2)]
		if _, err := c.xfer.WriteBuffer(ctxT(t), &transferv1.WriteBufferRequest{Name: "decode/dp0/tp1/kv", Offset: uint64(off), Data: []byte{want ^ 0x5a}}); err != nil {
			t.Fatal(err)
		}
		err := c.verify(room, d, ids)
		wantErr := fmt.Sprintf("decode tp 1 page %d (logical page 1): layer 2 V token %d head 7 byte 9 = %#02x, want %#02x", page, m.pageSize+5, want^0x5a, want)
		if err == nil || err.Error() != wantErr {
			t.Fatalf("verify after corrupting one byte = %v, want %q", err, wantErr)
		}
		c.release(room)
		c.settled()
	})

	t.Run("prefill TP 4 to decode TP 2 through staging, ring back-pressure", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.3:8998", 4)
		const room = 103
		// 1280 tokens: 80 pages. A 40-page chunk is 640 KiB per decode rank
		// (2 writers × 2 heads × 32 B × 4 layers × 2 × 640 tokens), so chunk 1
		// does not fit behind chunk 0 in the 1 MiB ring: it wraps into round
		// 1 over chunk 0 and must wait for chunk 0's scatter.
		dests := c.open(p, room, 1280)
		if n := len(dests[0].GetPageIndices()); n != 80 {
			t.Fatalf("destination has %d pages, want 80", n)
		}
		if !dests[0].GetStaging() {
			t.Fatal("destination has staging = false for prefill TP 4 / decode TP 2")
		}
		plans := c.setup(p)
		for r, plan := range plans {
			tg := plan.GetTargets()
			// Writer r%2 of decode rank r/2, 2 heads at dst_head_start 2·(r%2).
			if len(tg) != 1 || tg[0].GetDecodeTpRank() != uint32(r/2) || tg[0].GetNumWriters() != 2 || tg[0].GetWriter().GetWriterIndex() != uint32(r%2) ||
				tg[0].GetSlice().GetNumHeads() != 2 || tg[0].GetSlice().GetDstHeadStart() != uint32(2*(r%2)) || tg[0].GetSlice().GetSrcHeadStart() != 0 {
				t.Fatalf("SetupStaging(rank %d) targets = %v", r, tg)
			}
		}
		var r0, r1 [][]*pb.StagingRegion // per rank: chunk 0, chunk 1
		for r := range 4 {
			a, b := c.allocate(p, room, r, 0, 40), c.allocate(p, room, r, 1, 40)
			if r%2 == 1 && (!a[0].GetExisting() || !b[0].GetExisting()) {
				t.Fatalf("rank %d got new regions %v %v; want the ones rank %d allocated", r, a, b, r-1)
			}
			r0, r1 = append(r0, a), append(r1, b)
		}
		if r0[1][0].GetAllocId() != r0[0][0].GetAllocId() || r0[1][0].GetWriterOffset() != r0[0][0].GetWriterBytes() {
			t.Fatalf("ranks 0 and 1 share chunk 0's region: %v vs %v", r0[0][0], r0[1][0])
		}
		if r1[0][0].GetRound() != 1 || r1[0][0].GetWritable() {
			t.Fatalf("chunk 1's region = %v; want round 1, not writable while chunk 0 is live", r1[0][0])
		}
		// Reporting chunk 1 before the watermark released it is refused.
		_, err := c.staging.ChunkReady(ctxT(t), &pb.ChunkReadyRequest{Room: room, Rank: p.rank(0), ChunkIndex: 1, PageOffset: 40, NumPages: 40, Last: true,
			Aux: &pb.Aux{RoomMarker: room, OutputIds: ids}})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "not writable") {
			t.Fatalf("ChunkReady before the watermark = %v; want FailedPrecondition (not writable)", err)
		}
		for r := range 4 {
			resp := c.stageChunk(p, room, dests[r], plans[r], r, 0, 0, 40, r0[r], false, nil)
			if got := resp.GetScattered(); got != (r%2 == 1) {
				t.Errorf("ChunkReady(rank %d chunk 0).scattered = %v, want %v (the second writer completes the region)", r, got, r%2 == 1)
			}
		}
		for r := range 4 {
			c.stageChunk(p, room, dests[r], plans[r], r, 1, 40, 40, r1[r], true, ids)
		}
		c.waitSucceeded(room)
		if err := c.verify(room, dests[0], ids); err != nil {
			t.Fatal(err)
		}
		c.release(room)
		c.settled()
	})

	t.Run("prefill TP 1 to decode TP 2 through staging", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.4:8998", 1)
		const room = 104
		dests := c.open(p, room, 150) // 10 pages
		if !dests[0].GetStaging() || len(dests[0].GetTargets()) != 2 {
			t.Fatalf("destination = %v; want staging to 2 decode ranks", dests[0])
		}
		c.stageRoom(p, room, dests, 4, ids)
		c.waitSucceeded(room)
		if err := c.verify(room, dests[0], ids); err != nil {
			t.Fatal(err)
		}
		c.release(room)
		c.settled()
	})

	t.Run("chunk larger than the ring", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.5:8998", 4)
		const room = 105
		c.open(p, room, 1280)
		// 70 pages are 1120 KiB per decode rank: more than the 1 MiB ring.
		_, err := c.staging.AllocateStaging(ctxT(t), &pb.AllocateStagingRequest{Room: room, Rank: p.rank(0), ChunkIndex: 0, NumPages: 70})
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "Increase SGLANG_DISAGG_STAGING_POOL_SIZE_MB or reduce chunked_prefill_size.") {
			t.Fatalf("AllocateStaging(70 pages) = %v; want ResourceExhausted with SGLang's hint", err)
		}
		if f := c.failed(room).GetFailure(); f.GetCode() != pb.FailureCode_FAILURE_CODE_STAGING_FAILED {
			t.Errorf("failure = %v, want STAGING_FAILED", f)
		}
		c.settled()
	})

	t.Run("the agent fails a copy", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.6:8998", 2)
		const room = 106
		dests := c.open(p, room, 40)
		// Page 500 is past the end of the prefill's 128-page buffer: the
		// agent refuses the copy and says why.
		_, err := c.rooms.Transfer(ctxT(t), &pb.TransferRequest{Room: room, Rank: p.rank(1), ChunkIndex: 0, NumPages: 3, Last: true,
			Source: &pb.TransferSource{Buffer: p.buffer(1), PageIndices: []int32{p.srcPage(0), 500, p.srcPage(2)}}, Aux: &pb.Aux{RoomMarker: room}})
		if status.Code(err) != codes.Aborted {
			t.Fatalf("Transfer with a bad source page = %v, want Aborted", err)
		}
		f := c.failed(room).GetFailure()
		if f.GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(f.GetMessage(), "outside the buffer") || !strings.Contains(f.GetMessage(), p.buffer(1)) {
			t.Errorf("failure = %v; want TRANSFER_FAILED with the agent's reason (source range outside the buffer %s)", f, p.buffer(1))
		}
		_ = dests
		c.settled()
	})

	t.Run("abort while a direct chunk is in flight", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.7:8998", 2)
		room := uint64(roomHeldTransfer)
		dests := c.open(p, room, 40)
		done := make(chan error, 1)
		go func() {
			_, err := c.rooms.Transfer(ctxT(t), &pb.TransferRequest{Room: room, Rank: p.rank(0), ChunkIndex: 0, NumPages: 3, Last: true,
				Source: &pb.TransferSource{Buffer: p.buffer(0), PageIndices: []int32{p.srcPage(0), p.srcPage(1), p.srcPage(2)}}, Aux: &pb.Aux{RoomMarker: room}})
			done <- err
		}()
		c.waitAgentLog("batch", fmt.Sprintf("room=%d", room), "held")
		if _, err := c.rooms.AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("Transfer of the aborted room succeeded")
			}
		case <-time.After(e2eTimeout):
			t.Fatal("Transfer did not return after the abort")
		}
		if f := c.failed(room).GetFailure(); f.GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED {
			t.Errorf("failure = %v, want ABORTED", f)
		}
		_ = dests
		c.settled()
	})

	t.Run("abort while a scatter is in flight", func(t *testing.T) {
		c.t = t
		p := c.newPrefill("10.1.0.8:8998", 4)
		room := uint64(roomHeldScatter)
		dests := c.open(p, room, 100) // 7 pages
		plans := c.setup(p)
		regs := make([][]*pb.StagingRegion, 4)
		for r := range 4 {
			regs[r] = c.allocate(p, room, r, 0, 7)
		}
		c.stageChunk(p, room, dests[0], plans[0], 0, 0, 0, 7, regs[0], true, ids)
		done := make(chan error, 1)
		go func() {
			// The second writer completes decode rank 0's region: its
			// scatter is submitted and held by the agent.
			_, err := c.staging.ChunkReady(ctxT(t), &pb.ChunkReadyRequest{Room: room, Rank: p.rank(1), ChunkIndex: 0, NumPages: 7, Last: true, Aux: &pb.Aux{RoomMarker: room}})
			done <- err
		}()
		c.waitAgentLog("batch", fmt.Sprintf("room=%d", room), "held")
		if wms := c.watermarks(); wms[0].GetLiveAllocations() != 1 || wms[1].GetLiveAllocations() != 1 {
			t.Fatalf("watermarks during the scatter = %v; want one live region per decode rank", wms)
		}
		if _, err := c.rooms.AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("ChunkReady of the aborted room succeeded")
			}
		case <-time.After(e2eTimeout):
			t.Fatal("ChunkReady did not return after the abort")
		}
		c.failed(room)
		// Ranks 2 and 3 never reported their regions ready: they may still write.
		c.ackEnd(p, room, 4, 2, 3)
		c.settled() // both regions freed, the scattered one after its scatter returned
	})

	t.Run("reflection lists Staging", func(t *testing.T) {
		c.t = t
		if names := listServices(t, c.dconn); !slices.Contains(names, "decodeplane.v1.Staging") {
			t.Errorf("daemon reflection lists %q, want decodeplane.v1.Staging", names)
		}
		if names := listServices(t, c.aconn); !slices.Contains(names, "decodeplane.transfer.v1.TransferAgent") {
			t.Errorf("agent reflection lists %q, want decodeplane.transfer.v1.TransferAgent", names)
		}
	})
}

// waitAgentLog waits until the agent's log has a line containing every word
// (the agent logs each batch its fault hook holds, before holding it). It
// wakes on every write of the agent's output.
func (c *cluster) waitAgentLog(words ...string) {
	t := c.t
	t.Helper()
	deadline := time.NewTimer(e2eTimeout)
	defer deadline.Stop()
	for {
		out, changed := c.agent.Out.Snapshot()
		for _, line := range strings.Split(out, "\n") {
			ok := true
			for _, w := range words {
				ok = ok && strings.Contains(line, w)
			}
			if ok {
				return
			}
		}
		select {
		case <-changed:
		case <-c.agent.Exited():
			t.Fatal("the agent exited")
		case <-deadline.C:
			t.Fatalf("the agent never logged %q", words)
		}
	}
}

func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

func TestE2EDelegatedMLA(t *testing.T) {
	mla := model{layers: 4, pageSize: 16, mla: true, rowBytes: (32 + 16) * 2}
	c := newCluster(t, mla, 1, nil)
	p := c.newPrefill("10.2.0.1:8998", 4)
	const room = 201
	dests := c.open(p, room, 100)
	for r, d := range dests {
		if d.GetDummy() != (r != 0) {
			t.Errorf("rank %d destination dummy = %v, want %v (MLA: rank 0 is the real source)", r, d.GetDummy(), r != 0)
		}
	}
	ids := []int32{11, 12}
	c.transferRoom(p, room, dests, 3, ids)
	c.waitSucceeded(room)
	if err := c.verify(room, dests[0], ids); err != nil {
		t.Fatal(err)
	}
	c.release(room)
	c.settled()

	// MLA cannot stage: SGLang's exact refusal, over gRPC.
	_, err := c.staging.SetupStaging(ctxT(t), &pb.SetupStagingRequest{Rank: p.rank(1)})
	const msg = "SGLANG_DISAGG_STAGING_BUFFER is designed for non-MLA models (e.g. GQA, MHA). MLA models should not set this flag."
	if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != msg {
		t.Errorf("SetupStaging on an MLA pool = %v; want FailedPrecondition %q", err, msg)
	}
}

func TestE2EAgentRestart(t *testing.T) {
	const held = 301
	const batchTimeout = 2 * time.Second
	c := newCluster(t, gqa, 2, []string{"--fault-hold-rooms", fmt.Sprint(held)}, "transfer.delegate.batch_timeout="+batchTimeout.String())
	p := c.newPrefill("10.3.0.1:8998", 2)
	dests := c.open(p, held, 40)
	done := make(chan error, 1)
	go func() {
		_, err := c.rooms.Transfer(ctxT(t), &pb.TransferRequest{Room: held, Rank: p.rank(0), ChunkIndex: 0, NumPages: 3, Last: true,
			Source: &pb.TransferSource{Buffer: p.buffer(0), PageIndices: []int32{p.srcPage(0), p.srcPage(1), p.srcPage(2)}}, Aux: &pb.Aux{RoomMarker: held}})
		done <- err
	}()
	c.waitAgentLog("batch", fmt.Sprintf("room=%d", held), "held")
	c.agent.Kill(t, e2eTimeout) // mid-room, with a batch in flight

	select {
	case err := <-done:
		if status.Code(err) != codes.Aborted {
			t.Errorf("Transfer when the agent died = %v, want Aborted", err)
		}
	case <-time.After(e2eTimeout):
		t.Fatal("Transfer did not return after the agent died")
	}
	f := c.failed(held).GetFailure()
	if f.GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(f.GetMessage(), "transfer agent") {
		t.Errorf("failure = %v; want TRANSFER_FAILED naming the transfer agent", f)
	}
	waitHealth(t, c.dconn, c.daemon, healthpb.HealthCheckResponse_NOT_SERVING)
	// The dead agent may have accepted the held batch: until its deadline
	// the room's pages stay out of the pool (nothing else may be given pages
	// a late write could land in), then they come back.
	if c.ledgerFull() {
		t.Error("the room's pages were back while its lost batch could still be written")
	}
	deadline := time.Now().Add(batchTimeout + 5*time.Second)
	for !c.ledgerFull() {
		if time.Now().After(deadline) {
			t.Fatalf("the room's pages were not back %s after its lost batch's deadline", 5*time.Second)
		}
		waitAWhile(t, 50*time.Millisecond)
	}
	c.settled()

	// A new agent on the same port: the daemon registers its buffers again
	// and serves; the prefill registers its own again (new memory).
	c.agent, c.aconn = startAgent(t, c.agentBin, c.agentAt)
	c.xfer = transferv1.NewTransferAgentClient(c.aconn)
	waitHealth(t, c.dconn, c.daemon, healthpb.HealthCheckResponse_SERVING)
	p.registerBuffers()
	const room = 302
	dests = c.open(p, room, 100)
	ids := []int32{5}
	c.transferRoom(p, room, dests, 4, ids)
	c.waitSucceeded(room)
	if err := c.verify(room, dests[0], ids); err != nil {
		t.Fatal(err)
	}
	c.release(room)
	c.settled()
}
