package transfer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Engine errors. The room manager classifies an engine's error with
// errors.Is; the server maps them to gRPC codes.
var (
	// ErrTransferFailed: the chunk failed; the room is failed. Aborted.
	ErrTransferFailed = errors.New("transfer failed")
	// ErrEngineUnavailable: the transfer engine cannot be reached (delegated
	// path); nothing was written and the chunk may be sent again. Unavailable.
	ErrEngineUnavailable = errors.New("transfer engine unavailable")
)

// Engine moves KV chunks into decode pages. The simulated engine
// (transfer/sim) is the embedded default; the delegated engine
// (transfer/delegate) speaks decodeplane.transfer.v1.TransferAgent to an
// external GPU transfer service.
type Engine interface {
	// Transfer moves one chunk and returns when it landed, or an error
	// wrapping ErrTransferFailed (the chunk failed; the room fails) or
	// ErrEngineUnavailable. It must return promptly when ctx is cancelled
	// (the room failed or was aborted), and after it returns nothing may
	// still write into the chunk's destination pages.
	Transfer(ctx context.Context, op ChunkOp) (ChunkResult, error)
}

// AsyncEngine is an Engine that runs a chunk without a goroutine per call:
// TransferAsync starts the chunk and calls done exactly once, from any
// goroutine (possibly before it returns), with what Transfer would return.
// done must not block. The room manager uses it, when the engine has it,
// for the chunks of multiplexed sessions.
type AsyncEngine interface {
	Engine
	TransferAsync(ctx context.Context, op ChunkOp, done func(ChunkResult, error))
}

// Scatterer is the engine capability staging needs: scatter one staged
// region into a room's pages. The simulated and the delegated engines
// implement it; an engine without it cannot serve staged rooms.
type Scatterer interface {
	// Scatter copies op's ring region into the decode pages and, when
	// op.Marker is set, writes the metadata slot. Errors and cancellation as
	// Engine.Transfer: after it returns nothing writes into the pages.
	Scatter(ctx context.Context, op ScatterOp) (ChunkResult, error)
}

// ChunkChecker is implemented by an engine that can refuse a chunk's
// request before anything changes (the delegated path needs the chunk's
// source); the manager asks it before it records the chunk.
type ChunkChecker interface {
	// CheckChunk returns nil or a *FieldError naming the request field.
	CheckChunk(src ChunkSource) error
}

// ChunkSource is what a chunk request says about where its bytes come from,
// as ChunkChecker sees it before the chunk is recorded.
type ChunkSource struct {
	// NumPages is the number of destination pages the chunk covers.
	NumPages int
	// Buffer and Pages locate the bytes on the prefill side (the request's
	// source.buffer and source.page_indices).
	Buffer string
	Pages  []int32
}

// OpChecker is implemented by an engine that checks a chunk of a room
// whose decode engine registered its buffer layout (ChunkOp.Engine) before
// the room records it: the delegated engine checks the source the layout's
// copies need (source.aux_row, source.state, aux.output_ids left empty).
// The room calls it under its shard's lock; it must not block.
type OpChecker interface {
	// CheckOp returns nil or a *FieldError naming the request field.
	CheckOp(op ChunkOp) error
}

// LayoutRegistrar is implemented by an engine that must know the decode
// engine's buffers: the delegated engine registers them with its transfer
// agent (their memory is the engine's), again on every health check, and
// drops a layout whose buffers the agent refuses then (the engine's memory
// is gone: it exited). A chunk copies into the layout its room was
// declared with only while that exact layout (the same *BufferLayout) is
// the rank's registered one: a room of a dropped or replaced layout fails.
type LayoutRegistrar interface {
	// RegisterLayout makes l the buffers of decode rank (dp, tp), all or
	// nothing, replacing what the rank had (its buffers are released
	// first; nil: none). already: l equals the rank's registered layout,
	// still held in the same memory: nothing changed and the registered
	// layout stays the one chunks name.
	RegisterLayout(ctx context.Context, dp, tp int, l *kvlayout.BufferLayout) (already bool, err error)
	// LayoutDropped is why decode rank (dp, tp)'s layout was dropped, or ""
	// (registered, or none).
	LayoutDropped(dp, tp int) string
}

// FieldError is a chunk request field an engine refuses (ChunkChecker): the
// domain's one field error (kvlayout.Invalid), answered as an invalid
// argument naming Field.
type FieldError = kvlayout.Invalid

// Rank is the prefill scheduler rank a chunk comes from.
type Rank struct {
	Addr string
	DP   int
	CP   int
	TP   int
	PP   int
}

// Target is one decode TP rank a prefill rank writes to, with the head slice
// for heterogeneous TP (SGLang compute_head_slice_params).
type Target struct {
	DecodeTP     int
	Dummy        bool
	SrcHeadStart int
	DstHeadStart int
	NumHeads     int
}

// ChunkOp is one chunk of one prefill rank's KV for one room.
type ChunkOp struct {
	Room       uint64
	RID        string
	Attempt    uint32
	Rank       Rank
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
	Layout   kvlayout.Layout
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
	State        []kvlayout.StateIndices
	// Marker is the room marker to write into the metadata slot (0 = none).
	Marker    uint64
	OutputIDs []int32
	// Engine are the buffer layouts the decode engine registered for the
	// room's decode DP shard, index = decode TP rank
	// (RegisterEngineLayout); empty: the decode ranks use decodeplane's own
	// page-major buffers (transfer/kvcopy). A room keeps the layouts it
	// was declared with.
	Engine []*kvlayout.BufferLayout
	// SrcAuxRow is the prefill's aux row (source.aux_row; -1: not given)
	// and SrcState its state indices (source.state): with an engine
	// layout the last chunk copies the aux rows and state items from them.
	SrcAuxRow int32
	SrcState  []kvlayout.StateIndices
}

// ScatterOp is one staged region to scatter into a room's pages.
type ScatterOp struct {
	Room       uint64
	RID        string
	Attempt    uint32
	ChunkIndex int
	DecodeDP   int
	DecodeTP   int
	Layout     kvlayout.Layout
	// RingOffset is where the region starts in the staging ring of
	// (DecodeDP, DecodeTP).
	RingOffset int64
	// Tokens is num_pages × page_size: the region's token rows per block.
	Tokens    int
	DestPages []int32
	// Writers are the region's writers in order.
	Writers []ScatterWriter
	// Marker (0: none) and OutputIDs go into MetadataSlot with the scatter.
	MetadataSlot int32
	Marker       uint64
	OutputIDs    []int32
}

// ScatterWriter is one prefill rank's block of a staged region: its heads
// (NumHeads, landing at DstHeadStart of the decode rank's heads) of the
// layers [LayerBegin, LayerEnd), starting Tokens × OffsetPerToken into the
// region and BytesPerToken long per token.
type ScatterWriter struct {
	NumHeads       int
	DstHeadStart   int
	LayerBegin     int
	LayerEnd       int
	BytesPerToken  int64
	OffsetPerToken int64
}

// Bytes is what the scatter moves out of the ring.
func (op ScatterOp) Bytes() int64 {
	var n int64
	for _, w := range op.Writers {
		n += int64(op.Tokens) * w.BytesPerToken
	}
	return n
}

// ChunkResult is a landed chunk.
type ChunkResult struct {
	Bytes    int64
	Duration time.Duration
	// MarkerWritten is the room marker now in the metadata slot (0 if the
	// chunk wrote none).
	MarkerWritten uint64
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
