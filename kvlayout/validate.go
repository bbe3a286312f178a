package kvlayout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// MsgStagingMLA is SGLang's exact refusal of the staging buffer on an MLA pool
// (DecodePreallocQueue.__init__).
const MsgStagingMLA = "SGLANG_DISAGG_STAGING_BUFFER is designed for non-MLA models (e.g. GQA, MHA). MLA models should not set this flag."

// MsgDCPNeedsMLA is SGLang's refusal of decode context parallelism on a pool
// that is neither MLA nor hybrid-MLA.
const MsgDCPNeedsMLA = "PD decode DCP requires an MLA or hybrid-MLA KV pool."

// MsgDCPNotModelled refuses decode context parallelism on the pools SGLang
// allows it for: decodeplane's destinations address logical pages, and a DCP
// decode shards each page's tokens over dcp ranks (per-rank physical
// offsets), so a destination would send KV to the wrong place.
const MsgDCPNotModelled = "decodeplane does not model the decode DCP layout (each token's KV lives on one of the dcp ranks at a per-rank physical offset), so its destinations would be wrong under DCP."

// ConfigError is one configuration problem: the setting (its key in the
// configuration file), the value given, what is wrong and how to fix it.
// Validate joins every ConfigError it finds with errors.Join.
type ConfigError struct {
	// Key is the configuration key, e.g. "staging.enabled".
	Key string
	// Value is the value that was given.
	Value any
	// Problem says what is wrong. For rules SGLang also enforces it starts
	// with SGLang's own message.
	Problem string
	// Fix says how to correct it.
	Fix string
}

// Error renders "key = value: problem (fix: ...)".
func (e *ConfigError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s = %s: %s", e.Key, FormatValue(e.Value), e.Problem)
	if e.Fix != "" {
		fmt.Fprintf(&b, " Fix: %s", e.Fix)
	}
	return b.String()
}

// FormatValue renders a configuration value for messages.
func FormatValue(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("%q", x)
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v)
}

// Warning is a setting that is valid but probably not what the operator meant.
type Warning struct {
	Key     string
	Message string
}

func (w Warning) String() string { return w.Key + ": " + w.Message }

// Validate checks the decode-side configuration against the rules SGLang
// enforces at decode startup and decodeplane's own, and returns
// every problem at once (errors.Join of *ConfigError), or nil.
func (c Config) Validate() error {
	v := &validator{}
	c.validateBackend(v)
	c.validatePool(v)
	c.validateParallel(v)
	c.validateStaging(v)
	c.validateDCP(v)
	c.validateAdmission(v)
	c.Model.validate(v)
	return errors.Join(v.errs...)
}

type validator struct{ errs []error }

func (v *validator) add(key string, val any, problem, fix string) {
	v.errs = append(v.errs, &ConfigError{Key: key, Value: val, Problem: problem, Fix: fix})
}

func (c Config) validateBackend(v *validator) {
	if !slices.Contains(TransferBackends, c.Backend) {
		v.add("transfer.backend", c.Backend, "Unsupported transfer backend: "+c.Backend,
			"set transfer.backend to one of "+strings.Join(TransferBackends, ", ")+" (the engine's --disaggregation-transfer-backend).")
	}
}

func (c Config) validatePool(v *validator) {
	p := c.Pool
	if !p.Kind.Known() {
		v.add("kv_pool.kind", p.Kind, "the KV pool kind is required.", "set kv_pool.kind to one of "+strings.Join(KindNames(), ", ")+".")
		return
	}
	if p.NumLayers <= 0 {
		v.add("kv_pool.num_layers", p.NumLayers, "must be > 0.", "set it to the number of attention layers whose KV is transferred (e.g. 80 for Llama 3 70B, 61 for DeepSeek V3).")
	}
	if p.Kind.IsMLA() {
		if p.KVLoraRank <= 0 {
			v.add("kv_pool.kv_lora_rank", p.KVLoraRank, fmt.Sprintf("must be > 0 for %s (the MLA latent dimension).", p.Kind.pool()), "set it from the model config (kv_lora_rank: 512 for DeepSeek V3).")
		}
		if p.QKRopeHeadDim <= 0 {
			v.add("kv_pool.qk_rope_head_dim", p.QKRopeHeadDim, fmt.Sprintf("must be > 0 for %s (the decoupled RoPE dimension).", p.Kind.pool()), "set it from the model config (qk_rope_head_dim: 64 for DeepSeek V3).")
		}
	} else {
		if p.KVHeads <= 0 {
			v.add("kv_pool.kv_heads", p.KVHeads, fmt.Sprintf("must be > 0 for %s.", p.Kind.pool()), "set it to the model's num_key_value_heads (e.g. 8 for Llama 3 70B).")
		}
		if p.HeadDim <= 0 {
			v.add("kv_pool.head_dim", p.HeadDim, fmt.Sprintf("must be > 0 for %s.", p.Kind.pool()), "set it to the model's head_dim (e.g. 128).")
		}
		tp := c.Parallel.AttnTP
		if p.KVHeads > 0 && tp > 0 && p.KVHeads%tp != 0 && tp%p.KVHeads != 0 {
			v.add("kv_pool.kv_heads", p.KVHeads,
				fmt.Sprintf("%d KV heads cannot be split over parallel.attn_tp = %d: heads must divide evenly across ranks, or the TP size must be a multiple of the head count so heads are replicated.", p.KVHeads, tp),
				"choose an attention TP size that divides the KV head count or is a multiple of it.")
		}
	}
	if _, ok := CanonicalDType(p.DType); !ok {
		fix := "set kv_pool.dtype to one of bf16, fp16, fp32, fp8_e4m3, fp8_e5m2 (the engine's --kv-cache-dtype)."
		if strings.EqualFold(strings.TrimSpace(p.DType), "auto") {
			fix = "\"auto\" depends on the model; set the dtype the engine resolves it to (usually bf16)."
		}
		v.add("kv_pool.dtype", p.DType, "unknown KV cache dtype.", fix)
	}
	if p.PageSize <= 0 || p.PageSize&(p.PageSize-1) != 0 {
		v.add("kv_pool.page_size", p.PageSize, "must be a power of two (1, 16, 32, 64, ...).", "set it to the engine's --page-size; prefill and decode must use the same value.")
	}
	switch {
	case p.TotalTokens < 0:
		v.add("kv_pool.total_tokens", p.TotalTokens, "must not be negative.", "set the pool size in tokens (max_total_num_tokens) or in pages (kv_pool.total_pages).")
	case p.TotalPages < 0:
		v.add("kv_pool.total_pages", p.TotalPages, "must not be negative.", "set the pool size in pages or in tokens (kv_pool.total_tokens).")
	case p.TotalTokens > 0 && p.TotalPages > 0:
		v.add("kv_pool.total_pages", p.TotalPages, fmt.Sprintf("both kv_pool.total_tokens (%d) and kv_pool.total_pages are set.", p.TotalTokens), "set only one of them.")
	case p.TotalTokens == 0 && p.TotalPages == 0:
		v.add("kv_pool.total_tokens", p.TotalTokens, "the pool size is required.", "set kv_pool.total_tokens (max_total_num_tokens) or kv_pool.total_pages.")
	case p.PageSize > 0 && p.TotalTokens > 0 && p.TotalTokens < int64(p.PageSize):
		v.add("kv_pool.total_tokens", p.TotalTokens, fmt.Sprintf("is smaller than one page (%d tokens).", p.PageSize), "give the pool at least one page.")
	}
	if p.RequestSlots <= 0 {
		v.add("kv_pool.request_slots", p.RequestSlots, "must be > 0.", "set it to the engine's max_running_requests.")
	}
	if p.PreAllocSlots < -1 {
		v.add("kv_pool.pre_alloc_slots", p.PreAllocSlots, "must be >= 0, or -1 for SGLang's rule (2 × request_slots when request_slots <= 32, else 0).", "set it to 0 or more, or to -1.")
	}
	switch {
	case p.MetadataSlots < 0:
		v.add("kv_pool.metadata_slots", p.MetadataSlots, "must not be negative.", "set it to 0 for the default of 2 × (request_slots + pre_alloc_slots), or to a positive count.")
	case p.MetadataSlots > 0 && p.RequestSlots > 0 && p.MetadataSlots < p.ReqSlots():
		v.add("kv_pool.metadata_slots", p.MetadataSlots, fmt.Sprintf("must be >= the request slots (request_slots + pre_alloc_slots = %d): every pre-allocated request holds one metadata slot.", p.ReqSlots()),
			fmt.Sprintf("set it to at least %d, or to 0 for SGLang's default of %d.", p.ReqSlots(), 2*p.ReqSlots()))
	}
	c.validateHybrid(v)
}

func (c Config) validateHybrid(v *validator) {
	p := c.Pool
	if p.Kind == KindHybridSWA {
		if p.SWA.Window <= 0 {
			v.add("kv_pool.swa.window", p.SWA.Window, "a hybrid-swa pool needs its sliding window (tokens).", "set kv_pool.swa.window to the model's sliding_window (e.g. 4096).")
		}
		if p.SWA.TotalTokens <= 0 {
			v.add("kv_pool.swa.total_tokens", p.SWA.TotalTokens, "a hybrid-swa pool needs the size of its SWA pool (size_swa).", "set kv_pool.swa.total_tokens to the engine's SWA pool size in tokens.")
		}
	}
	if p.Kind == KindHybridLinear {
		if p.Mamba.StateSlots <= 0 {
			v.add("kv_pool.mamba.state_slots", p.Mamba.StateSlots, "a hybrid-linear pool needs its Mamba/linear state slots.", "set kv_pool.mamba.state_slots to the engine's mamba pool size.")
		} else if need := p.ReqSlots() * p.Mamba.MambaSlotsPerReq(); p.RequestSlots > 0 && p.Mamba.StateSlots < need {
			v.add("kv_pool.mamba.state_slots", p.Mamba.StateSlots,
				fmt.Sprintf("is smaller than (request_slots + pre_alloc_slots) × slots per request = %d × %d = %d; SGLang would size the pool up to that silently.", p.ReqSlots(), p.Mamba.MambaSlotsPerReq(), need),
				fmt.Sprintf("set kv_pool.mamba.state_slots to at least %d.", need))
		}
		if p.Mamba.ExtraBuffer && p.Mamba.PingPong != 1 && p.Mamba.PingPong != 2 {
			v.add("kv_pool.mamba.ping_pong", p.Mamba.PingPong, "must be 1 or 2 when the Mamba extra buffer is on (2 with the overlap scheduler).", "set it to 2 with the overlap scheduler, else 1.")
		}
		if p.Mamba.StateBytes < 0 {
			v.add("kv_pool.mamba.state_bytes", p.Mamba.StateBytes, "must not be negative.", "set it to one request's state size in bytes, or 0 if unknown.")
		}
	}
}

func (c Config) validateParallel(v *validator) {
	par := c.Parallel
	for _, f := range []struct {
		key string
		val int
	}{{"parallel.attn_tp", par.AttnTP}, {"parallel.dp", par.DP}, {"parallel.pp", par.PP}, {"parallel.dcp", par.DCP}} {
		if f.val < 1 {
			v.add(f.key, f.val, "must be >= 1.", "set it to 1 or more.")
		}
	}
	if par.AttnCP != 1 {
		v.add("parallel.attn_cp", par.AttnCP, "decode attention context parallelism must be 1 (SGLang asserts attn_cp_size == 1 on decode in _resolve_rank_mapping).", "set parallel.attn_cp: 1; use parallel.dcp for decode context parallelism on MLA pools.")
	}
}

func (c Config) validateStaging(v *validator) {
	s := c.Staging
	if s.PoolSizeMB < 0 {
		v.add("staging.pool_size_mb", s.PoolSizeMB, "must not be negative.", "set SGLANG_DISAGG_STAGING_POOL_SIZE_MB / staging.pool_size_mb to the ring size in MiB (default 4096).")
	}
	if !s.Enabled {
		return
	}
	if c.Pool.Kind.IsMLA() {
		v.add("staging.enabled", true, MsgStagingMLA,
			fmt.Sprintf("unset SGLANG_DISAGG_STAGING_BUFFER (or set it to 0) and leave staging.enabled false: %s has no KV heads to slice, so heterogeneous TP uses the regular transfer path (one real prefill source rank plus dummy targets).", c.Pool.Kind.pool()))
		return
	}
	if slices.Contains(TransferBackends, c.Backend) && !slices.Contains(stagingBackends, c.Backend) {
		v.add("staging.enabled", true,
			fmt.Sprintf("Staging is enabled but the %s transfer backend has no staging allocator: only mooncake and nixl implement the staging path.", c.Backend),
			"set transfer.backend to mooncake or nixl, or disable staging (SGLANG_DISAGG_STAGING_BUFFER=0).")
	}
	if s.PoolSizeMB == 0 {
		v.add("staging.pool_size_mb", 0, "Staging is enabled but the staging allocator cannot be built: the ring has size 0.", "set SGLANG_DISAGG_STAGING_POOL_SIZE_MB / staging.pool_size_mb (SGLang's default is 4096).")
		return
	}
	if c.Pool.Kind.HasHeads() && c.Pool.PageSize > 0 && c.Pool.NumLayers > 0 && c.Pool.HeadDim > 0 && c.Pool.KVHeads > 0 && c.Parallel.AttnTP > 0 {
		if _, ok := CanonicalDType(c.Pool.DType); ok {
			onePage := int64(c.Pool.PageSize) * c.Layout().TokenBytes()
			if ring := int64(s.PoolSizeMB) << 20; ring < onePage {
				v.add("staging.pool_size_mb", s.PoolSizeMB,
					fmt.Sprintf("Staging is enabled but the ring (%d MiB) is smaller than one page of one chunk (%d bytes), so no chunk could ever be staged.", s.PoolSizeMB, onePage),
					fmt.Sprintf("Increase SGLANG_DISAGG_STAGING_POOL_SIZE_MB to at least %d (and to several chunks for throughput) or reduce chunked_prefill_size.", (onePage+(1<<20)-1)>>20))
			}
		}
	}
}

func (c Config) validateDCP(v *validator) {
	dcp := c.Parallel.DCP
	if c.Admission.DecodeRadixCache {
		if dcp > 1 {
			v.add("admission.decode_radix_cache", true, fmt.Sprintf("PD decode DCP (parallel.dcp = %d) requires the decode chunk cache: a decode radix cache is not supported with DCP.", dcp), "set admission.decode_radix_cache: false or parallel.dcp: 1.")
		} else {
			v.add("admission.decode_radix_cache", true, "decodeplane's KV ledger does not model a decode radix cache, so admission could over-commit pages the engine's prefix cache holds.", "set admission.decode_radix_cache: false (and run the engine without --disaggregation-decode-enable-radix-cache).")
		}
	}
	if dcp <= 1 {
		return
	}
	if c.Pool.Kind > KindUnspecified && !c.Pool.Kind.IsMLA() {
		v.add("parallel.dcp", dcp, MsgDCPNeedsMLA, fmt.Sprintf("set parallel.dcp: 1 for %s; DCP only applies to MLA and hybrid-MLA pools.", c.Pool.Kind.pool()))
	} else {
		v.add("parallel.dcp", dcp, MsgDCPNotModelled, "set parallel.dcp: 1 (and --dcp-size 1 on the decode engine) until decodeplane models the DCP layout.")
	}
	if slices.Contains(TransferBackends, c.Backend) && !slices.Contains(dcpBackends, c.Backend) {
		name := strings.ToUpper(c.Backend[:1]) + c.Backend[1:]
		v.add("parallel.dcp", dcp,
			fmt.Sprintf("%s does not yet implement DCP-aware KV transfer, but engine is configured with dcp_size=%d. PD disaggregation under DCP requires the transfer layer to remap logical token loc -> per-rank physical offset.", name, dcp),
			"Use --dcp-size 1 (parallel.dcp: 1) on the disaggregated engine, or pick a backend that has been adapted for DCP (mooncake, nixl).")
	}
}

func (c Config) validateAdmission(v *validator) {
	a := c.Admission
	if a.ReservedDecodeTokens < 0 {
		v.add("admission.reserved_decode_tokens", a.ReservedDecodeTokens, "must not be negative.", "set it to 0 or more (SGLang's default --num-reserved-decode-tokens is 512).")
	}
	if a.ClipMaxNewTokens <= 0 {
		v.add("admission.clip_max_new_tokens", a.ClipMaxNewTokens, "must be > 0.", "set SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION / admission.clip_max_new_tokens (default 4096).")
	}
	switch a.Priority {
	case PriorityFIFO, PriorityLowFirst, PriorityHighFirst:
	default:
		v.add("admission.priority", a.Priority, "unknown priority order.", "set it to fifo, low-first or high-first.")
	}
	if a.MaxQueued < 0 {
		v.add("admission.max_queued", a.MaxQueued, "must not be negative.", "set it to 0 for the default of 65536, or to a positive bound on rooms waiting for admission per shard.")
	}
	if a.MaxBypass < 0 || a.MaxBypass > MaxBypassLimit {
		v.add("admission.max_bypass", a.MaxBypass, fmt.Sprintf("must be between 0 and %d.", MaxBypassLimit), fmt.Sprintf("set it to 0 for SGLang's strict head-of-line admission, or to how many later rooms may be admitted ahead of a room too big for the moment (default %d).", DefaultMaxBypass))
	}
	if a.ClaimTimeout < 0 {
		v.add("admission.claim_timeout", a.ClaimTimeout, "must not be negative.", "set a duration such as 60s, or 0 to disable the claim deadline.")
	}
}

// Warnings returns settings that are valid but suspicious.
func (c Config) Warnings() []Warning {
	var w []Warning
	p := c.Pool
	if p.Kind.IsMLA() && (p.KVHeads != 0 || p.HeadDim != 0) {
		w = append(w, Warning{"kv_pool.kv_heads", fmt.Sprintf("kv_heads and head_dim are ignored for %s; its per-token size is kv_lora_rank + qk_rope_head_dim.", p.Kind.pool())})
	}
	if p.Kind != KindHybridSWA && (p.SWA.Window != 0 || p.SWA.TotalTokens != 0) {
		w = append(w, Warning{"kv_pool.swa", fmt.Sprintf("ignored for %s.", p.Kind.pool())})
	}
	if p.Kind != KindHybridLinear && p.Mamba.StateSlots != 0 {
		w = append(w, Warning{"kv_pool.mamba", fmt.Sprintf("ignored for %s.", p.Kind.pool())})
	}
	if p.PageSize > 0 && p.TotalTokens > 0 && p.TotalTokens%int64(p.PageSize) != 0 {
		w = append(w, Warning{"kv_pool.total_tokens", fmt.Sprintf("%d is not a multiple of the page size %d; the last %d tokens are unusable.", p.TotalTokens, p.PageSize, p.TotalTokens%int64(p.PageSize))})
	}
	if c.Staging.Enabled && c.Pool.Kind.HasHeads() && c.Parallel.AttnTP > 0 {
		w = append(w, Warning{"staging.enabled", "staging is used only for prefill instances whose attention TP differs from parallel.attn_tp; same-TP prefills use direct page copies."})
	}
	return append(w, c.engineOwnerWarnings()...)
}

// engineOwnerWarnings names the admission settings an engine that owns its
// pages makes moot: it admits by its own budget and priority.
func (c Config) engineOwnerWarnings() []Warning {
	if c.Pool.Owner != OwnerEngine {
		return nil
	}
	var w []Warning
	a, d := c.Admission, DefaultConfig().Admission
	moot := func(key string, set bool) {
		if set {
			w = append(w, Warning{key, "ignored with kv_pool.owner engine: the decode engine admits requests by its own budget and order, and declares each room's destination (DeclareDestination)."})
		}
	}
	moot("admission.reserved_decode_tokens", a.ReservedDecodeTokens != d.ReservedDecodeTokens)
	moot("admission.clip_max_new_tokens", a.ClipMaxNewTokens != d.ClipMaxNewTokens)
	moot("admission.max_bypass", a.MaxBypass != d.MaxBypass)
	moot("admission.priority", a.Priority != d.Priority)
	return w
}
