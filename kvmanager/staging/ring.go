package staging

import (
	"errors"
	"fmt"

	"github.com/decodeplane/decodeplane/transfer"
)

// Staging errors (kvmanager re-exports them as ErrStaging*). The server maps
// them with errors.Is.
var (
	// ErrUnavailable: staging cannot be used against this decode
	// instance (MLA pool, staging not configured, total KV heads unknown, or
	// an engine that cannot scatter). FailedPrecondition; the message is
	// SGLang's where SGLang has one (see UnavailableError).
	ErrUnavailable = errors.New("staging not available")
	// ErrTooLarge: a chunk needs more bytes than the whole staging
	// ring; the room fails (it can never complete). ResourceExhausted, not
	// worth retrying: increase staging.pool_size_mb or send smaller chunks.
	ErrTooLarge = errors.New("staging chunk exceeds the ring")
	// ErrNotWritable: the region's watermark has not released it yet;
	// nothing was recorded. FailedPrecondition: wait for WatchWatermark,
	// write, then report.
	ErrNotWritable = errors.New("staging region not writable yet")
)

// Hint is SGLang's advice when a chunk does not fit the decode ring
// (MooncakeKVManager._do_staging_transfer).
const Hint = "Increase SGLANG_DISAGG_STAGING_POOL_SIZE_MB or reduce chunked_prefill_size."

// UnavailableError is a staging refusal whose message is exactly Msg (SGLang's
// text where it has one); it wraps ErrUnavailable.
type UnavailableError struct{ Msg string }

func (e *UnavailableError) Error() string { return e.Msg }

// Unwrap returns ErrUnavailable.
func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

// RingRegion is one allocation of a staging ring.
type RingRegion struct {
	ID     uint64
	Offset int64
	Size   int64
	Round  int64
}

// End is one past the region's last byte.
func (r RingRegion) End() int64 { return r.Offset + r.Size }

// Ring is SGLang's StagingAllocator (ring + overcommit): an
// allocation that fits after the head goes there; otherwise the ring starts a
// new round at offset 0. Assign never checks overlap: a region is safe to
// write only once the watermark — the (round, offset) of the oldest live
// allocation, or (round, head) when none is live — has moved past the data of
// the previous round (WatermarkReady). It is not safe for concurrent use.
//
// One deliberate difference: SGLang recomputes the watermark only on free,
// so a region that starts a new round while nothing is live is never
// writable (the watermark still points at the old round's head and nothing
// is left to free). Ring also recomputes it on assign; the value is
// SGLang's whenever an allocation was live at the last free, and otherwise
// the oldest live allocation's position, which is always safe. So the oldest
// live region is always writable and the ring cannot deadlock.
type Ring struct {
	size    int64
	head    int64
	round   int64
	live    map[uint64]RingRegion
	order   []uint64 // allocation order; freed ids are popped off the front
	next    uint64
	wmRound int64
	wmTail  int64
}

// NewRing returns an empty ring of size bytes.
func NewRing(size int64) *Ring {
	return &Ring{size: size, live: map[uint64]RingRegion{}}
}

// Size is the ring's size in bytes.
func (a *Ring) Size() int64 { return a.size }

// Assign allocates n bytes. n larger than the whole ring is
// ErrTooLarge (SGLang's ALLOC_OVERSIZED).
func (a *Ring) Assign(n int64) (RingRegion, error) {
	if n <= 0 {
		return RingRegion{}, fmt.Errorf("assign %d bytes from the staging ring: the size must be > 0", n)
	}
	if n > a.size {
		return RingRegion{}, fmt.Errorf("%w: %d bytes needed, the ring has %d", ErrTooLarge, n, a.size)
	}
	var off int64
	if n <= a.size-a.head {
		off = a.head
		a.head += n
	} else {
		a.round++
		off = 0
		a.head = n
	}
	r := RingRegion{ID: a.next, Offset: off, Size: n, Round: a.round}
	a.next++
	a.live[r.ID] = r
	a.order = append(a.order, r.ID)
	a.updateWatermark()
	return r, nil
}

// Free releases an allocation and advances the watermark past the leading
// freed allocations. It reports whether id was live.
func (a *Ring) Free(id uint64) bool {
	if _, ok := a.live[id]; !ok {
		return false
	}
	delete(a.live, id)
	i := 0
	for i < len(a.order) {
		if _, ok := a.live[a.order[i]]; ok {
			break
		}
		i++
	}
	a.order = a.order[i:]
	if len(a.live) == 0 {
		a.order = nil
	}
	a.updateWatermark()
	return true
}

// updateWatermark sets the watermark: (round, head) when nothing is live,
// else the oldest live allocation's (round, offset).
func (a *Ring) updateWatermark() {
	if len(a.live) == 0 {
		a.wmRound, a.wmTail = a.round, a.head
		return
	}
	oldest := a.live[a.order[0]]
	a.wmRound, a.wmTail = oldest.Round, oldest.Offset
}

// Watermark returns (round, tail): everything before it is free to overwrite.
func (a *Ring) Watermark() (round, tail int64) { return a.wmRound, a.wmTail }

// Head returns the current round and the next allocation offset.
func (a *Ring) Head() (round, head int64) { return a.round, a.head }

// Live counts allocations not freed yet.
func (a *Ring) Live() int { return len(a.live) }

// Writable reports whether r may be written now (WatermarkReady against this
// ring's watermark).
func (a *Ring) Writable(r RingRegion) bool {
	return WatermarkReady(a.wmRound, a.wmTail, r.Round, r.End())
}

// WatermarkReady is SGLang's is_watermark_ready: a region allocated in round
// round ending at end may be written iff round <= 0, or the previous round is
// behind the watermark's, or it is the watermark's round and the region ends
// at or before the watermark's tail.
func WatermarkReady(wmRound, wmTail, round, end int64) bool {
	if round <= 0 {
		return true
	}
	prev := round - 1
	return prev < wmRound || (prev == wmRound && end <= wmTail)
}

// ChunkLayout is compute_staging_layout's answer for one decode rank and
// one chunk: how many prefill ranks write the region and how many bytes each
// writes, concatenated in writer order.
type ChunkLayout struct {
	NumWriters    int
	WriterBytes   []int64
	WriterOffsets []int64
	Total         int64
}

// ComputeLayout mirrors SGLang's compute_staging_layout: num_writers =
// srcTP / max(1, dstTP) when the prefill TP is larger, else 1; writer i
// carries numTokens × heads_i × bytesPerHeadToken × numLayers × 2 bytes
// ([K layer 0..L−1][V layer 0..L−1], each layer block token-major), heads_i
// from transfer.ComputeHeadSliceParams(srcTP, dstTP, i, dstRank, totalHeads).
func ComputeLayout(srcTP, dstTP, dstRank, totalHeads, numTokens int, bytesPerHeadToken int64, numLayers int) ChunkLayout {
	n := 1
	if srcTP > dstTP {
		n = srcTP / max(1, dstTP)
	}
	out := ChunkLayout{NumWriters: n, WriterBytes: make([]int64, n), WriterOffsets: make([]int64, n)}
	for w := range n {
		hs := transfer.ComputeHeadSliceParams(srcTP, dstTP, w, dstRank, totalHeads)
		b := int64(numTokens) * int64(hs.NumHeads) * bytesPerHeadToken * int64(numLayers) * 2
		out.WriterOffsets[w] = out.Total
		out.WriterBytes[w] = b
		out.Total += b
	}
	return out
}

// HeadSlice is compute_head_slice_params's answer for one (prefill rank,
// decode rank) pair: the engine contract's (transfer.ComputeHeadSliceParams),
// the same formula the registry plans destinations with.
type HeadSlice = transfer.HeadSlice
