package config

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// --- validation rules ------------------------------------------------------

func gqaBase() Config { return DefaultConfig() }

func mhaBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = kvlayout.KindMHA
	c.KVPool.KVHeads = 32
	return c
}

func mlaBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = kvlayout.KindMLA
	c.KVPool.KVHeads, c.KVPool.HeadDim = 0, 0
	c.KVPool.KVLoraRank, c.KVPool.QKRopeHeadDim = 512, 64
	return c
}

func hybridMLABase() Config {
	c := mlaBase()
	c.KVPool.Kind = kvlayout.KindHybridMLA
	return c
}

func swaBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = kvlayout.KindHybridSWA
	c.KVPool.SWA = kvlayout.SWAConfig{Window: 128, TotalTokens: 200000}
	return c
}

func linearBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = kvlayout.KindHybridLinear
	c.KVPool.RequestSlots = 128
	c.KVPool.Mamba.StateSlots = 128
	return c
}

var bases = map[string]func() Config{
	"gqa": gqaBase, "mha": mhaBase, "mla": mlaBase, "hybrid-mla": hybridMLABase, "hybrid-swa": swaBase, "hybrid-linear": linearBase,
}

type ruleCase struct {
	name string
	base func() Config // nil: gqaBase
	mod  func(c *Config)
	// want are the keys of the expected problems; nil means valid.
	want []string
	// problem, if set, is the exact problem of one of the errors for want[0];
	// contains, if set, is a substring of one of them.
	problem, contains string
}

func checkRules(t *testing.T, tests []ruleCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := tt.base
			if base == nil {
				base = gqaBase
			}
			c := base()
			if tt.mod != nil {
				tt.mod(&c)
			}
			errs := configErrors(t, c.Validate())
			want := slices.Clone(tt.want)
			slices.Sort(want)
			if diff := cmp.Diff(want, errorKeys(errs)); diff != "" {
				t.Fatalf("problem keys (-want +got):\n%s\nproblems: %v", diff, errs)
			}
			if tt.problem == "" && tt.contains == "" {
				return
			}
			var problems []string
			for _, e := range errs {
				if e.Key == tt.want[0] {
					problems = append(problems, e.Problem)
				}
			}
			if tt.problem != "" && !slices.Contains(problems, tt.problem) {
				t.Errorf("problems for %s = %q, want exactly %q", tt.want[0], problems, tt.problem)
			}
			if tt.contains != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tt.contains) }) {
				t.Errorf("problems for %s = %q, want one containing %q", tt.want[0], problems, tt.contains)
			}
		})
	}
}

func TestRuleBasesAreValid(t *testing.T) {
	var tests []ruleCase
	for name, b := range bases {
		tests = append(tests, ruleCase{name: name, base: b})
	}
	checkRules(t, tests)
}

func TestRuleKindRequired(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "unspecified", mod: func(c *Config) { c.KVPool.Kind = kvlayout.KindUnspecified }, want: []string{"kv_pool.kind"}},
		{name: "out of range", mod: func(c *Config) { c.KVPool.Kind = kvlayout.Kind(99) }, want: []string{"kv_pool.kind"}},
	})
}

func TestRuleStagingNeedsNonMLA(t *testing.T) {
	on := func(c *Config) { c.Staging.Enabled = true }
	checkRules(t, []ruleCase{
		{name: "mla", base: mlaBase, mod: on, want: []string{"staging.enabled"}, problem: kvlayout.MsgStagingMLA},
		{name: "hybrid-mla", base: hybridMLABase, mod: on, want: []string{"staging.enabled"}, problem: kvlayout.MsgStagingMLA},
		{name: "mla with staging off", base: mlaBase},
		{name: "gqa", base: gqaBase, mod: on},
		{name: "mha", base: mhaBase, mod: on},
		{name: "hybrid-swa", base: swaBase, mod: on},
		{name: "hybrid-linear", base: linearBase, mod: on},
	})
}

func TestRuleStagingNeedsStagingBackend(t *testing.T) {
	var tests []ruleCase
	for _, b := range []string{"ascend", "mori", "fake"} {
		tests = append(tests, ruleCase{
			name: b, mod: func(c *Config) { c.Staging.Enabled, c.Transfer.Backend = true, b },
			want: []string{"staging.enabled"}, contains: "the " + b + " transfer backend has no staging allocator",
		}, ruleCase{
			name: b + " without staging", mod: func(c *Config) { c.Transfer.Backend = b },
		})
	}
	for _, b := range []string{"mooncake", "nixl"} {
		tests = append(tests, ruleCase{name: b, mod: func(c *Config) { c.Staging.Enabled, c.Transfer.Backend = true, b }})
	}
	checkRules(t, tests)
}

func TestRuleStagingPoolSize(t *testing.T) {
	// The default GQA pool: 2 × 8 heads × 128 × 2 B × 32 layers = 128 KiB per
	// token, 8 MiB per 64-token page at attn_tp 1; 1 MiB per page at attn_tp 8.
	staging := func(mb, tp int) func(c *Config) {
		return func(c *Config) { c.Staging.Enabled, c.Staging.PoolSizeMB, c.Parallel.AttnTP = true, mb, tp }
	}
	checkRules(t, []ruleCase{
		{name: "zero", mod: staging(0, 1), want: []string{"staging.pool_size_mb"}, contains: "the ring has size 0"},
		{name: "below one page", mod: staging(7, 1), want: []string{"staging.pool_size_mb"}, contains: "smaller than one page of one chunk (8388608 bytes)"},
		{name: "exactly one page", mod: staging(8, 1)},
		{name: "one page at tp 8", mod: staging(1, 8)},
		{name: "negative", mod: func(c *Config) { c.Staging.PoolSizeMB = -1 }, want: []string{"staging.pool_size_mb"}},
		{name: "zero with staging off", mod: func(c *Config) { c.Staging.PoolSizeMB = 0 }},
	})
}

func TestRuleDCPNeedsMLA(t *testing.T) {
	dcp2 := func(c *Config) { c.Parallel.DCP = 2 }
	checkRules(t, []ruleCase{
		{name: "gqa", base: gqaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNeedsMLA},
		{name: "mha", base: mhaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNeedsMLA},
		{name: "hybrid-swa", base: swaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNeedsMLA},
		{name: "hybrid-linear", base: linearBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNeedsMLA},
		{name: "mla", base: mlaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNotModelled},
		{name: "hybrid-mla", base: hybridMLABase, mod: func(c *Config) { c.Parallel.DCP = 8 }, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNotModelled},
		{name: "gqa at dcp 1", base: gqaBase},
	})
}

func TestRuleDCPNeedsDCPBackend(t *testing.T) {
	var tests []ruleCase
	for _, b := range []string{"ascend", "mori", "fake"} {
		name := strings.ToUpper(b[:1]) + b[1:]
		tests = append(tests, ruleCase{
			name: b, base: mlaBase, mod: func(c *Config) { c.Parallel.DCP, c.Transfer.Backend = 2, b },
			want:     []string{"parallel.dcp", "parallel.dcp"},
			contains: name + " does not yet implement DCP-aware KV transfer, but engine is configured with dcp_size=2. PD disaggregation under DCP requires the transfer layer to remap logical token loc -> per-rank physical offset",
		}, ruleCase{name: b + " at dcp 1", base: mlaBase, mod: func(c *Config) { c.Transfer.Backend = b }})
	}
	for _, b := range []string{"mooncake", "nixl"} {
		tests = append(tests, ruleCase{name: b, base: mlaBase, mod: func(c *Config) { c.Parallel.DCP, c.Transfer.Backend = 4, b },
			want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNotModelled})
	}
	// Both DCP rules at once on a GQA pool with a non-DCP backend.
	tests = append(tests, ruleCase{
		name: "gqa on ascend", mod: func(c *Config) { c.Parallel.DCP, c.Transfer.Backend = 2, "ascend" },
		want: []string{"parallel.dcp", "parallel.dcp"}, problem: kvlayout.MsgDCPNeedsMLA,
	})
	checkRules(t, tests)
}

// TestRuleDelegateNeedsStateless: the delegated path moves no SWA or Mamba
// state, so pools that need it are refused there (gpt-oss, Qwen3-Next would
// decode on missing state).
func TestRuleDelegateNeedsStateless(t *testing.T) {
	delegate := func(c *Config) {
		c.Transfer.Path, c.Transfer.Delegate.Target = "delegate", "127.0.0.1:7700"
	}
	checkRules(t, []ruleCase{
		{name: "hybrid-swa", base: swaBase, mod: delegate, want: []string{"transfer.path"}, contains: "not the SWA state a hybrid-swa pool needs"},
		{name: "hybrid-linear", base: linearBase, mod: delegate, want: []string{"transfer.path"}, contains: "not the MAMBA state a hybrid-linear pool needs"},
		{name: "gqa", base: gqaBase, mod: delegate},
		{name: "mla", base: mlaBase, mod: delegate},
		{name: "hybrid-mla", base: hybridMLABase, mod: delegate},
		{name: "hybrid-swa on sim", base: swaBase},
	})
}

func TestRuleDCPNoDecodeRadixCache(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "dcp with radix cache", base: mlaBase, mod: func(c *Config) { c.Parallel.DCP, c.Admission.DecodeRadixCache = 2, true },
			want: []string{"admission.decode_radix_cache", "parallel.dcp"}, contains: "a decode radix cache is not supported with DCP"},
		{name: "dcp without radix cache", base: mlaBase, mod: func(c *Config) { c.Parallel.DCP = 2 }, want: []string{"parallel.dcp"}, problem: kvlayout.MsgDCPNotModelled},
		{name: "radix cache without dcp", base: mlaBase, mod: func(c *Config) { c.Admission.DecodeRadixCache = true },
			want: []string{"admission.decode_radix_cache"}, contains: "does not model a decode radix cache"},
	})
}

func TestRuleAttnCPIsOne(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "1"},
		{name: "2", mod: func(c *Config) { c.Parallel.AttnCP = 2 }, want: []string{"parallel.attn_cp"}, contains: "must be 1"},
		{name: "0", mod: func(c *Config) { c.Parallel.AttnCP = 0 }, want: []string{"parallel.attn_cp"}},
		{name: "mla 2", base: mlaBase, mod: func(c *Config) { c.Parallel.AttnCP = 2 }, want: []string{"parallel.attn_cp"}},
	})
}

func TestRuleSizesPositive(t *testing.T) {
	type field struct {
		key  string
		base func() Config
		set  func(c *Config, v int)
		bad  []int
		good []int
	}
	fields := []field{
		{"kv_pool.num_layers", gqaBase, func(c *Config, v int) { c.KVPool.NumLayers = v }, []int{0, -1}, []int{1}},
		{"kv_pool.num_layers", mlaBase, func(c *Config, v int) { c.KVPool.NumLayers = v }, []int{0}, []int{1}},
		{"kv_pool.kv_heads", gqaBase, func(c *Config, v int) { c.KVPool.KVHeads = v }, []int{0, -8}, []int{1}},
		{"kv_pool.head_dim", gqaBase, func(c *Config, v int) { c.KVPool.HeadDim = v }, []int{0, -1}, []int{1}},
		{"kv_pool.kv_heads", swaBase, func(c *Config, v int) { c.KVPool.KVHeads = v }, []int{0}, []int{1}},
		{"kv_pool.head_dim", linearBase, func(c *Config, v int) { c.KVPool.HeadDim = v }, []int{0}, []int{1}},
		{"kv_pool.kv_lora_rank", mlaBase, func(c *Config, v int) { c.KVPool.KVLoraRank = v }, []int{0, -1}, []int{1}},
		{"kv_pool.qk_rope_head_dim", hybridMLABase, func(c *Config, v int) { c.KVPool.QKRopeHeadDim = v }, []int{0, -1}, []int{1}},
		{"kv_pool.request_slots", gqaBase, func(c *Config, v int) { c.KVPool.RequestSlots = v }, []int{0, -1}, []int{1}},
		{"kv_pool.pre_alloc_slots", gqaBase, func(c *Config, v int) { c.KVPool.PreAllocSlots = v }, []int{-2}, []int{-1, 0, 4}},
		{"parallel.attn_tp", gqaBase, func(c *Config, v int) { c.Parallel.AttnTP = v }, []int{0, -1}, []int{1}},
		{"parallel.dp", gqaBase, func(c *Config, v int) { c.Parallel.DP = v }, []int{0, -1}, []int{1, 8}},
		{"parallel.pp", gqaBase, func(c *Config, v int) { c.Parallel.PP = v }, []int{0, -1}, []int{1, 2}},
		{"parallel.dcp", gqaBase, func(c *Config, v int) { c.Parallel.DCP = v }, []int{0, -1}, []int{1}},
		{"admission.clip_max_new_tokens", gqaBase, func(c *Config, v int) { c.Admission.ClipMaxNewTokens = v }, []int{0, -1}, []int{1}},
		{"admission.reserved_decode_tokens", gqaBase, func(c *Config, v int) { c.Admission.ReservedDecodeTokens = v }, []int{-1}, []int{0}},
		{"admission.max_queued", gqaBase, func(c *Config, v int) { c.Admission.MaxQueued = v }, []int{-1}, []int{0, 1}},
		{"admission.max_bypass", gqaBase, func(c *Config, v int) { c.Admission.MaxBypass = v }, []int{-1, kvlayout.MaxBypassLimit + 1}, []int{0, 1, kvlayout.DefaultMaxBypass, kvlayout.MaxBypassLimit}},
		{"admission.claim_timeout", gqaBase, func(c *Config, v int) { c.Admission.ClaimTimeout = time.Duration(v) * time.Second }, []int{-1}, []int{0, 1}},
		{"kv_pool.mamba.state_bytes", linearBase, func(c *Config, v int) { c.KVPool.Mamba.StateBytes = int64(v) }, []int{-1}, []int{0, 1}},
		{"rooms.max_retained", gqaBase, func(c *Config, v int) { c.Rooms.MaxRetained = v }, []int{-1}, []int{0}},
		{"rooms.retention", gqaBase, func(c *Config, v int) { c.Rooms.Retention = time.Duration(v) * time.Second }, []int{-1}, []int{0}},
		{"transfer.sim.bandwidth_gbytes_per_s", gqaBase, func(c *Config, v int) { c.Transfer.Sim.BandwidthGBytesPerS = float64(v) }, []int{-1}, []int{0}},
		{"transfer.sim.latency", gqaBase, func(c *Config, v int) { c.Transfer.Sim.Latency = time.Duration(v) }, []int{-1}, []int{0}},
	}
	var tests []ruleCase
	for _, f := range fields {
		for _, v := range f.bad {
			tests = append(tests, ruleCase{name: fmt.Sprintf("%s=%d", f.key, v), base: f.base, mod: func(c *Config) { f.set(c, v) }, want: []string{f.key}})
		}
		for _, v := range f.good {
			tests = append(tests, ruleCase{name: fmt.Sprintf("%s=%d", f.key, v), base: f.base, mod: func(c *Config) { f.set(c, v) }})
		}
	}
	checkRules(t, tests)
}

func TestRuleKVHeadsDivideTP(t *testing.T) {
	heads := func(base func() Config, h, tp int, bad bool) ruleCase {
		rc := ruleCase{
			name: fmt.Sprintf("%s %d heads tp %d", base().KVPool.Kind, h, tp), base: base,
			mod: func(c *Config) { c.KVPool.KVHeads, c.Parallel.AttnTP = h, tp },
		}
		if bad {
			rc.want = []string{"kv_pool.kv_heads"}
			rc.contains = fmt.Sprintf("%d KV heads cannot be split over parallel.attn_tp = %d", h, tp)
		}
		return rc
	}
	checkRules(t, []ruleCase{
		heads(gqaBase, 8, 1, false),
		heads(gqaBase, 8, 2, false),
		heads(gqaBase, 8, 8, false),
		heads(gqaBase, 8, 16, false), // replication: TP a multiple of the heads
		heads(gqaBase, 2, 8, false),
		heads(gqaBase, 1, 4, false),
		heads(gqaBase, 8, 3, true),
		heads(gqaBase, 8, 12, true), // more ranks than heads, but not a multiple
		heads(gqaBase, 3, 2, true),
		heads(mhaBase, 32, 8, false),
		heads(mhaBase, 32, 6, true),
		heads(swaBase, 8, 3, true),
		heads(linearBase, 2, 3, true),
		{name: "mla has no heads", base: mlaBase, mod: func(c *Config) { c.Parallel.AttnTP = 3 }},
	})
}

func TestRulePageSizePowerOfTwo(t *testing.T) {
	var tests []ruleCase
	for _, p := range []int{1, 2, 16, 64, 128, 1024} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.KVPool.PageSize = p }})
	}
	for _, p := range []int{0, -64, 3, 48, 100} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.KVPool.PageSize = p }, want: []string{"kv_pool.page_size"}, contains: "power of two"})
	}
	checkRules(t, tests)
}

func TestRulePoolSizeExactlyOne(t *testing.T) {
	pool := func(tokens, pages int64) func(c *Config) {
		return func(c *Config) { c.KVPool.TotalTokens, c.KVPool.TotalPages = tokens, pages }
	}
	checkRules(t, []ruleCase{
		{name: "tokens only", mod: pool(1<<20, 0)},
		{name: "pages only", mod: pool(0, 1000)},
		{name: "exactly one page of tokens", mod: pool(64, 0)},
		{name: "both", mod: pool(1<<20, 1000), want: []string{"kv_pool.total_pages"}, contains: "both kv_pool.total_tokens (1048576) and kv_pool.total_pages are set"},
		{name: "neither", mod: pool(0, 0), want: []string{"kv_pool.total_tokens"}, contains: "the pool size is required"},
		{name: "less than a page", mod: pool(63, 0), want: []string{"kv_pool.total_tokens"}, contains: "smaller than one page (64 tokens)"},
		{name: "negative tokens", mod: pool(-1, 0), want: []string{"kv_pool.total_tokens"}},
		{name: "negative pages", mod: pool(0, -1), want: []string{"kv_pool.total_pages"}},
	})
}

func TestRuleMetadataSlots(t *testing.T) {
	meta := func(slots, prealloc, metadata int) func(c *Config) {
		return func(c *Config) {
			c.KVPool.RequestSlots, c.KVPool.PreAllocSlots, c.KVPool.MetadataSlots = slots, prealloc, metadata
		}
	}
	checkRules(t, []ruleCase{
		{name: "default", mod: meta(256, -1, 0)},
		{name: "equal", mod: meta(256, -1, 256)},
		{name: "more", mod: meta(256, -1, 1024)},
		{name: "one short", mod: meta(256, -1, 255), want: []string{"kv_pool.metadata_slots"}, contains: "must be >= the request slots (request_slots + pre_alloc_slots = 256)"},
		// SGLang's rule: 16 slots <= 32 get 2 × 16 pre-allocation rows, 48 in all.
		{name: "with SGLang's pre-alloc rows, equal", mod: meta(16, -1, 48)},
		{name: "with SGLang's pre-alloc rows, one short", mod: meta(16, -1, 47), want: []string{"kv_pool.metadata_slots"}, contains: "= 48"},
		{name: "explicit pre-alloc rows", mod: meta(16, 4, 20)},
		{name: "explicit pre-alloc rows, one short", mod: meta(16, 4, 19), want: []string{"kv_pool.metadata_slots"}},
		{name: "negative", mod: meta(256, -1, -1), want: []string{"kv_pool.metadata_slots"}},
	})
}

func TestRuleSWANeedsWindowAndPool(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "complete", base: swaBase},
		{name: "no window", base: swaBase, mod: func(c *Config) { c.KVPool.SWA.Window = 0 }, want: []string{"kv_pool.swa.window"}},
		{name: "no pool", base: swaBase, mod: func(c *Config) { c.KVPool.SWA.TotalTokens = 0 }, want: []string{"kv_pool.swa.total_tokens"}},
		{name: "neither", base: swaBase, mod: func(c *Config) { c.KVPool.SWA = kvlayout.SWAConfig{Window: -1} }, want: []string{"kv_pool.swa.total_tokens", "kv_pool.swa.window"}},
		{name: "not needed for gqa", base: gqaBase},
	})
}

func TestRuleHybridLinearStateSlots(t *testing.T) {
	mamba := func(slots, state int, extra bool, pp int) func(c *Config) {
		return func(c *Config) {
			c.KVPool.RequestSlots = slots
			c.KVPool.Mamba.StateSlots, c.KVPool.Mamba.ExtraBuffer, c.KVPool.Mamba.PingPong = state, extra, pp
		}
	}
	checkRules(t, []ruleCase{
		{name: "none", base: linearBase, mod: mamba(128, 0, false, 0), want: []string{"kv_pool.mamba.state_slots"}, contains: "needs its Mamba/linear state slots"},
		{name: "one per request", base: linearBase, mod: mamba(128, 128, false, 0)},
		{name: "one short", base: linearBase, mod: mamba(128, 127, false, 0), want: []string{"kv_pool.mamba.state_slots"}, contains: "128 × 1 = 128"},
		{name: "extra buffer ping-pong 1", base: linearBase, mod: mamba(128, 256, true, 1)},
		{name: "extra buffer ping-pong 1, one short", base: linearBase, mod: mamba(128, 255, true, 1), want: []string{"kv_pool.mamba.state_slots"}, contains: "128 × 2 = 256"},
		{name: "extra buffer ping-pong 2", base: linearBase, mod: mamba(128, 384, true, 2)},
		{name: "extra buffer ping-pong 2, one short", base: linearBase, mod: mamba(128, 383, true, 2), want: []string{"kv_pool.mamba.state_slots"}, contains: "128 × 3 = 384"},
		// 16 request slots get SGLang's 32 pre-allocation rows: 48 requests.
		{name: "with pre-alloc rows", base: linearBase, mod: mamba(16, 48, false, 0)},
		{name: "with pre-alloc rows, one short", base: linearBase, mod: mamba(16, 47, false, 0), want: []string{"kv_pool.mamba.state_slots"}, contains: "48 × 1 = 48"},
		{name: "bad ping-pong", base: linearBase, mod: mamba(128, 1024, true, 3), want: []string{"kv_pool.mamba.ping_pong"}},
		{name: "ping-pong ignored without the extra buffer", base: linearBase, mod: mamba(128, 128, false, 3)},
		{name: "not needed for gqa", base: gqaBase, mod: func(c *Config) { c.KVPool.Mamba.StateSlots = 0 }},
	})
}

func TestRuleTransferBackend(t *testing.T) {
	var tests []ruleCase
	for _, b := range kvlayout.TransferBackends {
		tests = append(tests, ruleCase{name: b, mod: func(c *Config) { c.Transfer.Backend = b }})
	}
	for _, b := range []string{"x", "", "Mooncake", "tcp"} {
		tests = append(tests, ruleCase{name: "unknown " + b, mod: func(c *Config) { c.Transfer.Backend = b },
			want: []string{"transfer.backend"}, problem: "Unsupported transfer backend: " + b})
	}
	// An unknown backend is reported once, not again by the staging rule.
	tests = append(tests, ruleCase{name: "unknown with staging", mod: func(c *Config) { c.Transfer.Backend, c.Staging.Enabled = "x", true },
		want: []string{"transfer.backend"}, problem: "Unsupported transfer backend: x"})
	checkRules(t, tests)
}

func TestRuleDType(t *testing.T) {
	var tests []ruleCase
	for d := range kvlayout.DTypes {
		tests = append(tests, ruleCase{name: d, mod: func(c *Config) { c.KVPool.DType = d }})
	}
	tests = append(tests,
		ruleCase{name: "BF16", mod: func(c *Config) { c.KVPool.DType = "BF16" }},
		ruleCase{name: "int4", mod: func(c *Config) { c.KVPool.DType = "int4" }, want: []string{"kv_pool.dtype"}, problem: "unknown KV cache dtype."},
		ruleCase{name: "empty", mod: func(c *Config) { c.KVPool.DType = "" }, want: []string{"kv_pool.dtype"}},
		ruleCase{name: "auto", mod: func(c *Config) { c.KVPool.DType = "auto" }, want: []string{"kv_pool.dtype"}, problem: "unknown KV cache dtype."},
	)
	checkRules(t, tests)

	// "auto" gets its own advice.
	c := DefaultConfig()
	c.KVPool.DType = "auto"
	errs := configErrors(t, c.Validate())
	if len(errs) != 1 || !strings.Contains(errs[0].Fix, `"auto" depends on the model`) {
		t.Errorf("auto: %v", errs)
	}
}

func TestRulePriority(t *testing.T) {
	var tests []ruleCase
	for _, p := range []string{"fifo", "low-first", "high-first"} {
		tests = append(tests, ruleCase{name: p, mod: func(c *Config) { c.Admission.Priority = p }})
	}
	for _, p := range []string{"", "lifo", "FIFO"} {
		tests = append(tests, ruleCase{name: "bad " + p, mod: func(c *Config) { c.Admission.Priority = p }, want: []string{"admission.priority"}})
	}
	checkRules(t, tests)
}

func TestRuleTimeoutsPositive(t *testing.T) {
	durations := []struct {
		key string
		set func(c *Config, d time.Duration)
	}{
		{"timeouts.waiting", func(c *Config, d time.Duration) { c.Timeouts.Waiting = d }},
		{"timeouts.bootstrap", func(c *Config, d time.Duration) { c.Timeouts.Bootstrap = d }},
		{"timeouts.heartbeat_interval", func(c *Config, d time.Duration) { c.Timeouts.HeartbeatInterval = d }},
		{"timeouts.prefill_info_backoff", func(c *Config, d time.Duration) { c.Timeouts.PrefillInfoBackoff = d }},
		{"timeouts.dp_rank_resolution", func(c *Config, d time.Duration) { c.Timeouts.DPRankResolution = d }},
		{"dp_rank.binding_ttl", func(c *Config, d time.Duration) { c.DPRank.BindingTTL = d }},
		{"server.shutdown_timeout", func(c *Config, d time.Duration) { c.Server.ShutdownTimeout = d }},
	}
	var tests []ruleCase
	for _, d := range durations {
		for _, v := range []time.Duration{0, -time.Second} {
			tests = append(tests, ruleCase{name: fmt.Sprintf("%s=%s", d.key, v), mod: func(c *Config) { d.set(c, v) }, want: []string{d.key}})
		}
		tests = append(tests, ruleCase{name: d.key + "=1ns", mod: func(c *Config) { d.set(c, 1) }})
	}
	tests = append(tests,
		ruleCase{name: "backoff max 0", mod: func(c *Config) { c.Timeouts.PrefillInfoBackoffMax = 0 }, want: []string{"timeouts.prefill_info_backoff_max"}},
		ruleCase{name: "backoff max below backoff", mod: func(c *Config) { c.Timeouts.PrefillInfoBackoffMax = 500 * time.Millisecond },
			want: []string{"timeouts.prefill_info_backoff_max"}, contains: "is below timeouts.prefill_info_backoff (1s)"},
		ruleCase{name: "backoff max equal", mod: func(c *Config) { c.Timeouts.PrefillInfoBackoffMax = time.Second }},
		ruleCase{name: "heartbeat failures 0 is floored, not refused", mod: func(c *Config) { c.Timeouts.HeartbeatMaxFailures = 0 }},
		ruleCase{name: "heartbeat failures negative", mod: func(c *Config) { c.Timeouts.HeartbeatMaxFailures = -1 }, want: []string{"timeouts.heartbeat_max_failures"}},
		ruleCase{name: "heartbeat interval below the floor is floored", mod: func(c *Config) { c.Timeouts.HeartbeatInterval = time.Second }},
		ruleCase{name: "prefill info attempts 0", mod: func(c *Config) { c.Timeouts.PrefillInfoAttempts = 0 }, want: []string{"timeouts.prefill_info_attempts"}},
	)
	checkRules(t, tests)
}

func TestHeartbeatFloors(t *testing.T) {
	tests := []struct {
		iv       time.Duration
		mf       int
		wantIV   time.Duration
		wantMF   int
		warnings []string
	}{
		{5 * time.Second, 2, 5 * time.Second, 2, nil},
		{2 * time.Second, 1, 2 * time.Second, 1, nil},
		{time.Second, 2, 2 * time.Second, 2, []string{"timeouts.heartbeat_interval"}},
		{5 * time.Second, 0, 5 * time.Second, 1, []string{"timeouts.heartbeat_max_failures"}},
		{500 * time.Millisecond, 0, 2 * time.Second, 1, []string{"timeouts.heartbeat_interval", "timeouts.heartbeat_max_failures"}},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.Timeouts.HeartbeatInterval, c.Timeouts.HeartbeatMaxFailures = tt.iv, tt.mf
		iv, mf := c.Timeouts.EffectiveHeartbeat()
		if iv != tt.wantIV || mf != tt.wantMF {
			t.Errorf("EffectiveHeartbeat(%s, %d) = %s, %d; want %s, %d", tt.iv, tt.mf, iv, mf, tt.wantIV, tt.wantMF)
		}
		var got []string
		for _, w := range c.Manager().Warnings() {
			got = append(got, w.Key)
		}
		if diff := cmp.Diff(tt.warnings, got); diff != "" {
			t.Errorf("(%s, %d) warnings (-want +got):\n%s", tt.iv, tt.mf, diff)
		}
	}
}

func TestRuleDelegateNeedsTarget(t *testing.T) {
	delegate := func(target string) func(c *Config) {
		return func(c *Config) { c.Transfer.Path, c.Transfer.Delegate.Target = "delegate", target }
	}
	checkRules(t, []ruleCase{
		{name: "no target", mod: delegate(""), want: []string{"transfer.delegate.target"}, contains: "needs the transfer agent's address"},
		{name: "no port", mod: delegate("localhost"), want: []string{"transfer.delegate.target"}},
		{name: "host:port", mod: delegate("127.0.0.1:7700")},
		{name: "name:port", mod: delegate("agent.local:7700")},
		{name: "sim needs no target", mod: func(c *Config) { c.Transfer.Path, c.Transfer.Delegate.Target = "sim", "" }},
		{name: "batch timeout", mod: func(c *Config) { delegate("a:1")(c); c.Transfer.Delegate.BatchTimeout = 0 }, want: []string{"transfer.delegate.batch_timeout"}},
		{name: "health interval", mod: func(c *Config) { delegate("a:1")(c); c.Transfer.Delegate.HealthInterval = -1 }, want: []string{"transfer.delegate.health_interval"}},
		{name: "unknown path", mod: func(c *Config) { c.Transfer.Path = "grpc" }, want: []string{"transfer.path"}},
		{name: "empty path", mod: func(c *Config) { c.Transfer.Path = "" }, want: []string{"transfer.path"}},
	})
}

func TestRuleSimFailureProbability(t *testing.T) {
	var tests []ruleCase
	for _, p := range []float64{0, 0.5, 1} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.Transfer.Sim.FailureProbability = p }})
	}
	for _, p := range []float64{-0.01, 1.01, math.NaN(), math.Inf(1)} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.Transfer.Sim.FailureProbability = p },
			want: []string{"transfer.sim.failure_probability"}, contains: "between 0 and 1"})
	}
	checkRules(t, tests)
}

func TestRuleServer(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "listen", mod: func(c *Config) { c.Server.Listen = "7600" }, want: []string{"server.listen"}},
		{name: "listen on every interface", mod: func(c *Config) { c.Server.Listen = ":7600" }},
		{name: "metrics disabled", mod: func(c *Config) { c.Server.MetricsListen = "" }},
		{name: "metrics bad", mod: func(c *Config) { c.Server.MetricsListen = "metrics" }, want: []string{"server.metrics_listen"}},
		{name: "metrics on the gRPC port", mod: func(c *Config) { c.Server.MetricsListen = c.Server.Listen }, want: []string{"server.metrics_listen"}},
	})
}

func TestRuleLog(t *testing.T) {
	var tests []ruleCase
	for _, l := range []string{"debug", "info", "warn", "error"} {
		tests = append(tests, ruleCase{name: l, mod: func(c *Config) { c.Log.Level = l }})
	}
	tests = append(tests,
		ruleCase{name: "json", mod: func(c *Config) { c.Log.Format = "json" }},
		ruleCase{name: "trace", mod: func(c *Config) { c.Log.Level = "trace" }, want: []string{"log.level"}},
		ruleCase{name: "xml", mod: func(c *Config) { c.Log.Format = "xml" }, want: []string{"log.format"}},
	)
	checkRules(t, tests)
}

// --- every problem at once -------------------------------------------------

func TestValidateReportsEveryProblem(t *testing.T) {
	c := mlaBase()
	c.Staging.Enabled = true
	c.Transfer.Backend = "x"
	c.Admission.Priority = "lifo"
	errs := configErrors(t, c.Validate())
	want := []string{"admission.priority", "staging.enabled", "transfer.backend"}
	if diff := cmp.Diff(want, errorKeys(errs)); diff != "" {
		t.Errorf("problem keys (-want +got):\n%s", diff)
	}
}
