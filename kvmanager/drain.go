package kvmanager

import (
	"fmt"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// The deferred release's settings and the manager's knowledge of which
// prefill instances write by themselves; the room decides who owes an
// acknowledgement and when its resources go back (package room, end.go).
// Shutdown does not wait for acknowledgements: the rooms it ends give
// their resources back at once, since the ledgers go away with the process.

// ReleaseConfig is the deferred release (release).
type ReleaseConfig struct {
	// DeferredTimeout bounds how long a room's pages stay draining, waiting
	// for the acknowledgements of the prefill ranks that may still write
	// into them (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE style).
	// 0: no deferral, the pages go back when the room ends.
	DeferredTimeout time.Duration `yaml:"deferred_timeout"`
}

// MaxDeferredTimeout is release.deferred_timeout's upper bound.
const MaxDeferredTimeout = 10 * time.Minute

// DefaultDeferredTimeout is the daemon's default release.deferred_timeout.
const DefaultDeferredTimeout = 30 * time.Second

func (c ReleaseConfig) validate(add func(key string, val any, problem, fix string)) {
	if c.DeferredTimeout < 0 || c.DeferredTimeout > MaxDeferredTimeout {
		add("release.deferred_timeout", c.DeferredTimeout, fmt.Sprintf("must be between 0 and %s.", MaxDeferredTimeout),
			"set a duration such as 30s (SGLang's deferred release), or 0 to release a room's pages as soon as it ends.")
	}
}

// ErrStaleAttempt: an acknowledgement names an attempt (generation) that is
// not the room's current one; it changes nothing.
var ErrStaleAttempt = room.ErrStaleAttempt

// maxSelfWriters bounds selfWriters (addresses are client-chosen); past it
// every instance is treated as one that writes by itself.
const maxSelfWriters = 4096

// selfWriters are the prefill addresses whose ranks reported a chunk they
// moved themselves (ReportTransfer): a rank of such an instance that
// received a destination and has not sent its last chunk may be writing.
// A rank of an instance that only ever asked the daemon's engine (Transfer)
// owes nothing until it reports a chunk itself. A leaf: its own lock.
type selfWriters struct {
	mu    sync.Mutex
	addrs map[string]struct{}
	full  bool
}

func (s *selfWriters) note(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full {
		return
	}
	if _, ok := s.addrs[addr]; ok {
		return
	}
	if len(s.addrs) >= maxSelfWriters {
		s.full, s.addrs = true, nil
		return
	}
	if s.addrs == nil {
		s.addrs = map[string]struct{}{}
	}
	s.addrs[addr] = struct{}{}
}

func (s *selfWriters) known(addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.addrs[addr]
	return ok || s.full
}
