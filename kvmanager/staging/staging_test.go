package staging_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/staging"
)

// A decode side of attention TP 2 (8 KV heads, 4 layers, 256-byte heads,
// 16-token pages) fed by a prefill of TP 4: each decode rank's region has
// two writers of 2 heads, 2 × 256 × 4 × 2 = 4096 bytes per token each, so a
// page is 16 × 8192 = 128 KiB of region and a 1 MiB ring holds 8 pages.
const (
	heads     = 8
	pageBytes = 16 * 8192
)

func newStager(ringBytes int64) *staging.Stager {
	return staging.New(kvlayout.Layout{AttnTP: 2, DP: 1, PP: 1, NumLayers: 4, HeadDim: 128, DTypeBytes: 2, PageSize: 16}, ringBytes)
}

func alloc(chunk, pages, writer int) staging.Alloc {
	return staging.Alloc{DecodeDP: 0, DecodeTP: 0, Stage: 0, Chunk: chunk, NumPages: pages, Heads: heads, WriterTP: writer, WriterPP: 0}
}

func live(t *testing.T, s *staging.Stager) int {
	t.Helper()
	return s.Watermarks()[0].Live // (dp 0, tp 0) comes first
}

// report has both writers of chunk's region report it.
func report(t *testing.T, s *staging.Stager, rm *staging.Room, chunk, pages int) *staging.Staged {
	t.Helper()
	sc := s.Lookup(rm, chunk, 0, 0)
	if sc == nil {
		t.Fatalf("chunk %d: no region", chunk)
	}
	for w := range 2 {
		wi, err := s.Check(rm, sc, staging.Report{NumPages: pages, PageOffset: 0, WriterTP: w})
		if err != nil || wi != w {
			t.Fatalf("chunk %d writer %d: Check = %d, %v; want %d, nil", chunk, w, wi, err, w)
		}
		if b := s.Arrive(sc, wi, 0, 0, nil); b != int64(pages)*16*4096 {
			t.Fatalf("chunk %d writer %d wrote %d bytes, want %d", chunk, w, b, int64(pages)*16*4096)
		}
	}
	return sc
}

func TestAllocateSharesARegionAndFreesItOnce(t *testing.T) {
	s := newStager(1 << 20)
	rm := s.Open(7, 1, 4, 1)
	first, err := s.Allocate(rm, alloc(0, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Allocate(rm, alloc(0, 2, 1))
	if err != nil {
		t.Fatal(err)
	}
	if first.Existing || !second.Existing || first.Region != second.Region || first.Region.Size != 2*pageBytes {
		t.Fatalf("the second writer must get the first's region of %d bytes: %+v, %+v", 2*pageBytes, first, second)
	}
	if first.NumWriters != 2 || first.WriterIndex != 0 || second.WriterIndex != 1 || second.WriterOffset != pageBytes || second.WriterBytes != pageBytes ||
		first.Buffer != "decode/dp0/tp0/staging" || !first.Writable {
		t.Fatalf("writer layout: %+v, %+v", first, second)
	}
	var fe *staging.FieldError
	if _, err := s.Allocate(rm, alloc(0, 3, 1)); !errors.As(err, &fe) || fe.Field != "num_pages" {
		t.Fatalf("another page count for an allocated region: %v, want a num_pages FieldError", err)
	}
	if got := live(t, s); got != 1 || s.Pending(rm) != 1 {
		t.Fatalf("live %d, pending %d; want 1, 1", got, s.Pending(rm))
	}

	sc := report(t, s, rm, 0, 2)
	if n, w := s.Arrived(sc); n != 2 || w != 2 {
		t.Fatalf("arrived %d of %d, want 2 of 2", n, w)
	}
	if ready := s.Ready(rm, 0, 0, []int{0, 1}); len(ready) != 1 || ready[0] != sc || !s.ScattersDue(rm) {
		t.Fatalf("Ready = %v, ScattersDue = %v; want the region, true", ready, s.ScattersDue(rm))
	}
	op := s.StartScatter(sc)
	if op.Chunk != 0 || op.Tokens != 32 || op.NumPages != 2 || len(op.Writers) != 2 || op.Region != first.Region {
		t.Fatalf("scatter: %+v", op)
	}
	wait, done := s.Scattering(sc)
	if wait == nil || done {
		t.Fatal("a started scatter is not in flight")
	}
	s.EndScatter(rm, sc, true)
	select {
	case <-wait:
	default:
		t.Fatal("EndScatter did not wake the scatter's waiters")
	}
	if _, done := s.Scattering(sc); !done {
		t.Fatal("an ended scatter is not done")
	}
	if got := live(t, s); got != 0 || s.Pending(rm) != 0 || s.ScattersDue(rm) || len(s.Ready(rm, 0, 0, []int{0})) != 0 {
		t.Fatalf("after the scatter: live %d, pending %d, due %v", got, s.Pending(rm), s.ScattersDue(rm))
	}
	if freed := s.Release(rm); len(freed) != 0 {
		t.Fatalf("Release freed %+v again after its scatter freed it", freed)
	}
	if got := live(t, s); got != 0 || s.Pending(rm) != 0 {
		t.Fatalf("after Release: live %d, pending %d", got, s.Pending(rm))
	}
}

func TestScatterNotLandedKeepsTheRegionForRelease(t *testing.T) {
	s := newStager(1 << 20)
	rm := s.Open(7, 1, 4, 1)
	if _, err := s.Allocate(rm, alloc(3, 1, 0)); err != nil {
		t.Fatal(err)
	}
	sc := report(t, s, rm, 3, 1)
	s.StartScatter(sc)
	s.EndScatter(rm, sc, false) // e.g. the engine was unavailable
	if wait, done := s.Scattering(sc); wait != nil || done {
		t.Fatal("a scatter that did not land must be startable again")
	}
	if live(t, s) != 1 || s.Pending(rm) != 1 || !s.ScattersDue(rm) {
		t.Fatalf("the region must stay allocated and due: live %d, pending %d", live(t, s), s.Pending(rm))
	}
	if m := s.Missing(rm); len(m) != 1 || m[0] != "chunk 3 -> decode tp 0 (2/2 writers)" {
		t.Fatalf("Missing = %q", m)
	}
	freed := s.Release(rm)
	if len(freed) != 1 || freed[0].Chunk != 3 || freed[0].DecodeTP != 0 || freed[0].Region.Size != pageBytes {
		t.Fatalf("Release freed %+v, want chunk 3's region", freed)
	}
	if live(t, s) != 0 || s.Pending(rm) != 0 || len(s.Release(rm)) != 0 {
		t.Fatal("a region must go back to its ring exactly once")
	}
}

func TestAllocateLargerThanTheRing(t *testing.T) {
	s := newStager(1 << 20)
	rm := s.Open(9, 1, 4, 1)
	_, err := s.Allocate(rm, alloc(0, 9, 0)) // 9 × 128 KiB > 1 MiB
	var tl *staging.TooLargeError
	if !errors.As(err, &tl) || !errors.Is(err, staging.ErrTooLarge) {
		t.Fatalf("err = %v, want a *TooLargeError wrapping ErrTooLarge", err)
	}
	for _, want := range []string{"Staging chunk 0 of room 9 (9 pages, 1179648 bytes for decode rank dp 0 tp 0)", "(1048576 bytes)", staging.Hint} {
		if !strings.Contains(tl.Msg, want) {
			t.Errorf("message %q does not contain %q", tl.Msg, want)
		}
	}
	if live(t, s) != 0 || s.Pending(rm) != 0 {
		t.Fatal("a refused allocation must hold nothing")
	}
}

func TestCheckWaitsForTheWatermark(t *testing.T) {
	s := newStager(1 << 20)
	rm := s.Open(5, 2, 4, 1)
	if _, err := s.Allocate(rm, alloc(0, 6, 0)); err != nil {
		t.Fatal(err)
	}
	next, err := s.Allocate(rm, alloc(1, 4, 0)) // does not fit after the head: round 1 at offset 0
	if err != nil {
		t.Fatal(err)
	}
	if next.Region.Round != 1 || next.Region.Offset != 0 || next.Writable {
		t.Fatalf("chunk 1 = %+v, want round 1 at 0, not writable", next)
	}
	sc1 := s.Lookup(rm, 1, 0, 0)
	var fe *staging.FieldError
	if _, err := s.Check(rm, sc1, staging.Report{NumPages: 5, WriterTP: 0}); !errors.As(err, &fe) || fe.Field != "num_pages" {
		t.Fatalf("wrong page count: %v", err)
	}
	if _, err := s.Check(rm, sc1, staging.Report{NumPages: 4, WriterTP: 0}); !errors.Is(err, staging.ErrNotWritable) ||
		!strings.Contains(err.Error(), "chunk 1 of room 5") {
		t.Fatalf("a region behind the watermark: %v, want ErrNotWritable", err)
	}
	sc0 := report(t, s, rm, 0, 6)
	s.StartScatter(sc0)
	s.EndScatter(rm, sc0, true)
	wi, err := s.Check(rm, sc1, staging.Report{NumPages: 4, WriterTP: 1})
	if err != nil || wi != 1 {
		t.Fatalf("once chunk 0 is freed chunk 1 is writable: %d, %v", wi, err)
	}
	if wi, err := s.Check(rm, sc1, staging.Report{NumPages: 4, WriterTP: 2}); err != nil || wi != -1 {
		t.Fatalf("prefill TP rank 2 writes decode rank 1, not 0: %d, %v", wi, err)
	}
	s.Arrive(sc1, 1, 2, 42, []int32{1, 2})
	if _, err := s.Check(rm, sc1, staging.Report{NumPages: 4, PageOffset: 3, WriterTP: 0}); !errors.As(err, &fe) || fe.Field != "page_offset" {
		t.Fatalf("another page offset than the first writer's: %v", err)
	}
	s.Arrive(sc1, 0, 2, 0, nil)
	if op := s.StartScatter(sc1); op.PageOffset != 2 || op.Marker != 42 || len(op.OutputIDs) != 2 {
		t.Fatalf("scatter of chunk 1: %+v, want page offset 2 and the marker", op)
	}
}

func TestWatchCoalescesAndCloses(t *testing.T) {
	s := newStager(1 << 20)
	w := s.Watch(0, []int{1, 0, 1})
	ctx := context.Background()
	got, err := w.Next(ctx)
	if err != nil || len(got) != 2 || got[0].DecodeTP != 0 || got[1].DecodeTP != 1 || got[0].Size != 1<<20 {
		t.Fatalf("first Next = %+v, %v; want both rings, by TP rank", got, err)
	}
	rm := s.Open(1, 1, 4, 1)
	for chunk := range 3 {
		if _, err := s.Allocate(rm, alloc(chunk, 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	got, err = w.Next(ctx)
	if err != nil || len(got) != 1 || got[0].DecodeTP != 0 || got[0].Live != 3 || got[0].Head != 3*pageBytes {
		t.Fatalf("Next = %+v, %v; want tp 0's latest state only (3 live)", got, err)
	}
	if _, err := s.Allocate(rm, alloc(3, 1, 0)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := w.Next(ctx); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Next after Close: %v, want the watch closed", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	s.Release(rm) // a closed watch is no longer told
	if _, err := w.Next(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next of a closed watch after a change: %v, want the context's error", err)
	}
}
