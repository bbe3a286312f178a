package kvmanager

// The Manager's calls around rooms: OpenRoom and ReleaseRoom refusals, retention, ListRooms and Poll, names. The transitions each covers are listed in lifecycle_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// TestOpenRoomErrors: T1 refused (capacity check of §2.3, duplicates, ranges).
func TestOpenRoomErrors(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withShards(2))
		h.register(instance{addr: addrA, dp: 2})
		h.open(addrA, 1, func(r *OpenRequest) { r.IdempotencyKey = "k1" })
		if s, again, err := h.m.OpenRoom(context.Background(), OpenRequest{Room: 1, Addr: addrA, IdempotencyKey: "k1", PrefillDP: -1, DecodeDP: -1, PromptLen: 1000}); err != nil || !again || s.Room != 1 {
			t.Errorf("OpenRoom(same key) = %d, %v, %v; want the room again", s.Room, again, err)
		}
		if _, _, err := h.m.OpenRoom(context.Background(), openReq(addrA, 1)); !errors.Is(err, ErrRoomExists) {
			t.Errorf("OpenRoom(other key) = %v, want ErrRoomExists", err)
		}
		var inv *InvalidError
		if _, _, err := h.m.OpenRoom(context.Background(), func() OpenRequest { r := openReq(addrA, 2); r.DecodeDP = 2; return r }()); !errors.As(err, &inv) || inv.Field != "decode_dp_rank" {
			t.Errorf("OpenRoom(decode dp 2 of 2) = %v, want InvalidError on decode_dp_rank", err)
		}
		if _, _, err := h.m.OpenRoom(context.Background(), func() OpenRequest { r := openReq(addrA, 2); r.PrefillDP = 2; return r }()); !errors.As(err, &inv) || inv.Field != "prefill_dp_rank" {
			t.Errorf("OpenRoom(prefill dp 2 of 2) = %v, want InvalidError on prefill_dp_rank", err)
		}
		// SGLang's entry check: nothing is allocated.
		_, _, err := h.m.OpenRoom(context.Background(), func() OpenRequest { r := openReq(addrA, 3); r.PromptLen = 2 << 20; return r }())
		var ce *prealloc.CapacityError
		if !errors.As(err, &ce) || !errors.Is(err, prealloc.ErrExceedsCapacity) || !strings.Contains(err.Error(), "Request rid-3 exceeds the maximum number of tokens: 2097152 > 1048576") {
			t.Errorf("OpenRoom(too long) = %v, want SGLang's capacity error", err)
		}
		if _, err := h.m.GetRoom(3, false); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("GetRoom(refused room) = %v, want ErrRoomNotFound", err)
		}
		// Room ids spread over the decode shards: 1 % 2 = 1; DecodeDP pins one.
		if s := h.snapshot(1); s.DecodeDP != 1 {
			t.Errorf("room 1 on decode shard %d, want 1", s.DecodeDP)
		}
		h.open(addrA, 4, func(r *OpenRequest) { r.DecodeDP = 1 })
		if s := h.snapshot(4); s.DecodeDP != 1 || h.stats(1).Admitted != 2 {
			t.Errorf("room 4 on decode shard %d (shard 1 admitted %d), want shard 1 with 2 admitted", s.DecodeDP, h.stats(1).Admitted)
		}
		for _, room := range []uint64{1, 4} {
			h.complete(room)
			h.release(room)
		}
		h.assertClean()
	})
}

// TestReleaseRoomErrors: release applies only after T12/T17.
func TestReleaseRoomErrors(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.m.ReleaseRoom(1); !errors.Is(err, ErrWrongState) {
			t.Errorf("ReleaseRoom(admitted) = %v, want ErrWrongState", err)
		}
		if _, _, err := h.m.ReleaseRoom(2); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("ReleaseRoom(unknown) = %v, want ErrRoomNotFound", err)
		}
		h.m.AbortRoom(1, "")
		if _, _, err := h.m.ReleaseRoom(1); !errors.Is(err, ErrWrongState) {
			t.Errorf("ReleaseRoom(failed) = %v, want ErrWrongState", err)
		}
		if _, err := h.m.RetractRoom(1, RetractCPU); !errors.Is(err, ErrWrongState) {
			t.Errorf("RetractRoom(failed) = %v, want ErrWrongState", err)
		}
		h.assertClean()
	})
}

// TestRoomRetention: terminal rooms (after T16) are kept for retention, then
// forgotten (decodeplane).
func TestRoomRetention(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withRun(), withConfig(func(c *Config) {
			c.Rooms.Retention = 2 * time.Minute
			c.Rooms.MaxRetained = 2
		}))
		for i := uint64(1); i <= 3; i++ {
			h.open(addrA, i)
			h.m.AbortRoom(i, "")
		}
		// MaxRetained 2: the oldest went first.
		if _, err := h.m.GetRoom(1, false); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("GetRoom(1) = %v, want ErrRoomNotFound (beyond max_retained)", err)
		}
		h.wantPhase(2, PhaseFailed)
		// A forgotten room id can be opened again.
		h.open(addrA, 1)
		h.m.AbortRoom(1, "")
		advance(3 * time.Minute)
		for i := uint64(1); i <= 3; i++ {
			if _, err := h.m.GetRoom(i, false); !errors.Is(err, ErrRoomNotFound) {
				t.Errorf("GetRoom(%d) after retention = %v, want ErrRoomNotFound", i, err)
			}
		}
		h.assertClean()
	})
}

func TestListRoomsAndPoll(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 2)
		advance(time.Second)
		h.open(addrA, 1)
		h.open(addrB, 3)
		h.m.AbortRoom(2, "")
		all, total := h.m.ListRooms(ListFilter{})
		if total != 3 || len(all) != 3 || all[0].Room != 2 {
			t.Errorf("ListRooms() = %d rooms (total %d), first %d; want 3, oldest (2) first", len(all), total, all[0].Room)
		}
		live, total := h.m.ListRooms(ListFilter{LiveOnly: true, Limit: 1})
		if total != 2 || len(live) != 1 || live[0].Room != 1 {
			t.Errorf("ListRooms(live, limit 1) = %v (total %d)", live, total)
		}
		byAddr, _ := h.m.ListRooms(ListFilter{Addr: addrB, Phases: []Phase{PhaseWaitingPrefill}})
		if len(byAddr) != 1 || byAddr[0].Room != 3 {
			t.Errorf("ListRooms(addr B, waiting) = %v", byAddr)
		}
		for room, want := range map[uint64]KVPoll{1: PollWaitingForInput, 2: PollFailed, 3: PollBootstrapping, 99: PollFailed} {
			if got := h.m.Poll(room); got != want {
				t.Errorf("Poll(%d) = %s, want %s", room, got, want)
			}
		}
		s, err := h.m.GetRoom(1, true)
		if err != nil || len(s.Pages) != 16 || len(s.Transitions) != 3 {
			t.Errorf("GetRoom(with pages) = %d pages, %d transitions, %v", len(s.Pages), len(s.Transitions), err)
		}
		h.m.AbortRoom(1, "")
		h.m.AbortRoom(3, "")
		h.assertClean()
	})
}

func TestPhaseAndCodeNames(t *testing.T) {
	for p := PhaseWaitingPrefill; p <= PhaseHeld; p++ {
		got, ok := ParsePhase(p.String())
		if !ok || got != p {
			t.Errorf("ParsePhase(%q) = %v, %v; want %v", p.String(), got, ok, p)
		}
	}
	if _, ok := ParsePhase("unspecified"); ok {
		t.Errorf("ParsePhase(unspecified) accepted")
	}
	for _, s := range []fmt.Stringer{Phase(99), FailureCode(99), DPRule(99), KVPoll(9)} {
		if !strings.Contains(s.String(), "(") {
			t.Errorf("out-of-range %T renders as %q", s, s.String())
		}
	}
	if got := FailureShutdown.String(); got != "shutdown" {
		t.Errorf("FailureShutdown = %q", got)
	}
}
