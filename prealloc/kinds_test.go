package prealloc

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// TestSWATailAdmission: hybrid-swa, page 16, 1024 full pages, window 256,
// SWA pool 1024 tokens (64 pages), R = 512.
// Room 1: prompt 1000 ⇒ fill 1000, window start floor16(1000−256=744) = 736,
// swa_tail_len = 264 ⇒ 17 SWA pages (sequence pages 46..62) and 63 full
// pages. SWA budget = 1024 − max(min(R×0, 0×256−0), 0) = 1024 ≥
// max(264, 264+100) ⇒ admitted; SWA budget −= 264 ⇒ 760. Full budget =
// (1024−63)×16 = 15376 − 512 = 14864.
// Room 2: prompt 1000, max_new 600: max(264, 264+600=864) > 760 ⇒ swa, while
// the full pool has plenty.
func TestSWATailAdmission(t *testing.T) {
	cfg := testConfig(kvlayout.KindHybridSWA, 16, 1024, 8)
	l := newLedger(t, cfg, false)
	mustNil(t, "enqueue 1", l.Enqueue(req(1, 1000, 100)))
	mustNil(t, "enqueue 2", l.Enqueue(req(2, 1000, 600)))
	mustNil(t, "ready 1", l.SetReady(1))
	mustNil(t, "ready 2", l.SetReady(2))
	got, reason, adm := admitRooms(t, l)
	if diff := cmp.Diff([]uint64{1}, got); diff != "" || reason != BlockSWA {
		t.Fatalf("admitted %v reason %s, want [1] swa", got, reason)
	}
	s := l.Stats()
	if s.FullBudget != 14864 || s.SWABudget != 760 || s.SWAPages.Used != 17 || s.Pages.Used != 63 {
		t.Errorf("stats: full budget %d (14864), swa budget %d (760), swa used %d (17), pages used %d (63)", s.FullBudget, s.SWABudget, s.SWAPages.Used, s.Pages.Used)
	}
	a := adm[0].Alloc
	if len(a.State) != 1 || a.State[0].Type != kvlayout.StateSWA || len(a.State[0].Indices) != 17 {
		t.Fatalf("state %+v, want one SWA entry of 17 pages", a.State)
	}
	// The SWA pool pops ascending: the window's pages are SWA pages 0..16.
	want := make([]int32, 17)
	for i := range want {
		want[i] = int32(i)
	}
	if diff := cmp.Diff(want, a.State[0].Indices); diff != "" {
		t.Errorf("SWA window pages (-want +got):\n%s", diff)
	}

	// Running growth: out 1 ⇒ seq 1001 fits in 63 pages, eviction bound
	// max(736, 1000−256−16=728) ⇒ nothing. Out 100 ⇒ seq 1100 ⇒ 69 pages
	// (6 new); eviction bound floor16(1099−272 = 827) = 816 ⇒ first live
	// page 51 ⇒ SWA pages for sequence pages 46..50 freed, 6 added: 18 live.
	mustNil(t, "claim", l.Claim(1))
	mustNil(t, "start", l.StartRunning(1))
	if np, err := l.UpdateRunning(1, 1); err != nil || np != nil {
		t.Fatalf("update 1: %v %v", np, err)
	}
	np, err := l.UpdateRunning(1, 100)
	if err != nil || len(np) != 6 {
		t.Fatalf("update 100: %d new pages, %v", len(np), err)
	}
	checkInv(t, l)
	s = l.Stats()
	if s.SWAPages.Used != 18 || s.Pages.Used != 69 {
		t.Errorf("after growth: SWA used %d (18), pages used %d (69)", s.SWAPages.Used, s.Pages.Used)
	}
	run, _ := l.Allocation(1)
	if len(run.State[0].Indices) != 18 || len(run.Pages) != 69 {
		t.Errorf("running allocation: %d SWA pages, %d pages", len(run.State[0].Indices), len(run.Pages))
	}
	releaseAll(t, l, 1, 2)
	assertFull(t, l)
}

// TestSWATailBudgetWithRunning: the SWA reservation is capped by the window
// growth potential and need_swa_single uses swa_tail_len(prompt).
// Page 16, window 256, SWA pool 1024. Room 1 runs (prompt 1000, out 1,
// max_new 100): 17 SWA pages = 272 used, retractable_swa = 264 + 1 = 265.
// Pass: active 1, reserved 512, growth = max(0, 1×256 − 272) = 0 ⇒ SWA
// reservation 0; need_swa_single = 264 + 100 − 265 = 99 ⇒ SWA budget =
// (1024−272) − 99 = 653. Room 2 (prompt 1000, max_new 600): max(264,
// 264+600−265 = 599) ≤ 653 ⇒ admitted, budget 653 − 264 = 389. Room 3 (prompt
// 2000 ⇒ window start floor16(1744) = 1744, tail 256, max_new 400):
// max(256, 256+400−265 = 391) > 389 ⇒ swa.
func TestSWATailBudgetWithRunning(t *testing.T) {
	cfg := testConfig(kvlayout.KindHybridSWA, 16, 1024, 8)
	l := newLedger(t, cfg, false)
	runRoom(t, l, req(1, 1000, 100), 1)
	mustNil(t, "enqueue 2", l.Enqueue(req(2, 1000, 600)))
	mustNil(t, "enqueue 3", l.Enqueue(req(3, 2000, 400)))
	mustNil(t, "ready 2", l.SetReady(2))
	mustNil(t, "ready 3", l.SetReady(3))
	got, reason, _ := admitRooms(t, l)
	if diff := cmp.Diff([]uint64{2}, got); diff != "" || reason != BlockSWA {
		t.Fatalf("admitted %v reason %s, want [2] swa", got, reason)
	}
	if s := l.Stats(); s.SWABudget != 389 {
		t.Errorf("SWA budget %d, want 389", s.SWABudget)
	}
	releaseAll(t, l, 1, 2, 3)
	assertFull(t, l)
}

// TestSWAMirrorPageSizeOne: with page size 1 SGLang allocates the SWA pool at
// full length and caps max_total_num_tokens at the SWA pool (1024 here,
// full pool 4096). Prompt 500 takes 500 full and 500 SWA tokens; the window
// sent to prefill is the last 128 tokens. Growth to seq 501 frees SWA tokens
// before 500−128−1 = 371 and adds one: 130 live.
func TestSWAMirrorPageSizeOne(t *testing.T) {
	cfg := testConfig(kvlayout.KindHybridSWA, 1, 4096, 8)
	cfg.Pool.SWA = kvlayout.SWAConfig{Window: 128, TotalTokens: 1024}
	cfg.Admission.ReservedDecodeTokens = 0
	l := newLedger(t, cfg, false)
	err := l.Enqueue(req(9, 1025, 1))
	var ce *CapacityError
	if !errors.As(err, &ce) || err.Error() != "Request rid-9 exceeds the maximum number of tokens: 1025 > 1024" {
		t.Fatalf("capacity error %v", err)
	}
	mustNil(t, "enqueue", l.Enqueue(req(1, 500, 10)))
	mustNil(t, "ready", l.SetReady(1))
	_, reason, adm := admitRooms(t, l)
	if len(adm) != 1 || reason != BlockNone {
		t.Fatalf("admission %d %s", len(adm), reason)
	}
	if n := len(adm[0].Alloc.State[0].Indices); n != 128 {
		t.Errorf("SWA window %d tokens, want 128", n)
	}
	if s := l.Stats(); s.SWAPages.Used != 500 || s.Pages.Used != 500 {
		t.Errorf("used: %d SWA, %d full; want 500, 500", s.SWAPages.Used, s.Pages.Used)
	}
	mustNil(t, "start", l.StartRunning(1))
	if np, err := l.UpdateRunning(1, 1); err != nil || len(np) != 1 {
		t.Fatalf("update: %v %v", np, err)
	}
	if s := l.Stats(); s.SWAPages.Used != 130 || s.Pages.Used != 501 {
		t.Errorf("after growth: %d SWA, %d full; want 130, 501", s.SWAPages.Used, s.Pages.Used)
	}
	mustNil(t, "release", l.Release(1))
	assertFull(t, l)
}

// TestMambaSlots: hybrid-linear with the extra buffer and ping_pong 2 takes
// 1 + 2 = 3 slots per request. With 7 slots (fewer than Validate requires,
// built on purpose) two rooms fit; the third is blocked by the Mamba check
// (3 > 7 − 6). Slots are reused FIFO.
func TestMambaSlots(t *testing.T) {
	cfg := testConfig(kvlayout.KindHybridLinear, 16, 1024, 4)
	cfg.Pool.Mamba.StateSlots = 7
	cfg.Admission.ReservedDecodeTokens = 0
	l := newLedger(t, cfg, true)
	for id := uint64(1); id <= 3; id++ {
		mustNil(t, "enqueue", l.Enqueue(req(id, 100, 10)))
		mustNil(t, "ready", l.SetReady(id))
	}
	got, reason, adm := admitRooms(t, l)
	if diff := cmp.Diff([]uint64{1, 2}, got); diff != "" || reason != BlockMamba {
		t.Fatalf("admitted %v reason %s, want [1 2] mamba", got, reason)
	}
	type slots struct{ Main, PingPong []int32 }
	view := func(a Allocation) slots {
		if len(a.State) != 1 || a.State[0].Type != kvlayout.StateMamba {
			t.Fatalf("state %+v", a.State)
		}
		return slots{a.State[0].Indices, a.MambaPingPong}
	}
	want := []slots{{[]int32{0}, []int32{1, 2}}, {[]int32{3}, []int32{4, 5}}}
	for i, a := range adm {
		if diff := cmp.Diff(want[i], view(a.Alloc)); diff != "" {
			t.Errorf("room %d slots (-want +got):\n%s", a.Room, diff)
		}
	}
	if s := l.Stats(); s.MambaSlots.Used != 6 || s.MambaSlots.Total != 7 {
		t.Errorf("mamba stats %+v", s.MambaSlots)
	}
	mustNil(t, "release 1", l.Release(1))
	_, reason, adm = admitRooms(t, l)
	if len(adm) != 1 || adm[0].Room != 3 || reason != BlockNone {
		t.Fatalf("after release: %d admissions, %s", len(adm), reason)
	}
	if diff := cmp.Diff(slots{[]int32{6}, []int32{0, 1}}, view(adm[0].Alloc)); diff != "" {
		t.Errorf("FIFO reuse (-want +got):\n%s", diff)
	}
	releaseAll(t, l, 2, 3)
	assertFull(t, l)
}

// TestMambaNoExtraBuffer: one slot per request, no ping-pong slots.
func TestMambaNoExtraBuffer(t *testing.T) {
	cfg := testConfig(kvlayout.KindHybridLinear, 16, 1024, 4)
	cfg.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 4}
	l := newLedger(t, cfg, false)
	mustNil(t, "enqueue", l.Enqueue(req(1, 100, 10)))
	mustNil(t, "ready", l.SetReady(1))
	_, _, adm := admitRooms(t, l)
	if len(adm) != 1 || len(adm[0].Alloc.MambaPingPong) != 0 || !cmp.Equal(adm[0].Alloc.State[0].Indices, []int32{0}) {
		t.Fatalf("allocation %+v", adm)
	}
	mustNil(t, "release", l.Release(1))
	assertFull(t, l)
}

// TestStateIndicesByKind: DSA sends the full-sequence page ids (the same
// pages as the KV destination); MLA/GQA send no state.
func TestStateIndicesByKind(t *testing.T) {
	for _, kind := range []kvlayout.Kind{kvlayout.KindHybridMLA, kvlayout.KindMLA, kvlayout.KindGQA, kvlayout.KindMHA} {
		t.Run(kind.String(), func(t *testing.T) {
			l := newLedger(t, testConfig(kind, 64, 1024, 4), false)
			mustNil(t, "enqueue", l.Enqueue(req(1, 4000, 10)))
			mustNil(t, "ready", l.SetReady(1))
			_, _, adm := admitRooms(t, l)
			a := adm[0].Alloc
			if len(a.Pages) != 63 || a.AllocTokens != 63*64 || a.FillLen != 4000 || a.ReqSlot != 1 {
				t.Fatalf("allocation: %d pages, alloc %d, fill %d, req slot %d", len(a.Pages), a.AllocTokens, a.FillLen, a.ReqSlot)
			}
			if kind == kvlayout.KindHybridMLA {
				if len(a.State) != 1 || a.State[0].Type != kvlayout.StateDSA {
					t.Fatalf("state %+v", a.State)
				}
				if diff := cmp.Diff(a.Pages, a.State[0].Indices); diff != "" {
					t.Errorf("DSA indices differ from pages:\n%s", diff)
				}
			} else if len(a.State) != 0 {
				t.Errorf("unexpected state %+v", a.State)
			}
			got, _ := l.Allocation(1)
			if diff := cmp.Diff(a, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Allocation() differs from the admission (-adm +get):\n%s", diff)
			}
			mustNil(t, "release", l.Release(1))
			assertFull(t, l)
		})
	}
}
