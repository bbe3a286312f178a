package decodeplanev1

import (
	"strings"
	"testing"
)

// The fuzz target of Rooms.RegisterEngineLayout (see fuzz_test.go for the
// contract every target checks): its documented bounds, restated here.

func FuzzRegisterEngineLayout(f *testing.F) {
	fuzzValidate(f, func() *RegisterEngineLayoutRequest { return new(RegisterEngineLayoutRequest) }, func(b *bounds, m *RegisterEngineLayoutRequest) {
		b.need(m.GetDecodeDpRank() < 1024 && m.GetDecodeTpRank() < 1024, "decode ranks < 1024")
		l := m.GetLayout()
		b.need(l != nil, "layout required")
		b.need(len(l.GetKv()) >= 1 && len(l.GetKv()) <= 4096, "kv 1..4096")
		b.need(len(l.GetAux()) >= 1 && len(l.GetAux()) <= 64, "aux 1..64")
		b.need(len(l.GetState()) <= 16, "state <= 16")
		names := map[string]bool{}
		name := func(n string) {
			ok := len(n) >= 1 && len(n) <= 128 && !strings.HasPrefix(n, "decode/") && !names[n]
			for _, c := range n {
				ok = ok && strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-", c)
			}
			b.need(ok, "buffer names: 1..128 bytes of [A-Za-z0-9._/-], unique, not decode/")
			names[n] = true
		}
		for _, k := range l.GetKv() {
			name(k.GetName())
			b.need(k.GetLayer() <= 4095, "kv[i].layer <= 4095")
			b.need(k.GetItemLen() >= 1 && k.GetItemLen() <= 1<<40, "kv[i].item_len 1..2^40")
			memoryOK(b, k.GetMemory(), k.GetLength())
		}
		markerOK := false
		for _, a := range l.GetAux() {
			name(a.GetName())
			b.need(a.GetRowLen() >= 1 && a.GetRowLen() <= 1<<24, "aux[i].row_len 1..2^24")
			memoryOK(b, a.GetMemory(), a.GetLength())
			markerOK = markerOK || a.GetName() == l.GetMarker()
		}
		b.need(markerOK, "marker names an aux buffer")
		for _, s := range l.GetState() {
			name(s.GetName())
			b.need(s.GetType() == StateType_STATE_TYPE_MAMBA || s.GetType() == StateType_STATE_TYPE_SWA, "state[i].type MAMBA or SWA")
			b.need(s.GetItemLen() >= 1 && s.GetItemLen() <= 1<<40, "state[i].item_len 1..2^40")
			memoryOK(b, s.GetMemory(), s.GetLength())
		}
	}, seedLayoutRequest(), &RegisterEngineLayoutRequest{DecodeTpRank: 1, Layout: &EngineLayout{
		Kv:     []*EngineKVBuffer{{Name: "e/kv/0", ItemLen: 1 << 12, Length: 1 << 20, Memory: &EngineMemory{Kind: &EngineMemory_CudaIpc{CudaIpc: &EngineCudaIpc{Handle: make([]byte, 64)}}}}},
		Aux:    []*EngineAuxBuffer{{Name: "e/room", RowLen: 64, Length: 1 << 12, Memory: &EngineMemory{Kind: &EngineMemory_Nixl{Nixl: &EngineNixl{Serialized: []byte("d")}}}}},
		Marker: "e/room", State: []*EngineStateBuffer{{Name: "e/mamba", Type: StateType_STATE_TYPE_MAMBA, ItemLen: 256, Length: 1 << 16}}}})
}

// memoryOK restates EngineMemory's bounds (length: the buffer's, 1..2^62).
func memoryOK(b *bounds, m *EngineMemory, length uint64) {
	b.need(length >= 1 && length <= 1<<62, "length 1..2^62")
	if m == nil {
		return
	}
	switch k := m.GetKind().(type) {
	case *EngineMemory_Shared:
		p, off := k.Shared.GetPath(), k.Shared.GetOffset()
		b.need(len(p) >= 1 && len(p) <= 4096 && p[0] == '/' && !strings.ContainsRune(p, 0), "shared.path absolute, 1..4096 bytes, no NUL")
		b.need(off%4096 == 0 && off <= 1<<62 && off+length <= 1<<62, "shared.offset a multiple of 4096, offset + length <= 2^62")
	case *EngineMemory_CudaIpc:
		b.need(len(k.CudaIpc.GetHandle()) == 64 && k.CudaIpc.GetDevice() >= 0 && k.CudaIpc.GetDevice() <= 1023, "cuda_ipc: 64-byte handle, device 0..1023")
	case *EngineMemory_Nixl:
		b.need(len(k.Nixl.GetSerialized()) >= 1 && len(k.Nixl.GetSerialized()) <= 1<<16, "nixl.serialized 1..65,536 bytes")
	default:
		b.need(false, "memory set with a kind")
	}
}

// seedLayoutRequest is a small SGLang-shaped layout: 2 layers × K/V, the
// marker column and an output-ids column, in a shared-memory file.
func seedLayoutRequest() *RegisterEngineLayoutRequest {
	shm := func(off uint64) *EngineMemory {
		return &EngineMemory{Kind: &EngineMemory_Shared{Shared: &EngineSharedMemory{Path: "/dev/shm/engine-0", Offset: off}}}
	}
	l := &EngineLayout{Marker: "e/aux/bootstrap_room"}
	for i, n := range []string{"e/k/0", "e/k/1", "e/v/0", "e/v/1"} {
		l.Kv = append(l.Kv, &EngineKVBuffer{Name: n, Layer: uint32(i % 2), Value: i >= 2, ItemLen: 4096, Length: 1 << 20, Memory: shm(uint64(i) << 20)})
	}
	l.Aux = []*EngineAuxBuffer{{Name: "e/aux/output_ids", RowLen: 16, Length: 4096, Memory: shm(4 << 20)}, {Name: "e/aux/bootstrap_room", RowLen: 64, Length: 4096, Memory: shm(5 << 20)}}
	return &RegisterEngineLayoutRequest{Layout: l}
}
