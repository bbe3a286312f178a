package main

import (
	"context"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The staging side of the end-to-end cluster: SetupStaging, the regions
// a prefill rank allocates, the gather of its heads and the chunks it
// stages and reports ready.

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
