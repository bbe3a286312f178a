package hostmem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// ErrCancelled: the batch was cancelled (CancelRoom) before it finished.
var ErrCancelled = errors.New("batch cancelled")

// Agent runs batches on a Store in process, with per-batch deadlines and
// per-room cancellation: delegate.Agent without a network, and the engine
// of the reference agent's gRPC service. It is safe for concurrent use.
type Agent struct {
	store *Store

	mu      sync.Mutex
	running map[uint64]map[*run]struct{}
	fault   func(kvcopy.Batch) error
	hold    func(kvcopy.Batch) bool
	// pastCancel: a held batch ignores cancellation (CancelRoom) and ends
	// only at its deadline or when the caller's context ends.
	pastCancel bool
}

type run struct {
	id     string
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// NewAgent runs batches on s.
func NewAgent(s *Store) *Agent {
	return &Agent{store: s, running: map[uint64]map[*run]struct{}{}}
}

// Store returns the agent's store.
func (a *Agent) Store() *Store { return a.store }

// SetFault installs a fault for testing: fn is called before each batch; a
// non-nil error fails the batch with it (nothing is copied).
func (a *Agent) SetFault(fn func(kvcopy.Batch) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fault = fn
}

// SetHold installs a fault for testing: batches for which fn is true are
// accepted but never run; they end only when cancelled or past their
// deadline.
func (a *Agent) SetHold(fn func(kvcopy.Batch) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hold = fn
}

// SetHoldPastCancel makes the batches SetHold holds ignore cancellation
// (testing: an agent whose copies in flight cannot be recalled): such a
// batch ends only at its deadline, or when Execute's context ends, and
// CancelRoom waits for it.
func (a *Agent) SetHoldPastCancel(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pastCancel = on
}

// RegisterBuffers registers buffers in the store, each in the memory its
// spec names (agent memory, or a shared-memory file region).
func (a *Agent) RegisterBuffers(_ context.Context, bufs []kvcopy.BufferSpec) error {
	regs := make([]Registration, len(bufs))
	for i, b := range bufs {
		regs[i] = Registration{Spec: b, Memory: MemoryOf(b.Memory)}
	}
	_, err := a.store.RegisterMemory(regs)
	return err
}

// DeregisterBuffers forgets buffers (Store.Deregister): buffers with
// copies in flight are ErrBusy and nothing is forgotten.
func (a *Agent) DeregisterBuffers(_ context.Context, names []string) error {
	return a.store.Deregister(names)
}

// Check always succeeds: an in-process store is always reachable.
func (a *Agent) Check(context.Context) error { return nil }

// Execute runs a batch until it finishes, its deadline passes, ctx is done
// or CancelRoom cancels it; when it returns nothing of it is in flight.
func (a *Agent) Execute(ctx context.Context, b kvcopy.Batch) error {
	// The batch's buffers are busy while it is in flight, held ones too.
	unpin, err := a.store.Pin(b)
	if err != nil {
		return err
	}
	defer unpin()
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !b.Deadline.IsZero() {
		var dcancel context.CancelFunc
		rctx, dcancel = context.WithDeadline(rctx, b.Deadline)
		defer dcancel()
	}
	r := &run{id: b.ID, cancel: cancel, done: make(chan struct{})}
	a.mu.Lock()
	set := a.running[b.Room]
	if set == nil {
		set = map[*run]struct{}{}
		a.running[b.Room] = set
	}
	set[r] = struct{}{}
	fault, hold, pastCancel := a.fault, a.hold, a.pastCancel
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.running[b.Room], r)
		if len(a.running[b.Room]) == 0 {
			delete(a.running, b.Room)
		}
		a.mu.Unlock()
		close(r.done)
	}()

	if fault != nil {
		if err := fault(b); err != nil {
			return err
		}
	}
	if hold != nil && hold(b) {
		wait := rctx
		if pastCancel {
			wait = ctx
			if !b.Deadline.IsZero() {
				var dcancel context.CancelFunc
				wait, dcancel = context.WithDeadline(ctx, b.Deadline)
				defer dcancel()
			}
		}
		<-wait.Done()
		return runErr(wait, b)
	}
	if _, err := a.store.Execute(rctx, b); err != nil {
		if rctx.Err() != nil {
			return runErr(rctx, b)
		}
		return err
	}
	return nil
}

func runErr(ctx context.Context, b kvcopy.Batch) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrCancelled) {
		return fmt.Errorf("batch %s of room %d: %w", b.ID, b.Room, ErrCancelled)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("batch %s of room %d: deadline exceeded (%s) before every copy landed", b.ID, b.Room, b.Deadline.Format("15:04:05.000"))
	}
	return ctx.Err()
}

// CancelRoom cancels the room's batches in flight and returns once none of
// them runs.
func (a *Agent) CancelRoom(ctx context.Context, room uint64) error {
	_, err := a.CancelBatches(ctx, room)
	return err
}

// CancelBatches cancels the room's batches in flight (only ids when given)
// and returns once none of them runs. It returns how many it cancelled.
func (a *Agent) CancelBatches(ctx context.Context, room uint64, ids ...string) (int, error) {
	a.mu.Lock()
	var runs []*run
	for r := range a.running[room] {
		if len(ids) == 0 || slices.Contains(ids, r.id) {
			r.cancel(ErrCancelled)
			runs = append(runs, r)
		}
	}
	a.mu.Unlock()
	for _, r := range runs {
		select {
		case <-r.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return len(runs), nil
}

// InFlight counts the batches running now.
func (a *Agent) InFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, set := range a.running {
		n += len(set)
	}
	return n
}
