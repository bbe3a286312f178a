package hostmem

import (
	"fmt"
	"runtime/debug"
)

// guard runs fn, which touches the bytes of bufs. Touching a page of a
// shared-memory file past its end (the file was truncated after the last
// size check) raises SIGBUS, which crashes a Go program by default; with
// panic-on-fault the runtime panics instead, and a fault inside one of
// bufs' mappings becomes ErrSharedMemory (what fn wrote before it stays).
// Any other panic goes on. Without shared memory fn runs as is.
func guard(what string, bufs []*buffer, fn func()) (err error) {
	shared := false
	for _, b := range bufs {
		shared = shared || b.shm != nil
	}
	if !shared {
		fn()
		return nil
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			for _, b := range bufs {
				if b.shm != nil && b.shm.contains(f.Addr()) {
					err = fmt.Errorf("%s: buffer %q: shared memory %s: %w: a fault at %#x: the file was truncated below the region [%d, %d) during the copy (an engine must not truncate a registered file)",
						what, b.spec.Name, b.shm.path, ErrSharedMemory, f.Addr(), b.shm.offset, b.shm.end)
					return
				}
			}
		}
		panic(r)
	}()
	fn()
	return nil
}
