package kvmanager

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"
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
			if i < len(all)-1 && h.instanceComplete(addrA) {
				t.Fatalf("complete after %d of 65536 ranks", i+1)
			}
		}
		if res.Registered != 65536 || res.Expected != 65536 || !h.instanceComplete(addrA) {
			t.Fatalf("registered %d of %d (complete %v), want 65536 of 65536", res.Registered, res.Expected, h.instanceComplete(addrA))
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
		h.m.lockAll()
		seen := h.m.allRooms()[1].RanksSeen()
		h.m.unlockAll()
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
