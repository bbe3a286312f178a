package ops

import (
	"context"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// registerEngineLayout registers the buffer layout of one decode rank
// (kv_pool.owner: engine). The request's bounds were checked (Validate);
// what depends on kv_pool is the domain's (kvlayout.BufferLayout.Validate).
func (e *engineRooms) registerEngineLayout(ctx context.Context, req *pb.RegisterEngineLayoutRequest) (*pb.RegisterEngineLayoutResponse, error) {
	l := layoutFromProto(req.GetLayout())
	already, err := e.m.RegisterEngineLayout(ctx, int(req.GetDecodeDpRank()), int(req.GetDecodeTpRank()), l)
	if err != nil {
		return nil, e.t.status(ctx, err)
	}
	return &pb.RegisterEngineLayoutResponse{LayoutId: l.ID(), Already: already}, nil
}

// layoutFromProto converts a validated layout (the wire's uint64 sizes are
// within int64 by their bounds).
func layoutFromProto(in *pb.EngineLayout) *kvlayout.BufferLayout {
	l := &kvlayout.BufferLayout{Marker: in.GetMarker(),
		KV: make([]kvlayout.KVBuffer, len(in.GetKv())), Aux: make([]kvlayout.AuxBuffer, len(in.GetAux())), State: make([]kvlayout.StateBuffer, len(in.GetState()))}
	for i, b := range in.GetKv() {
		l.KV[i] = kvlayout.KVBuffer{Name: b.GetName(), Layer: int(b.GetLayer()), Value: b.GetValue(), Draft: b.GetDraft(),
			ItemLen: int64(b.GetItemLen()), Length: int64(b.GetLength()), Memory: memoryFromProto(b.GetMemory())}
	}
	for i, b := range in.GetAux() {
		l.Aux[i] = kvlayout.AuxBuffer{Name: b.GetName(), RowLen: int64(b.GetRowLen()), Length: int64(b.GetLength()), Memory: memoryFromProto(b.GetMemory())}
	}
	for i, b := range in.GetState() {
		l.State[i] = kvlayout.StateBuffer{Name: b.GetName(), Type: stateTypeFromProto(b.GetType()), ItemLen: int64(b.GetItemLen()),
			Length: int64(b.GetLength()), Memory: memoryFromProto(b.GetMemory())}
	}
	return l
}

func memoryFromProto(m *pb.EngineMemory) kvlayout.Memory {
	switch k := m.GetKind().(type) {
	case *pb.EngineMemory_Shared:
		return kvlayout.Memory{Kind: kvlayout.MemoryShared, Path: k.Shared.GetPath(), Offset: int64(k.Shared.GetOffset())}
	case *pb.EngineMemory_CudaIpc:
		return kvlayout.Memory{Kind: kvlayout.MemoryCudaIPC, Handle: k.CudaIpc.GetHandle(), Device: int(k.CudaIpc.GetDevice())}
	case *pb.EngineMemory_Nixl:
		return kvlayout.Memory{Kind: kvlayout.MemoryNixl, Descriptor: k.Nixl.GetSerialized()}
	}
	return kvlayout.Memory{}
}

// engineLayoutToProto renders a layout for GetStatus: without its memory.
func engineLayoutToProto(r kvmanager.RegisteredLayout) *pb.RegisteredEngineLayout {
	l := r.Layout
	out := &pb.EngineLayout{Marker: l.Marker}
	for _, b := range l.KV {
		out.Kv = append(out.Kv, &pb.EngineKVBuffer{Name: b.Name, Layer: uint32(b.Layer), Value: b.Value, Draft: b.Draft, ItemLen: uint64(b.ItemLen), Length: uint64(b.Length)})
	}
	for _, b := range l.Aux {
		out.Aux = append(out.Aux, &pb.EngineAuxBuffer{Name: b.Name, RowLen: uint64(b.RowLen), Length: uint64(b.Length)})
	}
	for _, b := range l.State {
		out.State = append(out.State, &pb.EngineStateBuffer{Name: b.Name, Type: stateTypeToProto(b.Type), ItemLen: uint64(b.ItemLen), Length: uint64(b.Length)})
	}
	return &pb.RegisteredEngineLayout{DecodeDpRank: uint32(r.DecodeDP), DecodeTpRank: uint32(r.DecodeTP), LayoutId: l.ID(), Layout: out, Dropped: r.Dropped}
}

// layoutID is decode TP rank tp's layout id (0: none).
func layoutID(ls []*kvlayout.BufferLayout, tp int) uint64 {
	if tp < 0 || tp >= len(ls) || ls[tp] == nil {
		return 0
	}
	return ls[tp].ID()
}

// sourceAuxRow is TransferSource.aux_row in the domain's terms (-1: unset).
func sourceAuxRow(src *pb.TransferSource) int32 {
	if src == nil || src.AuxRow == nil {
		return -1
	}
	return int32(min(src.GetAuxRow(), pb.MaxSourceAuxRow))
}

// stateTypeFromProto maps a validated state type to the domain's.
func stateTypeFromProto(t pb.StateType) kvlayout.StateType {
	d, _ := domainOf[kvlayout.StateType](stateTypeWire[:], t)
	return d
}
