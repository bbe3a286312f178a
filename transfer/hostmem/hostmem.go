// Package hostmem executes KV copy batches (kvcopy.Batch) on buffers held in
// host memory: the core of the reference transfer agent
// (cmd/decodeplane-agent), usable in-process by tests and by prefills
// without GPUs. It moves real bytes with the same offsets a GPU agent would
// use, so a byte-exact check of the decode pages proves the copy plans.
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
	limit int64

	mu    sync.RWMutex
	bufs  map[string]*buffer
	total int64
}

type buffer struct {
	spec kvcopy.BufferSpec
	data []byte
	busy int
}

// New returns an empty store that allocates at most limit bytes in total
// (0 means no limit).
func New(limit int64) *Store {
	return &Store{limit: limit, bufs: map[string]*buffer{}}
}

// Register allocates the buffers (zeroed). It is idempotent by (name,
// length): a known buffer keeps its bytes. It returns the specs with the
// addresses used (host memory: a synthetic, non-zero handle).
func (s *Store) Register(specs []kvcopy.BufferSpec) ([]kvcopy.BufferSpec, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var add int64
	for i, sp := range specs {
		if sp.Name == "" {
			return nil, fmt.Errorf("buffers[%d]: %w: name is required", i, ErrInvalid)
		}
		if sp.Length <= 0 {
			return nil, fmt.Errorf("buffer %q: %w: length must be > 0 (got %d)", sp.Name, ErrInvalid, sp.Length)
		}
		if b := s.bufs[sp.Name]; b != nil {
			if b.spec.Length != sp.Length {
				return nil, fmt.Errorf("register buffer %q with %d bytes: %w (%d bytes)", sp.Name, sp.Length, ErrLengthMismatch, b.spec.Length)
			}
			continue
		}
		add += sp.Length
	}
	if s.limit > 0 && s.total+add > s.limit {
		return nil, fmt.Errorf("register %d bytes (%d in use): %w (%d bytes)", add, s.total, ErrTooLarge, s.limit)
	}
	out := make([]kvcopy.BufferSpec, len(specs))
	for i, sp := range specs {
		b := s.bufs[sp.Name]
		if b == nil {
			sp.Address = handle(sp.Name)
			b = &buffer{spec: sp, data: make([]byte, sp.Length)}
			s.bufs[sp.Name] = b
			s.total += sp.Length
		}
		out[i] = b.spec
	}
	return out, nil
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

// Deregister forgets buffers; unknown names are ignored. A buffer with
// copies in flight is ErrBusy and nothing is forgotten.
func (s *Store) Deregister(names []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		if b := s.bufs[n]; b != nil && b.busy > 0 {
			return fmt.Errorf("deregister %q: %w", n, ErrBusy)
		}
	}
	for _, n := range names {
		if b := s.bufs[n]; b != nil {
			s.total -= b.spec.Length
			delete(s.bufs, n)
		}
	}
	return nil
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

// Execute validates the batch, then runs its copies in order and its writes
// last. It stops between copies when ctx is done (the bytes copied so far
// stay) and returns ctx's error; once it returns nothing of the batch is in
// flight. It returns the bytes moved.
func (s *Store) Execute(ctx context.Context, b kvcopy.Batch) (int64, error) {
	s.mu.Lock()
	if err := s.validateLocked(b); err != nil {
		s.mu.Unlock()
		return 0, err
	}
	bufs := map[*buffer]bool{}
	for _, c := range b.Copies {
		bufs[s.bufs[c.SrcBuffer]], bufs[s.bufs[c.DstBuffer]] = true, true
	}
	for _, w := range b.Writes {
		bufs[s.bufs[w.DstBuffer]] = true
	}
	for buf := range bufs {
		buf.busy++
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for buf := range bufs {
			buf.busy--
		}
		s.mu.Unlock()
	}()

	var moved int64
	for _, c := range b.Copies {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		s.mu.Lock()
		src, dst := s.bufs[c.SrcBuffer].data, s.bufs[c.DstBuffer].data
		for r := range int64(c.Rows()) {
			so, do := c.SrcOffset+r*c.SrcStride, c.DstOffset+r*c.DstStride
			copy(dst[do:do+c.Length], src[so:so+c.Length])
		}
		s.mu.Unlock()
		moved += c.Bytes()
	}
	if err := ctx.Err(); err != nil {
		return moved, err
	}
	s.mu.Lock()
	for _, w := range b.Writes {
		copy(s.bufs[w.DstBuffer].data[w.DstOffset:], w.Data)
		moved += int64(len(w.Data))
	}
	s.mu.Unlock()
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
	return append([]byte(nil), b.data[off:off+n]...), nil
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
	copy(b.data[off:], data)
	return nil
}
