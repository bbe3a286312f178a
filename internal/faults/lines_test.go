package faults

import (
	"testing"
)

// TestLinesCountsAboveDebug: the lines at DEBUG are counted apart, lines
// split across writes count once, and a line not ended yet counts.
func TestLinesCountsAboveDebug(t *testing.T) {
	l := newLines(nil)
	for _, w := range []string{
		"time=2026-12-02T07:20:44.584Z level=INFO msg=\"serving\"\n",
		"time=2026-12-02T07:20:45.462Z level=DEBUG msg=\"batch held\" room=7\n",
		"time=2026-12-02T07:20:45.462Z lev", "el=DEBUG msg=\"batch held\" room=8\ntime=2026-12-02T07:20:47.457Z level=WARN",
		" msg=\"batch failed\" count=99\n",
		"time=2026-12-02T07:20:48.000Z level=ERROR msg=\"partial",
	} {
		if _, err := l.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	if n, debug := l.count(); n != 3 || debug != 2 {
		t.Fatalf("count() = %d, %d; want 3 lines above DEBUG (one not ended), 2 at DEBUG", n, debug)
	}
}

// TestHeldRooms: the rooms of the agent's held-batch lines, each line's
// own room only (not a summary's first.room, not a longer id's prefix).
func TestHeldRooms(t *testing.T) {
	out := []byte(`time=t level=DEBUG msg="batch held (--fault-hold-rooms)" batch=t/2000004/1#806 room=2000004 past_cancel=false
time=t level=INFO msg="batch held (--fault-hold-rooms)" batch=t/2000000/1#802 room=2000000 past_cancel=false
time=t level=INFO msg="batch held (--fault-hold-rooms)" count=99 ids="2000008 2000012" first.batch=x first.room=2000008 over=10s
time=t level=DEBUG msg="batch done" batch=t/2000016/1#1 room=2000016 copies=1
time=t level=DEBUG msg="batch held (--fault-hold-rooms)" batch=t/20000040/1#9 room=20000040`)
	got := heldRooms(out)
	want := map[uint64]bool{2000004: true, 2000000: true, 20000040: true}
	if len(got) != len(want) {
		t.Fatalf("heldRooms = %v, want %v", got, want)
	}
	for r := range want {
		if !got[r] {
			t.Fatalf("heldRooms = %v, want %v", got, want)
		}
	}
}
