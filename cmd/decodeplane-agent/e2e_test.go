package main

import (
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
