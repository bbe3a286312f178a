//go:build linux

package agentservice_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/validator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/server/grpcdecode"
	"github.com/decodeplane/decodeplane/transfer/agentservice"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// shmDir is a fresh directory for the engine's files: under /dev/shm when
// it is there (tmpfs, what shm_open uses), else the temp dir.
func shmDir(t *testing.T) string {
	t.Helper()
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "agentservice-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// engineFile creates and sizes the file an engine would, filled with fill,
// and maps it shared as the engine does; the mapping is what the engine
// sees.
func engineFile(t *testing.T, dir, name string, size int, fill byte) (string, []byte) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, bytes.Repeat([]byte{fill}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(m) })
	return path, m
}

// serveTCP serves the reference service over a real loopback socket the
// way cmd/decodeplane-agent does (the decoding codec, recovery, the
// validator), on a store admitting dir's files.
func serveTCP(t *testing.T, limit int64, dir string) (*hostmem.Agent, transferv1.TransferAgentClient) {
	t.Helper()
	store := hostmem.NewStore(hostmem.Options{Limit: limit, SharedDirs: []string{dir}})
	agent := hostmem.NewAgent(store)
	svc := agentservice.New(agent, slog.New(slog.DiscardHandler))
	gs := grpc.NewServer(append(grpcdecode.DecodeOptions(),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(), validator.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(), validator.StreamServerInterceptor()))...)
	svc.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		svc.Close()
		gs.Stop()
		<-served
		if err := store.Close(); err != nil {
			t.Errorf("store.Close: %v", err)
		}
	})
	return agent, transferv1.NewTransferAgentClient(conn)
}

func sharedMem(path string, off uint64) *transferv1.BufferMemory {
	return &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_Shared{Shared: &transferv1.SharedMemory{Path: path, Offset: off}}}
}

func buf(name string, length uint64, mem *transferv1.BufferMemory) *transferv1.Buffer {
	return &transferv1.Buffer{Name: name, Kind: transferv1.BufferKind_BUFFER_KIND_KV_POOL, Length: length, Memory: mem}
}

// completions watches the agent's completions; next returns the one of id.
type completions struct {
	t  *testing.T
	st grpc.ServerStreamingClient[transferv1.Completion]
}

func watch(ctx context.Context, t *testing.T, c transferv1.TransferAgentClient) *completions {
	t.Helper()
	st, err := c.WatchCompletions(ctx, &transferv1.WatchCompletionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if hello, err := st.Recv(); err != nil || hello.GetBatchId() != "" {
		t.Fatalf("hello = %v, %v", hello, err)
	}
	return &completions{t: t, st: st}
}

func (w *completions) next(id string) *transferv1.Completion {
	w.t.Helper()
	for {
		c, err := w.st.Recv()
		if err != nil {
			w.t.Fatalf("waiting for the completion of %s: %v", id, err)
		}
		if c.GetBatchId() == id {
			return c
		}
	}
}

// TestSharedMemoryOverGRPC: an engine's shared-memory file registered over
// a real socket receives the batch's copies (contiguous and strided) and
// inline writes at the region's offset, byte for byte, seen through the
// engine's own mapping and the file; the rest of the file is untouched;
// what the engine writes, ReadBuffer returns.
func TestSharedMemoryOverGRPC(t *testing.T) {
	dir := shmDir(t)
	const kvOff, kvLen, metaLen, size = 8192, 64 << 10, 256, 8192 + 64<<10 + 4096
	path, engine := engineFile(t, dir, "engine-kv", size, 0xee)
	_, c := serveTCP(t, 1<<20, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{
		buf("prefill/kv", kvLen, nil),
		buf("engine/kv", kvLen, sharedMem(path, kvOff)),
		{Name: "engine/meta", Kind: transferv1.BufferKind_BUFFER_KIND_METADATA, Length: metaLen, Memory: sharedMem(path, 0)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetBuffers()[1].GetMemory().GetShared().GetPath(); got != path || resp.GetBuffers()[1].GetAddress() == 0 {
		t.Errorf("RegisterBuffers echoed %v, want the shared memory and an address", resp.GetBuffers()[1])
	}
	src := make([]byte, kvLen)
	for i := range src {
		src[i] = byte(i*31 + i>>8)
	}
	if _, err := c.WriteBuffer(ctx, &transferv1.WriteBufferRequest{Name: "prefill/kv", Data: src}); err != nil {
		t.Fatal(err)
	}
	w := watch(ctx, t, c)
	// A page copy, then head slices: 64 rows of 128 bytes from a 256-byte
	// source stride into a 384-byte destination stride.
	req := &transferv1.SubmitBatchRequest{BatchId: "b1", Room: 1, Copies: []*transferv1.Copy{
		{SrcBuffer: "prefill/kv", SrcOffset: 4096, DstBuffer: "engine/kv", DstOffset: 0, Length: 4096},
		{SrcBuffer: "prefill/kv", SrcOffset: 8192, DstBuffer: "engine/kv", DstOffset: 16384, Length: 128, Count: 64, SrcStride: 256, DstStride: 384},
	}, Writes: []*transferv1.InlineWrite{{DstBuffer: "engine/meta", DstOffset: 64, Data: []byte("room 1: done")}}}
	if _, err := c.SubmitBatch(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := w.next("b1"); !got.GetOk() {
		t.Fatalf("batch b1 failed: %s", got.GetError())
	}
	want := bytes.Repeat([]byte{0xee}, size)
	copy(want[kvOff:], src[4096:8192])
	for r := range 64 {
		copy(want[kvOff+16384+r*384:][:128], src[8192+r*256:][:128])
	}
	copy(want[64:], "room 1: done")
	if i := diff(engine, want); i >= 0 {
		t.Fatalf("the engine's mapping: byte %d = %#x, want %#x", i, engine[i], want[i])
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if i := diff(file, want); i >= 0 {
		t.Fatalf("the file: byte %d = %#x, want %#x", i, file[i], want[i])
	}
	copy(engine[kvOff+100:], "written by the engine")
	got, err := c.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: "engine/kv", Offset: 100, Length: 21})
	if err != nil || string(got.GetData()) != "written by the engine" {
		t.Errorf("ReadBuffer after the engine wrote = %q, %v", got.GetData(), err)
	}
}

func diff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestSharedMemoryRefusalsOverGRPC: what the reference agent cannot hold is
// refused with the code the contract names and a message saying why;
// nothing is registered.
func TestSharedMemoryRefusalsOverGRPC(t *testing.T) {
	dir := shmDir(t)
	path, _ := engineFile(t, dir, "kv", 8192, 0)
	other, _ := engineFile(t, dir, "kv2", 8192, 0)
	_, c := serveTCP(t, 64<<10, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{buf("kv", 4096, sharedMem(path, 4096))}}); err != nil {
		t.Fatal(err)
	}
	fp, inv := codes.FailedPrecondition, codes.InvalidArgument
	for _, tc := range []struct {
		name string
		b    *transferv1.Buffer
		code codes.Code
		msg  []string
	}{
		{"cuda ipc", buf("g", 4096, &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_CudaIpc{CudaIpc: &transferv1.CudaIpc{Handle: make([]byte, 64)}}}),
			fp, []string{"cuda_ipc memory", "the reference agent holds host memory only", "needs a GPU transfer agent"}},
		{"nixl", buf("g", 4096, &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_Nixl{Nixl: &transferv1.NixlDescriptor{Serialized: []byte("d")}}}),
			fp, []string{"nixl memory", "the reference agent holds host memory only", "needs a GPU transfer agent"}},
		{"a path that does not exist", buf("s", 4096, sharedMem(filepath.Join(dir, "nope"), 0)), fp, []string{"no such file or directory"}},
		{"a region beyond the file", buf("s", 8192, sharedMem(path, 4096)), fp, []string{"the region [4096, 12288) needs a file of 12288 bytes, the file has 8192"}},
		{"a relative path", buf("s", 4096, sharedMem("dev/shm/kv", 0)), inv, []string{"buffers[0].memory.shared.path", "not absolute"}},
		{"an unaligned offset", buf("s", 4096, sharedMem(path, 100)), inv, []string{"buffers[0].memory.shared.offset: 100 is not a multiple of 4096"}},
		{"a memory without a kind", buf("s", 4096, &transferv1.BufferMemory{}), inv, []string{"buffers[0].memory: has no kind"}},
		{"outside the admitted directories", buf("s", 4096, sharedMem("/etc/hostname", 0)), fp, []string{"outside the directories this agent admits"}},
		{"kv in another memory", buf("kv", 4096, nil), fp, []string{`register buffer "kv"`, "in agent memory", "registered in other memory"}},
		{"kv in another file", buf("kv", 4096, sharedMem(other, 4096)), fp, []string{"registered in other memory", other}},
		{"kv at another offset", buf("kv", 4096, sharedMem(path, 0)), fp, []string{"registered in other memory", "at offset 0"}},
	} {
		_, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{tc.b}})
		msg := status.Convert(err).Message()
		if status.Code(err) != tc.code {
			t.Errorf("%s: RegisterBuffers = %v, want %v", tc.name, err, tc.code)
			continue
		}
		for _, m := range tc.msg {
			if !strings.Contains(msg, m) {
				t.Errorf("%s: %q does not say %q", tc.name, msg, m)
			}
		}
		if tc.b.GetName() != "kv" {
			if _, err := c.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: tc.b.GetName(), Length: 1}); status.Code(err) != codes.NotFound {
				t.Errorf("%s: the refused buffer reads %v, want NotFound", tc.name, err)
			}
		}
	}
	// The same registration again is OK.
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{buf("kv", 4096, sharedMem(path, 4096))}}); err != nil {
		t.Errorf("the same shared registration again: %v", err)
	}
}

// TestSharedMemoryBusyBudgetAndShrink: a held batch keeps its shared
// buffer registered (DeregisterBuffers refused) until it is cancelled; the
// memory budget counts agent memory only; a file truncated below its
// region fails the batch (ok = false, saying so) and ReadBuffer, without
// harm to the agent.
func TestSharedMemoryBusyBudgetAndShrink(t *testing.T) {
	dir := shmDir(t)
	path, _ := engineFile(t, dir, "kv", 1<<20, 0)
	agent, c := serveTCP(t, 64<<10, dir)
	agent.SetHold(func(b kvcopy.Batch) bool { return b.Room == 77 })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{
		buf("engine/kv", 1<<20, sharedMem(path, 0)), buf("src", 64<<10, nil),
	}}); err != nil {
		t.Fatalf("1 MiB shared beside 64 KiB of agent memory in a 64 KiB budget: %v", err)
	}
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{buf("more", 1, nil)}}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("one byte of agent memory past the budget = %v, want ResourceExhausted", err)
	}
	w := watch(ctx, t, c)
	held := &transferv1.SubmitBatchRequest{BatchId: "held", Room: 77, Copies: []*transferv1.Copy{{SrcBuffer: "src", DstBuffer: "engine/kv", Length: 64}}}
	if _, err := c.SubmitBatch(ctx, held); err != nil {
		t.Fatal(err)
	}
	_, err := c.DeregisterBuffers(ctx, &transferv1.DeregisterBuffersRequest{Names: []string{"engine/kv"}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "copies in flight") {
		t.Errorf("DeregisterBuffers with a held batch in flight = %v, want FailedPrecondition", err)
	}
	if _, err := c.CancelRoom(ctx, &transferv1.CancelRoomRequest{Room: 77}); err != nil {
		t.Fatal(err)
	}
	if got := w.next("held"); got.GetOk() {
		t.Error("the cancelled batch completed ok")
	}

	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitBatch(ctx, &transferv1.SubmitBatchRequest{BatchId: "shrunk", Room: 1, Copies: []*transferv1.Copy{{SrcBuffer: "src", DstBuffer: "engine/kv", Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	if got := w.next("shrunk"); got.GetOk() || !strings.Contains(got.GetError(), "the file was truncated to 4096 bytes") {
		t.Errorf("a batch into a truncated file completed %v (%q), want ok = false saying truncated", got.GetOk(), got.GetError())
	}
	if _, err := c.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: "engine/kv", Offset: 8192, Length: 8}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ReadBuffer of a truncated file = %v, want FailedPrecondition", err)
	}
	if _, err := c.DeregisterBuffers(ctx, &transferv1.DeregisterBuffersRequest{Names: []string{"engine/kv"}}); err != nil {
		t.Errorf("DeregisterBuffers with nothing in flight: %v", err)
	}
	if _, err := c.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: "engine/kv", Length: 8}); status.Code(err) != codes.NotFound {
		t.Errorf("ReadBuffer after DeregisterBuffers = %v, want NotFound", err)
	}
}
