// Package hostmem executes KV copy batches (kvcopy.Batch) on buffers held in
// host memory: the core of the reference transfer agent
// (cmd/decodeplane-agent), usable in-process by tests and by prefills
// without GPUs. It moves real bytes with the same offsets a GPU agent would
// use, so a byte-exact check of the decode pages proves the copy plans.
//
// A buffer's memory is either allocated by the store (agent memory, within
// its limit) or a region of a shared-memory file another process created
// (an engine's KV cache in /dev/shm), mapped shared so that the process
// sees every byte the store writes (Linux). The engine must keep such a
// file at least as long as the region while it is registered: the store
// checks the size before every batch, read and write, and a truncation
// that races a copy fails the copy instead of crashing the process.
package hostmem

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// Errors returned by the store. Callers branch with errors.Is.
var (
	// ErrUnknownBuffer: the buffer is not registered.
	ErrUnknownBuffer = errors.New("unknown buffer")
	// ErrOutOfRange: a copy or access falls outside its buffer.
	ErrOutOfRange = errors.New("outside the buffer")
	// ErrLengthMismatch: a known buffer was registered again with another
	// length.
	ErrLengthMismatch = errors.New("buffer registered with another length")
	// ErrBusy: the buffer has copies in flight.
	ErrBusy = errors.New("buffer has copies in flight")
	// ErrInvalid: a malformed buffer spec or copy.
	ErrInvalid = errors.New("invalid request")
	// ErrTooLarge: the allocation exceeds the store's limit.
	ErrTooLarge = errors.New("allocation exceeds the store's limit")
)

// Store holds named byte buffers and copies between them. It is safe for
// concurrent use; each copy runs atomically with respect to other copies,
// reads and writes.
type Store struct {
	limit      int64
	sharedDirs []string

	mu     sync.RWMutex
	bufs   map[string]*buffer
	total  int64 // bytes of agent memory
	closed bool
}

type buffer struct {
	spec kvcopy.BufferSpec
	mem  Memory
	data []byte
	shm  *mapping // shared memory; nil for agent memory
	busy int
}

// Options configure a store.
type Options struct {
	// Limit bounds the bytes the store allocates (agent memory) in total;
	// 0 means no limit. Shared memory is another process's and not counted.
	Limit int64
	// SharedDirs are the directories whose files (symlinks resolved) may be
	// registered as shared memory; none: shared memory is refused.
	SharedDirs []string
}

// New returns an empty store that allocates at most limit bytes in total
// (0 means no limit) and admits no shared memory.
func New(limit int64) *Store { return NewStore(Options{Limit: limit}) }

// NewStore returns an empty store configured by o.
func NewStore(o Options) *Store {
	return &Store{limit: o.Limit, sharedDirs: append([]string(nil), o.SharedDirs...), bufs: map[string]*buffer{}}
}

// Register allocates the buffers (zeroed) in agent memory: RegisterMemory
// with every buffer in agent memory.
func (s *Store) Register(specs []kvcopy.BufferSpec) ([]kvcopy.BufferSpec, error) {
	regs := make([]Registration, len(specs))
	for i, sp := range specs {
		regs[i] = Registration{Spec: sp}
	}
	return s.RegisterMemory(regs)
}

// Allocated is the bytes of agent memory the buffers take (what counts
// against the limit).
func (s *Store) Allocated() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.total
}

// handle is a stable, non-zero stand-in for a device address.
func handle(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := range len(name) {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h | 1<<63
}

// Deregister forgets buffers and releases their memory (shared memory is
// unmapped; the file stays its owner's); unknown names are ignored. A
// buffer with copies in flight is ErrBusy and nothing is forgotten.
func (s *Store) Deregister(names []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		if b := s.bufs[n]; b != nil && b.busy > 0 {
			return fmt.Errorf("deregister %q: %w", n, ErrBusy)
		}
	}
	var errs []error
	for _, n := range names {
		if b := s.bufs[n]; b != nil {
			if b.shm == nil {
				s.total -= b.spec.Length
			}
			if err := b.release(); err != nil {
				errs = append(errs, fmt.Errorf("deregister %q: unmap: %w", n, err))
			}
			delete(s.bufs, n)
		}
	}
	return errors.Join(errs...)
}

// Buffers lists the registered buffers.
func (s *Store) Buffers() []kvcopy.BufferSpec {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]kvcopy.BufferSpec, 0, len(s.bufs))
	for _, b := range s.bufs {
		out = append(out, b.spec)
	}
	return out
}

// Validate checks every copy and write of a batch against the registered
// buffers without moving anything.
func (s *Store) Validate(b kvcopy.Batch) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.validateLocked(b)
}

func (s *Store) validateLocked(b kvcopy.Batch) error {
	for i, c := range b.Copies {
		if c.Length <= 0 || c.Count < 0 || c.SrcOffset < 0 || c.DstOffset < 0 || c.SrcStride < 0 || c.DstStride < 0 {
			return fmt.Errorf("batch %s copy %d: %w: length %d, count %d, offsets %d/%d, strides %d/%d", b.ID, i, ErrInvalid, c.Length, c.Count, c.SrcOffset, c.DstOffset, c.SrcStride, c.DstStride)
		}
		src, dst := s.bufs[c.SrcBuffer], s.bufs[c.DstBuffer]
		switch {
		case src == nil:
			return fmt.Errorf("batch %s copy %d: source %q: %w", b.ID, i, c.SrcBuffer, ErrUnknownBuffer)
		case dst == nil:
			return fmt.Errorf("batch %s copy %d: destination %q: %w", b.ID, i, c.DstBuffer, ErrUnknownBuffer)
		case c.SrcEnd() > src.spec.Length:
			return fmt.Errorf("batch %s copy %d: source range [%d, %d) of %q is %w (%d bytes)", b.ID, i, c.SrcOffset, c.SrcEnd(), c.SrcBuffer, ErrOutOfRange, src.spec.Length)
		case c.DstEnd() > dst.spec.Length:
			return fmt.Errorf("batch %s copy %d: destination range [%d, %d) of %q is %w (%d bytes)", b.ID, i, c.DstOffset, c.DstEnd(), c.DstBuffer, ErrOutOfRange, dst.spec.Length)
		case int64(c.Rows()) > dst.spec.Length/c.Length:
			// Rows that overlap (a stride below the length) would rewrite
			// the same bytes: a copy never writes more than its destination holds.
			return fmt.Errorf("batch %s copy %d: %w: %d rows of %d bytes write more than %q holds (%d bytes)", b.ID, i, ErrInvalid, c.Rows(), c.Length, c.DstBuffer, dst.spec.Length)
		}
	}
	for i, w := range b.Writes {
		dst := s.bufs[w.DstBuffer]
		switch {
		case dst == nil:
			return fmt.Errorf("batch %s write %d: destination %q: %w", b.ID, i, w.DstBuffer, ErrUnknownBuffer)
		case w.DstOffset < 0 || w.DstOffset+int64(len(w.Data)) > dst.spec.Length:
			return fmt.Errorf("batch %s write %d: range [%d, %d) of %q is %w (%d bytes)", b.ID, i, w.DstOffset, w.DstOffset+int64(len(w.Data)), w.DstBuffer, ErrOutOfRange, dst.spec.Length)
		}
	}
	return nil
}

// Pin validates the batch and marks its buffers busy until unpin is
// called (once; later calls do nothing): what an accepted batch does before
// it runs, so that Deregister refuses its buffers from acceptance on.
func (s *Store) Pin(b kvcopy.Batch) (unpin func(), err error) { return s.pin(b, false) }

// pin is Pin; with check, it also checks the batch's shared-memory files
// (their size now, before the copies).
func (s *Store) pin(b kvcopy.Batch, check bool) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.validateLocked(b); err != nil {
		return nil, err
	}
	set := map[*buffer]bool{}
	for _, c := range b.Copies {
		set[s.bufs[c.SrcBuffer]], set[s.bufs[c.DstBuffer]] = true, true
	}
	for _, w := range b.Writes {
		set[s.bufs[w.DstBuffer]] = true
	}
	for buf := range set {
		if check && buf.shm != nil {
			if err := buf.shm.check(buf.spec.Name); err != nil {
				return nil, fmt.Errorf("batch %s: %w", b.ID, err)
			}
		}
	}
	for buf := range set {
		buf.busy++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			for buf := range set {
				buf.busy--
			}
		})
	}, nil
}

// Execute validates the batch and checks its shared-memory files, then
// runs its copies in order and its writes last. It stops between copies
// when ctx is done (the bytes copied so far stay) and returns ctx's error;
// once it returns nothing of the batch is in flight. It returns the bytes
// moved.
func (s *Store) Execute(ctx context.Context, b kvcopy.Batch) (int64, error) {
	unpin, err := s.pin(b, true)
	if err != nil {
		return 0, err
	}
	defer unpin()
	var moved int64
	for i, c := range b.Copies {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		if err := s.copyRows(fmt.Sprintf("batch %s copy %d", b.ID, i), c); err != nil {
			return moved, err
		}
		moved += c.Bytes()
	}
	if err := ctx.Err(); err != nil {
		return moved, err
	}
	n, err := s.writeInline(b)
	return moved + n, err
}

// lookupLocked returns the named buffers, or ErrClosed when the store
// released them while a batch ran (a batch's buffers are busy, so only
// Close can).
func (s *Store) lookupLocked(what string, names ...string) ([]*buffer, error) {
	out := make([]*buffer, len(names))
	for i, n := range names {
		if out[i] = s.bufs[n]; out[i] == nil {
			return nil, fmt.Errorf("%s: buffer %q: %w", what, n, ErrClosed)
		}
	}
	return out, nil
}

// copyRows runs one (validated) copy.
func (s *Store) copyRows(what string, c kvcopy.Copy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	bufs, err := s.lookupLocked(what, c.SrcBuffer, c.DstBuffer)
	if err != nil {
		return err
	}
	src, dst := bufs[0].data, bufs[1].data
	return guard(what, bufs, func() {
		for r := range int64(c.Rows()) {
			so, do := c.SrcOffset+r*c.SrcStride, c.DstOffset+r*c.DstStride
			copy(dst[do:do+c.Length], src[so:so+c.Length])
		}
	})
}

// writeInline runs a (validated) batch's inline writes.
func (s *Store) writeInline(b kvcopy.Batch) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var moved int64
	for i, w := range b.Writes {
		what := fmt.Sprintf("batch %s write %d", b.ID, i)
		bufs, err := s.lookupLocked(what, w.DstBuffer)
		if err != nil {
			return moved, err
		}
		if err := guard(what, bufs, func() { copy(bufs[0].data[w.DstOffset:], w.Data) }); err != nil {
			return moved, err
		}
		moved += int64(len(w.Data))
	}
	return moved, nil
}

// Read returns a copy of n bytes of a buffer from off.
func (s *Store) Read(name string, off, n int64) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b := s.bufs[name]
	if b == nil {
		return nil, fmt.Errorf("read %q: %w", name, ErrUnknownBuffer)
	}
	if off < 0 || n < 0 || off+n > b.spec.Length {
		return nil, fmt.Errorf("read [%d, %d) of %q: %w (%d bytes)", off, off+n, name, ErrOutOfRange, b.spec.Length)
	}
	if b.shm != nil {
		if err := b.shm.check(name); err != nil {
			return nil, fmt.Errorf("read: %w", err)
		}
	}
	var out []byte
	err := guard(fmt.Sprintf("read [%d, %d)", off, off+n), []*buffer{b}, func() { out = append([]byte(nil), b.data[off:off+n]...) })
	return out, err
}

// Write copies data into a buffer at off.
func (s *Store) Write(name string, off int64, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bufs[name]
	if b == nil {
		return fmt.Errorf("write %q: %w", name, ErrUnknownBuffer)
	}
	if off < 0 || off+int64(len(data)) > b.spec.Length {
		return fmt.Errorf("write [%d, %d) of %q: %w (%d bytes)", off, off+int64(len(data)), name, ErrOutOfRange, b.spec.Length)
	}
	if b.shm != nil {
		if err := b.shm.check(name); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	return guard(fmt.Sprintf("write [%d, %d)", off, off+int64(len(data))), []*buffer{b}, func() { copy(b.data[off:], data) })
}
