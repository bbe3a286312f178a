package agentservice_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/validator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/agentclient"
	"github.com/decodeplane/decodeplane/transfer/agentservice"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// serve runs the reference agent's service (with the validator, as
// cmd/decodeplane-agent serves it) over bufconn and returns the daemon's
// agent client, running, and a raw stub.
func serve(t *testing.T) (*agentclient.Client, transferv1.TransferAgentClient) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(validator.UnaryServerInterceptor()))
	svc := agentservice.New(hostmem.NewAgent(hostmem.New(1<<20)), slog.New(slog.DiscardHandler))
	svc.Register(gs)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
	ac, err := agentclient.Dial("passthrough:///bufnet", agentclient.Options{Logger: slog.New(slog.DiscardHandler), DialOptions: []grpc.DialOption{dialer}})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()), dialer)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = ac.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
		ac.Close()
		raw.Close()
		svc.Close()
		gs.Stop()
		<-served
	})
	// The client's completion stream must be up before a batch can be
	// submitted: Check waits for it (a test that raced it saw "no
	// completion stream").
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if err := ac.Check(cctx); err != nil {
		t.Fatalf("the agent client did not connect: %v", err)
	}
	return ac, transferv1.NewTransferAgentClient(raw)
}

// TestClientAndServiceMoveBytes: the daemon's client registers buffers,
// runs a batch of strided copies and an inline write through the reference
// service, and the bytes land where the batch said.
func TestClientAndServiceMoveBytes(t *testing.T) {
	ac, raw := serve(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := ac.RegisterBuffers(ctx, []kvcopy.BufferSpec{
		{Name: "prefill/tp0/kv", Kind: kvcopy.KindPrefillKV, Length: 1024},
		{Name: "decode/dp0/tp0/kv", Kind: kvcopy.KindKVPool, Length: 1024},
		{Name: "decode/dp0/meta", Kind: kvcopy.KindMetadata, Length: 64},
	}); err != nil {
		t.Fatalf("RegisterBuffers: %v", err)
	}
	src := make([]byte, 1024)
	for i := range src {
		src[i] = byte(i % 251)
	}
	if _, err := raw.WriteBuffer(ctx, &transferv1.WriteBufferRequest{Name: "prefill/tp0/kv", Data: src}); err != nil {
		t.Fatalf("WriteBuffer: %v", err)
	}
	// Two rows of 16 bytes, source stride 64, destination stride 32.
	b := kvcopy.Batch{ID: "b1", Room: 7,
		Copies: []kvcopy.Copy{{SrcBuffer: "prefill/tp0/kv", SrcOffset: 100, DstBuffer: "decode/dp0/tp0/kv", DstOffset: 512, Length: 16, Count: 2, SrcStride: 64, DstStride: 32}},
		Writes: []kvcopy.InlineWrite{{DstBuffer: "decode/dp0/meta", DstOffset: 8, Data: []byte("room-7")}},
	}
	if err := ac.Execute(ctx, b); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	got, err := raw.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: "decode/dp0/tp0/kv", Offset: 512, Length: 48})
	if err != nil {
		t.Fatalf("ReadBuffer: %v", err)
	}
	want := make([]byte, 48)
	copy(want[0:16], src[100:116])
	copy(want[32:48], src[164:180])
	if !bytes.Equal(got.GetData(), want) {
		t.Errorf("decode KV after the batch = %v, want %v", got.GetData(), want)
	}
	meta, err := raw.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: "decode/dp0/meta", Offset: 8, Length: 6})
	if err != nil || string(meta.GetData()) != "room-7" {
		t.Errorf("metadata after the inline write = %q, %v; want room-7", meta.GetData(), err)
	}
}

// TestServiceRefusesWithReasons: a batch out of a buffer's range fails the
// Execute with the agent's reason, and a buffer of an unknown kind is
// refused with InvalidArgument naming the field.
func TestServiceRefusesWithReasons(t *testing.T) {
	ac, raw := serve(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := ac.RegisterBuffers(ctx, []kvcopy.BufferSpec{{Name: "a", Kind: kvcopy.KindKVPool, Length: 64}}); err != nil {
		t.Fatal(err)
	}
	err := ac.Execute(ctx, kvcopy.Batch{ID: "b2", Room: 1, Copies: []kvcopy.Copy{{SrcBuffer: "a", SrcOffset: 60, DstBuffer: "a", DstOffset: 0, Length: 16}}})
	if err == nil || errors.Is(err, delegate.ErrAgentLost) {
		t.Errorf("out-of-range Execute = %v, want the agent's refusal", err)
	}
	_, err = raw.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{{Name: "x", Kind: 9, Length: 64}}})
	if status.Code(err) != codes.InvalidArgument || !bytes.Contains([]byte(status.Convert(err).Message()), []byte("kind")) {
		t.Errorf("unknown kind: %v, want InvalidArgument naming kind", err)
	}
}
