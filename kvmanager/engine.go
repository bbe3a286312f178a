package kvmanager

import (
	"context"
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// TransferEngine moves KV chunks into decode pages. The simulated engine
// (NewSimEngine) is the embedded default; the delegated engine speaks
// decodeplane.transfer.v1.TransferAgent to an external GPU transfer service.
type TransferEngine interface {
	// Transfer moves one chunk and returns when it landed, or an error
	// wrapping ErrTransferFailed (the chunk failed; the room fails) or
	// ErrEngineUnavailable. It must return promptly when ctx is cancelled
	// (the room failed or was aborted), and after it returns nothing may
	// still write into the chunk's destination pages.
	Transfer(ctx context.Context, op ChunkOp) (ChunkResult, error)
}

// ChunkChecker is implemented by an engine that can refuse a chunk's
// request before anything changes (the delegated path needs the chunk's
// source); the manager asks it before it records the chunk.
type ChunkChecker interface {
	CheckChunk(req ChunkRequest) error
}

// ChunkOp is one chunk of one prefill rank's KV for one room.
type ChunkOp struct {
	Room       uint64
	RID        string
	Attempt    uint32
	Rank       RankID
	ChunkIndex int
	// DestPages are the decode page indices of this chunk.
	DestPages []int32
	// Tokens is the number of tokens the chunk carries (the last page may
	// be partial).
	Tokens int
	// SrcBuffer and SrcPages locate the bytes on the prefill side (delegated
	// path); SrcPages has one entry per destination page.
	SrcBuffer string
	SrcPages  []int32
	// Targets are the decode TP ranks this prefill rank writes to.
	Targets []Target
	// Layout is the decode KV layout.
	Layout   prealloc.Layout
	DecodeDP int
	// PrefillTP and PrefillPP are the prefill instance's attention TP and PP
	// sizes: with Rank they locate the bytes in the prefill rank's buffer
	// (kvcopy.PrefillKV).
	PrefillTP int
	PrefillPP int
	// Last marks the rank's final chunk: state components and the metadata
	// (aux) write travel with it.
	Last         bool
	MetadataSlot int32
	State        []prealloc.StateIndices
	// Marker is the room marker to write into the metadata slot (0 = none).
	Marker    uint64
	OutputIDs []int32
}

// WritesMayContinueError is an engine failure after which writes into the
// operation's pages may still happen until Until (e.g. the transfer agent
// may have accepted a batch whose outcome is unknown, and it stops at the
// batch's deadline). The manager keeps the room's pages and slots until then
// instead of handing them to another room.
type WritesMayContinueError struct {
	Err   error
	Until time.Time
}

func (e *WritesMayContinueError) Error() string {
	return fmt.Sprintf("%v (writes into the pages may continue until %s)", e.Err, e.Until.Format(time.RFC3339Nano))
}

// Unwrap returns the underlying error.
func (e *WritesMayContinueError) Unwrap() error { return e.Err }

// ChunkResult is a landed chunk.
type ChunkResult struct {
	Bytes    int64
	Duration time.Duration
	// MarkerWritten is the room marker now in the metadata slot (0 if the
	// chunk wrote none).
	MarkerWritten uint64
}

// Clock is the manager's source of time. RealClock is the default; tests run
// it inside testing/synctest bubbles, where time is virtual.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d; Stop cancels it.
	AfterFunc(d time.Duration, f func()) Stopper
}

// Stopper stops a pending AfterFunc.
type Stopper interface{ Stop() bool }

// RealClock reads the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Stopper { return time.AfterFunc(d, f) }

// sleep waits d on the clock or until ctx is done.
func sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	done := make(chan struct{})
	t := c.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}
