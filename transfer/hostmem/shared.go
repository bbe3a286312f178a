package hostmem

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// mapping is a shared-memory region the store mapped: [offset, end) of a
// file another process created. The file stays open so that its size can
// be checked (fstat) before each access: touching a page past the end of a
// truncated file raises SIGBUS.
type mapping struct {
	path   string      // as registered
	file   *os.File    // the open file (its size is re-checked)
	info   os.FileInfo // at registration: the file's identity
	region []byte      // what mmap returned (page-aligned), for munmap
	data   []byte      // the buffer: region[offset-pageStart:][:length]
	offset int64
	end    int64 // offset + length: the size the file must keep
}

// mapShared opens the file at path (absolute, under one of dirs once its
// symlinks are resolved), checks that it is a regular file at least
// offset+length bytes long, and maps that region read-write and shared.
func mapShared(name, path string, offset, length int64, dirs []string) (*mapping, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("buffer %q: shared memory %s: %w: %s", name, path, ErrSharedMemory, fmt.Sprintf(format, args...))
	}
	if !sharedSupported {
		return nil, fail("the reference agent maps shared memory on Linux only")
	}
	if !filepath.IsAbs(path) {
		return nil, fail("the path is not absolute")
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fail("%v (the engine creates and sizes the file before registering it)", unwrapPath(err))
	}
	if !admitted(resolved, dirs) {
		if len(dirs) == 0 {
			return nil, fail("this agent admits no shared-memory directory")
		}
		return nil, fail("%s is outside the directories this agent admits for shared memory (%s)", resolved, strings.Join(dirs, ", "))
	}
	f, err := os.OpenFile(resolved, os.O_RDWR|openNoFollow, 0)
	if err != nil {
		return nil, fail("open read-write: %v", unwrapPath(err))
	}
	m := &mapping{path: path, file: f, offset: offset, end: offset + length}
	fi, err := f.Stat()
	switch {
	case err != nil:
		err = fail("stat: %v", err)
	case !fi.Mode().IsRegular():
		err = fail("not a regular file (%s)", fi.Mode().Type())
	case fi.Size() < m.end:
		err = fail("the region [%d, %d) needs a file of %d bytes, the file has %d", offset, m.end, m.end, fi.Size())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	m.info = fi
	page := int64(os.Getpagesize())
	start := offset &^ (page - 1)
	if m.end-start > math.MaxInt {
		f.Close()
		return nil, fail("the region [%d, %d) is larger than this process can map", offset, m.end)
	}
	if m.region, err = mmapShared(f, start, int(m.end-start)); err != nil {
		f.Close()
		return nil, fail("mmap [%d, %d): %v", start, m.end, err)
	}
	lo := offset - start
	m.data = m.region[lo : lo+length : lo+length]
	return m, nil
}

// unwrapPath drops the *PathError's operation and path (the message names
// the path already).
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// admitted reports whether resolved lies under one of dirs (their symlinks
// resolved too; a directory that does not exist admits nothing).
func admitted(resolved string, dirs []string) bool {
	for _, d := range dirs {
		rd, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		rel, err := filepath.Rel(rd, resolved)
		if err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// check fails when the file is now shorter than the region: an engine must
// not truncate a registered file, and touching the pages past its end
// would fault.
func (m *mapping) check(name string) error {
	fi, err := m.file.Stat()
	if err != nil {
		return fmt.Errorf("buffer %q: shared memory %s: %w: stat: %v", name, m.path, ErrSharedMemory, err)
	}
	if fi.Size() < m.end {
		return fmt.Errorf("buffer %q: shared memory %s: %w: the file was truncated to %d bytes, the region [%d, %d) needs %d (an engine must not truncate a registered file; restore its size or deregister the buffer)",
			name, m.path, ErrSharedMemory, fi.Size(), m.offset, m.end, m.end)
	}
	return nil
}

// contains reports whether addr lies in the mapping.
func (m *mapping) contains(addr uintptr) bool {
	if len(m.region) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.region)))
	return addr >= base && addr-base < uintptr(len(m.region))
}

// release unmaps the region and closes the file.
func (m *mapping) release() error {
	var err error
	if m.region != nil {
		err = munmap(m.region)
		m.region, m.data = nil, nil
	}
	if m.file != nil {
		if cerr := m.file.Close(); err == nil {
			err = cerr
		}
		m.file = nil
	}
	return err
}
