//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
)

// The shared-memory end-to-end test: the test process plays a decode
// engine that created its KV cache in a shared-memory file and maps it; the
// reference agent binary maps the same file region, and every byte it
// copies or writes appears in the engine's mapping.

// engineShm creates a size-byte file in a fresh directory (under /dev/shm
// when it is there), fills it with fill and maps it shared, as an engine
// does; it returns the directory, the path and the engine's mapping.
func engineShm(t *testing.T, name string, size int, fill byte) (dir, path string, mem []byte) {
	t.Helper()
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "decodeplane-agent-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path = filepath.Join(dir, name)
	if err := os.WriteFile(path, bytes.Repeat([]byte{fill}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if mem, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	return dir, path, mem
}

func shm(path string, off uint64) *transferv1.BufferMemory {
	return &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_Shared{Shared: &transferv1.SharedMemory{Path: path, Offset: off}}}
}

func kvBuf(name string, length uint64, mem *transferv1.BufferMemory) *transferv1.Buffer {
	return &transferv1.Buffer{Name: name, Kind: transferv1.BufferKind_BUFFER_KIND_KV_POOL, Length: length, Memory: mem}
}

// awaitCompletion reads the completion stream until batch id's.
func awaitCompletion(t *testing.T, st grpc.ServerStreamingClient[transferv1.Completion], id string) *transferv1.Completion {
	t.Helper()
	for {
		c, err := st.Recv()
		if err != nil {
			t.Fatalf("waiting for the completion of %s: %v", id, err)
		}
		if c.GetBatchId() == id {
			return c
		}
	}
}

// TestE2EAgentSharedMemory runs the agent binary on an engine's shared-memory
// file: copies (page-sized and strided) and inline writes land in the
// engine's own mapping byte for byte; the engine's writes are read back;
// GPU memory kinds, missing files, regions past the file, relative paths,
// files outside --shared-memory-dirs and re-registration in other memory
// are refused with their reasons; shared memory is not charged to
// --max-memory-mb; a held batch keeps its buffer from being deregistered;
// a truncated file fails its batch and the agent goes on; the agent stops
// cleanly and the file keeps the bytes.
func TestE2EAgentSharedMemory(t *testing.T) {
	const meta, page, pages = 4096, 64 << 10, 32 // 2 MiB of KV after one metadata page
	const size = meta + page*pages
	dir, path, engine := engineShm(t, "engine-kv", size, 0xee)
	bin := e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-agent")
	agent, conn := startAgent(t, bin, freeAddr(t), "--shared-memory-dirs", dir, "--max-memory-mb", "1", "--fault-hold-rooms", "77")
	c := transferv1.NewTransferAgentClient(conn)
	ctx := ctxT(t)

	// 2 MiB of the engine's memory beside the agent's whole 1 MiB budget.
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{
		kvBuf("prefill/kv", 1<<20, nil),
		kvBuf("engine/kv", page*pages, shm(path, meta)),
		{Name: "engine/meta", Kind: transferv1.BufferKind_BUFFER_KIND_METADATA, Length: meta, Memory: shm(path, 0)},
	}}); err != nil {
		t.Fatalf("RegisterBuffers: %v", err)
	}
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{kvBuf("more", 1, nil)}}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("one byte of agent memory past --max-memory-mb = %v, want ResourceExhausted", err)
	}
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i*131 + i>>12)
	}
	if _, err := c.WriteBuffer(ctx, &transferv1.WriteBufferRequest{Name: "prefill/kv", Data: src}); err != nil {
		t.Fatal(err)
	}
	st, err := c.WatchCompletions(ctx, &transferv1.WatchCompletionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil { // hello
		t.Fatal(err)
	}

	// Source pages 0..15 into engine pages 31..16 (reversed), then head
	// slices: 512 rows of 32 bytes, source stride 128, destination 96,
	// into engine pages 0..; then the metadata slot.
	want := bytes.Repeat([]byte{0xee}, size)
	b := &transferv1.SubmitBatchRequest{BatchId: "shm-1", Room: 5}
	for i := range 16 {
		b.Copies = append(b.Copies, &transferv1.Copy{SrcBuffer: "prefill/kv", SrcOffset: uint64(i * page), DstBuffer: "engine/kv", DstOffset: uint64((31 - i) * page), Length: page})
		copy(want[meta+(31-i)*page:][:page], src[i*page:][:page])
	}
	b.Copies = append(b.Copies, &transferv1.Copy{SrcBuffer: "prefill/kv", SrcOffset: 3, DstBuffer: "engine/kv", DstOffset: 5, Length: 32, Count: 512, SrcStride: 128, DstStride: 96})
	for r := range 512 {
		copy(want[meta+5+r*96:][:32], src[3+r*128:][:32])
	}
	b.Writes = []*transferv1.InlineWrite{{DstBuffer: "engine/meta", DstOffset: 128, Data: []byte("room 5 marker")}}
	copy(want[128:], "room 5 marker")
	if _, err := c.SubmitBatch(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := awaitCompletion(t, st, "shm-1"); !got.GetOk() || got.GetBytes() != 16*page+512*32+13 {
		t.Fatalf("batch shm-1 = ok %v, %d bytes, %q", got.GetOk(), got.GetBytes(), got.GetError())
	}
	checkBytes := func(what string, got []byte) {
		t.Helper()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: byte %d (engine/kv offset %d) = %#x, want %#x", what, i, i-meta, got[i], want[i])
			}
		}
	}
	checkBytes("the engine's mapping", engine)
	copy(engine[meta+page*pages-16:], "engine's own")
	copy(want[meta+page*pages-16:], "engine's own")
	if r, err := c.ReadBuffer(ctx, &transferv1.ReadBufferRequest{Name: "engine/kv", Offset: page*pages - 16, Length: 12}); err != nil || string(r.GetData()) != "engine's own" {
		t.Errorf("ReadBuffer of what the engine wrote = %q, %v", r.GetData(), err)
	}

	refusals(t, c, dir, path)

	heldAndShrunk(t, c, st, dir)
	waitHealth(t, conn, agent, healthpb.HealthCheckResponse_SERVING)

	if err := agent.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := agent.Wait(t, e2eTimeout); code != 0 {
		t.Fatalf("the agent exited %d on SIGTERM, want 0", code)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkBytes("the file after the agent stopped", file)
}

// refusals: what the reference agent cannot hold is refused with its
// reason; registered buffers keep their memory.
func refusals(t *testing.T, c transferv1.TransferAgentClient, dir, path string) {
	t.Helper()
	ctx := ctxT(t)
	fp, inv := codes.FailedPrecondition, codes.InvalidArgument
	for _, tc := range []struct {
		name string
		b    *transferv1.Buffer
		code codes.Code
		msg  string
	}{
		{"cuda ipc", kvBuf("gpu", 4096, &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_CudaIpc{CudaIpc: &transferv1.CudaIpc{Handle: make([]byte, 64), Device: 1}}}),
			fp, "cuda_ipc memory: memory kind not implemented by this agent: the reference agent holds host memory only (agent or shared memory); cuda_ipc memory needs a GPU transfer agent"},
		{"nixl", kvBuf("gpu", 4096, &transferv1.BufferMemory{Kind: &transferv1.BufferMemory_Nixl{Nixl: &transferv1.NixlDescriptor{Serialized: []byte{1}}}}),
			fp, "nixl memory needs a GPU transfer agent"},
		{"missing file", kvBuf("s", 4096, shm(filepath.Join(dir, "nope"), 0)), fp, "no such file or directory"},
		{"region past the file", kvBuf("s", 4096, shm(path, 2<<20+4096)), fp, fmt.Sprintf("needs a file of %d bytes, the file has %d", 2<<20+8192, 2<<20+4096)},
		{"relative path", kvBuf("s", 4096, shm("engine-kv", 0)), inv, `buffers[0].memory.shared.path: "engine-kv" is not absolute`},
		{"engine/kv in agent memory", kvBuf("engine/kv", 2<<20, nil), fp, "registered in other memory (shared memory " + path + " at offset 4096)"},
		{"engine/kv at another offset", kvBuf("engine/kv", 2<<20, shm(path, 0)), fp, "registered in other memory"},
		{"engine/kv shorter", kvBuf("engine/kv", 4096, shm(path, 4096)), fp, "registered with another length"},
	} {
		_, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{tc.b}})
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: RegisterBuffers = %v, want %v saying %q", tc.name, err, tc.code, tc.msg)
		}
	}
}

// heldAndShrunk: a held batch keeps engine/kv registered until it is
// cancelled; a file outside --shared-memory-dirs is refused; a file the
// engine truncates below its region fails the batch.
func heldAndShrunk(t *testing.T, c transferv1.TransferAgentClient, st grpc.ServerStreamingClient[transferv1.Completion], dir string) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := c.SubmitBatch(ctx, &transferv1.SubmitBatchRequest{BatchId: "held", Room: 77, Copies: []*transferv1.Copy{{SrcBuffer: "prefill/kv", DstBuffer: "engine/kv", Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeregisterBuffers(ctx, &transferv1.DeregisterBuffersRequest{Names: []string{"engine/kv"}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("DeregisterBuffers with a held batch in flight = %v, want FailedPrecondition", err)
	}
	if _, err := c.CancelRoom(ctx, &transferv1.CancelRoomRequest{Room: 77}); err != nil {
		t.Fatal(err)
	}
	if got := awaitCompletion(t, st, "held"); got.GetOk() {
		t.Error("the cancelled batch completed ok")
	}
	if _, err := c.DeregisterBuffers(ctx, &transferv1.DeregisterBuffersRequest{Names: []string{"engine/kv"}}); err != nil {
		t.Errorf("DeregisterBuffers once nothing is in flight: %v", err)
	}

	// A file outside --shared-memory-dirs is refused.
	_, small, _ := engineShm(t, "small", 8192, 0)
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{kvBuf("small", 4096, shm(small, 4096))}}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "outside the directories this agent admits") {
		t.Errorf("a file outside --shared-memory-dirs = %v, want FailedPrecondition", err)
	}
	// A file the engine truncates below its region fails the batch.
	shrink := filepath.Join(dir, "shrink")
	if err := os.WriteFile(shrink, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: []*transferv1.Buffer{kvBuf("shrink", 4096, shm(shrink, 4096))}}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(shrink, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitBatch(ctx, &transferv1.SubmitBatchRequest{BatchId: "shrunk", Room: 6, Copies: []*transferv1.Copy{{SrcBuffer: "prefill/kv", DstBuffer: "shrink", Length: 4096}}}); err != nil {
		t.Fatal(err)
	}
	if got := awaitCompletion(t, st, "shrunk"); got.GetOk() || !strings.Contains(got.GetError(), "the file was truncated to 4096 bytes") {
		t.Errorf("a batch into a truncated file = ok %v, %q; want ok = false saying truncated", got.GetOk(), got.GetError())
	}
}
