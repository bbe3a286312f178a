package room

import (
	"testing"
	"time"
	"unsafe"
)

// Every SGLang label a transition is recorded with has its index, so that
// the compact timeline renders it back unchanged.
func TestTransitionLabelsAreKnown(t *testing.T) {
	labels := []string{"", "T1", "T2/T4/T8", "T20", "T11", "T12/T17", "T21", "T22"}
	for _, l := range sglangFor {
		labels = append(labels, l)
	}
	for _, l := range labels {
		if i, ok := sglangIndex(l); !ok || sglangLabels[i] != l {
			t.Errorf("label %q: index %d, %v", l, i, ok)
		}
	}
}

// A compact transition renders what the room recorded: phase, time, label,
// attempt and the note's text.
func TestTransitionRendersItsNote(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123, time.UTC)
	rk := RankID{Addr: addrA, DP: 3, CP: 1, TP: 7, PP: 2}
	for _, c := range []struct {
		n    note
		want string
	}{
		{numNote(noteOpened, 2, 0), "opened on decode shard 2"},
		{numNote(noteAdmitted, 16, 5), "16 pages, metadata slot 5"},
		{numNote(noteClaimed, 4, int64(time.Minute)), "destination claimed by 4 prefill ranks; waiting timeout 1m0s"},
		{chunkLandedNote(9, rk), "chunk 9 from " + rk.String() + " landed"},
		{chunkLandedNote(9, RankID{Addr: addrA, TP: 1 << 20}), "chunk 9 from " + RankID{Addr: addrA, TP: 1 << 20}.String() + " landed"},
		{numNote(noteSucceeded, 3, 4096), "3 chunks, 4096 bytes"},
		{textNote("released by the decode engine"), "released by the decode engine"},
	} {
		var texts []string
		tr := newTransition(at, PhaseTransferring, "T11", c.n, 2, &texts).public(addrA, texts)
		if tr.Note != c.want || tr.Phase != PhaseTransferring || tr.Poll != PhaseTransferring.Poll() || !tr.At.Equal(at) || tr.SGLang != "T11" || tr.Attempt != 2 {
			t.Errorf("rendered %+v, want note %q, phase transferring at %s, T11, attempt 2", tr, c.want, at)
		}
	}
	if s := unsafe.Sizeof(transition{}); s > 32 {
		t.Errorf("a compact transition takes %d bytes, want at most 32", s)
	}
}
