//go:build linux

package hostmem

import (
	"os"
	"syscall"
)

// sharedSupported: shared memory is mapped on this platform.
const sharedSupported = true

// openNoFollow: the resolved path is opened without following a symlink
// swapped in since it was resolved.
const openNoFollow = syscall.O_NOFOLLOW

// mmapShared maps n bytes of f from off (page-aligned) read-write and
// shared: what the agent writes lands in the file.
func mmapShared(f *os.File, off int64, n int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), off, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

func munmap(b []byte) error { return syscall.Munmap(b) }
