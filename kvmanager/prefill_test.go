package kvmanager

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/prealloc"
)

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
		dec  func(*prealloc.Config)
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
			name: "auto dtype against fp8", dec: func(c *prealloc.Config) { c.Pool.DType = "fp8_e4m3" }, mod: func(r *Registration) { r.KVDType = "auto" },
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
			name: "MLA model facts", dec: mlaDecode(prealloc.KindMLA), mod: func(r *Registration) { r.Model = ModelFacts{Kind: "mla", KVLoraRank: 512, QKRopeHeadDim: 32} },
			want: "the prefill's model does not match the decode KV pool: kv_lora_rank + qk_rope_head_dim 544 (decode: 576)",
		},
		{
			name: "TP sizes that do not divide", dec: func(c *prealloc.Config) { c.Parallel.AttnTP = 2 }, mod: func(r *Registration) { r.Parallel.AttnTP = 3 },
			want: "prefill attn_tp_size=3 and decode attn_tp_size=2: one must divide the other for the rank mapping",
		},
		{
			name: "decode PP neither equal nor 1", dec: func(c *prealloc.Config) { c.Parallel.PP = 2 }, mod: func(r *Registration) { r.Parallel.PP = 4 },
			want: "decode pp_size=2 must equal the prefill's pp_size=4 or be 1",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				reg := h.registration(instance{addr: addrA}, 0, 0, 0, 0)
				tc.mod(&reg)
				_, err := h.m.RegisterPrefill(reg)
				if tc.want == "" {
					if err != nil {
						t.Fatalf("RegisterPrefill = %v, want nil", err)
					}
					return
				}
				if got := mismatchText(t, err); got != tc.want {
					t.Errorf("RegisterPrefill error:\n got %q\nwant %q", got, tc.want)
				}
				if st := h.m.Status(); len(st.Prefills) != 0 {
					t.Errorf("a refused registration was stored: %+v", st.Prefills)
				}
			})
		})
	}
}

func TestRegisterPrefillLayoutConflict(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, tp: 2}
		if _, err := h.m.RegisterPrefill(h.registration(in, 0, 0, 0, 0)); err != nil {
			t.Fatalf("RegisterPrefill(rank 0) = %v", err)
		}
		other := h.registration(instance{addr: addrA, tp: 4}, 0, 0, 1, 0)
		if _, err := h.m.RegisterPrefill(other); !errors.Is(err, ErrPrefillMismatch) {
			t.Errorf("RegisterPrefill(other layout) = %v, want ErrPrefillMismatch", err)
		}
		lb := h.registration(in, 0, 0, 1, 0)
		lb.LoadBalanceMethod = "round_robin"
		if _, err := h.m.RegisterPrefill(lb); !errors.Is(err, ErrPrefillMismatch) {
			t.Errorf("RegisterPrefill(other load_balance_method) = %v, want ErrPrefillMismatch", err)
		}
	})
}

func TestRegistrationResultRankView(t *testing.T) {
	tests := []struct {
		name string
		dec  func(*prealloc.Config)
		inst instance
		rank RankID
		want RegistrationResult
	}{
		{
			name: "MLA real source", dec: mlaDecode(prealloc.KindMLA), inst: instance{addr: addrA, tp: 4}, rank: RankID{TP: 0},
			want: RegistrationResult{ServesDecodeTP: []int{0}, RequiredDstInfoNum: 1},
		},
		{
			name: "MLA dummy", dec: mlaDecode(prealloc.KindMLA), inst: instance{addr: addrA, tp: 4}, rank: RankID{TP: 3},
			want: RegistrationResult{ServesDecodeTP: []int{0}, Dummy: true, RequiredDstInfoNum: 1},
		},
		{
			name: "prefill TP 1 serves decode TP 4", dec: func(c *prealloc.Config) { c.Parallel.AttnTP = 4 }, inst: instance{addr: addrA}, rank: RankID{},
			want: RegistrationResult{ServesDecodeTP: []int{0, 1, 2, 3}, RequiredDstInfoNum: 4},
		},
		{
			name: "staging for heterogeneous GQA", dec: func(c *prealloc.Config) { c.Staging.Enabled = true }, inst: instance{addr: addrA, tp: 2}, rank: RankID{TP: 1},
			want: RegistrationResult{ServesDecodeTP: []int{0}, RequiredDstInfoNum: 1, Staging: true},
		},
		{
			// CP 2 without all-CP transfer: only CP rank 0 is addressed.
			name: "prefill CP rank beyond 0", inst: instance{addr: addrA, cp: 2}, rank: RankID{CP: 1},
			want: RegistrationResult{Dummy: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(tc.dec))
				h.register(tc.inst) // completes the instance
				res, err := h.m.RegisterPrefill(h.registration(tc.inst, tc.rank.DP, tc.rank.CP, tc.rank.TP, tc.rank.PP))
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

func TestT5ReregistrationWithNewEndpointFailsDPGroup(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := instance{addr: addrA, dp: 2}
		h.register(in)
		h.open(addrA, 4) // dp 0
		h.complete(4)    // Success: unaffected
		h.open(addrA, 2) // dp 0
		h.claimAll(2)
		h.open(addrA, 3) // dp 1
		// Same endpoint again: idempotent.
		res, err := h.m.RegisterPrefill(h.registration(in, 0, 0, 0, 0))
		if err != nil || res.Replaced || res.RoomsFailed != 0 {
			t.Fatalf("RegisterPrefill(same endpoint) = %+v, %v; want no replacement", res, err)
		}
		h.wantPhase(2, PhaseClaimed)
		moved := h.registration(instance{addr: addrA, dp: 2, endpoint: "tcp://restarted"}, 0, 0, 0, 0)
		res, err = h.m.RegisterPrefill(moved)
		if err != nil || !res.Replaced || res.RoomsFailed != 1 {
			t.Fatalf("RegisterPrefill(new endpoint) = %+v, %v; want replaced with 1 room failed", res, err)
		}
		want := "Prefill server with bootstrap_addr: 10.0.0.1:8998 is healthy before, but now it is down: rank 10.0.0.1:8998[dp 0 cp 0 tp 0 pp 0] re-registered with a new endpoint (tcp://rank-0-0-0-0 -> tcp://restarted-0-0-0-0). Requests bound to the old registration have been marked as failed."
		if msg := h.wantFailure(2, FailurePrefillLost, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		h.wantPhase(3, PhaseAdmitted)
		h.wantPhase(4, PhaseSucceeded)
		h.complete(3)
		for _, room := range []uint64{3, 4} {
			h.release(room)
		}
		h.assertClean()
	})
}

func TestNewInstanceIDReplacesInstance(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		gen1 := instance{addr: addrA, tp: 2, instanceID: "gen-1"}
		gen2 := instance{addr: addrA, tp: 2, instanceID: "gen-2", endpoint: "tcp://gen2"}
		h.register(gen1)
		h.open(addrA, 1)
		h.claimAll(1)
		h.open(addrA, 2)
		h.complete(2)
		res, err := h.m.RegisterPrefill(h.registration(gen2, 0, 0, 0, 0))
		if err != nil || !res.Replaced || res.RoomsFailed != 1 || res.Registered != 1 || res.Expected != 2 {
			t.Fatalf("RegisterPrefill(gen-2 rank 0) = %+v, %v; want replaced, 1 room failed, 1 of 2 registered", res, err)
		}
		want := "prefill instance 10.0.0.1:8998 was replaced (instance id gen-1 -> gen-2)"
		if msg := h.wantFailure(1, FailurePrefillLost, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		h.wantPhase(2, PhaseSucceeded)
		if _, _, err := h.m.Heartbeat(RankID{Addr: addrA, TP: 0}, "gen-1"); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(old instance) = %v, want ErrPrefillNotFound", err)
		}
		if _, _, err := h.m.Heartbeat(RankID{Addr: addrA, TP: 1}, "gen-1"); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(rank not yet re-registered) = %v, want ErrPrefillNotFound", err)
		}
		if iv, mf, err := h.m.Heartbeat(RankID{Addr: addrA, TP: 0}, "gen-2"); err != nil || iv != 5*time.Second || mf != 2 {
			t.Errorf("Heartbeat(new instance) = %s, %d, %v", iv, mf, err)
		}
		// New rooms wait for the new instance to complete.
		h.open(addrA, 3)
		h.wantPhase(3, PhaseWaitingPrefill)
		if _, err := h.m.RegisterPrefill(h.registration(gen2, 0, 0, 1, 0)); err != nil {
			t.Fatalf("RegisterPrefill(gen-2 rank 1) = %v", err)
		}
		h.complete(3)
		h.release(2)
		h.release(3)
		h.assertClean()
	})
}

func TestHeartbeatUnknown(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		if _, _, err := h.m.Heartbeat(RankID{Addr: addrA}, ""); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(unknown instance) = %v, want ErrPrefillNotFound", err)
		}
		h.register(instance{addr: addrA})
		if _, _, err := h.m.Heartbeat(RankID{Addr: addrA, TP: 1}, ""); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(unknown rank) = %v, want ErrPrefillNotFound", err)
		}
	})
}

func TestBindRoomFollowBootstrapRoomConflict(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA, dp: 4})
		h.open(addrA, 5) // 5 % 4 = 1
		h.wantPhase(5, PhaseAdmitted)
		// The prefill scheduled the room on dp 0: SGLang's prefill fails it.
		want := "follow_bootstrap_room conflict: dispatched to dp_rank 0 but bootstrap_room 5 implies dp_rank 1. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing."
		_, err := h.m.BindRoom(addrA, 5, 0)
		if !errors.Is(err, ErrDPRankConflict) || err.Error() != ErrDPRankConflict.Error()+": "+want {
			t.Errorf("BindRoom = %v, want ErrDPRankConflict: %s", err, want)
		}
		if msg := h.wantFailure(5, FailureDPRankConflict, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		// A room not open yet: refused, nothing stored.
		if _, err := h.m.BindRoom(addrA, 6, 0); !errors.Is(err, ErrDPRankConflict) {
			t.Errorf("BindRoom(unopened room) = %v, want ErrDPRankConflict", err)
		}
		// The rank room % dp_size implies is accepted.
		if replaced, err := h.m.BindRoom(addrA, 6, 2); err != nil || replaced {
			t.Errorf("BindRoom(6, 2) = %v, %v; want accepted", replaced, err)
		}
		var inv *InvalidError
		if _, err := h.m.BindRoom(addrA, 7, 4); !errors.As(err, &inv) || inv.Field != "dp_rank" {
			t.Errorf("BindRoom(dp 4 of 4) = %v, want InvalidError on dp_rank", err)
		}
		if _, err := h.m.BindRoom(addrB, 7, 0); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("BindRoom(unknown instance) = %v, want ErrPrefillNotFound", err)
		}
		h.assertClean()
	})
}

func TestBindRoomForceQuery(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withConfig(func(c *Config) { c.DPRank.ForceQuery = true }))
		h.register(instance{addr: addrA, dp: 4})
		if replaced, err := h.m.BindRoom(addrA, 5, 0); err != nil || replaced {
			t.Fatalf("BindRoom(5, 0) = %v, %v; want accepted (mixed routing allowed)", replaced, err)
		}
		if replaced, err := h.m.BindRoom(addrA, 5, 2); err != nil || !replaced {
			t.Fatalf("BindRoom(5, 2) = %v, %v; want replaced", replaced, err)
		}
		h.open(addrA, 5)
		if s := h.wantPhase(5, PhaseAdmitted); s.PrefillDP != 2 || s.DPRule != DPRuleBinding {
			t.Errorf("room resolved to dp %d (%s), want 2 (binding)", s.PrefillDP, s.DPRule)
		}
		// A binding that contradicts the room's resolution fails the room.
		_, err := h.m.BindRoom(addrA, 5, 3)
		if !errors.Is(err, ErrDPRankConflict) {
			t.Fatalf("BindRoom(5, 3) after resolution = %v, want ErrDPRankConflict", err)
		}
		h.wantFailure(5, FailureDPRankConflict, "prefill DP rank 3 reported holding room 5, but the room was resolved to dp_rank 2 (binding)")
		h.assertClean()
	})
}

func TestLookupDPRanks(t *testing.T) {
	tests := []struct {
		name           string
		inst           instance
		force          bool
		binds          map[uint64]int
		rooms          []uint64
		hints          map[uint64]int
		wait           time.Duration // before the lookup
		want           []DPResolution
		wantUnresolved []uint64
	}{
		{
			name: "single dp", inst: instance{addr: addrA, lb: "round_robin"}, rooms: []uint64{7, 8},
			want: []DPResolution{{Room: 7, DP: 0, Rule: DPRuleSingleDP}, {Room: 8, DP: 0, Rule: DPRuleSingleDP}},
		},
		{
			name: "follow room", inst: instance{addr: addrA, dp: 4}, rooms: []uint64{7, 8}, hints: map[uint64]int{8: 3},
			want: []DPResolution{{Room: 7, DP: 3, Rule: DPRuleFollowRoom}, {Room: 8, DP: 3, Rule: DPRuleHint}},
		},
		{
			name: "bindings and unresolved", inst: instance{addr: addrA, dp: 4, lb: "round_robin"}, binds: map[uint64]int{10: 2},
			rooms: []uint64{10, 11, 12}, hints: map[uint64]int{12: 1},
			want:           []DPResolution{{Room: 10, DP: 2, Rule: DPRuleBinding}, {Room: 12, DP: 1, Rule: DPRuleHint}},
			wantUnresolved: []uint64{11},
		},
		{
			name: "force query ignores room % dp", inst: instance{addr: addrA, dp: 4}, force: true, binds: map[uint64]int{10: 1},
			rooms: []uint64{10, 11}, want: []DPResolution{{Room: 10, DP: 1, Rule: DPRuleBinding}}, wantUnresolved: []uint64{11},
		},
		{
			// SGLang's server-side entry lives 120–240 s; here binding_ttl.
			name: "expired binding", inst: instance{addr: addrA, dp: 4, lb: "round_robin"}, binds: map[uint64]int{10: 2},
			rooms: []uint64{10}, wait: 120 * time.Second, wantUnresolved: []uint64{10},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withConfig(func(c *Config) { c.DPRank.ForceQuery = tc.force }))
				h.register(tc.inst)
				for room, dp := range tc.binds {
					if _, err := h.m.BindRoom(tc.inst.addr, room, dp); err != nil {
						t.Fatalf("BindRoom(%d, %d) = %v", room, dp, err)
					}
				}
				advance(tc.wait)
				res, unresolved, err := h.m.LookupDPRanks(tc.inst.addr, tc.rooms, tc.hints)
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
			in := instance{addr: addrA, dp: 2}
			if _, err := h.m.RegisterPrefill(h.registration(in, 0, 0, 0, 0)); err != nil {
				t.Fatal(err)
			}
			if _, _, err := h.m.LookupDPRanks(addrA, []uint64{1}, nil); !errors.Is(err, ErrPrefillNotFound) {
				t.Errorf("LookupDPRanks(incomplete instance) = %v, want ErrPrefillNotFound", err)
			}
			h.register(in)
			var inv *InvalidError
			if _, _, err := h.m.LookupDPRanks(addrA, []uint64{1}, map[uint64]int{1: 2}); !errors.As(err, &inv) || inv.Field != "hints" {
				t.Errorf("LookupDPRanks(hint out of range) = %v, want InvalidError on hints", err)
			}
		})
	})
}

func TestStatus(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withShards(2))
		in := instance{addr: addrA, tp: 2}
		h.register(in)
		h.open(addrA, 1)
		h.open(addrA, 2)
		h.open(addrB, 3)
		advance(7 * time.Second)
		st := h.m.Status()
		want := map[Phase]int{PhaseAdmitted: 2, PhaseWaitingPrefill: 1}
		if diff := cmp.Diff(want, st.RoomsByPhase); diff != "" {
			t.Errorf("RoomsByPhase (-want +got):\n%s", diff)
		}
		if len(st.Shards) != 2 || st.Shards[0].Admitted+st.Shards[1].Admitted != 2 || st.Draining {
			t.Errorf("shards = %+v, draining %v", st.Shards, st.Draining)
		}
		if len(st.Prefills) != 1 {
			t.Fatalf("prefills = %+v, want 1", st.Prefills)
		}
		p := st.Prefills[0]
		if p.Addr != addrA || p.Registered != 2 || p.Expected != 2 || p.ActiveRooms != 2 || p.MissedHeartbeats != 1 || p.Topology.AttnTP != 2 {
			t.Errorf("prefill status = %+v", p)
		}
		for _, room := range []uint64{1, 2, 3} {
			h.m.AbortRoom(room, "")
		}
		h.assertClean()
	})
}

// TestT2HintOutOfRangeOnceRegistered: a router hint beyond the prefill's
// dp_size, seen only when the instance completes its registration (T4),
// fails the room instead of resolving it (T2).
func TestT2HintOutOfRangeOnceRegistered(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.open(addrA, 1, func(r *OpenRequest) { r.PrefillDP = 5 })
		h.wantPhase(1, PhaseWaitingPrefill)
		h.register(instance{addr: addrA, dp: 2})
		want := "disagg_prefill_dp_rank 5 is out of range for 10.0.0.1:8998 (dp_size 2)"
		if msg := h.wantFailure(1, FailureDPRankUnresolved, want); msg != want {
			t.Errorf("failure = %q, want %q", msg, want)
		}
		h.assertClean()
	})
}
