package kvmanager

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// allocated returns how many bytes f allocated (runtime.MemStats.TotalAlloc:
// every allocation, freed or not). Inside a bubble nothing else runs.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// maxRegisterAlloc bounds one RegisterPrefill call: the rank mapping's four
// lists at the wire's per-size bound are 4 × 1,024 ints (32 KiB), plus the
// instance's and the rank's own entries.
const maxRegisterAlloc = 128 << 10

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
		dec      func(*prealloc.Config)
		par      ParallelInfo
		expected int // 0: refused
	}{
		{name: "attn_tp_size 2^31", par: ParallelInfo{AttnTP: big}},
		{name: "attn_tp_size 2^32-1", par: ParallelInfo{AttnTP: max32}},
		{name: "pp_size 2^31", par: ParallelInfo{PP: big}},
		{name: "pp_size 2^32-1", par: ParallelInfo{PP: max32}},
		{name: "attn_cp_size 2^31 on an all-CP pool", dec: mlaDecode(prealloc.KindHybridMLA), par: ParallelInfo{AttnCP: big}},
		{name: "attn_dp_size 2^31", par: ParallelInfo{AttnDP: big}, expected: big},
		{name: "attn_cp_size 2^31", par: ParallelInfo{AttnCP: big}, expected: big},
		{name: "system_dp_size 2^31", par: ParallelInfo{SystemDP: big}, expected: big},
		{name: "pp_size 1024 (more stages than the model's 32 layers)", par: ParallelInfo{PP: 1024}},
		{name: "every size 1024, pp 16", par: ParallelInfo{AttnTP: 1024, AttnCP: 1024, AttnDP: 1024, PP: 16}, expected: 1 << 34},
		{name: "every size 1024, pp 16, on an all-CP MLA pool", dec: mlaDecode(prealloc.KindHybridMLA), par: ParallelInfo{AttnTP: 1024, AttnCP: 1024, AttnDP: 1024, PP: 16}, expected: 1 << 34},
		{name: "dp, cp 2^32-1 (product saturates)", par: ParallelInfo{AttnCP: max32, AttnDP: max32, SystemDP: max32}, expected: math.MaxInt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				reg := h.registration(instance{addr: addrA}, 0, 0, 0, 0)
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
				n := allocated(func() { res, err = h.m.RegisterPrefill(reg) })
				t.Logf("RegisterPrefill(%+v): %d bytes allocated, err %v", p, n, err)
				if n > maxRegisterAlloc {
					t.Errorf("RegisterPrefill allocated %d bytes, want < %d", n, maxRegisterAlloc)
				}
				st := h.m.Status()
				if tc.expected == 0 {
					if err == nil {
						t.Fatalf("RegisterPrefill = %+v, want refused", res)
					}
					if !errors.Is(err, ErrPrefillMismatch) || (!strings.Contains(err.Error(), "decodeplane lists at most 65536") && !strings.Contains(err.Error(), "exceeds the model's")) {
						t.Errorf("RegisterPrefill = %v, want the mapping budget's or the PP-stage ErrPrefillMismatch", err)
					}
					if len(st.Prefills) != 0 {
						t.Errorf("a refused registration was stored: %+v", st.Prefills)
					}
					return
				}
				if err != nil {
					t.Fatalf("RegisterPrefill = %v", err)
				}
				if res.Registered != 1 || res.Expected != tc.expected {
					t.Errorf("registered %d of %d, want 1 of %d", res.Registered, res.Expected, tc.expected)
				}
				if len(st.Prefills) != 1 || st.Prefills[0].Expected != tc.expected {
					t.Errorf("Status().Prefills = %+v", st.Prefills)
				}
				// A second rank of the same instance costs as little.
				reg.Parallel.AttnTPRank, reg.Parallel.PPRank, reg.Parallel.AttnCPRank = 0, 0, 0
				reg.Parallel.AttnDPRank, reg.Parallel.SystemDPRank = 0, 0
				reg.Endpoint += "-2"
				if n := allocated(func() { res, err = h.m.RegisterPrefill(reg) }); err != nil || n > maxRegisterAlloc || res.Registered != 2 {
					t.Errorf("second rank: %+v, %v, %d bytes allocated", res, err, n)
				}
				// Never complete: rooms wait under SGLang's retry budget.
				if _, _, err := h.m.LookupDPRanks(addrA, []uint64{1}, nil); !errors.Is(err, ErrPrefillNotFound) {
					t.Errorf("LookupDPRanks on an incomplete instance = %v, want ErrPrefillNotFound", err)
				}
				if _, _, err := h.m.Heartbeat(RankID{Addr: addrA}, ""); err != nil {
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
				reg := h.registration(instance{addr: addrA}, 0, 0, 0, 0)
				tc.mod(&reg.Parallel)
				_, err := h.m.RegisterPrefill(reg)
				var inv *InvalidError
				if !errors.As(err, &inv) || inv.Field != tc.field {
					t.Fatalf("RegisterPrefill = %v, want InvalidError on %s", err, tc.field)
				}
				if st := h.m.Status(); len(st.Prefills) != 0 {
					t.Errorf("a refused registration was stored: %+v", st.Prefills)
				}
			})
		})
	}
}

// TestLargeAllowedInstanceCompletes: an instance at the wire's bounds
// (attn_tp 1024 × dp 64 = 65,536 ranks) completes its registration with an
// exact count; a room on it needs 1,024 ranks, keeps no per-rank state until
// a rank shows up, and succeeds once all of them claimed and sent.
func TestLargeAllowedInstanceCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("registers 65,536 ranks")
	}
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 1024, dp: 64}
		var res RegistrationResult
		all := ranksOf(in)
		for i, rk := range all {
			var err error
			res, err = h.m.RegisterPrefill(h.registration(in, rk.DP, rk.CP, rk.TP, rk.PP))
			if err != nil {
				t.Fatalf("RegisterPrefill(%s) = %v", rk, err)
			}
			if i < len(all)-1 && h.m.prefills[addrA].complete {
				t.Fatalf("complete after %d of 65536 ranks", i+1)
			}
		}
		if res.Registered != 65536 || res.Expected != 65536 || !h.m.prefills[addrA].complete {
			t.Fatalf("registered %d of %d (complete %v), want 65536 of 65536", res.Registered, res.Expected, h.m.prefills[addrA].complete)
		}
		var perRoom uint64
		for room := uint64(1); room <= 64; room++ {
			perRoom = max(perRoom, allocated(func() { h.open(addrA, room, func(r *OpenRequest) { r.PrefillDP = int(room % 64) }) }))
		}
		t.Logf("OpenRoom on a 1,024-rank plan: at most %d bytes allocated", perRoom)
		if perRoom > 64<<10 {
			t.Errorf("OpenRoom on a 1,024-rank plan allocated up to %d bytes, want < 64 KiB (nothing per required rank)", perRoom)
		}
		ranks := h.requiredRanks(1)
		if len(ranks) != 1024 {
			t.Fatalf("room 1 needs %d ranks, want 1024", len(ranks))
		}
		h.m.mu.Lock()
		seen := h.m.rooms[1].ranks.len()
		h.m.mu.Unlock()
		if seen != 0 {
			t.Errorf("room 1 holds progress for %d ranks before any claimed", seen)
		}
		for i, rk := range ranks {
			h.claim(1, rk)
			if p := h.snapshot(1).Phase; (p == PhaseClaimed) != (i == len(ranks)-1) {
				t.Fatalf("after %d of 1024 claims: phase %s", i+1, p)
			}
		}
		h.sendAll(1)
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		for room := uint64(2); room <= 64; room++ {
			h.m.AbortRoom(room, "")
		}
		h.assertClean()
	})
}

// TestModelFactsContradictingThePool: facts that contradict this decode pool
// are FailedPrecondition (ErrPrefillMismatch) listing every field; a
// kv_pool_kind that is no kind at all is InvalidArgument naming
// model.kv_pool_kind with the allowed values. Nothing is stored.
func TestModelFactsContradictingThePool(t *testing.T) {
	tests := []struct {
		name    string
		dec     func(*prealloc.Config)
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
		{name: "KV heads on an MLA pool", dec: mlaDecode(prealloc.KindMLA), model: ModelFacts{Kind: "mla", TotalKVHeads: 8},
			want: "the prefill's model does not match the decode KV pool: total_kv_heads 8 (decode: mla pool, one latent KV vector per token)"},
		{name: "head dim on an MLA pool", dec: mlaDecode(prealloc.KindMLA), model: ModelFacts{HeadDim: 128},
			want: "the prefill's model does not match the decode KV pool: head_dim 128 (decode: 576)"},
		{name: "GQA kind on a hybrid-mla pool", dec: mlaDecode(prealloc.KindHybridMLA), model: ModelFacts{Kind: "gqa", NumLayers: 61},
			want: `the prefill's model does not match the decode KV pool: kv_pool_kind "gqa" (decode: hybrid-mla), num_layers 61 (decode: 32)`},
		{name: "MLA facts that match", dec: mlaDecode(prealloc.KindMLA), model: ModelFacts{Kind: "MLA", NumLayers: 32, TotalKVHeads: 1, HeadDim: 576, KVLoraRank: 512, QKRopeHeadDim: 64}},
		{name: "GQA facts that match", model: ModelFacts{Kind: "gqa", NumLayers: 32, TotalKVHeads: 8, HeadDim: 128}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				reg := h.registration(instance{addr: addrA}, 0, 0, 0, 0)
				reg.Model = tc.model
				_, err := h.m.RegisterPrefill(reg)
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
				if n := len(h.m.Status().Prefills); (tc.want != "" || tc.invalid != "") && n != 0 {
					t.Errorf("a refused registration was stored (%d instances)", n)
				}
			})
		})
	}
}

// TestHeartbeatLivenessPerRank: liveness is per rank. Rank 0 of a TP 2
// instance keeps heartbeating, rank 1 stops: GetStatus names rank 1 once it
// missed an interval, and when it has been silent for max_failures (2) ×
// interval (5 s) the instance is dead; the rooms' failure and the log line
// name rank 1 and its silence, not rank 0.
func TestHeartbeatLivenessPerRank(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var logs bytes.Buffer
		h := newHarness(t, withRun(), withLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		h.open(addrA, 1)
		h.claimAll(1)
		r0 := RankID{Addr: addrA, TP: 0}
		for range 2 {
			advance(3 * time.Second)
			if _, _, err := h.m.Heartbeat(r0, ""); err != nil {
				t.Fatalf("Heartbeat(rank 0) = %v", err)
			}
		}
		// 6 s: rank 1 missed one interval, rank 0 none.
		st := h.m.Status()
		if len(st.Prefills) != 1 {
			t.Fatalf("prefills = %+v", st.Prefills)
		}
		p := st.Prefills[0]
		want := []SilentRank{{Rank: RankID{Addr: addrA, TP: 1}, Silent: 6 * time.Second, Missed: 1}}
		if p.SilentRankCount != 1 || len(p.SilentRanks) != 1 || p.SilentRanks[0] != want[0] {
			t.Errorf("silent ranks at 6s = %+v (%d), want %+v", p.SilentRanks, p.SilentRankCount, want)
		}
		advance(2 * time.Second)
		if _, _, err := h.m.Heartbeat(r0, ""); err != nil {
			t.Fatalf("Heartbeat(rank 0) = %v", err)
		}
		advance(1 * time.Second)
		h.wantPhase(1, PhaseClaimed) // 9 s
		advance(1 * time.Second)     // 10 s: the check (every 1.25 s) finds rank 1 silent for 10 s
		msg := "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 1 requests affected; silent ranks (no heartbeat within 2 × 5s): dp 0 cp 0 tp 1 pp 0 for 10s"
		if got := h.wantFailure(1, FailurePrefillLost, msg); got != msg {
			t.Errorf("failure = %q\nwant %q", got, msg)
		}
		if _, _, err := h.m.Heartbeat(r0, ""); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(rank 0) after the loss = %v, want ErrPrefillNotFound", err)
		}
		line := logs.String()
		if !strings.Contains(line, `msg="prefill instance lost: heartbeats stopped"`) || !strings.Contains(line, `silent_ranks="dp 0 cp 0 tp 1 pp 0 for 10s"`) || !strings.Contains(line, "silent_rank_count=1") {
			t.Errorf("log:\n%s\nwant the loss naming rank tp 1 and its silence", line)
		}
		h.assertClean()
	})
}

// TestHeartbeatLossListIsBounded: an instance whose 64 ranks all went silent
// fails its rooms with a message that lists 8 of them and counts the rest.
func TestHeartbeatLossListIsBounded(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun())
		in := instance{addr: addrA, tp: 64}
		h.register(in)
		h.open(addrA, 1)
		advance(10 * time.Second)
		got := h.wantFailure(1, FailurePrefillLost, "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 1 requests affected; silent ranks (no heartbeat within 2 × 5s): dp 0 cp 0 tp 0 pp 0 for 10s, ")
		var parts []string
		for tp := range 8 {
			parts = append(parts, fmt.Sprintf("dp 0 cp 0 tp %d pp 0 for 10s", tp))
		}
		if want := strings.Join(parts, ", ") + ", and 56 more"; !strings.HasSuffix(got, want) {
			t.Errorf("failure = %q, want it to end with %q", got, want)
		}
		h.assertClean()
	})
}

// referencePlan is the plan derived by enumerating rankMapping's lists (the
// derivation decodeplane used before the closed form): the closed form must
// agree with it on every topology.
func referencePlan(mapping []DecodeRankMapping, p PrefillTopology, decodeTP, totalHeads int, isMLA bool) (map[rankKey]*rankPlan, []rankKey) {
	perRank := map[rankKey]*rankPlan{}
	var order []rankKey
	for _, m := range mapping {
		for _, cp := range m.TargetCPRanks {
			for _, pp := range m.TargetPPRanks {
				for _, t := range m.TargetTPRanks {
					k := rankKey{CP: cp, TP: t, PP: pp}
					rp := perRank[k]
					if rp == nil {
						rp = &rankPlan{dummy: true, requiredDstInfoNum: m.RequiredDstInfoNum}
						perRank[k] = rp
						order = append(order, k)
					}
					dummy := false
					for _, d := range m.DummyTPRanks {
						dummy = dummy || d == t
					}
					tg := transfer.Target{DecodeTP: m.DecodeTP, Dummy: dummy}
					if !isMLA && !dummy {
						hs := ComputeHeadSliceParams(p.AttnTP, decodeTP, t, m.DecodeTP, totalHeads)
						tg.SrcHeadStart, tg.DstHeadStart, tg.NumHeads = hs.SrcHeadStart, hs.DstHeadStart, hs.NumHeads
					}
					rp.targets = append(rp.targets, tg)
					rp.dummy = rp.dummy && dummy
				}
			}
		}
	}
	var required []rankKey
	for _, pp := range upTo(0, p.PP) {
		for _, cp := range upTo(0, max(1, p.AttnCP)) {
			for _, tp := range upTo(0, p.AttnTP) {
				if rp := perRank[rankKey{CP: cp, TP: tp, PP: pp}]; rp != nil && !rp.dummy {
					required = append(required, rankKey{CP: cp, TP: tp, PP: pp})
				}
			}
		}
	}
	return perRank, required
}

// TestPlanClosedFormMatchesMapping sweeps topologies: the closed-form plan
// (one rank at a time, and enumerated once complete) equals the plan
// enumerated from SGLang's rank mapping.
func TestPlanClosedFormMatchesMapping(t *testing.T) {
	n := 0
	for _, D := range []int{1, 2, 4, 8} {
		for _, P := range []int{1, 2, 4, 8, 16} {
			if D%P != 0 && P%D != 0 {
				continue
			}
			for _, cp := range []int{1, 2, 3} {
				for _, pp := range []int{1, 2, 3} {
					for _, isMLA := range []bool{false, true} {
						for _, allCP := range []bool{false, true} {
							for _, dsa := range []bool{false, true} {
								topo := PrefillTopology{AttnTP: P, AttnCP: cp, DP: 2, PP: pp, DSACacheLayerSplit: dsa}
								mapping, err := rankMapping(D, 1, isMLA, allCP, topo)
								if err != nil {
									t.Fatal(err)
								}
								wantRanks, wantRequired := referencePlan(mapping, topo, D, 8, isMLA)
								plan := newPlan(topo, D, 8, isMLA, allCP, false)
								name := fmt.Sprintf("D %d P %d cp %d pp %d mla %v allCP %v dsa %v", D, P, cp, pp, isMLA, allCP, dsa)
								for c := range cp + 1 {
									for tp := range P + 1 {
										for p := range pp + 1 {
											k := rankKey{CP: c, TP: tp, PP: p}
											if diff := cmp.Diff(wantRanks[k], plan.rankPlan(k), cmp.AllowUnexported(rankPlan{})); diff != "" {
												t.Fatalf("%s: rank %+v before completion (-want +got):\n%s", name, k, diff)
											}
										}
									}
								}
								plan.enumerate()
								if diff := cmp.Diff(wantRanks, plan.perRank, cmp.AllowUnexported(rankPlan{}, rankKey{})); diff != "" {
									t.Fatalf("%s: perRank (-want +got):\n%s", name, diff)
								}
								if diff := cmp.Diff(wantRequired, plan.required, cmp.AllowUnexported(rankKey{})); diff != "" {
									t.Fatalf("%s: required (-want +got):\n%s", name, diff)
								}
								n++
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d topologies agree", n)
}

// TestIncompleteInstancesRetainLittle: what an instance keeps does not grow
// with its parallel sizes. 1,000 instances of attn_tp × attn_cp × dp × pp =
// 1024^4 on an all-CP MLA pool (where SGLang's mapping lists every TP, CP
// and PP rank) each register one rank; the heap they retain is measured
// after a GC.
func TestIncompleteInstancesRetainLittle(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(mlaDecode(prealloc.KindHybridMLA)))
		heap := func() uint64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		const n = 1000
		before := heap()
		for i := range n {
			reg := h.registration(instance{addr: fmt.Sprintf("10.1.%d.%d:8998", i/250, i%250), tp: 1024, cp: 1024, dp: 1024, pp: 16}, 0, 0, 0, 0)
			if _, err := h.m.RegisterPrefill(reg); err != nil {
				t.Fatalf("RegisterPrefill: %v", err)
			}
		}
		after := heap()
		per := (int64(after) - int64(before)) / n
		t.Logf("an incomplete 1024^4 instance retains %d bytes", per)
		if per > 4<<10 {
			t.Errorf("an incomplete 1024^4 instance retains %d bytes, want < 4 KiB (nothing sized by its parallel sizes)", per)
		}
		if st := h.m.Status(); len(st.Prefills) != n {
			t.Errorf("%d instances known, want %d", len(st.Prefills), n)
		}
	})
}
