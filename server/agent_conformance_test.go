package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/validator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/server/grpcdecode"
	"github.com/decodeplane/decodeplane/transfer/agentservice"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
)

// TestConformanceTransferAgent is the conformance table of the reference
// agent's TransferAgent service, served the way cmd/decodeplane-agent serves
// it (DecodeOptions first, then recovery and the validator). After every
// refusal the registered buffers hold exactly the bytes they held before.
func TestConformanceTransferAgent(t *testing.T) {
	agent := hostmem.NewAgent(hostmem.New(64 << 20))
	svc := agentservice.New(agent, slog.New(slog.NewTextHandler(io.Discard, nil)))
	gs := grpc.NewServer(append(grpcdecode.DecodeOptions(),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(), validator.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(), validator.StreamServerInterceptor()),
	)...)
	svc.Register(gs)
	lis := bufconn.Listen(1 << 20)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		svc.Close()
		gs.GracefulStop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := transferv1.NewTransferAgentClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const kv, meta = "decode/dp0/tp0/kv", "decode/dp0/meta"
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{
		{Name: kv, Kind: transferv1.BufferKind_BUFFER_KIND_KV_POOL, Length: 4096},
		{Name: meta, Kind: transferv1.BufferKind_BUFFER_KIND_METADATA, Length: 64},
	}}); err != nil {
		t.Fatal(err)
	}
	pattern := bytes.Repeat([]byte{0xa5, 0x5a, 0x01}, 4096/3+1)[:4096]
	if _, err := c.WriteBuffer(ctx, &transferv1.WriteBufferRequest{Name: kv, Data: pattern}); err != nil {
		t.Fatal(err)
	}
	snapshot := func(ctx context.Context) string {
		var out strings.Builder
		for _, b := range []struct {
			name string
			n    uint64
		}{{kv, 4096}, {meta, 64}} {
			r, err := c.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: b.name, Length: b.n})
			if err != nil {
				t.Fatalf("ReadBuffer(%s): %v", b.name, err)
			}
			fmt.Fprintf(&out, "%s %x\n", b.name, r.GetData())
		}
		return out.String()
	}

	copyOK := func() *transferv1.Copy {
		return &transferv1.Copy{SrcBuffer: kv, DstBuffer: kv, DstOffset: 1024, Length: 64}
	}
	goodBatch := func() *transferv1.SubmitBatchRequest {
		return &transferv1.SubmitBatchRequest{BatchId: "b-conf", Room: 1, Copies: []*transferv1.Copy{copyOK()}}
	}
	goodReg := func() *transferv1.RegisterBuffersRequest {
		return &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{{Name: "x", Kind: transferv1.BufferKind_BUFFER_KIND_PREFILL_KV, Length: 64}}}
	}
	register := func(ctx context.Context, r *transferv1.RegisterBuffersRequest) error {
		_, err := c.RegisterBuffers(ctx, r)
		return err
	}
	deregister := func(ctx context.Context, r *transferv1.DeregisterBuffersRequest) error {
		_, err := c.DeregisterBuffers(ctx, r)
		return err
	}
	submit := func(ctx context.Context, r *transferv1.SubmitBatchRequest) error {
		_, err := c.SubmitBatch(ctx, r)
		return err
	}
	watch := func(ctx context.Context, r *transferv1.WatchCompletionsRequest) error {
		st, err := c.WatchCompletions(ctx, r)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	cancelRoom := func(ctx context.Context, r *transferv1.CancelRoomRequest) error {
		_, err := c.CancelRoom(ctx, r)
		return err
	}
	read := func(ctx context.Context, r *transferv1.ReadBufferRequest) error {
		_, err := c.ReadBuffer(ctx, r)
		return err
	}
	write := func(ctx context.Context, r *transferv1.WriteBufferRequest) error {
		_, err := c.WriteBuffer(ctx, r)
		return err
	}
	inv := codes.InvalidArgument
	type regReq = transferv1.RegisterBuffersRequest
	type batch = transferv1.SubmitBatchRequest
	const svcName = "/decodeplane.transfer.v1.TransferAgent/"
	rows := []confRow{
		// RegisterBuffers
		unaryRow("RegisterBuffers empty", goodReg, func(r *regReq) { r.Buffers = nil }, register, inv, "buffers: has 0 entries"),
		unaryRow("RegisterBuffers 4097", goodReg, func(r *regReq) { r.Buffers = repeat(r.Buffers[0], 4097) }, register, inv, "buffers: has 4097 entries"),
		unaryRow("RegisterBuffers name empty", goodReg, func(r *regReq) { r.Buffers[0].Name = "" }, register, inv, "buffers[0].name"),
		unaryRow("RegisterBuffers name long", goodReg, func(r *regReq) { r.Buffers[0].Name = strings.Repeat("n", 257) }, register, inv, "buffers[0].name"),
		unaryRow("RegisterBuffers twice", goodReg, func(r *regReq) { r.Buffers = append(r.Buffers, r.Buffers[0]) }, register, inv, "buffers[1].name: \"x\" is listed twice"),
		unaryRow("RegisterBuffers kind 0", goodReg, func(r *regReq) { r.Buffers[0].Kind = 0 }, register, inv, "buffers[0].kind"),
		unaryRow("RegisterBuffers kind 9", goodReg, func(r *regReq) { r.Buffers[0].Kind = 9 }, register, inv, "buffers[0].kind"),
		unaryRow("RegisterBuffers length 0", goodReg, func(r *regReq) { r.Buffers[0].Length = 0 }, register, inv, "buffers[0].length"),
		unaryRow("RegisterBuffers length 2^63", goodReg, func(r *regReq) { r.Buffers[0].Length = 1 << 63 }, register, inv, "buffers[0].length"),
		unaryRow("RegisterBuffers item_size", goodReg, func(r *regReq) { r.Buffers[0].ItemSize = 1 << 63 }, register, inv, "buffers[0].item_size"),
		unaryRow("RegisterBuffers other length", goodReg, func(r *regReq) { r.Buffers[0].Name = kv }, register, codes.FailedPrecondition, kv),
		unaryRow("RegisterBuffers beyond the memory limit", goodReg, func(r *regReq) { r.Buffers[0].Length = 1 << 40 }, register, codes.ResourceExhausted, "x"),
		utf8Row(t, conn, svcName+"RegisterBuffers", false, goodReg, func(r *regReq) {
			r.Buffers = append(r.Buffers, &transferv1.Buffer{Name: utf8Slot, Kind: 1, Length: 1})
		}, "buffers[1].name"),
		rawRow(conn, svcName+"RegisterBuffers", false, []byte{0x0a, 0x03, 0x0a, 0x09}, "buffers: cannot be decoded"),

		// DeregisterBuffers
		unaryRow("DeregisterBuffers name empty", func() *transferv1.DeregisterBuffersRequest { return &transferv1.DeregisterBuffersRequest{} }, func(r *transferv1.DeregisterBuffersRequest) { r.Names = []string{"a", ""} }, deregister, inv, "names[1]"),
		unaryRow("DeregisterBuffers 4097", func() *transferv1.DeregisterBuffersRequest { return &transferv1.DeregisterBuffersRequest{} }, func(r *transferv1.DeregisterBuffersRequest) { r.Names = repeat("a", 4097) }, deregister, inv, "names: has 4097 entries"),
		utf8Row(t, conn, svcName+"DeregisterBuffers", false, func() *transferv1.DeregisterBuffersRequest { return &transferv1.DeregisterBuffersRequest{} }, func(r *transferv1.DeregisterBuffersRequest) { r.Names = []string{"a", "b", utf8Slot} }, "names[2]"),

		// SubmitBatch
		unaryRow("SubmitBatch batch_id empty", goodBatch, func(r *batch) { r.BatchId = "" }, submit, inv, "batch_id"),
		unaryRow("SubmitBatch batch_id long", goodBatch, func(r *batch) { r.BatchId = strings.Repeat("b", 257) }, submit, inv, "batch_id"),
		unaryRow("SubmitBatch nothing", goodBatch, func(r *batch) { r.Copies = nil }, submit, inv, "moves nothing"),
		unaryRow("SubmitBatch copy length 0", goodBatch, func(r *batch) { r.Copies[0].Length = 0 }, submit, inv, "copies[0].length"),
		unaryRow("SubmitBatch copy src empty", goodBatch, func(r *batch) { r.Copies[0].SrcBuffer = "" }, submit, inv, "copies[0].src_buffer"),
		unaryRow("SubmitBatch copy dst long", goodBatch, func(r *batch) { r.Copies[0].DstBuffer = strings.Repeat("d", 300) }, submit, inv, "copies[0].dst_buffer"),
		unaryRow("SubmitBatch copy count", goodBatch, func(r *batch) { r.Copies[0].Count = 1<<32 - 1 }, submit, inv, "copies[0].count"),
		unaryRow("SubmitBatch copy stride", goodBatch, func(r *batch) { r.Copies[0].SrcStride = 1 << 41 }, submit, inv, "copies[0].src_stride"),
		unaryRow("SubmitBatch copy offset", goodBatch, func(r *batch) { r.Copies[0].DstOffset = 1 << 63 }, submit, inv, "copies[0].dst_offset"),
		unaryRow("SubmitBatch copy rows overflow", goodBatch, func(r *batch) { r.Copies[0].Count, r.Copies[0].DstStride = 1<<24, 1<<40 }, submit, inv, "copies[0].dst_offset: the copy's last row ends beyond 2^62"),
		unaryRow("SubmitBatch copy outside the buffer", goodBatch, func(r *batch) { r.Copies[0].DstOffset = 4090 }, submit, inv, "outside"),
		unaryRow("SubmitBatch unknown buffer", goodBatch, func(r *batch) { r.Copies[0].SrcBuffer = "nope" }, submit, codes.NotFound, "nope"),
		unaryRow("SubmitBatch write without data", goodBatch, func(r *batch) { r.Writes = []*transferv1.InlineWrite{{DstBuffer: meta}} }, submit, inv, "writes[0].data"),
		unaryRow("SubmitBatch write too big", goodBatch, func(r *batch) { r.Writes = []*transferv1.InlineWrite{{DstBuffer: meta, Data: make([]byte, 1<<16+1)}} }, submit, inv, "writes[0].data"),
		unaryRow("SubmitBatch write offset", goodBatch, func(r *batch) {
			r.Writes = []*transferv1.InlineWrite{{DstBuffer: meta, Data: []byte{1}, DstOffset: 1 << 62}}
		}, submit, inv, "writes[0].dst_offset"),
		unaryRow("SubmitBatch write dst", goodBatch, func(r *batch) { r.Writes = []*transferv1.InlineWrite{{Data: []byte{1}}} }, submit, inv, "writes[0].dst_buffer"),
		unaryRow("SubmitBatch deadline", goodBatch, func(r *batch) { r.Deadline = &timestamppb.Timestamp{Seconds: 1 << 62} }, submit, inv, "deadline"),
		unaryRow("SubmitBatch many bad copies", goodBatch, func(r *batch) { r.Copies = repeat(&transferv1.Copy{}, 1000) }, submit, inv, "copies: "),
		utf8Row(t, conn, svcName+"SubmitBatch", false, goodBatch, func(r *batch) { r.BatchId = utf8Slot }, "batch_id"),
		utf8Row(t, conn, svcName+"SubmitBatch", false, goodBatch, func(r *batch) { r.Copies = append(r.Copies, &transferv1.Copy{SrcBuffer: utf8Slot}) }, "copies[1].src_buffer"),
		utf8Row(t, conn, svcName+"SubmitBatch", false, goodBatch, func(r *batch) { r.Writes = []*transferv1.InlineWrite{{DstBuffer: utf8Slot}} }, "writes[0].dst_buffer"),

		// WatchCompletions (server streaming)
		unaryRow("WatchCompletions empty id", func() *transferv1.WatchCompletionsRequest { return &transferv1.WatchCompletionsRequest{} }, func(r *transferv1.WatchCompletionsRequest) { r.ReplayBatchIds = []string{""} }, watch, inv, "replay_batch_ids[0]"),
		unaryRow("WatchCompletions too many ids", func() *transferv1.WatchCompletionsRequest { return &transferv1.WatchCompletionsRequest{} }, func(r *transferv1.WatchCompletionsRequest) { r.ReplayBatchIds = repeat("b", transferv1.MaxBatchIDs+1) }, watch, inv, "replay_batch_ids: has 1048577 entries"),
		utf8Row(t, conn, svcName+"WatchCompletions", true, func() *transferv1.WatchCompletionsRequest { return &transferv1.WatchCompletionsRequest{} }, func(r *transferv1.WatchCompletionsRequest) { r.ReplayBatchIds = []string{utf8Slot} }, "replay_batch_ids[0]"),

		// CancelRoom
		unaryRow("CancelRoom empty id", func() *transferv1.CancelRoomRequest { return &transferv1.CancelRoomRequest{Room: 1} }, func(r *transferv1.CancelRoomRequest) { r.BatchIds = []string{"a", ""} }, cancelRoom, inv, "batch_ids[1]"),
		utf8Row(t, conn, svcName+"CancelRoom", false, func() *transferv1.CancelRoomRequest { return &transferv1.CancelRoomRequest{Room: 1} }, func(r *transferv1.CancelRoomRequest) { r.BatchIds = []string{utf8Slot} }, "batch_ids[0]"),

		// ReadBuffer, WriteBuffer
		unaryRow("ReadBuffer name empty", func() *transferv1.ReadBufferRequest { return &transferv1.ReadBufferRequest{Name: kv, Length: 8} }, func(r *transferv1.ReadBufferRequest) { r.Name = "" }, read, inv, "name"),
		unaryRow("ReadBuffer too long", func() *transferv1.ReadBufferRequest { return &transferv1.ReadBufferRequest{Name: kv, Length: 8} }, func(r *transferv1.ReadBufferRequest) { r.Length = 1 << 40 }, read, inv, "length"),
		unaryRow("ReadBuffer offset", func() *transferv1.ReadBufferRequest { return &transferv1.ReadBufferRequest{Name: kv, Length: 8} }, func(r *transferv1.ReadBufferRequest) { r.Offset = 1 << 63 }, read, inv, "offset"),
		unaryRow("ReadBuffer unknown", func() *transferv1.ReadBufferRequest { return &transferv1.ReadBufferRequest{Name: kv, Length: 8} }, func(r *transferv1.ReadBufferRequest) { r.Name = "nope" }, read, codes.NotFound, "nope"),
		utf8Row(t, conn, svcName+"ReadBuffer", false, func() *transferv1.ReadBufferRequest { return &transferv1.ReadBufferRequest{Length: 8} }, func(r *transferv1.ReadBufferRequest) { r.Name = utf8Slot }, "name"),
		unaryRow("WriteBuffer too much", func() *transferv1.WriteBufferRequest {
			return &transferv1.WriteBufferRequest{Name: kv, Data: []byte{1}}
		}, func(r *transferv1.WriteBufferRequest) { r.Data = make([]byte, transferv1.MaxBufferIO+1) }, write, inv, "data"),
		unaryRow("WriteBuffer offset", func() *transferv1.WriteBufferRequest {
			return &transferv1.WriteBufferRequest{Name: kv, Data: []byte{1}}
		}, func(r *transferv1.WriteBufferRequest) { r.Offset = 1 << 63 }, write, inv, "offset"),
		unaryRow("WriteBuffer outside", func() *transferv1.WriteBufferRequest {
			return &transferv1.WriteBufferRequest{Name: kv, Data: []byte{1}}
		}, func(r *transferv1.WriteBufferRequest) { r.Offset = 4096 }, write, inv, "4096"),
		utf8Row(t, conn, svcName+"WriteBuffer", false, func() *transferv1.WriteBufferRequest { return &transferv1.WriteBufferRequest{Data: []byte{1}} }, func(r *transferv1.WriteBufferRequest) { r.Name = utf8Slot }, "name"),
		rawRow(conn, svcName+"WriteBuffer", false, []byte{0x1a, 0x20, 0x00}, "data: cannot be decoded"),
	}
	runConformance(t, rows, snapshot)
}
