package kvlayout

import (
	"fmt"
	"strings"
	"time"
)

// Config describes one decode instance's KV side as decodeplane sees it: the
// engine transfer backend it stands in for, the KV pool, the parallel layout,
// the staging buffer and the admission budget. The yaml tags are the keys of
// the daemon's configuration file; Validate names problems by those keys.
//
// Sizes are per decode data-parallel shard: a daemon with parallel.dp = 4 hosts
// four ledgers, each with the pool described here.
type Config struct {
	// Backend is the engine's transfer backend (transfer.backend): one of
	// TransferBackends. It decides whether staging and DCP are supported.
	Backend string `yaml:"-"`
	// Pool is the KV pool (kv_pool).
	Pool PoolConfig `yaml:"kv_pool"`
	// Parallel is the decode parallel layout (parallel).
	Parallel ParallelConfig `yaml:"parallel"`
	// Staging is the heterogeneous-TP staging ring (staging).
	Staging StagingConfig `yaml:"staging"`
	// Admission holds the admission budget knobs (admission).
	Admission AdmissionConfig `yaml:"admission"`
	// Model names the served model (model; optional): part of the
	// fingerprint, checked against a prefill that names its model.
	Model ModelConfig `yaml:"model"`
}

// PoolConfig is the decode KV pool of one DP shard (kv_pool).
type PoolConfig struct {
	// Kind is the KV backend kind (kv_pool.kind).
	Kind Kind `yaml:"kind"`
	// NumLayers is the number of attention layers whose KV is transferred.
	NumLayers int `yaml:"num_layers"`
	// KVHeads is the model's total number of KV heads (MHA/GQA and the hybrids
	// on them). Per-rank heads are max(1, KVHeads / parallel.attn_tp).
	KVHeads int `yaml:"kv_heads"`
	// HeadDim is the per-head dimension (MHA/GQA).
	HeadDim int `yaml:"head_dim"`
	// KVLoraRank is MLA's latent dimension (kv_lora_rank, 512 for DeepSeek V3).
	KVLoraRank int `yaml:"kv_lora_rank"`
	// QKRopeHeadDim is MLA's decoupled RoPE dimension (64 for DeepSeek V3).
	QKRopeHeadDim int `yaml:"qk_rope_head_dim"`
	// DType is the KV cache dtype (--kv-cache-dtype): one of DTypes.
	DType string `yaml:"dtype"`
	// PageSize is the number of tokens per KV page; a power of two.
	PageSize int `yaml:"page_size"`
	// TotalTokens is the pool size in tokens (max_total_num_tokens). Exactly
	// one of TotalTokens and TotalPages is set.
	TotalTokens int64 `yaml:"total_tokens"`
	// TotalPages is the pool size in pages.
	TotalPages int64 `yaml:"total_pages"`
	// RequestSlots is max_running_requests: SGLang's req_to_token pool size.
	RequestSlots int `yaml:"request_slots"`
	// PreAllocSlots are the extra req_to_token rows for requests that are
	// pre-allocated or transferring. -1 (the default) applies SGLang's rule:
	// 2 × request_slots when request_slots <= 32, else 0.
	PreAllocSlots int `yaml:"pre_alloc_slots"`
	// MetadataSlots is the number of metadata (aux) slots. 0 (the default)
	// means 2 × (request_slots + pre_alloc_slots), as SGLang sizes them.
	MetadataSlots int `yaml:"metadata_slots"`
	// SWA is the sliding-window pool of a hybrid-swa kind.
	SWA SWAConfig `yaml:"swa"`
	// Mamba is the linear-attention state of a hybrid-linear kind.
	Mamba MambaConfig `yaml:"mamba"`
	// Owner is who allocates the pool's pages: the daemon (the default) or
	// the decode engine, which declares each room's destination.
	Owner Owner `yaml:"owner"`
}

// SWAConfig is the sliding-window part of a hybrid-swa pool (kv_pool.swa).
type SWAConfig struct {
	// Window is the sliding window in tokens.
	Window int `yaml:"window"`
	// TotalTokens is the SWA pool size in tokens (size_swa).
	TotalTokens int64 `yaml:"total_tokens"`
}

// MambaConfig is the linear-attention state of a hybrid-linear pool
// (kv_pool.mamba).
type MambaConfig struct {
	// StateSlots is the number of Mamba state slots (mamba_size).
	StateSlots int `yaml:"state_slots"`
	// ExtraBuffer enables the Mamba extra buffer: each request then takes
	// 1 + PingPong slots instead of 1.
	ExtraBuffer bool `yaml:"extra_buffer"`
	// PingPong is the ping-pong factor of the extra buffer: 2 with the
	// overlap scheduler, 1 without.
	PingPong int `yaml:"ping_pong"`
	// StateBytes is the size of one request's state in bytes, summed over
	// layers and tensors (conv + temporal); used to size state transfers.
	StateBytes int64 `yaml:"state_bytes"`
}

// ParallelConfig is the decode instance's parallel layout (parallel).
type ParallelConfig struct {
	// AttnTP is the attention tensor-parallel size.
	AttnTP int `yaml:"attn_tp"`
	// DP is the number of decode data-parallel shards hosted by the daemon.
	DP int `yaml:"dp"`
	// PP is the pipeline-parallel size.
	PP int `yaml:"pp"`
	// AttnCP is the attention context-parallel size; decode requires 1.
	AttnCP int `yaml:"attn_cp"`
	// DCP is the decode context-parallel size (dcp_size).
	DCP int `yaml:"dcp"`
}

// StagingConfig is the decode-side staging ring for heterogeneous TP
// (staging). SGLANG_DISAGG_STAGING_BUFFER and SGLANG_DISAGG_STAGING_POOL_SIZE_MB
// map here.
type StagingConfig struct {
	// Enabled turns the staging path on (GQA/MHA only).
	Enabled bool `yaml:"enabled"`
	// PoolSizeMB is the ring size in MiB per decode rank (default 4096).
	PoolSizeMB int `yaml:"pool_size_mb"`
}

// AdmissionConfig holds the admission budget knobs (admission).
type AdmissionConfig struct {
	// ReservedDecodeTokens is R, the tokens reserved per active request for
	// decoding (--num-reserved-decode-tokens, default 512).
	ReservedDecodeTokens int `yaml:"reserved_decode_tokens"`
	// ClipMaxNewTokens caps the max_new_tokens estimate
	// (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, default 4096).
	ClipMaxNewTokens int `yaml:"clip_max_new_tokens"`
	// Priority is the queue order: "fifo" (default), "low-first" (lower
	// priority values first) or "high-first".
	Priority string `yaml:"priority"`
	// DecodeRadixCache mirrors --disaggregation-decode-enable-radix-cache.
	// decodeplane's ledger does not model a decode prefix cache, so it is
	// only accepted as false; the key exists so that configurations copied
	// from SGLang are checked against the DCP rule rather than ignored.
	DecodeRadixCache bool `yaml:"decode_radix_cache"`
	// ClaimTimeout bounds how long an admitted pre-allocation may wait for
	// every required prefill rank to claim it (AwaitDestination) before it is
	// released. SGLang has no such deadline. Zero disables it.
	ClaimTimeout time.Duration `yaml:"claim_timeout"`
	// MaxQueued bounds the rooms waiting for admission per shard; beyond it
	// new rooms are refused with prealloc.ErrQueueFull (ResourceExhausted
	// with a retry hint) instead of growing without bound. 0 means 65536.
	MaxQueued int `yaml:"max_queued"`
	// MaxBypass is the head-of-line policy: how many later rooms may be
	// admitted ahead of a ready room that does not fit the current token
	// (or SWA) budget before the queue waits strictly for it. 0 is SGLang's
	// strict FIFO (a room too big for the moment blocks every room behind
	// it); the default 32 lets smaller rooms through, then drains the pool
	// for the big one, so it is not starved. At most MaxBypassLimit.
	MaxBypass int `yaml:"max_bypass"`
}

// DefaultMaxBypass is AdmissionConfig.MaxBypass's default.
const DefaultMaxBypass = 32

// MaxBypassLimit is the largest admission.max_bypass.
const MaxBypassLimit = 1 << 20

// Priority orders accepted by AdmissionConfig.Priority.
const (
	PriorityFIFO      = "fifo"
	PriorityLowFirst  = "low-first"
	PriorityHighFirst = "high-first"
)

// TransferBackends are the engine transfer backends SGLang accepts
// (--disaggregation-transfer-backend).
var TransferBackends = []string{"mooncake", "nixl", "ascend", "mori", "fake"}

// stagingBackends support the staging path (StagingManagerMixin: Mooncake, NIXL).
var stagingBackends = []string{"mooncake", "nixl"}

// dcpBackends declare supports_dcp_transfer (Mooncake, NIXL).
var dcpBackends = []string{"mooncake", "nixl"}

// DTypes maps accepted KV cache dtype spellings to their canonical name.
var DTypes = map[string]string{
	"bf16": "bf16", "bfloat16": "bf16",
	"fp16": "fp16", "float16": "fp16", "half": "fp16",
	"fp32": "fp32", "float32": "fp32", "float": "fp32",
	"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
}

var dtypeBytes = map[string]int{"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}

// CanonicalDType returns the canonical spelling of a dtype and whether it is known.
func CanonicalDType(s string) (string, bool) {
	c, ok := DTypes[strings.ToLower(strings.TrimSpace(s))]
	return c, ok
}

// DefaultConfig returns the embedded defaults: a small GQA pool, TP 1, DP 1,
// staging off, SGLang's budget defaults.
func DefaultConfig() Config {
	return Config{
		Backend: "mooncake",
		Pool: PoolConfig{
			Kind:          KindGQA,
			NumLayers:     32,
			KVHeads:       8,
			HeadDim:       128,
			DType:         "bf16",
			PageSize:      64,
			TotalTokens:   1 << 20,
			RequestSlots:  256,
			PreAllocSlots: -1,
		},
		Parallel:  ParallelConfig{AttnTP: 1, DP: 1, PP: 1, AttnCP: 1, DCP: 1},
		Staging:   StagingConfig{PoolSizeMB: 4096},
		Admission: AdmissionConfig{ReservedDecodeTokens: 512, ClipMaxNewTokens: 4096, Priority: PriorityFIFO, ClaimTimeout: 60 * time.Second, MaxBypass: DefaultMaxBypass},
	}
}

// Pages returns the pool size in pages.
func (p PoolConfig) Pages() int64 {
	if p.TotalPages > 0 {
		return p.TotalPages
	}
	if p.PageSize <= 0 {
		return 0
	}
	return p.TotalTokens / int64(p.PageSize)
}

// PreAlloc returns the effective pre_alloc_slots (SGLang's rule when -1).
func (p PoolConfig) PreAlloc() int {
	if p.PreAllocSlots >= 0 {
		return p.PreAllocSlots
	}
	if p.RequestSlots <= 32 {
		return 2 * p.RequestSlots
	}
	return 0
}

// ReqSlots returns the req_to_token capacity: request_slots + pre_alloc_slots.
func (p PoolConfig) ReqSlots() int { return p.RequestSlots + p.PreAlloc() }

// Metadata returns the effective number of metadata slots.
func (p PoolConfig) Metadata() int {
	if p.MetadataSlots > 0 {
		return p.MetadataSlots
	}
	return 2 * p.ReqSlots()
}

// MambaSlotsPerReq returns the state slots one request takes:
// 1 + ping_pong with the extra buffer, else 1.
func (m MambaConfig) MambaSlotsPerReq() int {
	if m.ExtraBuffer {
		pp := m.PingPong
		if pp <= 0 {
			pp = 1
		}
		return 1 + pp
	}
	return 1
}

// Layout is the byte geometry of one decode rank's KV pool, derived from a
// Config. It is what a transfer engine needs to size and place copies.
type Layout struct {
	Kind          Kind
	IsMLA         bool
	NumLayers     int
	TotalKVHeads  int // 0 for MLA
	HeadsPerRank  int // max(1, TotalKVHeads / AttnTP); 0 for MLA
	HeadDim       int // MHA/GQA head dim; MLA: kv_lora_rank + qk_rope_head_dim
	DType         string
	DTypeBytes    int
	PageSize      int
	AttnTP        int
	DP            int
	PP            int
	DCP           int
	Staging       bool
	TotalPages    int64
	StateTypes    []StateType
	MambaBytes    int64 // one request's Mamba state (hybrid-linear)
	SWAWindow     int
	DSAIndexBytes int // indexer-K bytes per token per layer (hybrid-mla): 132
	// Owner is kv_pool.owner: who chooses the rooms' pages.
	Owner Owner
	// KVLoraRank and QKRopeHeadDim are MLA's dimensions (0 elsewhere):
	// HeadDim is their sum.
	KVLoraRank, QKRopeHeadDim int
	// ModelName and ModelRevision are model.name and model.revision.
	ModelName, ModelRevision string
}

// dsaIndexKBytesPerToken is one DSA indexer-K entry: a 128-byte key plus a
// 4-byte scale (SGLang's DSA indexer buffer).
const dsaIndexKBytesPerToken = 132

// Layout derives the per-rank byte geometry. Call it on a validated Config.
func (c Config) Layout() Layout {
	p := c.Pool
	l := Layout{
		Kind:       p.Kind,
		IsMLA:      p.Kind.IsMLA(),
		NumLayers:  p.NumLayers,
		PageSize:   p.PageSize,
		AttnTP:     max(1, c.Parallel.AttnTP),
		DP:         max(1, c.Parallel.DP),
		PP:         max(1, c.Parallel.PP),
		DCP:        max(1, c.Parallel.DCP),
		Staging:    c.Staging.Enabled,
		TotalPages: p.Pages(),
		StateTypes: p.Kind.StateTypes(),
		Owner:      p.Owner,
		ModelName:  c.Model.Name, ModelRevision: c.Model.Revision,
	}
	l.DType, _ = CanonicalDType(p.DType)
	l.DTypeBytes = dtypeBytes[l.DType]
	if l.IsMLA {
		l.HeadDim = p.KVLoraRank + p.QKRopeHeadDim
		l.KVLoraRank, l.QKRopeHeadDim = p.KVLoraRank, p.QKRopeHeadDim
	} else {
		l.TotalKVHeads = p.KVHeads
		l.HeadsPerRank = max(1, p.KVHeads/l.AttnTP)
		l.HeadDim = p.HeadDim
	}
	switch p.Kind {
	case KindHybridLinear:
		l.MambaBytes = p.Mamba.StateBytes
	case KindHybridSWA:
		l.SWAWindow = p.SWA.Window
	case KindHybridMLA:
		l.DSAIndexBytes = dsaIndexKBytesPerToken
	}
	return l
}

// HeadBytes is the size of one head of one token in one layer (K or V alone).
func (l Layout) HeadBytes() int64 { return int64(l.HeadDim) * int64(l.DTypeBytes) }

// TokenBytes is the KV of one token across all layers on one decode rank:
// MHA/GQA 2 × heads_per_rank × head_dim × dtype × layers; MLA
// (kv_lora_rank + qk_rope_head_dim) × dtype × layers (+ DSA indexer-K).
func (l Layout) TokenBytes() int64 {
	if l.IsMLA {
		return (l.HeadBytes() + int64(l.DSAIndexBytes)) * int64(l.NumLayers)
	}
	return 2 * int64(l.HeadsPerRank) * l.HeadBytes() * int64(l.NumLayers)
}

// ItemLen is SGLang's kv_item_len: the bytes of one page of one layer of one
// buffer (K or V for MHA/GQA; the latent for MLA).
func (l Layout) ItemLen() int64 {
	if l.IsMLA {
		return int64(l.PageSize) * l.HeadBytes()
	}
	return int64(l.PageSize) * int64(l.HeadsPerRank) * l.HeadBytes()
}

// String renders the layout for logs.
func (l Layout) String() string {
	if l.IsMLA {
		return fmt.Sprintf("%s layers=%d latent=%d dtype=%s page=%d tp=%d", l.Kind, l.NumLayers, l.HeadDim, l.DType, l.PageSize, l.AttnTP)
	}
	return fmt.Sprintf("%s layers=%d kv_heads=%d (per rank %d) head_dim=%d dtype=%s page=%d tp=%d", l.Kind, l.NumLayers, l.TotalKVHeads, l.HeadsPerRank, l.HeadDim, l.DType, l.PageSize, l.AttnTP)
}
