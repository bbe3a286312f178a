package transferv1

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	buf := &Buffer{Name: "decode/dp0/tp0/kv", Kind: BufferKind_BUFFER_KIND_KV_POOL, Length: 4096}
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
