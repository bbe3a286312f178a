package kvlayout

import (
	"bytes"
	"encoding/binary"
	"hash/fnv"
	"slices"
	"strconv"
)

// BufferLayout is a decode engine's own buffer layout on one decode rank
// (one decode DP shard's TP rank), as SGLang registers it with its transfer
// backend (KVArgs): one KV buffer per layer and per K/V (every layer's K
// buffer, then every layer's V buffer; MLA: one latent buffer per layer),
// then the draft model's buffers likewise; auxiliary buffers with one row
// per metadata slot each (first output ids, cached tokens, logprobs, top-k,
// hidden states, and the column whose row begins with the room marker); and
// typed state buffers. Inside a KV buffer a page is one item of ItemLen
// bytes, token-major (NHD: token, head, dim), so that page p of a buffer
// is at p × ItemLen, as SGLang's own transfer code computes it.
//
// The decode engine registers one per decode rank (RegisterEngineLayout);
// without one the rank uses decodeplane's own page-major buffers
// (transfer/kvcopy). Validate checks a layout against the decode pool
// (kv_pool) it must describe.
type BufferLayout struct {
	KV  []KVBuffer
	Aux []AuxBuffer
	// Marker names the aux buffer whose row begins with the room marker
	// (a little-endian uint64: SGLang's bootstrap_room column).
	Marker string
	State  []StateBuffer
}

// KVBuffer is one KV buffer of a layout: one layer's K or V (MLA: its
// latent), of the model or of its draft model.
type KVBuffer struct {
	// Name is the buffer's name at the transfer agent.
	Name string
	// Layer is the layer the buffer holds: 0..num_layers-1, or, for a
	// draft buffer, the draft model's layer (0..draft layers-1).
	Layer int
	// Value: the buffer holds V (else K; MLA's latent buffers are K).
	Value bool
	// Draft: the buffer is the draft model's (speculative decoding).
	Draft bool
	// ItemLen is the bytes of one page of this buffer (kv_item_len).
	ItemLen int64
	// Length is the buffer's size in bytes (kv_data_len).
	Length int64
	// Memory is where its bytes live.
	Memory Memory
}

// AuxBuffer is one auxiliary (metadata) buffer: one row per metadata slot.
type AuxBuffer struct {
	Name   string
	RowLen int64 // aux_item_len: the bytes of one row
	Length int64
	Memory Memory
}

// StateBuffer is one per-request state buffer: one item per state index of
// its type (a Mamba slot, an SWA page).
type StateBuffer struct {
	Name    string
	Type    StateType
	ItemLen int64
	Length  int64
	Memory  Memory
}

// MemoryKind says where a buffer's bytes live.
type MemoryKind uint8

// Memory kinds (decodeplane.transfer.v1.BufferMemory).
const (
	// MemoryAgent: the transfer agent allocates the buffer; the engine
	// sees its bytes only through the agent (ReadBuffer).
	MemoryAgent MemoryKind = iota
	// MemoryShared: a region of a shared-memory file the engine created.
	MemoryShared
	// MemoryCudaIPC: GPU memory the engine exported (cudaIpcMemHandle_t).
	MemoryCudaIPC
	// MemoryNixl: memory a NIXL descriptor describes.
	MemoryNixl
)

func (k MemoryKind) String() string {
	switch k {
	case MemoryAgent:
		return "agent"
	case MemoryShared:
		return "shared"
	case MemoryCudaIPC:
		return "cuda_ipc"
	case MemoryNixl:
		return "nixl"
	}
	return "MemoryKind(" + strconv.Itoa(int(k)) + ")"
}

// Memory is where an engine buffer's bytes live: the region [Offset,
// Offset+length) of the shared-memory file at Path, a CUDA IPC Handle on
// Device, a NIXL Descriptor, or (the zero value) agent memory.
type Memory struct {
	Kind       MemoryKind
	Path       string
	Offset     int64
	Handle     []byte
	Device     int
	Descriptor []byte
}

// Equal reports whether m and o name the same memory.
func (m Memory) Equal(o Memory) bool {
	return m.Kind == o.Kind && m.Path == o.Path && m.Offset == o.Offset && bytes.Equal(m.Handle, o.Handle) &&
		m.Device == o.Device && bytes.Equal(m.Descriptor, o.Descriptor)
}

// Bounds of a BufferLayout.
const (
	MaxLayoutKV    = 4096
	MaxLayoutAux   = 64
	MaxLayoutState = 16
	// MaxBufferName is a buffer name's length in bytes.
	MaxBufferName = 128
	// MaxAuxRow bounds an aux row (hidden states of a large model fit).
	MaxAuxRow = 1 << 24
	// MaxItemLen bounds an item (a page of one layer, a state item).
	MaxItemLen = 1 << 40
	// MaxBufferLength bounds a buffer's size (the agent's 2^62).
	MaxBufferLength = 1 << 62
	// MarkerBytes is the room marker at the start of the marker row.
	MarkerBytes = 8
	// ReservedPrefix begins the names of decodeplane's own buffers.
	ReservedPrefix = "decode/"
)

// Equal reports whether l and o are the same layout, memory included.
func (l *BufferLayout) Equal(o *BufferLayout) bool {
	if l == nil || o == nil {
		return l == o
	}
	return l.Marker == o.Marker &&
		slices.EqualFunc(l.KV, o.KV, func(a, b KVBuffer) bool {
			return a.Name == b.Name && a.Layer == b.Layer && a.Value == b.Value && a.Draft == b.Draft &&
				a.ItemLen == b.ItemLen && a.Length == b.Length && a.Memory.Equal(b.Memory)
		}) &&
		slices.EqualFunc(l.Aux, o.Aux, func(a, b AuxBuffer) bool {
			return a.Name == b.Name && a.RowLen == b.RowLen && a.Length == b.Length && a.Memory.Equal(b.Memory)
		}) &&
		slices.EqualFunc(l.State, o.State, func(a, b StateBuffer) bool {
			return a.Name == b.Name && a.Type == b.Type && a.ItemLen == b.ItemLen && a.Length == b.Length && a.Memory.Equal(b.Memory)
		})
}

// ID is the layout's fingerprint (FNV-1a, never 0) over what a prefill
// rank needs of it: every buffer's name, role and sizes and the marker,
// not where the bytes live. Destinations name a decode rank's layout by it.
func (l *BufferLayout) ID() uint64 {
	h := fnv.New64a()
	var n [8]byte
	num := func(v int64) {
		binary.LittleEndian.PutUint64(n[:], uint64(v))
		h.Write(n[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		h.Write([]byte(s))
	}
	flag := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	num(int64(len(l.KV)))
	for _, b := range l.KV {
		str(b.Name)
		num(int64(b.Layer))
		num(flag(b.Value)<<1 | flag(b.Draft))
		num(b.ItemLen)
		num(b.Length)
	}
	num(int64(len(l.Aux)))
	for _, b := range l.Aux {
		str(b.Name)
		num(b.RowLen)
		num(b.Length)
	}
	str(l.Marker)
	num(int64(len(l.State)))
	for _, b := range l.State {
		str(b.Name)
		num(int64(b.Type))
		num(b.ItemLen)
		num(b.Length)
	}
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// MarkerIndex is the index of the marker's aux buffer (-1 when none).
func (l *BufferLayout) MarkerIndex() int {
	return slices.IndexFunc(l.Aux, func(a AuxBuffer) bool { return a.Name == l.Marker })
}

// Names lists every buffer's name.
func (l *BufferLayout) Names() []string {
	out := make([]string, 0, len(l.KV)+len(l.Aux)+len(l.State))
	for _, b := range l.KV {
		out = append(out, b.Name)
	}
	for _, b := range l.Aux {
		out = append(out, b.Name)
	}
	for _, b := range l.State {
		out = append(out, b.Name)
	}
	return out
}

// DraftLayers is the number of draft-model layers the layout holds.
func (l *BufferLayout) DraftLayers() int {
	n := 0
	for _, b := range l.KV {
		if b.Draft {
			n = max(n, b.Layer+1)
		}
	}
	return n
}

// HeadShare is the bytes of one page of a KV buffer that numHeads of the
// decode rank's headsPerRank heads hold (MHA/GQA, the TP-mismatch share);
// the whole item when numHeads is 0 or all of them, or for MLA (mla).
func (b KVBuffer) HeadShare(mla bool, headsPerRank, numHeads int) int64 {
	if mla || numHeads <= 0 || numHeads == headsPerRank || headsPerRank <= 0 {
		return b.ItemLen
	}
	return b.ItemLen / int64(headsPerRank) * int64(numHeads)
}
