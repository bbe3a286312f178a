package prealloc

import (
	"fmt"
	"testing"
)

// BenchmarkPageAllocFree allocates and frees the pages, req slot and
// metadata slot of a typical request: 4096-token prompt, page size 64
// (64 pages). Expect 0 allocs/op.
func BenchmarkPageAllocFree(b *testing.B) {
	l, _ := newLedger(b, typicalConfig(), false)
	r := &room{readyIdx: -1, dlIdx: -1, runIdx: -1, runSWAIdx: -1, metaSlot: -1}
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
// admit, claim, start, grow by two pages, release (1 alloc/op: the Admit
// result slice).
func BenchmarkRoomLifecycle(b *testing.B) {
	l, _ := newLedger(b, typicalConfig(), false)
	var id uint64
	b.ReportAllocs()
	for b.Loop() {
		id++
		if err := l.Enqueue(Request{Room: id, PromptLen: 4096, MaxNewTokens: 256}); err != nil {
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
// whose head cannot fit (n = 1,000 and 100,000): the pass looks at the head
// only, so the cost does not depend on n.
func BenchmarkAdmitBlocked(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			cfg := typicalConfig()
			cfg.Admission.MaxQueued = 200_000
			l, _ := newLedger(b, cfg, false)
			// Head: 4M − 64 tokens passes the capacity check, never the budget.
			if err := l.Enqueue(Request{Room: 1, PromptLen: 1<<22 - 64, MaxNewTokens: 1}); err != nil {
				b.Fatal(err)
			}
			_ = l.SetReady(1)
			for id := uint64(2); id <= uint64(n); id++ {
				if err := l.Enqueue(Request{Room: id, PromptLen: 100, MaxNewTokens: 10}); err != nil {
					b.Fatal(err)
				}
				_ = l.SetReady(id)
			}
			if adm, reason := l.Admit(); len(adm) != 0 || reason != BlockTokens {
				b.Fatalf("head did not block: %d admitted, %s", len(adm), reason)
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

// BenchmarkAdmit1k is one admission pass that admits 1,000 ready rooms
// (4096-token prompts, page size 64); setup and release are untimed.
func BenchmarkAdmit1k(b *testing.B) {
	cfg := typicalConfig()
	cfg.Pool.RequestSlots = 1000
	cfg.Pool.TotalPages = 1 << 17 // 8M tokens: 1000 × (4096 + R) fit
	l, _ := newLedger(b, cfg, false)
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
