//go:build linux

package hostmem

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// TestSharedMemoryFaultIsAnError: a file truncated after the size check
// (between the check and the copy) raises SIGBUS on the first page past its
// end; the copy, read or write fails with ErrSharedMemory and the process
// goes on.
func TestSharedMemoryFaultIsAnError(t *testing.T) {
	dir := t.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err = os.MkdirTemp("/dev/shm", "hostmem-fault-"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	path := filepath.Join(dir, "kv")
	if err := os.WriteFile(path, make([]byte, 4*4096), 0o600); err != nil {
		t.Fatal(err)
	}
	st := NewStore(Options{SharedDirs: []string{dir}})
	defer st.Close()
	if _, err := st.RegisterMemory([]Registration{
		{Spec: kvcopy.BufferSpec{Name: "src", Length: 4 * 4096}},
		{Spec: kvcopy.BufferSpec{Name: "kv", Length: 3 * 4096}, Memory: Memory{Kind: MemoryShared, Path: path, Offset: 4096}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 2*4096); err != nil {
		t.Fatal(err)
	}
	// copyRows skips the batch's size check: the copy faults on page 2.
	err := st.copyRows("batch b copy 0", kvcopy.Copy{SrcBuffer: "src", DstBuffer: "kv", Length: 3 * 4096})
	if !errors.Is(err, ErrSharedMemory) || !strings.Contains(err.Error(), "truncated below the region [4096, 16384) during the copy") {
		t.Fatalf("a copy into pages past the file's end = %v, want ErrSharedMemory", err)
	}
	b := st.bufs["kv"]
	var got []byte
	err = guard("read", []*buffer{b}, func() { got = append([]byte(nil), b.data...) })
	if !errors.Is(err, ErrSharedMemory) || got != nil {
		t.Errorf("a read past the file's end = %v (%d bytes), want ErrSharedMemory", err, len(got))
	}
	// The page still in the file took the bytes copied before the fault.
	if err := guard("read", []*buffer{b}, func() { got = append([]byte(nil), b.data[:4096]...) }); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Errorf("the page within the file: %v", err)
	}
	// A panic that is not a fault in the buffers' memory goes on.
	func() {
		defer func() {
			if r := recover(); r != "other" {
				t.Errorf("recovered %v, want the panic itself", r)
			}
		}()
		_ = guard("x", []*buffer{b}, func() { panic("other") })
	}()
}

// TestCloseReleasesTheMappings: Close unmaps every shared buffer and closes
// its file; the store refuses registrations from then on.
func TestCloseReleasesTheMappings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kv")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	st := NewStore(Options{SharedDirs: []string{dir}})
	if _, err := st.RegisterMemory([]Registration{{Spec: kvcopy.BufferSpec{Name: "kv", Length: 4096}, Memory: Memory{Kind: MemoryShared, Path: path}}}); err != nil {
		t.Fatal(err)
	}
	m := st.bufs["kv"].shm
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if m.region != nil || m.file != nil || len(st.bufs) != 0 {
		t.Errorf("after Close: mapping %v, file %v, %d buffers; want all released", m.region != nil, m.file, len(st.bufs))
	}
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: "a", Length: 1}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close = %v, want ErrClosed", err)
	}
}
