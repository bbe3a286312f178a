package transferv1

import (
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Fuzz targets for the validation of every decodeplane.transfer.v1 request
// message: random bytes → proto.Unmarshal → Validate() must not panic; every
// error line names a field path; a message that validates respects the
// bounds the .proto comments document, restated here.

type validated interface {
	proto.Message
	Validate() error
}

var fieldLine = regexp.MustCompile(`^[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*: `)

type bounds []string

func (b *bounds) need(ok bool, what string) {
	if !ok {
		*b = append(*b, what)
	}
}

func fuzzValidate[T validated](f *testing.F, newMsg func() T, check func(*bounds, T), seeds ...T) {
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newMsg()
		if err := proto.Unmarshal(data, m); err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !fieldLine.MatchString(line) {
					t.Fatalf("%T: error line %q does not start with a field path", m, line)
				}
			}
			return
		}
		var b bounds
		check(&b, m)
		if len(b) > 0 {
			t.Fatalf("%T validated but breaks its documented bounds %q: %v", m, b, m)
		}
	})
}

func nameOK(s string) bool { return len(s) >= 1 && len(s) <= 256 }

// rowsEnd is offset + (rows−1)·stride + length in big enough arithmetic
// (every term is bounded before it is used here).
func rowsEnd(offset, stride, length uint64, count uint32) (end uint64, ok bool) {
	rows := uint64(max(count, 1))
	if stride != 0 && rows-1 > (1<<62)/stride {
		return 0, false
	}
	end = offset + (rows-1)*stride
	if end > 1<<62 || length > 1<<62 {
		return 0, false
	}
	end += length
	return end, end <= 1<<62
}

func FuzzRegisterBuffers(f *testing.F) {
	fuzzValidate(f, func() *RegisterBuffersRequest { return new(RegisterBuffersRequest) }, func(b *bounds, m *RegisterBuffersRequest) {
		b.need(len(m.GetBuffers()) >= 1 && len(m.GetBuffers()) <= 4096, "buffers 1..4096")
		seen := map[string]bool{}
		for _, x := range m.GetBuffers() {
			b.need(nameOK(x.GetName()) && !seen[x.GetName()], "buffers[i].name unique, 1..256 bytes")
			seen[x.GetName()] = true
			b.need(x.GetKind() >= BufferKind_BUFFER_KIND_KV_POOL && x.GetKind() <= BufferKind_BUFFER_KIND_PREFILL_KV, "buffers[i].kind defined")
			b.need(x.GetLength() >= 1 && x.GetLength() <= 1<<62 && x.GetItemSize() <= 1<<62, "buffers[i].length, item_size")
			if x.GetMemory() != nil {
				memoryBounds(b, x.GetMemory(), x.GetLength())
			}
		}
	}, &RegisterBuffersRequest{Buffers: []*Buffer{{Name: "decode/dp0/tp0/kv", Kind: BufferKind_BUFFER_KIND_KV_POOL, Length: 4096, ItemSize: 512}, {Name: "decode/dp0/meta", Kind: BufferKind_BUFFER_KIND_METADATA, Length: 64}}},
		&RegisterBuffersRequest{Buffers: []*Buffer{
			{Name: "engine/kv", Kind: BufferKind_BUFFER_KIND_KV_POOL, Length: 8192, Memory: &BufferMemory{Kind: &BufferMemory_Shared{Shared: &SharedMemory{Path: "/dev/shm/kv", Offset: 4096}}}},
			{Name: "engine/meta", Kind: BufferKind_BUFFER_KIND_METADATA, Length: 64, Memory: &BufferMemory{Kind: &BufferMemory_Agent{Agent: &AgentMemory{}}}},
			{Name: "gpu/kv", Kind: BufferKind_BUFFER_KIND_KV_POOL, Length: 4096, Memory: &BufferMemory{Kind: &BufferMemory_CudaIpc{CudaIpc: &CudaIpc{Handle: make([]byte, 64), Device: 3}}}},
			{Name: "nixl/kv", Kind: BufferKind_BUFFER_KIND_PREFILL_KV, Length: 4096, Memory: &BufferMemory{Kind: &BufferMemory_Nixl{Nixl: &NixlDescriptor{Serialized: []byte("nixl")}}}},
		}})
}

// memoryBounds restates the bounds agent.proto documents for a buffer's
// memory (length is the buffer's).
func memoryBounds(b *bounds, m *BufferMemory, length uint64) {
	switch k := m.GetKind().(type) {
	case *BufferMemory_Agent:
	case *BufferMemory_Shared:
		p, off := k.Shared.GetPath(), k.Shared.GetOffset()
		b.need(len(p) >= 1 && len(p) <= 4096 && p[0] == '/' && !strings.Contains(p, "\x00"), "memory.shared.path absolute, 1..4096 bytes, no NUL")
		b.need(off <= 1<<62 && off%4096 == 0 && off+length <= 1<<62, "memory.shared.offset a multiple of 4096, offset + length <= 2^62")
	case *BufferMemory_CudaIpc:
		b.need(len(k.CudaIpc.GetHandle()) == 64, "memory.cuda_ipc.handle 64 bytes")
		b.need(k.CudaIpc.GetDevice() >= 0 && k.CudaIpc.GetDevice() <= 1023, "memory.cuda_ipc.device 0..1023")
	case *BufferMemory_Nixl:
		b.need(len(k.Nixl.GetSerialized()) >= 1 && len(k.Nixl.GetSerialized()) <= 1<<16, "memory.nixl.serialized 1..65536 bytes")
	default:
		b.need(false, "memory has a kind")
	}
}

func FuzzDeregisterBuffers(f *testing.F) {
	fuzzValidate(f, func() *DeregisterBuffersRequest { return new(DeregisterBuffersRequest) }, func(b *bounds, m *DeregisterBuffersRequest) {
		b.need(len(m.GetNames()) <= 4096, "names <= 4096")
		for _, n := range m.GetNames() {
			b.need(nameOK(n), "names[i]")
		}
	}, &DeregisterBuffersRequest{Names: []string{"a", "decode/dp0/meta"}})
}

func FuzzSubmitBatch(f *testing.F) {
	fuzzValidate(f, func() *SubmitBatchRequest { return new(SubmitBatchRequest) }, func(b *bounds, m *SubmitBatchRequest) {
		b.need(nameOK(m.GetBatchId()), "batch_id")
		b.need(len(m.GetCopies()) <= 1<<20 && len(m.GetWrites()) <= 1<<16, "copies, writes counts")
		b.need(len(m.GetCopies())+len(m.GetWrites()) > 0, "moves something")
		for _, c := range m.GetCopies() {
			b.need(nameOK(c.GetSrcBuffer()) && nameOK(c.GetDstBuffer()), "copies[i] buffers")
			b.need(c.GetLength() >= 1 && c.GetCount() <= 1<<24 && c.GetSrcStride() <= 1<<40 && c.GetDstStride() <= 1<<40, "copies[i] length, count, strides")
			_, okSrc := rowsEnd(c.GetSrcOffset(), c.GetSrcStride(), c.GetLength(), c.GetCount())
			_, okDst := rowsEnd(c.GetDstOffset(), c.GetDstStride(), c.GetLength(), c.GetCount())
			b.need(okSrc && okDst, "copies[i] rows end within 2^62")
		}
		for _, w := range m.GetWrites() {
			b.need(nameOK(w.GetDstBuffer()) && len(w.GetData()) >= 1 && len(w.GetData()) <= 1<<16, "writes[i]")
			b.need(w.GetDstOffset()+uint64(len(w.GetData())) <= 1<<62, "writes[i] end within 2^62")
		}
		b.need(m.GetDeadline() == nil || m.GetDeadline().IsValid(), "deadline valid")
	}, &SubmitBatchRequest{BatchId: "b1", Room: 5, Copies: []*Copy{{SrcBuffer: "p/kv", SrcOffset: 4096, DstBuffer: "decode/dp0/tp0/kv", DstOffset: 8192, Length: 256, Count: 128, SrcStride: 1024, DstStride: 512}},
		Writes: []*InlineWrite{{DstBuffer: "decode/dp0/meta", DstOffset: 64, Data: make([]byte, 64)}}, Deadline: timestamppb.Now()},
		&SubmitBatchRequest{BatchId: "b2", Copies: []*Copy{{SrcBuffer: "a", DstBuffer: "b", Length: 8, Count: 1 << 24, DstStride: 1 << 40}}})
}

func FuzzWatchCompletions(f *testing.F) {
	fuzzValidate(f, func() *WatchCompletionsRequest { return new(WatchCompletionsRequest) }, func(b *bounds, m *WatchCompletionsRequest) {
		b.need(len(m.GetReplayBatchIds()) <= 1<<20, "replay_batch_ids count")
		for _, id := range m.GetReplayBatchIds() {
			b.need(nameOK(id), "replay_batch_ids[i]")
		}
	}, &WatchCompletionsRequest{ReplayBatchIds: []string{"b1", "b2"}})
}

func FuzzCancelRoom(f *testing.F) {
	fuzzValidate(f, func() *CancelRoomRequest { return new(CancelRoomRequest) }, func(b *bounds, m *CancelRoomRequest) {
		b.need(len(m.GetBatchIds()) <= 1<<20, "batch_ids count")
		for _, id := range m.GetBatchIds() {
			b.need(nameOK(id), "batch_ids[i]")
		}
	}, &CancelRoomRequest{Room: 5, BatchIds: []string{"b1"}})
}

func FuzzReadBuffer(f *testing.F) {
	fuzzValidate(f, func() *ReadBufferRequest { return new(ReadBufferRequest) }, func(b *bounds, m *ReadBufferRequest) {
		b.need(nameOK(m.GetName()), "name")
		b.need(m.GetOffset() <= 1<<62 && m.GetLength() <= 2<<20, "offset, length")
	}, &ReadBufferRequest{Name: "decode/dp0/tp0/kv", Offset: 4096, Length: 2 << 20})
}

func FuzzWriteBuffer(f *testing.F) {
	fuzzValidate(f, func() *WriteBufferRequest { return new(WriteBufferRequest) }, func(b *bounds, m *WriteBufferRequest) {
		b.need(nameOK(m.GetName()), "name")
		b.need(m.GetOffset() <= 1<<62 && len(m.GetData()) <= 2<<20, "offset, data")
	}, &WriteBufferRequest{Name: "p/kv", Offset: 64, Data: []byte{1, 2, 3}})
}
