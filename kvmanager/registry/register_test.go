package registry

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// maxRegisterAlloc bounds one RegisterPrefill call: the rank mapping's four
// lists at the wire's per-size bound are 4 × 1,024 ints (32 KiB), plus the
// instance's and the rank's own entries.
const maxRegisterAlloc = 128 << 10

// mismatchText strips the ErrPrefillMismatch umbrella, leaving SGLang's text.
func mismatchText(t *testing.T, err error) string {
	t.Helper()
	if !errors.Is(err, ErrPrefillMismatch) {
		t.Fatalf("error %v is not ErrPrefillMismatch", err)
	}
	prefix := ErrPrefillMismatch.Error() + ": "
	msg := err.Error()
	if len(msg) < len(prefix) || msg[:len(prefix)] != prefix {
		t.Fatalf("error %q does not start with %q", msg, prefix)
	}
	return msg[len(prefix):]
}

func TestRegisterPrefillCompatibility(t *testing.T) {
	tests := []struct {
		name string
		dec  func(*kvlayout.Config)
		mod  func(*Registration)
		want string // SGLang's text after the umbrella; "" = accepted
	}{
		{name: "same layout", mod: func(*Registration) {}},
		{name: "dtype spelled differently", mod: func(r *Registration) { r.KVDType = "bfloat16" }},
		{name: "auto dtype against bf16", mod: func(r *Registration) { r.KVDType = "auto" }},
		{
			name: "page size mismatch", mod: func(r *Registration) { r.PageSize = 16 },
			want: "Page size mismatch: prefill server has page_size=16, but decode server has page_size=64. Both servers must use the same --page-size value.",
		},
		{
			name: "dtype mismatch", mod: func(r *Registration) { r.KVDType = "fp8_e4m3" },
			want: "KV cache dtype mismatch: prefill server has kv_cache_dtype=fp8_e4m3, but decode server has kv_cache_dtype=bf16. Both servers must use the same --kv-cache-dtype value.",
		},
		{
			name: "auto dtype against fp8", dec: func(c *kvlayout.Config) { c.Pool.DType = "fp8_e4m3" }, mod: func(r *Registration) { r.KVDType = "auto" },
			want: "KV cache dtype mismatch: prefill server has kv_cache_dtype=auto, but decode server has kv_cache_dtype=fp8_e4m3. Both servers must use the same --kv-cache-dtype value.",
		},
		{
			name: "unknown dtype", mod: func(r *Registration) { r.KVDType = "int4" },
			want: "KV cache dtype mismatch: prefill server has kv_cache_dtype=int4, but decode server has kv_cache_dtype=bf16. Both servers must use the same --kv-cache-dtype value.",
		},
		{
			name: "model facts", mod: func(r *Registration) { r.Model = ModelFacts{Kind: "mla", NumLayers: 61, TotalKVHeads: 8, HeadDim: 64} },
			want: `the prefill's model does not match the decode KV pool: kv_pool_kind "mla" (decode: gqa), num_layers 61 (decode: 32), head_dim 64 (decode: 128)`,
		},
		{name: "matching model facts", mod: func(r *Registration) { r.Model = ModelFacts{Kind: "GQA", NumLayers: 32, TotalKVHeads: 8, HeadDim: 128} }},
		{
			name: "MLA model facts", dec: mlaDecode(kvlayout.KindMLA), mod: func(r *Registration) { r.Model = ModelFacts{Kind: "mla", KVLoraRank: 512, QKRopeHeadDim: 32} },
			want: "the prefill's model does not match the decode KV pool: kv_lora_rank + qk_rope_head_dim 544 (decode: 576)",
		},
		{
			name: "TP sizes that do not divide", dec: func(c *kvlayout.Config) { c.Parallel.AttnTP = 2 }, mod: func(r *Registration) { r.Parallel.AttnTP = 3 },
			want: "prefill attn_tp_size=3 and decode attn_tp_size=2: one must divide the other for the rank mapping",
		},
		{
			name: "decode PP neither equal nor 1", dec: func(c *kvlayout.Config) { c.Parallel.PP = 2 }, mod: func(r *Registration) { r.Parallel.PP = 4 },
			want: "decode pp_size=2 must equal the prefill's pp_size=4 or be 1",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				reg := h.registration(prefill{addr: addrA}, 0, 0, 0, 0)
				tc.mod(&reg)
				_, _, err := h.g.Register(reg)
				if tc.want == "" {
					if err != nil {
						t.Fatalf("RegisterPrefill = %v, want nil", err)
					}
					return
				}
				if got := mismatchText(t, err); got != tc.want {
					t.Errorf("RegisterPrefill error:\n got %q\nwant %q", got, tc.want)
				}
				if st := h.g.Status(); len(st) != 0 {
					t.Errorf("a refused registration was stored: %+v", st)
				}
			})
		})
	}
}

func TestRegisterPrefillLayoutConflict(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := prefill{addr: addrA, tp: 2}
		if _, _, err := h.g.Register(h.registration(in, 0, 0, 0, 0)); err != nil {
			t.Fatalf("RegisterPrefill(rank 0) = %v", err)
		}
		other := h.registration(prefill{addr: addrA, tp: 4}, 0, 0, 1, 0)
		if _, _, err := h.g.Register(other); !errors.Is(err, ErrPrefillMismatch) {
			t.Errorf("RegisterPrefill(other layout) = %v, want ErrPrefillMismatch", err)
		}
		lb := h.registration(in, 0, 0, 1, 0)
		lb.LoadBalanceMethod = "round_robin"
		if _, _, err := h.g.Register(lb); !errors.Is(err, ErrPrefillMismatch) {
			t.Errorf("RegisterPrefill(other load_balance_method) = %v, want ErrPrefillMismatch", err)
		}
	})
}

func TestRegistrationResultRankView(t *testing.T) {
	tests := []struct {
		name string
		dec  func(*kvlayout.Config)
		inst prefill
		rank RankID
		want RegistrationResult
	}{
		{
			name: "MLA real source", dec: mlaDecode(kvlayout.KindMLA), inst: prefill{addr: addrA, tp: 4}, rank: RankID{TP: 0},
			want: RegistrationResult{ServesDecodeTP: []int{0}, RequiredDstInfoNum: 1},
		},
		{
			name: "MLA dummy", dec: mlaDecode(kvlayout.KindMLA), inst: prefill{addr: addrA, tp: 4}, rank: RankID{TP: 3},
			want: RegistrationResult{ServesDecodeTP: []int{0}, Dummy: true, RequiredDstInfoNum: 1},
		},
		{
			name: "prefill TP 1 serves decode TP 4", dec: func(c *kvlayout.Config) { c.Parallel.AttnTP = 4 }, inst: prefill{addr: addrA}, rank: RankID{},
			want: RegistrationResult{ServesDecodeTP: []int{0, 1, 2, 3}, RequiredDstInfoNum: 4},
		},
		{
			name: "staging for heterogeneous GQA", dec: func(c *kvlayout.Config) { c.Staging.Enabled = true }, inst: prefill{addr: addrA, tp: 2}, rank: RankID{TP: 1},
			want: RegistrationResult{ServesDecodeTP: []int{0}, RequiredDstInfoNum: 1, Staging: true},
		},
		{
			// CP 2 without all-CP transfer: only CP rank 0 is addressed.
			name: "prefill CP rank beyond 0", inst: prefill{addr: addrA, cp: 2}, rank: RankID{CP: 1},
			want: RegistrationResult{Dummy: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				h.register(tc.inst) // completes the instance
				res, _, err := h.g.Register(h.registration(tc.inst, tc.rank.DP, tc.rank.CP, tc.rank.TP, tc.rank.PP))
				if err != nil {
					t.Fatalf("RegisterPrefill = %v", err)
				}
				if res.HeartbeatInterval != 5*time.Second || res.MaxFailures != 2 || res.Replaced || res.RoomsFailed != 0 {
					t.Errorf("result = %+v, want SGLang's heartbeat settings and no replacement", res)
				}
				got := RegistrationResult{ServesDecodeTP: res.ServesDecodeTP, Dummy: res.Dummy, RequiredDstInfoNum: res.RequiredDstInfoNum, Staging: res.Staging}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("rank view (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestHeartbeatUnknown(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		if _, _, err := h.g.Heartbeat(RankID{Addr: addrA}, ""); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(unknown instance) = %v, want ErrPrefillNotFound", err)
		}
		h.register(prefill{addr: addrA})
		if _, _, err := h.g.Heartbeat(RankID{Addr: addrA, TP: 1}, ""); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(unknown rank) = %v, want ErrPrefillNotFound", err)
		}
	})
}

func TestLookupDPRanks(t *testing.T) {
	tests := []struct {
		name           string
		inst           prefill
		force          bool
		binds          map[uint64]int
		rooms          []uint64
		hints          map[uint64]int
		wait           time.Duration // before the lookup
		want           []DPResolution
		wantUnresolved []uint64
	}{
		{
			name: "single dp", inst: prefill{addr: addrA, lb: "round_robin"}, rooms: []uint64{7, 8},
			want: []DPResolution{{Room: 7, DP: 0, Rule: DPRuleSingleDP}, {Room: 8, DP: 0, Rule: DPRuleSingleDP}},
		},
		{
			name: "follow room", inst: prefill{addr: addrA, dp: 4}, rooms: []uint64{7, 8}, hints: map[uint64]int{8: 3},
			want: []DPResolution{{Room: 7, DP: 3, Rule: DPRuleFollowRoom}, {Room: 8, DP: 3, Rule: DPRuleHint}},
		},
		{
			name: "bindings and unresolved", inst: prefill{addr: addrA, dp: 4, lb: "round_robin"}, binds: map[uint64]int{10: 2},
			rooms: []uint64{10, 11, 12}, hints: map[uint64]int{12: 1},
			want:           []DPResolution{{Room: 10, DP: 2, Rule: DPRuleBinding}, {Room: 12, DP: 1, Rule: DPRuleHint}},
			wantUnresolved: []uint64{11},
		},
		{
			name: "force query ignores room % dp", inst: prefill{addr: addrA, dp: 4}, force: true, binds: map[uint64]int{10: 1},
			rooms: []uint64{10, 11}, want: []DPResolution{{Room: 10, DP: 1, Rule: DPRuleBinding}}, wantUnresolved: []uint64{11},
		},
		{
			// SGLang's server-side entry lives 120–240 s; here binding_ttl.
			name: "expired binding", inst: prefill{addr: addrA, dp: 4, lb: "round_robin"}, binds: map[uint64]int{10: 2},
			rooms: []uint64{10}, wait: 120 * time.Second, wantUnresolved: []uint64{10},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withForceQuery(tc.force))
				h.register(tc.inst)
				for room, dp := range tc.binds {
					if _, _, err := h.g.BindRoom(tc.inst.addr, room, dp); err != nil {
						t.Fatalf("BindRoom(%d, %d) = %v", room, dp, err)
					}
				}
				advance(tc.wait)
				res, unresolved, err := h.lookup(tc.inst.addr, tc.rooms, tc.hints)
				if err != nil {
					t.Fatalf("LookupDPRanks = %v", err)
				}
				if diff := cmp.Diff(tc.want, res); diff != "" {
					t.Errorf("resolved (-want +got):\n%s", diff)
				}
				if !slices.Equal(tc.wantUnresolved, unresolved) {
					t.Errorf("unresolved = %v, want %v", unresolved, tc.wantUnresolved)
				}
			})
		})
	}
	t.Run("errors", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			h := newHarness(t)
			in := prefill{addr: addrA, dp: 2}
			if _, _, err := h.g.Register(h.registration(in, 0, 0, 0, 0)); err != nil {
				t.Fatal(err)
			}
			if _, _, err := h.lookup(addrA, []uint64{1}, nil); !errors.Is(err, ErrPrefillNotFound) {
				t.Errorf("LookupDPRanks(incomplete instance) = %v, want ErrPrefillNotFound", err)
			}
			h.register(in)
			var inv *InvalidError
			if _, _, err := h.lookup(addrA, []uint64{1}, map[uint64]int{1: 2}); !errors.As(err, &inv) || inv.Field != "hints" {
				t.Errorf("LookupDPRanks(hint out of range) = %v, want InvalidError on hints", err)
			}
		})
	})
}

// TestRegisterPrefillHugeSizesAllocateNothing sends, straight to the domain
// (no wire check in front of it), the parallel sizes an outside sweep used to
// grow the daemon past 4 GiB: each registration is either refused or
// accepted, and either way allocates less than maxRegisterAlloc and returns. An
// accepted instance counts its expected ranks exactly (saturating, never
// wrapping) and is not complete.
func TestRegisterPrefillHugeSizesAllocateNothing(t *testing.T) {
	const big, max32 = 1 << 31, math.MaxUint32
	tests := []struct {
		name     string
		dec      func(*kvlayout.Config)
		par      ParallelInfo
		expected int // 0: refused
	}{
		{name: "attn_tp_size 2^31", par: ParallelInfo{AttnTP: big}},
		{name: "attn_tp_size 2^32-1", par: ParallelInfo{AttnTP: max32}},
		{name: "pp_size 2^31", par: ParallelInfo{PP: big}},
		{name: "pp_size 2^32-1", par: ParallelInfo{PP: max32}},
		{name: "attn_cp_size 2^31 on an all-CP pool", dec: mlaDecode(kvlayout.KindHybridMLA), par: ParallelInfo{AttnCP: big}},
		{name: "attn_dp_size 2^31", par: ParallelInfo{AttnDP: big}, expected: big},
		{name: "attn_cp_size 2^31", par: ParallelInfo{AttnCP: big}, expected: big},
		{name: "system_dp_size 2^31", par: ParallelInfo{SystemDP: big}, expected: big},
		{name: "pp_size 1024 (more stages than the model's 32 layers)", par: ParallelInfo{PP: 1024}},
		{name: "every size 1024, pp 16", par: ParallelInfo{AttnTP: 1024, AttnCP: 1024, AttnDP: 1024, PP: 16}, expected: 1 << 34},
		{name: "every size 1024, pp 16, on an all-CP MLA pool", dec: mlaDecode(kvlayout.KindHybridMLA), par: ParallelInfo{AttnTP: 1024, AttnCP: 1024, AttnDP: 1024, PP: 16}, expected: 1 << 34},
		{name: "dp, cp 2^32-1 (product saturates)", par: ParallelInfo{AttnCP: max32, AttnDP: max32, SystemDP: max32}, expected: math.MaxInt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				reg := h.registration(prefill{addr: addrA}, 0, 0, 0, 0)
				p := tc.par
				for _, f := range []*int{&p.AttnTP, &p.AttnCP, &p.AttnDP, &p.PP, &p.SystemDP} {
					*f = max(1, *f)
				}
				reg.Parallel = p
				reg.Parallel.AttnTPRank = p.AttnTP - 1 // the last rank of every size
				reg.Parallel.PPRank = p.PP - 1
				reg.Parallel.AttnCPRank = p.AttnCP - 1
				reg.Parallel.AttnDPRank = p.AttnDP - 1
				reg.Parallel.SystemDPRank = p.SystemDP - 1
				var res RegistrationResult
				var err error
				n := allocated(func() { res, _, err = h.g.Register(reg) })
				t.Logf("RegisterPrefill(%+v): %d bytes allocated, err %v", p, n, err)
				if n > maxRegisterAlloc {
					t.Errorf("RegisterPrefill allocated %d bytes, want < %d", n, maxRegisterAlloc)
				}
				st := h.g.Status()
				if tc.expected == 0 {
					if err == nil {
						t.Fatalf("RegisterPrefill = %+v, want refused", res)
					}
					if !errors.Is(err, ErrPrefillMismatch) || (!strings.Contains(err.Error(), "decodeplane lists at most 65536") && !strings.Contains(err.Error(), "exceeds the model's")) {
						t.Errorf("RegisterPrefill = %v, want the mapping budget's or the PP-stage ErrPrefillMismatch", err)
					}
					if len(st) != 0 {
						t.Errorf("a refused registration was stored: %+v", st)
					}
					return
				}
				if err != nil {
					t.Fatalf("RegisterPrefill = %v", err)
				}
				if res.Registered != 1 || res.Expected != tc.expected {
					t.Errorf("registered %d of %d, want 1 of %d", res.Registered, res.Expected, tc.expected)
				}
				if len(st) != 1 || st[0].Expected != tc.expected {
					t.Errorf("Status().Prefills = %+v", st)
				}
				// A second rank of the same instance costs as little.
				reg.Parallel.AttnTPRank, reg.Parallel.PPRank, reg.Parallel.AttnCPRank = 0, 0, 0
				reg.Parallel.AttnDPRank, reg.Parallel.SystemDPRank = 0, 0
				reg.Endpoint += "-2"
				if n := allocated(func() { res, _, err = h.g.Register(reg) }); err != nil || n > maxRegisterAlloc || res.Registered != 2 {
					t.Errorf("second rank: %+v, %v, %d bytes allocated", res, err, n)
				}
				// Never complete: rooms wait under SGLang's retry budget.
				if _, _, err := h.lookup(addrA, []uint64{1}, nil); !errors.Is(err, ErrPrefillNotFound) {
					t.Errorf("LookupDPRanks on an incomplete instance = %v, want ErrPrefillNotFound", err)
				}
				if _, _, err := h.g.Heartbeat(RankID{Addr: addrA}, ""); err != nil {
					t.Errorf("Heartbeat(rank 0) = %v", err)
				}
			})
		})
	}
}

// TestRegisterPrefillRankOutsideLayout: a rank beyond its own sizes is
// refused naming the field, and nothing is stored (the count of registered
// ranks must be exact).
func TestRegisterPrefillRankOutsideLayout(t *testing.T) {
	tests := []struct {
		name  string
		mod   func(*ParallelInfo)
		field string
	}{
		{"tp rank", func(p *ParallelInfo) { p.AttnTP, p.AttnTPRank = 4, 4 }, "parallel.attn_tp_rank"},
		{"cp rank", func(p *ParallelInfo) { p.AttnCPRank = 1 }, "parallel.attn_cp_rank"},
		{"pp rank", func(p *ParallelInfo) { p.PP, p.PPRank = 2, 7 }, "parallel.pp_rank"},
		{"attention dp rank", func(p *ParallelInfo) { p.AttnDP, p.AttnDPRank = 2, 2 }, "parallel.attn_dp_rank"},
		{"system dp rank", func(p *ParallelInfo) { p.SystemDP, p.SystemDPRank = 4, 9 }, "parallel.system_dp_rank"},
		{"negative tp rank", func(p *ParallelInfo) { p.AttnTPRank = -1 }, "parallel.attn_tp_rank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t)
				reg := h.registration(prefill{addr: addrA}, 0, 0, 0, 0)
				tc.mod(&reg.Parallel)
				_, _, err := h.g.Register(reg)
				var inv *InvalidError
				if !errors.As(err, &inv) || inv.Field != tc.field {
					t.Fatalf("RegisterPrefill = %v, want InvalidError on %s", err, tc.field)
				}
				if st := h.g.Status(); len(st) != 0 {
					t.Errorf("a refused registration was stored: %+v", st)
				}
			})
		})
	}
}

// TestModelFactsContradictingThePool: facts that contradict this decode pool
// are FailedPrecondition (ErrPrefillMismatch) listing every field; a
// kv_pool_kind that is no kind at all is InvalidArgument naming
// model.kv_pool_kind with the allowed values. Nothing is stored.
func TestModelFactsContradictingThePool(t *testing.T) {
	tests := []struct {
		name    string
		dec     func(*kvlayout.Config)
		model   ModelFacts
		want    string // after the umbrella; "" = accepted
		invalid string // InvalidError text instead
	}{
		{name: "MLA latent on a GQA pool", model: ModelFacts{KVLoraRank: 512},
			want: "the prefill's model does not match the decode KV pool: kv_lora_rank 512 (decode: gqa pool, which has no latent dimension)"},
		{name: "MLA latent and rope on a GQA pool, with its own kind", model: ModelFacts{Kind: "mla", KVLoraRank: 512, QKRopeHeadDim: 64},
			want: `the prefill's model does not match the decode KV pool: kv_pool_kind "mla" (decode: gqa), kv_lora_rank 512 (decode: gqa pool, which has no latent dimension), qk_rope_head_dim 64 (decode: gqa pool, which has no decoupled RoPE part)`},
		{name: "KV heads and head dim", model: ModelFacts{TotalKVHeads: 4, HeadDim: 64},
			want: "the prefill's model does not match the decode KV pool: total_kv_heads 4 (decode: 8), head_dim 64 (decode: 128)"},
		{name: "another head-sliced kind", model: ModelFacts{Kind: "mha"},
			want: `the prefill's model does not match the decode KV pool: kv_pool_kind "mha" (decode: gqa)`},
		{name: "layers", model: ModelFacts{NumLayers: 80},
			want: "the prefill's model does not match the decode KV pool: num_layers 80 (decode: 32)"},
		{name: "not a kind", model: ModelFacts{Kind: "mamba", KVLoraRank: 512},
			invalid: "model.kv_pool_kind: \"mamba\" is not a KV pool kind (allowed: mha, gqa, mla, hybrid-mla, hybrid-swa, hybrid-linear)"},
		{name: "KV heads on an MLA pool", dec: mlaDecode(kvlayout.KindMLA), model: ModelFacts{Kind: "mla", TotalKVHeads: 8},
			want: "the prefill's model does not match the decode KV pool: total_kv_heads 8 (decode: mla pool, one latent KV vector per token)"},
		{name: "head dim on an MLA pool", dec: mlaDecode(kvlayout.KindMLA), model: ModelFacts{HeadDim: 128},
			want: "the prefill's model does not match the decode KV pool: head_dim 128 (decode: 576)"},
		{name: "GQA kind on a hybrid-mla pool", dec: mlaDecode(kvlayout.KindHybridMLA), model: ModelFacts{Kind: "gqa", NumLayers: 61},
			want: `the prefill's model does not match the decode KV pool: kv_pool_kind "gqa" (decode: hybrid-mla), num_layers 61 (decode: 32)`},
		{name: "MLA facts that match", dec: mlaDecode(kvlayout.KindMLA), model: ModelFacts{Kind: "MLA", NumLayers: 32, TotalKVHeads: 1, HeadDim: 576, KVLoraRank: 512, QKRopeHeadDim: 64}},
		{name: "GQA facts that match", model: ModelFacts{Kind: "gqa", NumLayers: 32, TotalKVHeads: 8, HeadDim: 128}},
		{name: "another model", dec: servesModel("m1", "r1"), model: ModelFacts{ModelName: "m2", ModelRevision: "r1"},
			want: `the prefill's model does not match the decode KV pool: model_name "m2" (decode: "m1")`},
		{name: "another revision", dec: servesModel("m1", "r1"), model: ModelFacts{ModelName: "m1", ModelRevision: "r0"},
			want: `the prefill's model does not match the decode KV pool: model_revision "r0" (decode: "r1")`},
		{name: "the model, no revision given", dec: servesModel("m1", "r1"), model: ModelFacts{ModelName: "m1"}},
		{name: "a model name, none configured", model: ModelFacts{ModelName: "m2", ModelRevision: "r9"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				reg := h.registration(prefill{addr: addrA}, 0, 0, 0, 0)
				reg.Model = tc.model
				_, _, err := h.g.Register(reg)
				switch {
				case tc.invalid != "":
					var inv *InvalidError
					if !errors.As(err, &inv) || inv.Field != "model.kv_pool_kind" || err.Error() != tc.invalid {
						t.Fatalf("RegisterPrefill = %v, want InvalidError %q", err, tc.invalid)
					}
				case tc.want != "":
					if got := mismatchText(t, err); got != tc.want {
						t.Errorf("RegisterPrefill error:\n got %q\nwant %q", got, tc.want)
					}
				case err != nil:
					t.Fatalf("RegisterPrefill = %v, want accepted", err)
				}
				if n := len(h.g.Status()); (tc.want != "" || tc.invalid != "") && n != 0 {
					t.Errorf("a refused registration was stored (%d instances)", n)
				}
			})
		})
	}
}

func servesModel(name, rev string) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) { c.Model = kvlayout.ModelConfig{Name: name, Revision: rev} }
}

// TestCompatNamesEveryDifference: a prefill that differs in page size, KV
// dtype and model is told all three at once, SGLang's page size and dtype
// messages unchanged, in one FailedPrecondition; the same check against
// another pool's fingerprint (Compat) answers as that pool would.
func TestCompatNamesEveryDifference(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(servesModel("m1", "")))
		reg := h.registration(prefill{addr: addrA}, 0, 0, 0, 0)
		reg.PageSize, reg.KVDType, reg.Model = 32, "fp8_e4m3", ModelFacts{ModelName: "m2"}
		_, _, err := h.g.Register(reg)
		want := "Page size mismatch: prefill server has page_size=32, but decode server has page_size=64. Both servers must use the same --page-size value.; " +
			"KV cache dtype mismatch: prefill server has kv_cache_dtype=fp8_e4m3, but decode server has kv_cache_dtype=bf16. Both servers must use the same --kv-cache-dtype value.; " +
			`the prefill's model does not match the decode KV pool: model_name "m2" (decode: "m1")`
		if got := mismatchText(t, err); got != want {
			t.Fatalf("RegisterPrefill error:\n got %q\nwant %q", got, want)
		}
		other := kvlayout.DefaultConfig()
		other.Pool.PageSize, other.Pool.DType, other.Model.Name = 32, "fp8_e4m3", "m2"
		if err := Compat(reg, other.Layout().Fingerprint()); err != nil {
			t.Fatalf("Compat against a pool that matches it = %v", err)
		}
	})
}

// TestIncompleteInstancesRetainLittle: what an instance keeps does not grow
// with its parallel sizes. 1,000 instances of attn_tp × attn_cp × dp × pp =
// 1024^4 on an all-CP MLA pool (where SGLang's mapping lists every TP, CP
// and PP rank) each register one rank; the heap they retain is measured
// after a GC.
func TestIncompleteInstancesRetainLittle(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(mlaDecode(kvlayout.KindHybridMLA)))
		heap := func() uint64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		const n = 1000
		before := heap()
		for i := range n {
			reg := h.registration(prefill{addr: fmt.Sprintf("10.1.%d.%d:8998", i/250, i%250), tp: 1024, cp: 1024, dp: 1024, pp: 16}, 0, 0, 0, 0)
			if _, _, err := h.g.Register(reg); err != nil {
				t.Fatalf("RegisterPrefill: %v", err)
			}
		}
		after := heap()
		per := (int64(after) - int64(before)) / n
		t.Logf("an incomplete 1024^4 instance retains %d bytes", per)
		if per > 4<<10 {
			t.Errorf("an incomplete 1024^4 instance retains %d bytes, want < 4 KiB (nothing sized by its parallel sizes)", per)
		}
		if st := h.g.Status(); len(st) != n {
			t.Errorf("%d instances known, want %d", len(st), n)
		}
	})
}

// TestStatusNamesInstanceID: Status names each instance's id as its ranks
// registered it, the replacing one after a replacement, "" when none was
// given.
func TestStatusNamesInstanceID(t *testing.T) {
	h := newHarness(t)
	ids := func() map[string]string {
		out := map[string]string{}
		for _, st := range h.g.Status() {
			out[st.Addr] = st.InstanceID
		}
		return out
	}
	h.register(prefill{addr: addrA, instanceID: "inc-1"})
	h.register(prefill{addr: addrB})
	if got := ids(); got[addrA] != "inc-1" || got[addrB] != "" || len(got) != 2 {
		t.Errorf("Status instance ids = %v, want %s: inc-1, %s: \"\"", got, addrA, addrB)
	}
	if res, _, err := h.g.Register(h.registration(prefill{addr: addrA, instanceID: "inc-2"}, 0, 0, 0, 0)); err != nil || !res.Replaced {
		t.Fatalf("Register(inc-2) = %+v, %v; want a replacement", res, err)
	}
	if got := ids()[addrA]; got != "inc-2" {
		t.Errorf("after the replacement, Status names instance id %q, want inc-2", got)
	}
}
