package kvmanager

import (
	"testing"
)

// TestWatchSeqs: every event carries its position in the room's timeline,
// for the replayed and the live ones, with or without history.
func TestWatchSeqs(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		hist, err := h.m.Watch(1, true)
		if err != nil {
			t.Fatal(err)
		}
		cur, err := h.m.Watch(1, false)
		if err != nil {
			t.Fatal(err)
		}
		rk := RankID{Addr: addrA}
		h.claimAll(1)
		h.m.Transfer(t.Context(), chunk(1, rk, 0, 0, 16, true))
		h.release(1)
		evs := drainWatcher(hist)
		for i, ev := range evs {
			if ev.Seq != uint32(i+1) {
				t.Errorf("history event %d (%s): seq %d, want %d", i, ev.Transition.Phase, ev.Seq, i+1)
			}
		}
		first := len(evs) - len(drainWatcher(cur))
		cur2, _ := h.m.Watch(1, false) // the released room: its last transition
		if last := drainWatcher(cur2); len(last) != 1 || last[0].Seq != uint32(len(evs)) {
			t.Errorf("watch of the released room = %+v, want its last transition at seq %d", last, len(evs))
		}
		if first != 2 {
			t.Errorf("the current-state watcher missed %d events, want 2 (it starts at the room's state when it watched)", first)
		}
		h.assertClean()
	})
}

// TestWatchOutcome: an outcome watcher gets one event, the room's
// SUCCEEDED transition (or the terminal one of a room that fails first),
// with its timeline position, then Events closes with no error; a room
// whose outcome came already sends it at once.
func TestWatchOutcome(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.open(addrA, 2)
		live, err := h.m.WatchOutcome(1)
		if err != nil {
			t.Fatal(err)
		}
		failing, err := h.m.WatchOutcome(2)
		if err != nil {
			t.Fatal(err)
		}
		rk := RankID{Addr: addrA}
		h.claimAll(1)
		h.m.Transfer(t.Context(), chunk(1, rk, 0, 0, 16, true))
		h.m.AbortRoom(2, "")
		timeline := func(room uint64) []Transition {
			snap, err := h.m.GetRoom(room, false)
			if err != nil {
				t.Fatal(err)
			}
			return snap.Transitions
		}
		succAt := 0
		for i, tr := range timeline(1) {
			if tr.Phase == PhaseSucceeded {
				succAt = i + 1
			}
		}
		evs := drainWatcher(live)
		if len(evs) != 1 || evs[0].Transition.Phase != PhaseSucceeded || evs[0].Seq != uint32(succAt) || evs[0].Terminal || live.Err() != nil {
			t.Errorf("outcome of room 1 = %+v (err %v), want one SUCCEEDED event at seq %d, not terminal", evs, live.Err(), succAt)
		}
		evs = drainWatcher(failing)
		if n := len(timeline(2)); len(evs) != 1 || !evs[0].Terminal || evs[0].Room.Failure == nil || evs[0].Room.Failure.Code != FailureAborted || evs[0].Seq != uint32(n) {
			t.Errorf("outcome of room 2 = %+v, want its terminal ABORTED event at seq %d", evs, n)
		}
		// After the fact: room 1 released, its outcome is still its SUCCEEDED.
		h.release(1)
		late, err := h.m.WatchOutcome(1)
		if err != nil {
			t.Fatal(err)
		}
		if evs := drainWatcher(late); len(evs) != 1 || evs[0].Transition.Phase != PhaseSucceeded || evs[0].Seq != uint32(succAt) {
			t.Errorf("late outcome of room 1 = %+v, want its SUCCEEDED at seq %d", evs, succAt)
		}
		late2, err := h.m.WatchOutcome(2)
		if err != nil {
			t.Fatal(err)
		}
		if evs := drainWatcher(late2); len(evs) != 1 || !evs[0].Terminal {
			t.Errorf("late outcome of room 2 = %+v, want its terminal event", evs)
		}
		h.assertClean()
	})
}
