// Package agentwire converts between the transfer engines' types
// (transfer/kvcopy: buffers, batches) and the transfer agent's wire
// messages (decodeplane.transfer.v1). Both ends of the agent protocol use it:
// transfer/agentclient (the daemon) and transfer/agentservice (the reference
// agent), so the two cannot drift apart.
package agentwire

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/decodeplane/decodeplane/kvlayout"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// bufferKindWire maps kvcopy's buffer kinds to the wire's, indexed by the
// domain value (wire_test.go walks every value of both sides).
var bufferKindWire = [...]transferv1.BufferKind{
	kvcopy.KindUnspecified: transferv1.BufferKind_BUFFER_KIND_UNSPECIFIED,
	kvcopy.KindKVPool:      transferv1.BufferKind_BUFFER_KIND_KV_POOL,
	kvcopy.KindStagingRing: transferv1.BufferKind_BUFFER_KIND_STAGING_RING,
	kvcopy.KindMetadata:    transferv1.BufferKind_BUFFER_KIND_METADATA,
	kvcopy.KindPrefillKV:   transferv1.BufferKind_BUFFER_KIND_PREFILL_KV,
}

// BufferKindFromProto: a wire kind kvcopy does not know is KindUnspecified
// (the validator refuses those before a handler runs).
func BufferKindFromProto(k transferv1.BufferKind) kvcopy.BufferKind {
	for d, w := range bufferKindWire {
		if w == k {
			return kvcopy.BufferKind(d)
		}
	}
	return kvcopy.KindUnspecified
}

func BufferKindToProto(k kvcopy.BufferKind) transferv1.BufferKind {
	if k < 0 || int(k) >= len(bufferKindWire) {
		return transferv1.BufferKind_BUFFER_KIND_UNSPECIFIED
	}
	return bufferKindWire[k]
}

// BuffersFromProto converts registered buffers from the wire (their
// memory: MemoryFromProto).
func BuffersFromProto(in []*transferv1.Buffer) []kvcopy.BufferSpec {
	out := make([]kvcopy.BufferSpec, len(in))
	for i, b := range in {
		out[i] = kvcopy.BufferSpec{Name: b.GetName(), Kind: BufferKindFromProto(b.GetKind()), Address: b.GetAddress(), Length: int64(b.GetLength()),
			ItemSize: int64(b.GetItemSize()), Memory: MemoryFromProto(b.GetMemory())}
	}
	return out
}

// BuffersToProto converts buffer specs to the wire: agent memory is sent
// as memory unset (what an agent older than the field reads the same).
func BuffersToProto(in []kvcopy.BufferSpec) []*transferv1.Buffer {
	out := make([]*transferv1.Buffer, len(in))
	for i, b := range in {
		out[i] = &transferv1.Buffer{Name: b.Name, Kind: BufferKindToProto(b.Kind), Address: b.Address, Length: uint64(b.Length), ItemSize: uint64(b.ItemSize),
			Memory: MemoryToProto(b.Memory)}
	}
	return out
}

// MemoryToProto converts a buffer's memory to the wire (nil for agent
// memory).
func MemoryToProto(m kvlayout.Memory) *transferv1.BufferMemory {
	switch m.Kind {
	case kvlayout.MemoryShared:
		return &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_Shared{Shared: &transferv1.SharedMemory{Path: m.Path, Offset: uint64(m.Offset)}}}
	case kvlayout.MemoryCudaIPC:
		return &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_CudaIpc{CudaIpc: &transferv1.CudaIpc{Handle: m.Handle, Device: int32(m.Device)}}}
	case kvlayout.MemoryNixl:
		return &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_Nixl{Nixl: &transferv1.NixlDescriptor{Serialized: m.Descriptor}}}
	}
	return nil
}

// MemoryFromProto converts a buffer's memory from the wire: unset (and a
// memory without a kind, which the validator refuses first) is agent
// memory.
func MemoryFromProto(m *transferv1.BufferMemory) kvlayout.Memory {
	switch k := m.GetKind().(type) {
	case *transferv1.BufferMemory_Shared:
		return kvlayout.Memory{Kind: kvlayout.MemoryShared, Path: k.Shared.GetPath(), Offset: int64(min(k.Shared.GetOffset(), transferv1.MaxExtent+1))}
	case *transferv1.BufferMemory_CudaIpc:
		return kvlayout.Memory{Kind: kvlayout.MemoryCudaIPC, Handle: k.CudaIpc.GetHandle(), Device: int(k.CudaIpc.GetDevice())}
	case *transferv1.BufferMemory_Nixl:
		return kvlayout.Memory{Kind: kvlayout.MemoryNixl, Descriptor: k.Nixl.GetSerialized()}
	}
	return kvlayout.Memory{}
}

// BatchFromProto converts a submitted batch from the wire.
func BatchFromProto(req *transferv1.SubmitBatchRequest) kvcopy.Batch {
	b := kvcopy.Batch{ID: req.GetBatchId(), Room: req.GetRoom(), Copies: make([]kvcopy.Copy, len(req.GetCopies()))}
	for i, c := range req.GetCopies() {
		b.Copies[i] = kvcopy.Copy{SrcBuffer: c.GetSrcBuffer(), SrcOffset: int64(c.GetSrcOffset()), DstBuffer: c.GetDstBuffer(), DstOffset: int64(c.GetDstOffset()),
			Length: int64(c.GetLength()), Count: int(c.GetCount()), SrcStride: int64(c.GetSrcStride()), DstStride: int64(c.GetDstStride())}
	}
	for _, w := range req.GetWrites() {
		b.Writes = append(b.Writes, kvcopy.InlineWrite{DstBuffer: w.GetDstBuffer(), DstOffset: int64(w.GetDstOffset()), Data: w.GetData()})
	}
	if req.GetDeadline() != nil {
		b.Deadline = req.GetDeadline().AsTime()
	}
	return b
}

// BatchToProto converts a batch to its SubmitBatch request.
func BatchToProto(b kvcopy.Batch) *transferv1.SubmitBatchRequest {
	req := &transferv1.SubmitBatchRequest{BatchId: b.ID, Room: b.Room, Copies: make([]*transferv1.Copy, len(b.Copies))}
	for i, cp := range b.Copies {
		req.Copies[i] = &transferv1.Copy{SrcBuffer: cp.SrcBuffer, SrcOffset: uint64(cp.SrcOffset), DstBuffer: cp.DstBuffer, DstOffset: uint64(cp.DstOffset),
			Length: uint64(cp.Length), Count: uint32(cp.Count), SrcStride: uint64(cp.SrcStride), DstStride: uint64(cp.DstStride)}
	}
	for _, w := range b.Writes {
		req.Writes = append(req.Writes, &transferv1.InlineWrite{DstBuffer: w.DstBuffer, DstOffset: uint64(w.DstOffset), Data: w.Data})
	}
	if !b.Deadline.IsZero() {
		req.Deadline = timestamppb.New(b.Deadline)
	}
	return req
}
