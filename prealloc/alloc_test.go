package prealloc

import (
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// typicalConfig is a GQA pool with page size 64 and room for a few thousand
// 4k-token requests.
func typicalConfig() kvlayout.Config {
	c := testConfig(kvlayout.KindGQA, 64, 1<<16, 1024)
	c.Admission.MaxQueued = 1 << 18
	return c
}

// TestPageAllocZeroAllocs proves that allocating and freeing the pages,
// req slot and metadata slot of a typical request (4k-token prompt, page
// size 64 ⇒ 64 pages) does no heap allocation once the per-room page lists
// are recycled. It drives the same internal path Admit and Release use.
func TestPageAllocZeroAllocs(t *testing.T) {
	for _, kind := range []kvlayout.Kind{kvlayout.KindGQA, kvlayout.KindHybridSWA, kvlayout.KindHybridLinear, kvlayout.KindHybridMLA} {
		t.Run(kind.String(), func(t *testing.T) {
			cfg := typicalConfig()
			cfg.Pool.Kind = kind
			if kind == kvlayout.KindHybridSWA {
				cfg.Pool.SWA = kvlayout.SWAConfig{Window: 1024, TotalTokens: 1 << 20}
			}
			if kind == kvlayout.KindHybridLinear {
				cfg.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 3 * 1024, ExtraBuffer: true, PingPong: 2}
			}
			if kind == kvlayout.KindHybridMLA {
				cfg.Pool.KVHeads, cfg.Pool.HeadDim, cfg.Pool.KVLoraRank, cfg.Pool.QKRopeHeadDim = 0, 0, 512, 64
			}
			l := newLedger(t, cfg, false)
			r := &room{readyIdx: -1}
			cycle := func() {
				l.preAlloc(r, 4096, 4096)
				r.metaSlot = l.meta.pop()
				if len(r.pages) != 64 {
					t.Fatalf("%d pages", len(r.pages))
				}
				l.freeResources(r)
			}
			cycle() // warm the slice pool
			if n := testing.AllocsPerRun(1000, cycle); n != 0 {
				t.Errorf("page allocate/free: %.1f allocs per request, want 0", n)
			}
			if s := l.Stats(); s.Pages.Used != 0 || s.ReqSlots.Used != 0 || s.MetaSlots.Used != 0 {
				t.Errorf("leaked: %+v", s)
			}
		})
	}
}

// TestRoomLifecycleAllocs: the whole public lifecycle of a room (enqueue,
// ready, admit, claim, start, grow by two pages, release) allocates exactly
// once in steady state: the []Admission that Admit returns. The room's
// record is the caller's (EnqueueEntry, as kvmanager keeps it inside its own
// room); Enqueue would allocate it.
func TestRoomLifecycleAllocs(t *testing.T) {
	l := newLedger(t, typicalConfig(), false)
	var id uint64
	var e Entry
	cycle := func() {
		id++
		r := Request{Room: id, PromptLen: 4096, MaxNewTokens: 256}
		if err := l.EnqueueEntry(&e, r); err != nil {
			t.Fatal(err)
		}
		if err := l.SetReady(id); err != nil {
			t.Fatal(err)
		}
		if adm, _ := l.Admit(); len(adm) != 1 || len(adm[0].Alloc.Pages) != 64 {
			t.Fatalf("admission %+v", adm)
		}
		if err := l.Claim(id); err != nil {
			t.Fatal(err)
		}
		if err := l.StartRunning(id); err != nil {
			t.Fatal(err)
		}
		if np, err := l.UpdateRunning(id, 100); err != nil || len(np) != 2 {
			t.Fatalf("growth %v %v", np, err)
		}
		if err := l.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 10; i++ {
		cycle()
	}
	if n := testing.AllocsPerRun(1000, cycle); n != 1 {
		t.Errorf("room lifecycle: %.2f allocs, want 1 (the Admit result slice)", n)
	}
	assertFull(t, l)
}
