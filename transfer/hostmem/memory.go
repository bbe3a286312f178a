package hostmem

import (
	"errors"
	"fmt"
	"os"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// MemoryKind says where a buffer's bytes live: kvlayout's kinds. The store
// serves MemoryAgent (it allocates the buffer, zeroed, and counts it
// against its limit; the zero value) and MemoryShared (a region of a file
// another process created and sized, mapped shared so that process sees
// every byte written; Linux only); the GPU kinds, MemoryCudaIPC and
// MemoryNixl, are a GPU transfer agent's, and the store refuses them.
type MemoryKind = kvlayout.MemoryKind

// The memory kinds.
const (
	MemoryAgent   = kvlayout.MemoryAgent
	MemoryShared  = kvlayout.MemoryShared
	MemoryCudaIPC = kvlayout.MemoryCudaIPC
	MemoryNixl    = kvlayout.MemoryNixl
)

// Memory is where a buffer's bytes live. The zero value is agent memory.
type Memory struct {
	Kind MemoryKind
	// Path and Offset locate shared memory: the region [Offset, Offset +
	// length) of the file at Path (absolute; Offset a multiple of the wire's
	// 4096, which the store does not require).
	Path   string
	Offset int64
}

func (m Memory) String() string {
	if m.Kind == MemoryShared {
		return fmt.Sprintf("shared memory %s at offset %d", m.Path, m.Offset)
	}
	return m.Kind.String() + " memory"
}

// MemoryOf is the store's memory for a buffer spec's (the GPU kinds keep
// their kind only: the store refuses them).
func MemoryOf(m kvlayout.Memory) Memory {
	switch m.Kind {
	case kvlayout.MemoryShared:
		return Memory{Kind: MemoryShared, Path: m.Path, Offset: m.Offset}
	case kvlayout.MemoryCudaIPC:
		return Memory{Kind: MemoryCudaIPC}
	case kvlayout.MemoryNixl:
		return Memory{Kind: MemoryNixl}
	}
	return Memory{}
}

// Registration is a buffer and where its bytes live.
type Registration struct {
	Spec   kvcopy.BufferSpec
	Memory Memory
}

// Errors of memory the store cannot use. Callers branch with errors.Is.
var (
	// ErrMemoryMismatch: a known buffer was registered again in other
	// memory (another kind, file, offset, or its file was replaced).
	ErrMemoryMismatch = errors.New("buffer registered in other memory")
	// ErrUnsupportedMemory: a memory kind the store does not hold (GPU
	// memory).
	ErrUnsupportedMemory = errors.New("memory kind not implemented by this agent")
	// ErrSharedMemory: a shared-memory file that cannot be used (missing,
	// unreadable, not a regular file, outside the admitted directories,
	// smaller than the region, or truncated since it was registered).
	ErrSharedMemory = errors.New("shared memory unusable")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
)

// checkRegistration checks what needs neither the store nor the file.
func checkRegistration(i int, r Registration) error {
	sp := r.Spec
	switch {
	case sp.Name == "":
		return fmt.Errorf("buffers[%d]: %w: name is required", i, ErrInvalid)
	case sp.Length <= 0:
		return fmt.Errorf("buffer %q: %w: length must be > 0 (got %d)", sp.Name, ErrInvalid, sp.Length)
	}
	switch r.Memory.Kind {
	case MemoryAgent:
		return nil
	case MemoryShared:
		if r.Memory.Offset < 0 || r.Memory.Offset > maxExtent-sp.Length {
			return fmt.Errorf("buffer %q: %w: shared-memory region [%d, +%d) is out of range", sp.Name, ErrInvalid, r.Memory.Offset, sp.Length)
		}
		return nil
	case MemoryCudaIPC, MemoryNixl:
		return fmt.Errorf("buffer %q: %s memory: %w: the reference agent holds host memory only (agent or shared memory); %s memory needs a GPU transfer agent",
			sp.Name, r.Memory.Kind, ErrUnsupportedMemory, r.Memory.Kind)
	}
	return fmt.Errorf("buffer %q: %w: unknown memory kind %d", sp.Name, ErrInvalid, int(r.Memory.Kind))
}

// maxExtent bounds a shared-memory region's end (the wire's 2^62).
const maxExtent = 1 << 62

// RegisterMemory registers buffers, each in its memory, all or none: agent
// memory is allocated (zeroed) within the store's limit; shared memory is
// mapped and not counted. It is idempotent by (name, length, memory): a
// known buffer keeps its bytes; another length is ErrLengthMismatch,
// another memory ErrMemoryMismatch. It returns the specs with the addresses
// used (a synthetic, non-zero handle).
func (s *Store) RegisterMemory(regs []Registration) ([]kvcopy.BufferSpec, error) {
	for i, r := range regs {
		if err := checkRegistration(i, r); err != nil {
			return nil, err
		}
	}
	// Files are opened and mapped before the lock is taken: a slow file
	// system must not stall the copies.
	maps := make([]*mapping, len(regs))
	defer func() {
		for _, m := range maps {
			if m != nil {
				_ = m.release()
			}
		}
	}()
	for i, r := range regs {
		if r.Memory.Kind != MemoryShared {
			continue
		}
		m, err := mapShared(r.Spec.Name, r.Memory.Path, r.Memory.Offset, r.Spec.Length, s.sharedDirs)
		if err != nil {
			return nil, err
		}
		maps[i] = m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("register buffers: %w", ErrClosed)
	}
	var add int64
	for i, r := range regs {
		b := s.bufs[r.Spec.Name]
		if b == nil {
			if r.Memory.Kind == MemoryAgent {
				add += r.Spec.Length
			}
			continue
		}
		if b.spec.Length != r.Spec.Length {
			return nil, fmt.Errorf("register buffer %q with %d bytes: %w (%d bytes)", r.Spec.Name, r.Spec.Length, ErrLengthMismatch, b.spec.Length)
		}
		if err := b.sameMemory(r.Memory, maps[i]); err != nil {
			return nil, fmt.Errorf("register buffer %q: %w", r.Spec.Name, err)
		}
	}
	if s.limit > 0 && s.total+add > s.limit {
		return nil, fmt.Errorf("register %d bytes of agent memory (%d in use): %w (%d bytes; shared memory is not counted)", add, s.total, ErrTooLarge, s.limit)
	}
	out := make([]kvcopy.BufferSpec, len(regs))
	for i, r := range regs {
		b := s.bufs[r.Spec.Name]
		if b == nil {
			sp := r.Spec
			sp.Address = handle(sp.Name)
			b = &buffer{spec: sp, mem: r.Memory}
			if m := maps[i]; m != nil {
				b.shm, b.data, maps[i] = m, m.data, nil // the buffer owns the mapping now
			} else {
				b.data = make([]byte, sp.Length)
				s.total += sp.Length
			}
			s.bufs[sp.Name] = b
		}
		out[i] = b.spec
	}
	return out, nil
}

// sameMemory reports how mem (mapped as m when shared) differs from the
// buffer's memory, or nil.
func (b *buffer) sameMemory(mem Memory, m *mapping) error {
	if b.mem != mem {
		return fmt.Errorf("in %s: %w (%s)", mem, ErrMemoryMismatch, b.mem)
	}
	if b.shm != nil && m != nil && !os.SameFile(b.shm.info, m.info) {
		return fmt.Errorf("in %s: %w: the file at %s is not the one registered (it was replaced since); deregister the buffer first", mem, ErrMemoryMismatch, mem.Path)
	}
	return nil
}

// release frees what the buffer holds outside the Go heap (a mapping).
func (b *buffer) release() error {
	if b.shm == nil {
		return nil
	}
	err := b.shm.release()
	b.shm, b.data = nil, nil
	return err
}

// Close releases every buffer (shared memory is unmapped; the files stay
// their owners') and refuses registrations from then on. It does not wait
// for copies: stop the batches first (Agent.CancelBatches); a copy still
// running fails with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for name, b := range s.bufs {
		if err := b.release(); err != nil {
			errs = append(errs, fmt.Errorf("release %q: %w", name, err))
		}
		delete(s.bufs, name)
	}
	s.total = 0
	return errors.Join(errs...)
}
