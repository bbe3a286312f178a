package server

import (
	"github.com/decodeplane/decodeplane/prealloc"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

func layoutToProto(l prealloc.Layout) *pb.KVLayout {
	out := &pb.KVLayout{
		Kind:           l.Kind.String(),
		IsMla:          l.IsMLA,
		NumLayers:      uint32(l.NumLayers),
		TotalKvHeads:   uint32(l.TotalKVHeads),
		HeadsPerRank:   uint32(l.HeadsPerRank),
		HeadDim:        uint32(l.HeadDim),
		KvCacheDtype:   l.DType,
		DtypeBytes:     uint32(l.DTypeBytes),
		PageSize:       uint32(l.PageSize),
		AttnTpSize:     uint32(l.AttnTP),
		DpSize:         uint32(l.DP),
		PpSize:         uint32(l.PP),
		DcpSize:        uint32(l.DCP),
		StagingEnabled: l.Staging,
		TokenBytes:     uint64(l.TokenBytes()),
		ItemLen:        uint64(l.ItemLen()),
		TotalPages:     uint64(l.TotalPages),
	}
	for _, st := range l.StateTypes {
		out.StateTypes = append(out.StateTypes, stateTypeToProto(st))
	}
	return out
}

func stateTypeToProto(t prealloc.StateType) pb.StateType {
	switch t {
	case prealloc.StateMamba:
		return pb.StateType_STATE_TYPE_MAMBA
	case prealloc.StateSWA:
		return pb.StateType_STATE_TYPE_SWA
	case prealloc.StateDSA:
		return pb.StateType_STATE_TYPE_DSA
	}
	return pb.StateType_STATE_TYPE_UNSPECIFIED
}
