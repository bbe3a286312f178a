//go:build linux

package hostmem_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// shmDir is a fresh directory for the test's shared-memory files: under
// /dev/shm (tmpfs, what shm_open uses) when it is there, else the temp dir.
func shmDir(t *testing.T) string {
	t.Helper()
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "hostmem-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// engineFile creates the file an engine would: size bytes, filled with fill.
func engineFile(t *testing.T, dir, name string, size int, fill byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, bytes.Repeat([]byte{fill}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func shared(path string, off int64) hostmem.Memory {
	return hostmem.Memory{Kind: hostmem.MemoryShared, Path: path, Offset: off}
}

func reg(name string, length int64, mem hostmem.Memory) hostmem.Registration {
	return hostmem.Registration{Spec: kvcopy.BufferSpec{Name: name, Kind: kvcopy.KindKVPool, Length: length}, Memory: mem}
}

// TestSharedMemoryLandsInTheFile: copies (contiguous and strided) and
// inline writes into a shared buffer land in the file at the region's
// offset, and nowhere else in it; what the engine writes into the file is
// what the store reads.
func TestSharedMemoryLandsInTheFile(t *testing.T) {
	dir := shmDir(t)
	const off, n, fileSize = 8192, 4096, 3 * 8192
	path := engineFile(t, dir, "kv", fileSize, 0xee)
	st := hostmem.NewStore(hostmem.Options{SharedDirs: []string{dir}})
	defer st.Close()
	if _, err := st.RegisterMemory([]hostmem.Registration{reg("src", n, hostmem.Memory{}), reg("kv", n, shared(path, off))}); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	if err := st.Write("src", 0, src); err != nil {
		t.Fatal(err)
	}
	b := kvcopy.Batch{ID: "b", Copies: []kvcopy.Copy{
		{SrcBuffer: "src", SrcOffset: 0, DstBuffer: "kv", DstOffset: 0, Length: 1024},
		{SrcBuffer: "src", SrcOffset: 1024, DstBuffer: "kv", DstOffset: 1024, Length: 64, Count: 16, SrcStride: 128, DstStride: 96},
	}, Writes: []kvcopy.InlineWrite{{DstBuffer: "kv", DstOffset: n - 8, Data: []byte("metadata")}}}
	if _, err := st.Execute(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	region := bytes.Repeat([]byte{0xee}, n)
	copy(region, src[:1024])
	for r := range 16 {
		copy(region[1024+r*96:][:64], src[1024+r*128:][:64])
	}
	copy(region[n-8:], "metadata")
	want := bytes.Repeat([]byte{0xee}, fileSize)
	copy(want[off:], region)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("file byte %d = %#x after the batch, want %#x", i, got[i], want[i])
	}
	// The engine writes into its file; the store reads what it wrote.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("from the engine"), off+100); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Read("kv", 100, 15); err != nil || string(r) != "from the engine" {
		t.Errorf("Read after the engine wrote = %q, %v; want %q", r, err, "from the engine")
	}
}

func firstDiff(a, b []byte) int {
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

// TestSharedMemoryRefusals: every memory the store cannot use is refused
// with the reason, and nothing is registered.
func TestSharedMemoryRefusals(t *testing.T) {
	dir, other := shmDir(t), shmDir(t)
	path := engineFile(t, dir, "kv", 8192, 0)
	outside := engineFile(t, other, "kv", 8192, 0)
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	st := hostmem.NewStore(hostmem.Options{SharedDirs: []string{dir}})
	defer st.Close()
	for _, tc := range []struct {
		name string
		r    hostmem.Registration
		want error
		msg  string
	}{
		{"missing file", reg("b", 4096, shared(filepath.Join(dir, "nope"), 0)), hostmem.ErrSharedMemory, "no such file or directory"},
		{"relative path", reg("b", 4096, shared("kv", 0)), hostmem.ErrSharedMemory, "not absolute"},
		{"region past the end", reg("b", 4096, shared(path, 8192)), hostmem.ErrSharedMemory, "the region [8192, 12288) needs a file of 12288 bytes, the file has 8192"},
		{"longer than the file", reg("b", 8193, shared(path, 0)), hostmem.ErrSharedMemory, "needs a file of 8193 bytes"},
		{"outside the admitted directories", reg("b", 4096, shared(outside, 0)), hostmem.ErrSharedMemory, "outside the directories this agent admits"},
		{"a symlink out of them", reg("b", 4096, shared(filepath.Join(dir, "link"), 0)), hostmem.ErrSharedMemory, "outside the directories this agent admits"},
		{"the admitted directory itself", reg("b", 4096, shared(dir, 0)), hostmem.ErrSharedMemory, "outside the directories"},
		{"cuda ipc", reg("b", 4096, hostmem.Memory{Kind: hostmem.MemoryCudaIPC}), hostmem.ErrUnsupportedMemory, "cuda_ipc memory needs a GPU transfer agent"},
		{"nixl", reg("b", 4096, hostmem.Memory{Kind: hostmem.MemoryNixl}), hostmem.ErrUnsupportedMemory, "nixl memory needs a GPU transfer agent"},
	} {
		_, err := st.RegisterMemory([]hostmem.Registration{reg("a", 64, hostmem.Memory{}), tc.r})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: RegisterMemory = %v, want %v saying %q", tc.name, err, tc.want, tc.msg)
		}
		if got := st.Buffers(); len(got) != 0 {
			t.Errorf("%s: a refused registration left buffers %v", tc.name, got)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterMemory([]hostmem.Registration{reg("b", 1, shared(filepath.Join(dir, "sub"), 0))}); !errors.Is(err, hostmem.ErrSharedMemory) || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory: RegisterMemory = %v, want ErrSharedMemory saying is a directory", err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterMemory([]hostmem.Registration{reg("b", 1, shared(filepath.Join(dir, "fifo"), 0))}); !errors.Is(err, hostmem.ErrSharedMemory) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO: RegisterMemory = %v, want ErrSharedMemory saying not a regular file", err)
	}
	none := hostmem.New(0)
	defer none.Close()
	if _, err := none.RegisterMemory([]hostmem.Registration{reg("b", 4096, shared(path, 0))}); !errors.Is(err, hostmem.ErrSharedMemory) || !strings.Contains(err.Error(), "admits no shared-memory directory") {
		t.Errorf("a store without shared directories: RegisterMemory = %v, want ErrSharedMemory", err)
	}
}

// TestSharedMemoryReRegistration: the same name, length and memory keeps
// the bytes; another memory (kind, file, offset, or the file replaced at
// its path) or length is refused.
func TestSharedMemoryReRegistration(t *testing.T) {
	dir := shmDir(t)
	path := engineFile(t, dir, "kv", 3*4096, 0)
	otherPath := engineFile(t, dir, "kv2", 3*4096, 0)
	st := hostmem.NewStore(hostmem.Options{SharedDirs: []string{dir}})
	defer st.Close()
	kv := reg("kv", 4096, shared(path, 4096))
	if _, err := st.RegisterMemory([]hostmem.Registration{kv, reg("agent", 64, hostmem.Memory{})}); err != nil {
		t.Fatal(err)
	}
	if err := st.Write("kv", 0, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterMemory([]hostmem.Registration{kv}); err != nil {
		t.Fatalf("the same registration again: %v", err)
	}
	if got, _ := st.Read("kv", 0, 4); string(got) != "kept" {
		t.Errorf("after registering again the buffer holds %q, want kept", got)
	}
	for _, tc := range []struct {
		name string
		r    hostmem.Registration
		want error
		msg  string
	}{
		{"agent memory", reg("kv", 4096, hostmem.Memory{}), hostmem.ErrMemoryMismatch, "in agent memory: buffer registered in other memory (shared memory " + path + " at offset 4096)"},
		{"another offset", reg("kv", 4096, shared(path, 8192)), hostmem.ErrMemoryMismatch, "at offset 8192"},
		{"another file", reg("kv", 4096, shared(otherPath, 4096)), hostmem.ErrMemoryMismatch, otherPath},
		{"another length", reg("kv", 8192, shared(path, 0)), hostmem.ErrLengthMismatch, "8192"},
		{"shared over agent memory", reg("agent", 64, shared(path, 0)), hostmem.ErrMemoryMismatch, "(agent memory)"},
	} {
		if _, err := st.RegisterMemory([]hostmem.Registration{tc.r}); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: RegisterMemory = %v, want %v saying %q", tc.name, err, tc.want, tc.msg)
		}
	}
	// The engine recreates its file at the same path: another memory.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	engineFile(t, dir, "kv", 3*4096, 0)
	if _, err := st.RegisterMemory([]hostmem.Registration{kv}); !errors.Is(err, hostmem.ErrMemoryMismatch) || !strings.Contains(err.Error(), "replaced since") {
		t.Errorf("the file replaced at its path: RegisterMemory = %v, want ErrMemoryMismatch saying replaced", err)
	}
	if got, _ := st.Read("kv", 0, 4); string(got) != "kept" {
		t.Errorf("the buffer (the old file, still mapped) holds %q, want kept", got)
	}
}

// TestSharedMemoryNotCharged: the store's limit counts the memory it
// allocates, not an engine's shared memory.
func TestSharedMemoryNotCharged(t *testing.T) {
	dir := shmDir(t)
	path := engineFile(t, dir, "kv", 1<<20, 0)
	st := hostmem.NewStore(hostmem.Options{Limit: 8192, SharedDirs: []string{dir}})
	defer st.Close()
	if _, err := st.RegisterMemory([]hostmem.Registration{reg("kv", 1<<20, shared(path, 0))}); err != nil {
		t.Fatalf("1 MiB of shared memory in a store of 8 KiB: %v", err)
	}
	if got := st.Allocated(); got != 0 {
		t.Errorf("Allocated = %d with only shared memory, want 0", got)
	}
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: "a", Length: 8192}}); err != nil {
		t.Fatalf("the whole limit in agent memory beside shared memory: %v", err)
	}
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: "b", Length: 1}}); !errors.Is(err, hostmem.ErrTooLarge) {
		t.Errorf("one byte past the limit = %v, want ErrTooLarge", err)
	}
	if err := st.Deregister([]string{"kv"}); err != nil {
		t.Fatal(err)
	}
	if got := st.Allocated(); got != 8192 {
		t.Errorf("Allocated = %d after the shared buffer went, want 8192", got)
	}
}

// TestSharedMemoryTruncated: a file truncated below its region fails the
// batches, reads and writes that touch it with the reason (nothing
// crashes); once the engine restores the size they work again.
func TestSharedMemoryTruncated(t *testing.T) {
	dir := shmDir(t)
	path := engineFile(t, dir, "kv", 2*4096, 1)
	st := hostmem.NewStore(hostmem.Options{SharedDirs: []string{dir}})
	defer st.Close()
	if _, err := st.RegisterMemory([]hostmem.Registration{reg("src", 64, hostmem.Memory{}), reg("kv", 4096, shared(path, 4096))}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	b := kvcopy.Batch{ID: "b", Copies: []kvcopy.Copy{{SrcBuffer: "src", DstBuffer: "kv", Length: 64}}}
	const msg = "the file was truncated to 4096 bytes, the region [4096, 8192) needs 8192"
	if _, err := st.Execute(context.Background(), b); !errors.Is(err, hostmem.ErrSharedMemory) || !strings.Contains(err.Error(), msg) {
		t.Errorf("Execute on a truncated file = %v, want ErrSharedMemory saying %q", err, msg)
	}
	if _, err := st.Read("kv", 0, 8); !errors.Is(err, hostmem.ErrSharedMemory) {
		t.Errorf("Read of a truncated file = %v, want ErrSharedMemory", err)
	}
	if err := st.Write("kv", 0, []byte{1}); !errors.Is(err, hostmem.ErrSharedMemory) {
		t.Errorf("Write into a truncated file = %v, want ErrSharedMemory", err)
	}
	if err := os.Truncate(path, 2*4096); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Execute(context.Background(), b); err != nil {
		t.Errorf("Execute once the size is restored: %v", err)
	}
}

// TestSharedMemoryBusyAndRelease: a shared buffer with a batch in flight
// cannot be deregistered; once the batch is cancelled it can, and the file
// keeps the bytes written.
func TestSharedMemoryBusyAndRelease(t *testing.T) {
	dir := shmDir(t)
	path := engineFile(t, dir, "kv", 4096, 0)
	st := hostmem.NewStore(hostmem.Options{SharedDirs: []string{dir}})
	defer st.Close()
	if _, err := st.RegisterMemory([]hostmem.Registration{reg("kv", 4096, shared(path, 0))}); err != nil {
		t.Fatal(err)
	}
	if err := st.Write("kv", 10, []byte("written")); err != nil {
		t.Fatal(err)
	}
	agent := hostmem.NewAgent(st)
	entered := make(chan struct{})
	agent.SetHold(func(kvcopy.Batch) bool { close(entered); return true })
	errc := make(chan error, 1)
	go func() {
		errc <- agent.Execute(context.Background(), kvcopy.Batch{ID: "held", Room: 9, Copies: []kvcopy.Copy{{SrcBuffer: "kv", DstBuffer: "kv", DstOffset: 64, Length: 8}}})
	}()
	<-entered
	if err := st.Deregister([]string{"kv"}); !errors.Is(err, hostmem.ErrBusy) {
		t.Errorf("Deregister with a batch in flight = %v, want ErrBusy", err)
	}
	if _, err := agent.CancelBatches(context.Background(), 9); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, hostmem.ErrCancelled) {
		t.Errorf("the held batch = %v, want ErrCancelled", err)
	}
	if err := st.Deregister([]string{"kv"}); err != nil {
		t.Fatalf("Deregister once nothing is in flight: %v", err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got[10:17]) != "written" {
		t.Errorf("the file after Deregister holds %q, %v; want written at 10", got[10:17], err)
	}
}
