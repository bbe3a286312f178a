package grpcdecode

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestMarshalMatchesProto: for messages of every block size and past the
// pooling threshold, the codec's bytes are proto.Marshal's, and a small
// message costs one allocation.
func TestMarshalMatchesProto(t *testing.T) {
	codec := decodeCodec{base: encoding.GetCodecV2("proto")}
	for _, n := range []int{0, 1, 100, 128, 200, 256, 400, 512, 900, 1024, 1500, 70000} {
		m := &pb.Failure{Message: strings.Repeat("x", n)}
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := codec.Marshal(m)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if b := got.Materialize(); !bytes.Equal(b, want) {
			t.Errorf("message of %d bytes: codec wrote %d bytes, proto.Marshal %d (or different bytes)", len(want), len(b), len(want))
		}
		got.Free()
	}
	small := &pb.Failure{Message: strings.Repeat("x", 300)}
	if a := testing.AllocsPerRun(100, func() {
		bs, err := codec.Marshal(small)
		if err != nil {
			t.Fatal(err)
		}
		bs.Free()
	}); a != 1 {
		t.Errorf("a %d-byte message: %.0f allocations per Marshal, want 1", proto.Size(small), a)
	}
	// Not a proto message: the base codec's error.
	if _, err := codec.Marshal(struct{}{}); err == nil {
		t.Error("Marshal of a non-message: no error")
	}
}
