package prealloc

import (
	"fmt"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// BenchmarkPageAllocFree allocates and frees the pages, req slot and
// metadata slot of a typical request: 4096-token prompt, page size 64
// (64 pages). Expect 0 allocs/op.
func BenchmarkPageAllocFree(b *testing.B) {
	l := newLedger(b, typicalConfig(), false)
	r := &room{readyIdx: -1}
	l.preAlloc(r, 4096, 4096)
	l.freeResources(r)
	b.ReportAllocs()
	for b.Loop() {
		l.preAlloc(r, 4096, 4096)
		r.metaSlot = l.meta.pop()
		l.freeResources(r)
	}
}

// BenchmarkRoomLifecycle runs a room through the public API: enqueue, ready,
// admit, claim, start, grow by two pages, release, the room's record
// kept by the caller (EnqueueEntry) (1 alloc/op: the Admit result slice).
func BenchmarkRoomLifecycle(b *testing.B) {
	l := newLedger(b, typicalConfig(), false)
	var id uint64
	var e Entry
	b.ReportAllocs()
	for b.Loop() {
		id++
		if err := l.EnqueueEntry(&e, Request{Room: id, PromptLen: 4096, MaxNewTokens: 256}); err != nil {
			b.Fatal(err)
		}
		_ = l.SetReady(id)
		if adm, _ := l.Admit(); len(adm) != 1 {
			b.Fatal("not admitted")
		}
		_ = l.Claim(id)
		_ = l.StartRunning(id)
		if _, err := l.UpdateRunning(id, 100); err != nil {
			b.Fatal(err)
		}
		_ = l.Release(id)
	}
}

// BenchmarkAdmitBlocked is one admission pass over n queued ready rooms
// (n = 1,000 and 100,000) none of which fits now: a running 2M-token room
// leaves less than the 3M tokens each queued room needs (each would fit the
// empty 4M-token pool). With admission.max_bypass 0 (strict) the pass looks
// at the head only; with bypass it steps over bypassLookahead rooms and
// puts them back (O(log n) each). "full" is the common busy case with
// bypass: the running room leaves a budget below R, so no room can fit and
// the pass stops at the head.
func BenchmarkAdmitBlocked(b *testing.B) {
	for _, mode := range []struct {
		name            string
		bypass          int
		running, queued int
	}{
		{"strict", 0, 1 << 21, 3 << 20},
		{"bypass", kvlayout.DefaultMaxBypass, 1 << 21, 3 << 20},
		{"bypass-full", kvlayout.DefaultMaxBypass, 1<<22 - 512, 100},
	} {
		for _, n := range []int{1_000, 100_000} {
			b.Run(fmt.Sprintf("%s/queued=%d", mode.name, n), func(b *testing.B) {
				cfg := typicalConfig()
				cfg.Admission.MaxQueued = 200_000
				cfg.Admission.MaxBypass = mode.bypass
				l := newLedger(b, cfg, false)
				const running = uint64(1 << 40)
				if err := l.Enqueue(Request{Room: running, PromptLen: mode.running, MaxNewTokens: 1}); err != nil {
					b.Fatal(err)
				}
				_ = l.SetReady(running)
				if adm, _ := l.Admit(); len(adm) != 1 {
					b.Fatal("running room not admitted")
				}
				_ = l.Claim(running)
				_ = l.StartRunning(running)
				for id := uint64(1); id <= uint64(n); id++ {
					if err := l.Enqueue(Request{Room: id, PromptLen: mode.queued, MaxNewTokens: 1}); err != nil {
						b.Fatal(err)
					}
					_ = l.SetReady(id)
				}
				if adm, reason := l.Admit(); len(adm) != 0 || reason != BlockTokens {
					b.Fatalf("queue did not block: %d admitted, %s", len(adm), reason)
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, reason := l.Admit(); reason != BlockTokens {
						b.Fatal(reason)
					}
				}
			})
		}
	}
}

// BenchmarkAdmit1k is one admission pass that admits 1,000 ready rooms
// (4096-token prompts, page size 64); setup and release are untimed.
func BenchmarkAdmit1k(b *testing.B) {
	cfg := typicalConfig()
	cfg.Pool.RequestSlots = 1000
	cfg.Pool.TotalPages = 1 << 17 // 8M tokens: 1000 × (4096 + R) fit
	l := newLedger(b, cfg, false)
	var next uint64
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		first := next + 1
		for k := 0; k < 1000; k++ {
			next++
			if err := l.Enqueue(Request{Room: next, PromptLen: 4096, MaxNewTokens: 256}); err != nil {
				b.Fatal(err)
			}
			_ = l.SetReady(next)
		}
		b.StartTimer()
		adm, reason := l.Admit()
		b.StopTimer()
		if len(adm) != 1000 || reason != BlockNone {
			b.Fatalf("admitted %d, %s", len(adm), reason)
		}
		for id := first; id <= next; id++ {
			_ = l.Release(id)
		}
		b.StartTimer()
	}
}
