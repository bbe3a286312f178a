package registry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRegisterEvents: each accepted registration says what happened, in
// order — the rank registered, and the instance complete (with its complete
// plan) on the last rank; a refused one changes nothing and says nothing.
func TestRegisterEvents(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := prefill{addr: addrA, tp: 2}
		_, evs, err := h.g.Register(h.registration(in, 0, 0, 0, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := kinds(evs), []EventKind{RankRegistered}; !slices.Equal(got, want) {
			t.Fatalf("first rank: events %v, want %v", got, want)
		}
		if e := evs[0]; e.Addr != addrA || e.Rank != (RankID{Addr: addrA}) || e.Replaced {
			t.Errorf("RankRegistered = %+v", e)
		}
		if inst, ok := h.g.Instance(addrA); !ok || inst.Complete || inst.Plan.Required() != nil {
			t.Errorf("Instance after one of two ranks = %+v, %v; want known, incomplete, nothing enumerated", inst, ok)
		}
		_, evs, err = h.g.Register(h.registration(in, 0, 0, 1, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := kinds(evs), []EventKind{RankRegistered, InstanceComplete}; !slices.Equal(got, want) {
			t.Fatalf("last rank: events %v, want %v", got, want)
		}
		done := evs[1].Instance
		if done.Addr != addrA || !done.Complete || done.Registered != 2 || done.Expected != 2 || done.Topology.AttnTP != 2 || !done.Topology.FollowBootstrapRoom {
			t.Errorf("InstanceComplete.Instance = %+v", done)
		}
		if diff := cmp.Diff([]RankKey{{TP: 0}, {TP: 1}}, done.Plan.Required()); diff != "" {
			t.Errorf("complete plan's required ranks (-want +got):\n%s", diff)
		}
		// Registering a rank again (same endpoint) is idempotent: no completion again.
		_, evs, err = h.g.Register(h.registration(in, 0, 0, 1, 0))
		if err != nil || !slices.Equal(kinds(evs), []EventKind{RankRegistered}) || evs[0].Replaced {
			t.Errorf("same rank again: %v, events %+v; want one RankRegistered, not replaced", err, evs)
		}
		// A Checked that did not come from Check: refused, nothing recorded.
		if _, evs, err := h.g.Record(Checked{}); err == nil || evs != nil {
			t.Errorf("Record(zero Checked) = %v, events %+v; want an error and none", err, evs)
		}
		// A refused registration: an error and no event.
		bad := h.registration(prefill{addr: addrA, tp: 4}, 0, 0, 3, 0)
		if _, evs, err := h.g.Register(bad); !errors.Is(err, ErrPrefillMismatch) || evs != nil {
			t.Errorf("other layout: %v, events %+v; want ErrPrefillMismatch and none", err, evs)
		}
	})
}

// TestRegisterReplacementEvents: a new endpoint for a known rank is
// RankReplaced (naming the rank, with SGLang's message) before the rank's
// RankRegistered; a new instance id is InstanceReplaced, and the old
// instance's ranks and bindings are forgotten at once.
func TestRegisterReplacementEvents(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withForceQuery(true))
		in := prefill{addr: addrA, dp: 2, instanceID: "one"}
		h.register(in)
		moved := in
		moved.endpoint = "tcp://moved"
		res, evs, err := h.g.Register(h.registration(moved, 1, 0, 0, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := kinds(evs), []EventKind{RankReplaced, RankRegistered}; !slices.Equal(got, want) {
			t.Fatalf("new endpoint: events %v, want %v", got, want)
		}
		want := "Prefill server with bootstrap_addr: 10.0.0.1:8998 is healthy before, but now it is down: rank 10.0.0.1:8998[dp 1 cp 0 tp 0 pp 0] re-registered with a new endpoint (tcp://rank-1-0-0-0 -> tcp://moved-1-0-0-0). Requests bound to the old registration have been marked as failed."
		if e := evs[0]; e.Rank != (RankID{Addr: addrA, DP: 1}) || e.Message != want {
			t.Errorf("RankReplaced = %+v\nwant rank dp 1 and message %q", e, want)
		}
		if !res.Replaced || !evs[1].Replaced || res.RoomsFailed != 0 {
			t.Errorf("result %+v, RankRegistered %+v: want replaced, no room counted by the registry", res, evs[1])
		}
		if _, _, err := h.g.BindRoom(addrA, 9, 1); err != nil {
			t.Fatal(err)
		}
		next := prefill{addr: addrA, dp: 2, instanceID: "two"}
		res, evs, err = h.g.Register(h.registration(next, 0, 0, 0, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := kinds(evs), []EventKind{InstanceReplaced, RankRegistered}; !slices.Equal(got, want) {
			t.Fatalf("new instance id: events %v, want %v", got, want)
		}
		if msg := evs[0].Message; msg != "prefill instance 10.0.0.1:8998 was replaced (instance id one -> two)" {
			t.Errorf("InstanceReplaced message = %q", msg)
		}
		if res.Registered != 1 || res.Expected != 2 || !res.Replaced {
			t.Errorf("result = %+v, want 1 of 2 registered, replaced", res)
		}
		// The old instance's rank 1 is gone, and so is its binding.
		if _, _, err := h.g.Heartbeat(RankID{Addr: addrA, DP: 1}, "one"); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("Heartbeat(old rank) = %v, want ErrPrefillNotFound", err)
		}
		h.register(next)
		if _, un, err := h.lookup(addrA, []uint64{9}, nil); err != nil || !slices.Equal(un, []uint64{9}) {
			t.Errorf("lookup of the old instance's binding = %v, unresolved %v; want it forgotten", err, un)
		}
	})
}

// TestCheckLivenessEvents: each check counts once per rank whose missed
// intervals grew (HeartbeatMissed), and a rank silent for max_failures
// intervals loses its instance (InstanceLost naming the silent rank) and its
// bindings.
func TestCheckLivenessEvents(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withForceQuery(true))
		h.register(prefill{addr: addrA, tp: 2, dp: 2})
		h.register(prefill{addr: addrB})
		if _, _, err := h.g.BindRoom(addrA, 3, 1); err != nil {
			t.Fatal(err)
		}
		if evs := h.g.CheckLiveness(); len(evs) != 0 {
			t.Fatalf("check at 0s: %+v, want nothing", evs)
		}
		r0 := RankID{Addr: addrA, DP: 0, TP: 0}
		// tick is one check period (a quarter of the 5 s interval, as the
		// Manager checks): every rank but r0 beats, then the check.
		tick := func() []Event {
			advance(1250 * time.Millisecond)
			for _, rk := range append(ranksOf(prefill{addr: addrA, tp: 2, dp: 2})[1:], RankID{Addr: addrB}) {
				if _, _, err := h.g.Heartbeat(rk, ""); err != nil {
					t.Fatalf("Heartbeat(%s) = %v", rk, err)
				}
			}
			return h.g.CheckLiveness()
		}
		for i := range 3 {
			if evs := tick(); len(evs) != 0 {
				t.Fatalf("check %d: %+v, want nothing", i+1, evs)
			}
		}
		evs := tick() // 5 s: r0 missed an interval
		want := []Event{{Kind: HeartbeatMissed, Addr: addrA, Count: 1}}
		if diff := cmp.Diff(want, evs); diff != "" {
			t.Fatalf("check at 5s (-want +got):\n%s", diff)
		}
		if evs := h.g.CheckLiveness(); len(evs) != 0 {
			t.Errorf("second check at 5s: %+v, want nothing (an interval counts once)", evs)
		}
		for i := range 3 {
			if evs := tick(); len(evs) != 0 {
				t.Fatalf("check at %v: %+v, want nothing", time.Duration(5000+1250*(i+1))*time.Millisecond, evs)
			}
		}
		evs = tick() // r0 silent 10 s = 2 × 5 s
		if got, want := kinds(evs), []EventKind{HeartbeatMissed, InstanceLost}; !slices.Equal(got, want) {
			t.Fatalf("check at 10s: events %v, want %v", got, want)
		}
		lost := evs[1]
		if lost.Addr != addrA || lost.SilentTotal != 1 || len(lost.Silent) != 1 || lost.Silent[0].Rank != r0 || lost.Silent[0].Missed != 2 {
			t.Errorf("InstanceLost = %+v, want rank %s, 2 intervals missed", lost, r0)
		}
		msg := "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 3 requests affected; silent ranks (no heartbeat within 2 × 5s): dp 0 cp 0 tp 0 pp 0 for 10s"
		if got := lost.LostMessage(3); got != msg {
			t.Errorf("LostMessage(3) = %q\nwant %q", got, msg)
		}
		if _, ok := h.g.Instance(addrA); ok {
			t.Error("the lost instance is still known")
		}
		if _, ok := h.g.Instance(addrB); !ok {
			t.Error("the live instance was forgotten")
		}
		if _, _, err := h.g.BindRoom(addrA, 3, 1); !errors.Is(err, ErrPrefillNotFound) {
			t.Errorf("BindRoom on the lost instance = %v, want ErrPrefillNotFound", err)
		}
		h.register(prefill{addr: addrA, tp: 2, dp: 2})
		if _, un, err := h.lookup(addrA, []uint64{3}, nil); err != nil || !slices.Equal(un, []uint64{3}) {
			t.Errorf("lookup after re-registration = %v, unresolved %v; want the old binding forgotten", err, un)
		}
	})
}

// TestBindRoomEvents: an accepted binding is RoomBound; a follow-room
// conflict is BindConflict with SGLang's message and records nothing; other
// refusals carry no event.
func TestBindRoomEvents(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(prefill{addr: addrA, dp: 4})
		replaced, ev, err := h.g.BindRoom(addrA, 5, 1)
		if err != nil || replaced || !cmp.Equal(ev, Event{Kind: RoomBound, Addr: addrA, Room: 5, DP: 1}) {
			t.Errorf("BindRoom(5, 1) = %v, %+v, %v; want RoomBound", replaced, ev, err)
		}
		_, ev, err = h.g.BindRoom(addrA, 5, 0)
		want := "follow_bootstrap_room conflict: dispatched to dp_rank 0 but bootstrap_room 5 implies dp_rank 1. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing."
		if !errors.Is(err, ErrDPRankConflict) || ev.Kind != BindConflict || ev.Room != 5 || ev.Message != want || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("BindRoom(5, 0) = %+v, %v; want BindConflict with %q", ev, err, want)
		}
		var inv *InvalidError
		if _, ev, err := h.g.BindRoom(addrA, 5, 4); !errors.As(err, &inv) || inv.Field != "dp_rank" || ev.Kind != 0 {
			t.Errorf("BindRoom(dp 4 of 4) = %+v, %v; want InvalidError on dp_rank, no event", ev, err)
		}
		if _, ev, err := h.g.BindRoom(addrB, 5, 0); !errors.Is(err, ErrPrefillNotFound) || ev.Kind != 0 {
			t.Errorf("BindRoom(unknown instance) = %+v, %v; want ErrPrefillNotFound, no event", ev, err)
		}
	})
}

// TestExpireBindings: a binding resolves its room until binding_ttl, and the
// sweep forgets it after.
func TestExpireBindings(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		in := prefill{addr: addrA, dp: 2, lb: "round_robin"}
		h.register(in)
		topo := PrefillTopology{AttnTP: 1, AttnCP: 1, DP: 2, PP: 1}
		if _, _, err := h.g.BindRoom(addrA, 7, 1); err != nil {
			t.Fatal(err)
		}
		advance(119 * time.Second)
		h.g.ExpireBindings()
		if dp, rule, ok := h.g.ResolveDP(addrA, 7, -1, topo); !ok || dp != 1 || rule != DPRuleBinding {
			t.Errorf("ResolveDP at 119s = %d, %s, %v; want 1 by binding", dp, rule, ok)
		}
		advance(time.Second)
		h.g.ExpireBindings()
		h.g.mu.Lock()
		n := len(h.g.bindings)
		h.g.mu.Unlock()
		if n != 0 {
			t.Errorf("%d binding tables left after the TTL, want none", n)
		}
		if _, _, ok := h.g.ResolveDP(addrA, 7, -1, topo); ok {
			t.Error("ResolveDP at 120s resolved the expired binding")
		}
	})
}

// TestBoundDPRanks: what /query_dp_ranks answers is the binding table
// alone, as SGLang's bootstrap server: a bound room (within the TTL) with
// its rank, in the order asked; no room the decode side resolves by itself
// (dp_size 1, follow_bootstrap_room), none of an unknown instance.
// LookupDPRanks applies every rule.
func TestBoundDPRanks(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(prefill{addr: addrA, dp: 2, lb: "round_robin"})
		h.register(prefill{addr: addrB}) // dp_size 1
		for _, b := range []struct {
			addr string
			room uint64
			dp   int
		}{{addrA, 7, 1}, {addrA, 3, 0}, {addrB, 9, 0}} {
			if _, _, err := h.g.BindRoom(b.addr, b.room, b.dp); err != nil {
				t.Fatal(err)
			}
		}
		got := h.g.BoundDPRanks(addrA, []uint64{3, 5, 7}, nil)
		if want := []DPResolution{{Room: 3, DP: 0, Rule: DPRuleBinding}, {Room: 7, DP: 1, Rule: DPRuleBinding}}; !slices.Equal(got, want) {
			t.Errorf("BoundDPRanks(A, 3 5 7) = %+v, want %+v (room 5 unbound: left out)", got, want)
		}
		if got := h.g.BoundDPRanks(addrB, []uint64{8, 9}, nil); !slices.Equal(got, []DPResolution{{Room: 9, DP: 0, Rule: DPRuleBinding}}) {
			t.Errorf("BoundDPRanks(B, 8 9) = %+v, want room 9 only: dp_size 1 resolves nothing here", got)
		}
		if lk, err := h.g.LookupDPRanks(addrB, []uint64{8}, nil); err != nil || len(lk.Resolved) != 1 || lk.Resolved[0].Rule != DPRuleSingleDP {
			t.Errorf("LookupDPRanks(B, 8) = %+v, %v; want room 8 by the single-DP rule", lk, err)
		}
		if got := h.g.BoundDPRanks("10.9.9.9:1", []uint64{7}, nil); len(got) != 0 {
			t.Errorf("BoundDPRanks(unknown instance) = %+v, want none", got)
		}
		out := make([]DPResolution, 1, 4)
		if got := h.g.BoundDPRanks(addrA, []uint64{7}, out); len(got) != 2 || got[1].Room != 7 {
			t.Errorf("BoundDPRanks appended %+v to a slice of one, want room 7 after it", got)
		}
		advance(120 * time.Second)
		if got := h.g.BoundDPRanks(addrA, []uint64{3, 7}, nil); len(got) != 0 {
			t.Errorf("BoundDPRanks after binding_ttl = %+v, want none: the bindings expired", got)
		}
	})
}

// TestCheckLivenessDiscountsTheDaemonsStall: a check that comes long after
// the previous one (the daemon was paused: its ranks' beats wait in its
// sockets) does not count the pause as the ranks' silence; a rank already
// silent before it keeps that silence, and a rank that stays silent is
// lost after max_failures intervals of the daemon's running time.
func TestCheckLivenessDiscountsTheDaemonsStall(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(prefill{addr: addrA})
		h.register(prefill{addr: addrB})
		a := RankID{Addr: addrA}
		beat := func(rk RankID) {
			if _, _, err := h.g.Heartbeat(rk, ""); err != nil {
				t.Fatalf("Heartbeat(%s) = %v", rk, err)
			}
		}
		h.g.CheckLiveness()
		// 5 s of checks every 1.25 s: A beats, B is silent (1 interval).
		for range 4 {
			advance(1250 * time.Millisecond)
			beat(a)
			h.g.CheckLiveness()
		}
		// The daemon is paused 12 s (more than the 10 s limit): no check.
		advance(12 * time.Second)
		if evs := h.g.CheckLiveness(); slices.Contains(kinds(evs), InstanceLost) || slices.Contains(kinds(evs), HeartbeatMissed) {
			t.Fatalf("check after the daemon's 12 s pause: %+v, want nothing (the pause is not the ranks' silence)", evs)
		}
		// From here no rank beats. B was silent 5 s before the pause (6.25 s
		// now): lost after 3.75 s more; A after 10 s (less the check period
		// the pause is not discounted by).
		var lostAt []string
		for i := 1; len(lostAt) < 2 && i <= 12; i++ {
			advance(1250 * time.Millisecond)
			for _, e := range h.g.CheckLiveness() {
				if e.Kind == InstanceLost {
					lostAt = append(lostAt, fmt.Sprintf("%s@%v", e.Addr, time.Duration(i)*1250*time.Millisecond))
				}
			}
		}
		want := []string{addrB + "@3.75s", addrA + "@8.75s"}
		if !slices.Equal(lostAt, want) {
			t.Errorf("lost after the pause: %v, want %v", lostAt, want)
		}
	})
}

// TestCheckLivenessLateCheckIsNoStall: a check loop that is late while the
// daemon served heartbeats (it was running) credits nothing: the silent
// rank is lost at that check; and a credited stall does not change the
// last heartbeat Status shows.
func TestCheckLivenessLateCheckIsNoStall(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(prefill{addr: addrA})
		h.register(prefill{addr: addrB})
		a := RankID{Addr: addrA}
		h.g.CheckLiveness()
		// 12 s without a check, A beating every second meanwhile; B silent.
		for range 12 {
			advance(time.Second)
			if _, _, err := h.g.Heartbeat(a, ""); err != nil {
				t.Fatal(err)
			}
		}
		var lost []string
		for _, e := range h.g.CheckLiveness() {
			if e.Kind == InstanceLost {
				lost = append(lost, e.Addr)
			}
		}
		if !slices.Equal(lost, []string{addrB}) {
			t.Fatalf("a late check while heartbeats were served lost %v, want [%s] (no credit)", lost, addrB)
		}

		// A real pause (nothing served): credited, and Status still shows
		// A's last heartbeat where it was.
		last := time.Now()
		advance(12 * time.Second)
		h.g.CheckLiveness()
		for _, st := range h.g.Status() {
			if st.Addr == addrA && !st.LastHeartbeat.Equal(last) {
				t.Errorf("A's last heartbeat after a credited pause = %v, want %v (the real one)", st.LastHeartbeat, last)
			}
		}
	})
}

// TestCheckLivenessStallAfterABeat: a daemon paused just after it served a
// heartbeat (the beat came between a check and the pause, as it does when
// the pause is not timed to the checks) still counts the pause as its own
// stall: what it measures is the longest stretch in which it showed no sign
// of running (no check, no heartbeat served), not whether any heartbeat
// came since the last check.
func TestCheckLivenessStallAfterABeat(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(prefill{addr: addrA})
		a := RankID{Addr: addrA}
		h.g.CheckLiveness()
		advance(100 * time.Millisecond)
		if _, _, err := h.g.Heartbeat(a, ""); err != nil {
			t.Fatal(err)
		}
		// Paused 12 s (past the 10 s limit) right after that beat; the beat
		// queued in its socket meanwhile is served as it resumes, before the
		// check.
		advance(12 * time.Second)
		if _, _, err := h.g.Heartbeat(a, ""); err != nil {
			t.Fatal(err)
		}
		if evs := h.g.CheckLiveness(); slices.Contains(kinds(evs), InstanceLost) {
			t.Fatalf("check after a 12 s pause that began just after a beat: %+v, want no instance lost", evs)
		}
		// The same with the check first, the queued beat after it.
		advance(100 * time.Millisecond)
		if _, _, err := h.g.Heartbeat(a, ""); err != nil {
			t.Fatal(err)
		}
		advance(12 * time.Second)
		if evs := h.g.CheckLiveness(); slices.Contains(kinds(evs), InstanceLost) {
			t.Fatalf("check first after a 12 s pause that began just after a beat: %+v, want no instance lost", evs)
		}
	})
}

// TestCheckLivenessStallBeforeTheFirstCheck: a daemon paused before its
// first liveness check (just after a rank registered) counts the pause as
// its own stall too: the registry's creation is its first sign of running.
func TestCheckLivenessStallBeforeTheFirstCheck(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		advance(100 * time.Millisecond)
		h.register(prefill{addr: addrA})
		advance(12 * time.Second)
		if evs := h.g.CheckLiveness(); slices.Contains(kinds(evs), InstanceLost) {
			t.Fatalf("first check after a 12 s pause: %+v, want no instance lost", evs)
		}
		// Silent from here on: lost once the rank was silent 10 s of the
		// daemon's running time (the pause credited less one check period).
		var lostAt time.Duration
		for i := 1; lostAt == 0 && i <= 12; i++ {
			advance(1250 * time.Millisecond)
			if slices.Contains(kinds(h.g.CheckLiveness()), InstanceLost) {
				lostAt = time.Duration(i) * 1250 * time.Millisecond
			}
		}
		if lostAt != 8750*time.Millisecond {
			t.Errorf("lost %v after the pause, want 8.75s", lostAt)
		}
	})
}
