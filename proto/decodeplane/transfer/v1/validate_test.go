package transferv1

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	buf := &Buffer{Name: "decode/dp0/tp0/kv", Kind: BufferKind_BUFFER_KIND_KV_POOL, Length: 4096}
	reg := func(m *BufferMemory) *RegisterBuffersRequest {
		return &RegisterBuffersRequest{Buffers: []*Buffer{{Name: "engine/kv", Kind: BufferKind_BUFFER_KIND_KV_POOL, Length: 4096, Memory: m}}}
	}
	shared := func(path string, off uint64) *BufferMemory {
		return &BufferMemory{Kind: &BufferMemory_Shared{Shared: &SharedMemory{Path: path, Offset: off}}}
	}
	cp := &Copy{SrcBuffer: "a", DstBuffer: "b", Length: 8}
	tests := []struct {
		name string
		msg  interface{ Validate() error }
		want string
	}{
		{"register ok", &RegisterBuffersRequest{Buffers: []*Buffer{buf}}, ""},
		{"register nothing", &RegisterBuffersRequest{}, "buffers"},
		{"register twice", &RegisterBuffersRequest{Buffers: []*Buffer{buf, buf}}, "listed twice"},
		{"register no kind", &RegisterBuffersRequest{Buffers: []*Buffer{{Name: "x", Length: 1}}}, "kind"},
		{"register empty", &RegisterBuffersRequest{Buffers: []*Buffer{{Name: "x", Kind: BufferKind_BUFFER_KIND_METADATA}}}, "length"},
		{"batch ok", &SubmitBatchRequest{BatchId: "b1", Copies: []*Copy{cp}}, ""},
		{"batch without id", &SubmitBatchRequest{Copies: []*Copy{cp}}, "batch_id"},
		{"empty batch", &SubmitBatchRequest{BatchId: "b1"}, "moves nothing"},
		{"copy without length", &SubmitBatchRequest{BatchId: "b1", Copies: []*Copy{{SrcBuffer: "a", DstBuffer: "b"}}}, "copies[0]"},
		{"write without data", &SubmitBatchRequest{BatchId: "b1", Writes: []*InlineWrite{{DstBuffer: "m"}}}, "writes[0]"},
		{"read too much", &ReadBufferRequest{Name: "x", Length: MaxBufferIO + 1}, "length"},
		{"write too much", &WriteBufferRequest{Name: "x", Data: make([]byte, MaxBufferIO+1)}, "data"},
		{"read ok", &ReadBufferRequest{Name: "x", Length: MaxBufferIO}, ""},
		{"agent memory", reg(&BufferMemory{Kind: &BufferMemory_Agent{Agent: &AgentMemory{}}}), ""},
		{"memory without a kind", reg(&BufferMemory{}), "buffers[0].memory: has no kind (agent, shared, cuda_ipc or nixl"},
		{"shared ok", reg(shared("/dev/shm/kv", 8192)), ""},
		{"shared path empty", reg(shared("", 0)), "buffers[0].memory.shared.path: is required"},
		{"shared path relative", reg(shared("dev/shm/kv", 0)), "buffers[0].memory.shared.path: \"dev/shm/kv\" is not absolute"},
		{"shared path long", reg(shared("/"+strings.Repeat("p", MaxSharedPath), 0)), "buffers[0].memory.shared.path: is 4097 bytes long (at most 4096)"},
		{"shared path 4096", reg(shared("/"+strings.Repeat("p", MaxSharedPath-1), 0)), ""},
		{"shared path NUL", reg(shared("/dev/shm/k\x00v", 0)), "buffers[0].memory.shared.path: contains a NUL byte (at 10)"},
		{"shared offset unaligned", reg(shared("/dev/shm/kv", 4097)), "buffers[0].memory.shared.offset: 4097 is not a multiple of 4096"},
		{"shared offset huge", reg(shared("/dev/shm/kv", 1<<63)), "buffers[0].memory.shared.offset: 9223372036854775808 is out of range"},
		{"shared region past 2^62", reg(shared("/dev/shm/kv", 1<<62)), "buffers[0].memory.shared.offset: 4611686018427387904 + length 4096 ends beyond 2^62"},
		{"cuda ipc ok", reg(&BufferMemory{Kind: &BufferMemory_CudaIpc{CudaIpc: &CudaIpc{Handle: make([]byte, 64), Device: 7}}}), ""},
		{"cuda ipc handle", reg(&BufferMemory{Kind: &BufferMemory_CudaIpc{CudaIpc: &CudaIpc{Handle: make([]byte, 63)}}}), "buffers[0].memory.cuda_ipc.handle: has 63 bytes (a cudaIpcMemHandle_t: exactly 64)"},
		{"cuda ipc device", reg(&BufferMemory{Kind: &BufferMemory_CudaIpc{CudaIpc: &CudaIpc{Handle: make([]byte, 64), Device: -1}}}), "buffers[0].memory.cuda_ipc.device: -1 is out of range (allowed 0..1023)"},
		{"nixl ok", reg(&BufferMemory{Kind: &BufferMemory_Nixl{Nixl: &NixlDescriptor{Serialized: []byte{1}}}}), ""},
		{"nixl empty", reg(&BufferMemory{Kind: &BufferMemory_Nixl{Nixl: &NixlDescriptor{}}}), "buffers[0].memory.nixl.serialized: has 0 bytes (allowed 1..65536)"},
		{"nixl too big", reg(&BufferMemory{Kind: &BufferMemory_Nixl{Nixl: &NixlDescriptor{Serialized: make([]byte, MaxNixlDescriptor+1)}}}), "buffers[0].memory.nixl.serialized: has 65537 bytes"},
	}
	for _, tc := range tests {
		err := tc.msg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func FuzzValidate(f *testing.F) {
	f.Add("a", "b", uint64(0), uint64(8), uint32(2), uint64(16), int32(1))
	f.Add("", "", uint64(1<<63), uint64(0), uint32(0), uint64(1<<41), int32(9))
	f.Fuzz(func(t *testing.T, src, dst string, off, length uint64, count uint32, stride uint64, kind int32) {
		msgs := []interface{ Validate() error }{
			&RegisterBuffersRequest{Buffers: []*Buffer{{Name: src, Kind: BufferKind(kind), Length: length}}},
			&SubmitBatchRequest{BatchId: dst, Copies: []*Copy{{SrcBuffer: src, DstBuffer: dst, SrcOffset: off, Length: length, Count: count, SrcStride: stride}}},
			&ReadBufferRequest{Name: src, Offset: off, Length: length},
			&WriteBufferRequest{Name: dst, Offset: off},
		}
		for _, m := range msgs {
			if err := m.Validate(); err != nil && err.Error() == "" {
				t.Errorf("%T: an error without a message", m)
			}
		}
	})
}
