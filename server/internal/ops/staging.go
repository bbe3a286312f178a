package ops

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// staging are Staging's ops over the manager's staging handler.
type staging struct {
	t *Table
	m Stager
}

func (s *staging) setupStaging(ctx context.Context, req *pb.SetupStagingRequest) (*pb.SetupStagingResponse, error) {
	plan, err := s.m.SetupStaging(rankFromProto(req.GetRank()))
	if err != nil {
		return nil, s.t.status(ctx, err)
	}
	return stagingPlanToProto(plan), nil
}

func (s *staging) allocateStaging(ctx context.Context, req *pb.AllocateStagingRequest) (*pb.AllocateStagingResponse, error) {
	regs, err := s.m.AllocateStaging(req.GetRoom(), rankFromProto(req.GetRank()), int(req.GetChunkIndex()), int(req.GetNumPages()))
	if err != nil {
		return nil, s.t.status(ctx, err)
	}
	out := &pb.AllocateStagingResponse{}
	for _, r := range regs {
		out.Regions = append(out.Regions, stagingRegionToProto(r))
	}
	return out, nil
}

func (s *staging) chunkReady(ctx context.Context, req *pb.ChunkReadyRequest) (*pb.ChunkReadyResponse, error) {
	res, err := s.m.StagingChunkReady(ctx, kvmanager.ChunkRequest{
		Room: req.GetRoom(), Rank: rankFromProto(req.GetRank()), Index: int(req.GetChunkIndex()),
		PageOffset: int(req.GetPageOffset()), NumPages: int(req.GetNumPages()), Last: req.GetLast(),
		Marker: req.GetAux().GetRoomMarker(), OutputIDs: req.GetAux().GetOutputIds(),
	})
	if err != nil {
		return nil, s.t.status(ctx, err)
	}
	return &pb.ChunkReadyResponse{Poll: pollToProto(res.Poll), Duplicate: res.Duplicate, WritersArrived: uint32(res.Arrived),
		NumWriters: uint32(res.NumWriters), Scattered: res.Scattered}, nil
}

func (s *staging) watchWatermark(ctx context.Context, req *pb.WatchWatermarkRequest, send func(*pb.Watermark) error) error {
	tps := make([]int, len(req.GetDecodeTpRanks()))
	for i, tp := range req.GetDecodeTpRanks() {
		tps[i] = int(tp)
	}
	w, err := s.m.WatchWatermark(int(req.GetDecodeDpRank()), tps)
	if err != nil {
		return s.t.status(ctx, err)
	}
	defer w.Close()
	// The stream ends with the server: it would otherwise hold GracefulStop.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.t.cfg.Host.Stopping(), cancel)
	defer stop()
	for {
		wms, err := w.Next(wctx)
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return status.Error(codes.Unavailable, "decodeplane is shutting down: watch again elsewhere")
		}
		for _, wm := range wms {
			if err := send(watermarkToProto(wm)); err != nil {
				return err
			}
		}
	}
}

func watermarkToProto(w kvmanager.Watermark) *pb.Watermark {
	return &pb.Watermark{DecodeDpRank: uint32(w.DecodeDP), DecodeTpRank: uint32(w.DecodeTP), Round: uint64(w.Round), Tail: uint64(w.Tail),
		HeadRound: uint64(w.HeadRound), Head: uint64(w.Head), LiveAllocations: uint32(w.Live), SizeBytes: uint64(w.Size)}
}

func headSliceToProto(prefillTP, decodeTP int, s kvmanager.StagingHeadSlice) *pb.HeadSlice {
	return &pb.HeadSlice{PrefillTpRank: uint32(prefillTP), DecodeTpRank: uint32(decodeTP), SrcHeadStart: uint32(s.SrcHeadStart),
		DstHeadStart: uint32(s.DstHeadStart), NumHeads: uint32(s.NumHeads)}
}

func stagingWriterToProto(w kvmanager.StagingWriter) *pb.StagingWriterLayout {
	return &pb.StagingWriterLayout{WriterIndex: uint32(w.Index), NumHeads: uint32(w.Slice.NumHeads), LayerBegin: uint32(w.LayerBegin),
		LayerEnd: uint32(w.LayerEnd), BytesPerToken: uint64(w.BytesPerToken), OffsetPerToken: uint64(w.OffsetPerToken)}
}

func stagingPlanToProto(p kvmanager.StagingPlan) *pb.SetupStagingResponse {
	out := &pb.SetupStagingResponse{
		StagingRequired: p.Required, PrefillAttnTpSize: uint32(p.PrefillTP), DecodeAttnTpSize: uint32(p.DecodeTP),
		PrefillPpSize: uint32(p.PrefillPP), DecodePpSize: uint32(p.DecodePP), TotalKvHeads: uint32(p.TotalKVHeads),
		PageSize: uint32(p.PageSize), HeadBytes: uint64(p.HeadBytes), NumLayers: uint32(p.NumLayers),
		CompletionTimeout: durationpb.New(p.CompletionTimeout),
	}
	for _, pr := range p.Pairs {
		out.HeadSlices = append(out.HeadSlices, headSliceToProto(pr.PrefillTP, pr.DecodeTP, pr.Slice))
	}
	for _, t := range p.Targets {
		pt := &pb.StagingTarget{DecodeTpRank: uint32(t.DecodeTP), Slice: headSliceToProto(t.Writer.PrefillTP, t.DecodeTP, t.Slice),
			NumWriters: uint32(len(t.Writers)), Writer: stagingWriterToProto(t.Writer), RegionBytesPerToken: uint64(t.RegionBytesPerToken)}
		for _, w := range t.Writers {
			pt.Writers = append(pt.Writers, stagingWriterToProto(w))
		}
		out.Targets = append(out.Targets, pt)
	}
	for _, r := range p.Rings {
		out.Rings = append(out.Rings, &pb.StagingRing{DecodeDpRank: uint32(r.DecodeDP), DecodeTpRank: uint32(r.DecodeTP), Buffer: r.Buffer,
			SizeBytes: uint64(r.Size), Watermark: watermarkToProto(r.Watermark)})
	}
	return out
}

func stagingRegionToProto(r kvmanager.StagingRegion) *pb.StagingRegion {
	return &pb.StagingRegion{DecodeTpRank: uint32(r.DecodeTP), Buffer: r.Buffer, AllocId: r.Region.ID, Offset: uint64(r.Region.Offset),
		Size: uint64(r.Region.Size), Round: uint64(r.Region.Round), End: uint64(r.Region.End()), NumPages: uint32(r.NumPages),
		Writable: r.Writable, NumWriters: uint32(r.NumWriters), WriterIndex: uint32(r.WriterIndex), WriterOffset: uint64(r.WriterOffset),
		WriterBytes: uint64(r.WriterBytes), Existing: r.Existing}
}
