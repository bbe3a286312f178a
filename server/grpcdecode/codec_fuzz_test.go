package grpcdecode

import (
	"strings"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// FuzzDecodeCodec: for any bytes and every request type, decodeCodec either
// decodes exactly what proto.Unmarshal decodes (and records nothing), or
// leaves the message empty but for its record, which decodeError turns into
// InvalidArgument naming a field path (or "request"). Nothing panics.
func FuzzDecodeCodec(f *testing.F) {
	for _, m := range []proto.Message{
		&pb.RegisterPrefillRequest{BootstrapAddr: "10.0.0.1:8998", Parallel: &pb.ParallelInfo{AttnTpSize: 2}, Model: &pb.ModelFacts{KvPoolKind: "gqa"}},
		&pb.TransferRequest{Room: 5, Rank: &pb.PrefillRank{BootstrapAddr: "a:1"}, Source: &pb.TransferSource{Buffer: "b", PageIndices: []int32{1, 2}}, Aux: &pb.Aux{RoomMarker: 5}},
		&transferv1.SubmitBatchRequest{BatchId: "b", Copies: []*transferv1.Copy{{SrcBuffer: "a", DstBuffer: "b", Length: 1}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte("\x0a\x04\xff\xfe\xfd\xfc"))
	f.Add([]byte("\x12\x06\x0a\x04a:\xff1"))
	codec := decodeCodec{base: encoding.GetCodecV2("proto")}
	news := []func() proto.Message{
		func() proto.Message { return new(pb.RegisterPrefillRequest) },
		func() proto.Message { return new(pb.LookupDPRanksRequest) },
		func() proto.Message { return new(pb.OpenRoomRequest) },
		func() proto.Message { return new(pb.TransferRequest) },
		func() proto.Message { return new(pb.ReportTransferRequest) },
		func() proto.Message { return new(pb.ListRoomsRequest) },
		func() proto.Message { return new(pb.ChunkReadyRequest) },
		func() proto.Message { return new(pb.GetStatusRequest) },
		func() proto.Message { return new(transferv1.RegisterBuffersRequest) },
		func() proto.Message { return new(transferv1.SubmitBatchRequest) },
		func() proto.Message { return new(transferv1.WatchCompletionsRequest) },
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newMsg := range news {
			m, want := newMsg(), newMsg()
			wantErr := proto.Unmarshal(data, want)
			if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, m); err != nil {
				t.Fatalf("%T: Unmarshal returned %v; the codec records errors instead", m, err)
			}
			rec := decodeError(m)
			if wantErr == nil {
				if rec != nil || !proto.Equal(m, want) {
					t.Fatalf("%T: decodable bytes gave record %v / message %v, want %v", m, rec, m, want)
				}
				continue
			}
			if rec == nil {
				t.Fatalf("%T: undecodable bytes (%v) left no record", m, wantErr)
			}
			msg := rec.Error()
			if !strings.Contains(msg, "InvalidArgument") || !fieldLine(msg) {
				t.Fatalf("%T: record %q is not InvalidArgument naming a field", m, msg)
			}
			m.ProtoReflect().SetUnknown(nil)
			if !proto.Equal(m, newMsg()) {
				t.Fatalf("%T: a partially decoded message survived: %v", m, m)
			}
		}
	})
}

// fieldLine reports whether a status text's message starts with a field path
// (or "request") and ": ".
func fieldLine(s string) bool {
	_, msg, ok := strings.Cut(s, "desc = ")
	if !ok {
		return false
	}
	path, _, ok := strings.Cut(msg, ": ")
	return ok && path != "" && !strings.ContainsAny(path, " \t")
}
