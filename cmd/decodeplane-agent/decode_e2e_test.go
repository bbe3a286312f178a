package main

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// rawCodec sends requests already encoded, so that a test can put invalid
// UTF-8 on the wire (proto.Marshal refuses it).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestE2EUndecodableIsInvalidArgument: invalid UTF-8 in a string field is
// INVALID_ARGUMENT naming the field, from the real agent binary and the real
// daemon binary alike (not grpc-go's INTERNAL).
func TestE2EUndecodableIsInvalidArgument(t *testing.T) {
	t.Parallel()
	c := newCluster(t, gqa, 1, nil)
	withBad := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.ReplaceAll(b, []byte("SLOT"), []byte("\xff\xfe(\xc3"))
	}
	for _, tc := range []struct {
		conn   *grpc.ClientConn
		method string
		req    []byte
		field  string
	}{
		{c.aconn, "/decodeplane.transfer.v1.TransferAgent/RegisterBuffers",
			withBad(&transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{{Name: "ok", Kind: 1, Length: 8}, {Name: "SLOT", Kind: 1, Length: 8}}}), "buffers[1].name"},
		{c.aconn, "/decodeplane.transfer.v1.TransferAgent/ReadBuffer", withBad(&transferv1.ReadBufferRequest{Name: "SLOT"}), "name"},
		{c.dconn, "/decodeplane.v1.Rooms/OpenRoom", withBad(&pb.OpenRoomRequest{Rid: "SLOT", BootstrapAddr: "10.0.0.1:8998", Room: 9, PromptLen: 8, MaxNewTokens: 1}), "rid"},
		{c.dconn, "/decodeplane.v1.Bootstrap/Heartbeat", withBad(&pb.HeartbeatRequest{Rank: &pb.PrefillRank{BootstrapAddr: "SLOT"}}), "rank.bootstrap_addr"},
	} {
		var out []byte
		err := tc.conn.Invoke(ctxT(t), tc.method, tc.req, &out, grpc.ForceCodec(rawCodec{}))
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.field+": contains invalid UTF-8") {
			t.Errorf("%s with invalid UTF-8 in %s = %v; want InvalidArgument naming %s", tc.method, tc.field, err, tc.field)
		}
	}
}
