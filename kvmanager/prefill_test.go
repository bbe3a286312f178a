package kvmanager

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

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

// registryObserver records the registry-side observer calls.
type registryObserver struct {
	NopObserver
	mu         sync.Mutex
	registered []bool // PrefillRegistered's replaced, in order
	resolvedN  map[DPRule]int
	missed     map[string]int
}

func (o *registryObserver) PrefillRegistered(_ string, replaced bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.registered = append(o.registered, replaced)
}

func (o *registryObserver) DPRankResolvedN(rule DPRule, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.resolvedN[rule] += n
}

func (o *registryObserver) HeartbeatMissed(addr string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.missed[addr]++
}

// TestRegistryThroughManager: the manager's registry calls keep their
// contract — the registry's field errors come out as the manager's
// InvalidError (same field, same text), the heartbeat policy is the
// effective one (SGLang's floors), and the observer hears the registrations,
// the lookups' counts by rule and the missed heartbeats.
func TestRegistryThroughManager(t *testing.T) {
	bubble(t, func(t *testing.T) {
		obs := &registryObserver{resolvedN: map[DPRule]int{}, missed: map[string]int{}}
		h := newHarness(t, withRun(), withObserver(obs), withConfig(func(c *Config) { c.Timeouts.HeartbeatInterval = time.Second }))
		bad := h.registration(instance{addr: addrA}, 0, 0, 1, 0)
		var inv *InvalidError
		if _, err := h.m.RegisterPrefill(bad); !errors.As(err, &inv) || inv.Field != "parallel.attn_tp_rank" || err.Error() != "parallel.attn_tp_rank: 1 is outside parallel.attn_tp_size 1 (allowed 0..0)" {
			t.Errorf("RegisterPrefill(rank outside layout) = %v, want the manager's InvalidError on parallel.attn_tp_rank", err)
		}
		in := instance{addr: addrA, dp: 2, lb: "round_robin"}
		res := h.register(in)
		if res.HeartbeatInterval != 2*time.Second || res.MaxFailures != 2 {
			t.Errorf("RegisterPrefill's policy = %s × %d, want the 2s floor × 2", res.HeartbeatInterval, res.MaxFailures)
		}
		moved := in
		moved.endpoint = "tcp://moved"
		if _, err := h.m.RegisterPrefill(h.registration(moved, 1, 0, 0, 0)); err != nil {
			t.Fatal(err)
		}
		if iv, mf, err := h.m.Heartbeat(RankID{Addr: addrA, DP: 1}, ""); err != nil || iv != 2*time.Second || mf != 2 {
			t.Errorf("Heartbeat = %s, %d, %v; want 2s, 2", iv, mf, err)
		}
		if _, _, err := h.m.LookupDPRanks(addrA, []uint64{1}, map[uint64]int{1: 2}); !errors.As(err, &inv) || inv.Field != "hints" {
			t.Errorf("LookupDPRanks(hint out of range) = %v, want the manager's InvalidError on hints", err)
		}
		if _, err := h.m.BindRoom(addrA, 10, 1); err != nil {
			t.Fatal(err)
		}
		if res, un, err := h.m.LookupDPRanks(addrA, []uint64{10, 11, 12}, map[uint64]int{11: 0}); err != nil || len(res) != 2 || !cmp.Equal(un, []uint64{12}) {
			t.Fatalf("LookupDPRanks = %+v, %v, %v", res, un, err)
		}
		advance(2 * time.Second) // one interval: both ranks missed one (rank 1 heartbeat at 0s)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if want := []bool{false, false, true}; !cmp.Equal(obs.registered, want) {
			t.Errorf("PrefillRegistered(replaced) = %v, want %v", obs.registered, want)
		}
		if want := map[DPRule]int{DPRuleBinding: 1, DPRuleHint: 1}; !cmp.Equal(obs.resolvedN, want) {
			t.Errorf("DPRankResolvedN = %v, want %v (none for the refused lookup)", obs.resolvedN, want)
		}
		if obs.missed[addrA] != 2 {
			t.Errorf("HeartbeatMissed(%s) = %d, want 2 (one per rank)", addrA, obs.missed[addrA])
		}
	})
}
