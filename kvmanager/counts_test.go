package kvmanager

import (
	"maps"
	"testing"
)

// walkCounts is what Status, InFlight and RoomsFor counted by walking every
// room before the counts were kept on transition.
func (m *Manager) walkCounts() (byPhase map[Phase]int, live map[string]int, all map[string]int, inFlight int) {
	m.lockAll()
	defer m.unlockAll()
	byPhase, live, all = map[Phase]int{}, map[string]int{}, map[string]int{}
	for _, e := range m.allRooms() {
		byPhase[e.Phase()]++
		all[e.Addr()]++
		if !e.Phase().Terminal() {
			live[e.Addr()]++
			inFlight++
		}
	}
	return byPhase, live, all, inFlight
}

// TestCountsMatchAWalk: through opens (on a known and an unknown prefill),
// a whole hand-off, a release, aborts, a lost instance and the retention
// of finished rooms, the counts Status, InFlight and RoomsFor read are what
// a walk of every room finds, and an address no room refers to any more is
// forgotten.
func TestCountsMatchAWalk(t *testing.T) {
	h := newHarness(t, withConfig(func(c *Config) { c.Rooms.MaxRetained = 2 }))
	a := instance{addr: "10.0.0.1:8998", tp: 1}
	h.register(a)
	check := func(step string) {
		t.Helper()
		byPhase, live, all, inFlight := h.m.walkCounts()
		st := h.m.Status()
		if !maps.Equal(st.RoomsByPhase, byPhase) {
			t.Errorf("%s: Status().RoomsByPhase = %v, a walk finds %v", step, st.RoomsByPhase, byPhase)
		}
		for _, p := range st.Prefills {
			if p.ActiveRooms != live[p.Addr] {
				t.Errorf("%s: %s ActiveRooms = %d, a walk finds %d", step, p.Addr, p.ActiveRooms, live[p.Addr])
			}
		}
		for _, addr := range []string{a.addr, "10.0.0.2:8998", "10.0.0.3:8998"} {
			if got := h.m.RoomsFor(addr); got != all[addr] {
				t.Errorf("%s: RoomsFor(%s) = %d, a walk finds %d", step, addr, got, all[addr])
			}
		}
		if got := h.m.InFlight(); got != inFlight {
			t.Errorf("%s: InFlight() = %d, a walk finds %d", step, got, inFlight)
		}
		h.m.lockAll()
		counted := map[string]bool{}
		for _, sh := range h.m.shards {
			for addr := range sh.byAddr {
				counted[addr] = true
			}
		}
		h.m.unlockAll()
		if len(counted) != len(all) {
			t.Errorf("%s: %d addresses counted, %d referred to by a room", step, len(counted), len(all))
		}
	}
	check("empty")
	for room := uint64(1); room <= 4; room++ {
		h.open(a.addr, room)
	}
	h.open("10.0.0.2:8998", 10) // waits for its prefill
	h.open("10.0.0.3:8998", 11)
	check("opened")
	h.complete(1)
	check("room 1 succeeded")
	h.release(1)
	check("room 1 released")
	if _, _, err := h.m.AbortRoom(2, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.m.AbortRoom(10, ""); err != nil {
		t.Fatal(err)
	}
	check("rooms 2 and 10 aborted")
	h.m.shards.fail(func(e *entry) bool { return e.Addr() == a.addr && e.HandingOff() }, Failure{Code: FailurePrefillLost, Message: "lost"})
	check("the instance's rooms failed")
	if _, _, err := h.m.AbortRoom(11, ""); err != nil {
		t.Fatal(err)
	}
	h.m.shards.each(func(sh *shard) { sh.trim(h.m.clock.Now()) }) // keeps the newest 2 finished rooms
	check("retention trimmed")
	if h.m.RoomsFor("10.0.0.2:8998") != 0 {
		t.Errorf("RoomsFor(10.0.0.2:8998) = %d after its only room was forgotten", h.m.RoomsFor("10.0.0.2:8998"))
	}
}
