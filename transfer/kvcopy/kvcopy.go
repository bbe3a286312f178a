// Package kvcopy defines how decodeplane addresses KV bytes on the delegated
// transfer path: the page-major layout of every KV buffer, the names of the
// decode buffers, the metadata slot encoding, and the copy batches a transfer
// agent executes (decodeplane.transfer.v1.TransferAgent mirrors these types).
// It is pure Go: the reference agent's host-memory store (transfer/hostmem)
// and the delegated engine (transfer/delegate) both build on it.
//
// # KV buffers
//
// A KV buffer is page-major. For MHA/GQA, with L the buffer's layers, H its
// heads per rank, D the head dim and B the dtype size, the byte of
// (page, layer, kv ∈ {K=0, V=1}, token, head, dim) is at
//
//	((((page·L + layer)·2 + kv)·page_size + token)·H + head)·D·B + dim·B
//
// For MLA there are no heads; with R the row bytes (latent·B, plus the DSA
// indexer-K bytes for hybrid-MLA) the row of (page, layer, token) is at
//
//	((page·L + layer)·page_size + token)·R
//
// A decode rank's buffer has every layer and max(1, total_kv_heads /
// decode_tp) heads; a prefill rank's buffer has max(1, total_kv_heads /
// prefill_tp) heads and, with PP > 1, only its stage's layers (transfer.StageLayers),
// numbered from 0.
//
// # Metadata slots
//
// MetadataSlotBytes (64) bytes per slot: the room marker as a little-endian
// uint64 at offset 0, then up to MaxOutputIDs (14) little-endian int32 output
// ids, zero padded.
package kvcopy

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
)

// BufferKind says what a registered buffer holds.
type BufferKind int

// Buffer kinds (decodeplane.transfer.v1.BufferKind).
const (
	KindUnspecified BufferKind = iota
	// KindKVPool is a decode rank's paged KV pool.
	KindKVPool
	// KindStagingRing is a decode rank's staging ring.
	KindStagingRing
	// KindMetadata is a decode DP shard's metadata slots.
	KindMetadata
	// KindPrefillKV is a prefill rank's KV, the source of transfers.
	KindPrefillKV
)

var kindNames = [...]string{"unspecified", "kv_pool", "staging_ring", "metadata", "prefill_kv"}

func (k BufferKind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("BufferKind(%d)", int(k))
	}
	return kindNames[k]
}

// BufferSpec describes a registered buffer. Address 0 asks the agent to
// allocate it.
type BufferSpec struct {
	Name     string
	Kind     BufferKind
	Address  uint64
	Length   int64
	ItemSize int64
	// Memory is where the bytes live: agent memory (the zero value, what
	// decodeplane's own buffers use), or the decode engine's memory for the
	// buffers of its registered layout.
	Memory kvlayout.Memory
}

// Copy is a strided copy: Rows() rows of Length bytes, row i from
// SrcOffset + i·SrcStride to DstOffset + i·DstStride.
type Copy struct {
	SrcBuffer string
	SrcOffset int64
	DstBuffer string
	DstOffset int64
	Length    int64
	// Count is the number of rows; 0 means 1.
	Count     int
	SrcStride int64
	DstStride int64
}

// Rows is the number of rows the copy moves (at least 1).
func (c Copy) Rows() int { return max(1, c.Count) }

// Bytes is the number of bytes the copy moves.
func (c Copy) Bytes() int64 { return int64(c.Rows()) * c.Length }

// SrcEnd is one past the last source byte the copy reads.
func (c Copy) SrcEnd() int64 { return c.SrcOffset + int64(c.Rows()-1)*c.SrcStride + c.Length }

// DstEnd is one past the last destination byte the copy writes.
func (c Copy) DstEnd() int64 { return c.DstOffset + int64(c.Rows()-1)*c.DstStride + c.Length }

// InlineWrite writes bytes carried in the batch (the metadata slot).
type InlineWrite struct {
	DstBuffer string
	DstOffset int64
	Data      []byte
}

// Batch is one unit of work for a transfer agent: copies, then inline
// writes. ID is unique per submission and the agent's idempotency key.
type Batch struct {
	ID       string
	Room     uint64
	Copies   []Copy
	Writes   []InlineWrite
	Deadline time.Time
}

// Bytes is the number of bytes the batch moves.
func (b Batch) Bytes() int64 {
	var n int64
	for _, c := range b.Copies {
		n += c.Bytes()
	}
	for _, w := range b.Writes {
		n += int64(len(w.Data))
	}
	return n
}

// Decode buffer names.

// DecodeKVName is the name of decode rank (dp, tp)'s KV pool.
func DecodeKVName(dp, tp int) string { return fmt.Sprintf("decode/dp%d/tp%d/kv", dp, tp) }

// StagingName is the name of decode rank (dp, tp)'s staging ring.
func StagingName(dp, tp int) string { return fmt.Sprintf("decode/dp%d/tp%d/staging", dp, tp) }

// MetadataName is the name of decode DP shard dp's metadata slots.
func MetadataName(dp int) string { return fmt.Sprintf("decode/dp%d/meta", dp) }

// KV is the geometry of one KV buffer.
type KV struct {
	// Layers is the number of layers the buffer holds.
	Layers int
	// Heads is the heads per rank (0 for MLA).
	Heads int
	// HeadBytes is head_dim × dtype (MHA/GQA).
	HeadBytes int64
	// RowBytes is one token's row in one layer for MLA.
	RowBytes int64
	PageSize int
	MLA      bool
}

// PageBytes is the size of one page (every layer, K and V).
func (g KV) PageBytes() int64 {
	if g.MLA {
		return int64(g.Layers) * int64(g.PageSize) * g.RowBytes
	}
	return int64(g.Layers) * 2 * int64(g.PageSize) * int64(g.Heads) * g.HeadBytes
}

// TokenRowBytes is one token's bytes in one layer and one of K/V (all heads);
// for MLA the latent row.
func (g KV) TokenRowBytes() int64 {
	if g.MLA {
		return g.RowBytes
	}
	return int64(g.Heads) * g.HeadBytes
}

// Offset is the byte offset of (page, layer, kv, token, head) for MHA/GQA.
func (g KV) Offset(page, layer, kv, token, head int) int64 {
	row := ((int64(page)*int64(g.Layers)+int64(layer))*2+int64(kv))*int64(g.PageSize) + int64(token)
	return (row*int64(g.Heads) + int64(head)) * g.HeadBytes
}

// RowOffset is the byte offset of (page, layer, token) for MLA.
func (g KV) RowOffset(page, layer, token int) int64 {
	return ((int64(page)*int64(g.Layers)+int64(layer))*int64(g.PageSize) + int64(token)) * g.RowBytes
}

// LayerOffset is where layer's block starts within a page: MHA/GQA K of
// layer (V follows it), or the MLA layer's rows.
func (g KV) LayerOffset(page, layer int) int64 {
	if g.MLA {
		return g.RowOffset(page, layer, 0)
	}
	return g.Offset(page, layer, 0, 0, 0)
}

// Size is the size of a buffer of pages pages.
func (g KV) Size(pages int64) int64 { return pages * g.PageBytes() }

// mlaRowBytes is one MLA row: latent × dtype, plus the DSA indexer-K bytes.
func mlaRowBytes(l kvlayout.Layout) int64 { return l.HeadBytes() + int64(l.DSAIndexBytes) }

// DecodeKV is the geometry of a decode rank's KV pool.
func DecodeKV(l kvlayout.Layout) KV {
	if l.IsMLA {
		return KV{Layers: l.NumLayers, RowBytes: mlaRowBytes(l), PageSize: l.PageSize, MLA: true}
	}
	return KV{Layers: l.NumLayers, Heads: l.HeadsPerRank, HeadBytes: l.HeadBytes(), PageSize: l.PageSize}
}

// PrefillKV is the geometry of a prefill rank's KV buffer against the decode
// layout: the same model, max(1, total_kv_heads / prefillTP) heads, and the
// layers of its PP stage.
func PrefillKV(l kvlayout.Layout, prefillTP, prefillPP, ppRank int) KV {
	b, e := transfer.StageLayers(l.NumLayers, prefillPP, ppRank)
	g := DecodeKV(l)
	g.Layers = e - b
	if !l.IsMLA {
		g.Heads = max(1, l.TotalKVHeads/max(1, prefillTP))
	}
	return g
}

// Metadata slot encoding.
const (
	MetadataSlotBytes = 64
	MaxOutputIDs      = (MetadataSlotBytes - 8) / 4
)

// EncodeMetadata renders a metadata slot: the marker, then up to
// MaxOutputIDs output ids (more are an error).
func EncodeMetadata(marker uint64, outputIDs []int32) ([]byte, error) {
	if len(outputIDs) > MaxOutputIDs {
		return nil, fmt.Errorf("%d output ids do not fit a %d-byte metadata slot (at most %d)", len(outputIDs), MetadataSlotBytes, MaxOutputIDs)
	}
	b := make([]byte, MetadataSlotBytes)
	binary.LittleEndian.PutUint64(b, marker)
	for i, id := range outputIDs {
		binary.LittleEndian.PutUint32(b[8+4*i:], uint32(id))
	}
	return b, nil
}

// DecodeMetadata reads a metadata slot: the marker and the MaxOutputIDs
// output id positions.
func DecodeMetadata(b []byte) (marker uint64, outputIDs []int32, err error) {
	if len(b) < MetadataSlotBytes {
		return 0, nil, fmt.Errorf("metadata slot is %d bytes, want %d", len(b), MetadataSlotBytes)
	}
	marker = binary.LittleEndian.Uint64(b)
	outputIDs = make([]int32, MaxOutputIDs)
	for i := range outputIDs {
		outputIDs[i] = int32(binary.LittleEndian.Uint32(b[8+4*i:]))
	}
	return marker, outputIDs, nil
}

// DecodeBuffers lists the buffers a decode instance registers with its
// agent: per (DP shard, TP rank) the KV pool and, when ringBytes > 0, the
// staging ring; per DP shard the metadata slots.
func DecodeBuffers(l kvlayout.Layout, ringBytes int64, metadataSlots int) []BufferSpec {
	g := DecodeKV(l)
	var out []BufferSpec
	for dp := range max(1, l.DP) {
		for tp := range max(1, l.AttnTP) {
			out = append(out, BufferSpec{Name: DecodeKVName(dp, tp), Kind: KindKVPool, Length: g.Size(l.TotalPages), ItemSize: l.ItemLen()})
			if ringBytes > 0 {
				out = append(out, BufferSpec{Name: StagingName(dp, tp), Kind: KindStagingRing, Length: ringBytes, ItemSize: 1})
			}
		}
		out = append(out, BufferSpec{Name: MetadataName(dp), Kind: KindMetadata, Length: int64(metadataSlots) * MetadataSlotBytes, ItemSize: MetadataSlotBytes})
	}
	return out
}
