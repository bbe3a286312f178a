package prealloc

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// queued is one room of an admission table case.
type queued struct {
	room     uint64
	prompt   int
	maxNew   int
	priority int
	notReady bool
}

// TestAdmitDecisions reproduces SGLang's pop_preallocated decisions on
// hand-computed cases. Unless a case says otherwise the pool is GQA, page
// size 16, 1024 pages (16384 tokens), 8 request slots (16 metadata slots),
// R = 512, CLIP = 4096, FIFO. Every case states its arithmetic.
func TestAdmitDecisions(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*kvlayout.Config)
		running []Request // taken to running with output 1 before the pass
		queue   []queued
		want    []uint64
		reason  BlockReason
		budget  int64 // Stats.FullBudget after the pass
	}{
		{
			name: "empty ledger FIFO: budget=16384; 8000 needs 8000+512 ⇒ admit, budget=(524 pages)8384-512=7872; 7000 needs 7008+512=7520 ⇒ admit, budget=1376-1024=352; 100 needs 112+512=624 > 352 ⇒ tokens",
			queue: []queued{
				{room: 1, prompt: 8000, maxNew: 100},
				{room: 2, prompt: 7000, maxNew: 100},
				{room: 3, prompt: 100, maxNew: 100},
			},
			want: []uint64{1, 2}, reason: BlockTokens, budget: 352,
		},
		{
			name:   "head-of-line, R=0: 16000 needs max(16000, 16000+100) ≤ 16384 ⇒ admit, budget=384; 1000 needs 1008 > 384 ⇒ tokens and the 16-token room behind it waits",
			mutate: func(c *kvlayout.Config) { c.Admission.ReservedDecodeTokens = 0 },
			queue: []queued{
				{room: 1, prompt: 16000, maxNew: 100},
				{room: 2, prompt: 1000, maxNew: 100},
				{room: 3, prompt: 16, maxNew: 1},
			},
			want: []uint64{1}, reason: BlockTokens, budget: 384,
		},
		{
			name: "not-ready room skipped, keeps its place: room 1 waiting, room 2 (100 tokens) admitted; queue then has no ready room ⇒ none; budget=(16384-112)-512=15760",
			queue: []queued{
				{room: 1, prompt: 100, maxNew: 10, notReady: true},
				{room: 2, prompt: 100, maxNew: 10},
			},
			want: []uint64{2}, reason: BlockNone, budget: 15760,
		},
		{
			name: "3 running (prompt 1000, out 1, max_new 256), R=512, page 16: retractable=3003, need_single=1256-3003<0, budget=13360-max(1536,-1747)=11824; prompt 3000 needs max(3008+512, 3000+4096-3003=4093) ⇒ admit; budget=10352-2048=8304; prompt 9000 needs 9008+512=9520 ⇒ tokens",
			running: []Request{
				req(101, 1000, 256), req(102, 1000, 256), req(103, 1000, 256),
			},
			queue: []queued{
				{room: 1, prompt: 3000, maxNew: 8000},
				{room: 2, prompt: 9000, maxNew: 10},
			},
			want: []uint64{1}, reason: BlockTokens, budget: 8304,
		},
		{
			name:    "need_space_for_single_req dominates: 1 running (prompt 2000, out 1 ⇒ 126 pages, max_new 10000→CLIP 4096): single=4096+2000-2001=4095 > R=512, budget=14368-4095=10273; prompt 10000 needs 10000+512=10512 ⇒ tokens",
			running: []Request{req(101, 2000, 10000)},
			queue:   []queued{{room: 1, prompt: 10000, maxNew: 16}},
			want:    nil, reason: BlockTokens, budget: 10273,
		},
		{
			// On an empty pool the same estimate would exceed the pool: such a
			// room is refused at Enqueue (TestCapacityRejection).
			name:    "per-room estimate dominates: 1 running (prompt 1000, out 1, max_new 1 ⇒ 63 pages, retractable 1001, need_single 0): budget=15376-512=14864; prompt 11800, max_new 8000→4096: required=11808+512=12320 but 11800+4096-1001=14895 > 14864 ⇒ tokens",
			running: []Request{req(101, 1000, 1)},
			queue:   []queued{{room: 1, prompt: 11800, maxNew: 8000}},
			want:    nil, reason: BlockTokens, budget: 14864,
		},
		{
			name:   "prompt 12300, max_new 8000 with CLIP=2048: max(12816, 12300+2048=14348) ≤ 16384 ⇒ admit; budget=(255 pages)4080-512=3568",
			mutate: func(c *kvlayout.Config) { c.Admission.ClipMaxNewTokens = 2048 },
			queue:  []queued{{room: 1, prompt: 12300, maxNew: 8000}},
			want:   []uint64{1}, reason: BlockNone, budget: 3568,
		},
		{
			name:   "req-slot shortage: 2 slots, three 16-token rooms ⇒ 2 admitted, req_slots; budget=(1022 pages)16352-1024=15328",
			mutate: func(c *kvlayout.Config) { c.Pool.RequestSlots = 2 },
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1}, {room: 2, prompt: 16, maxNew: 1}, {room: 3, prompt: 16, maxNew: 1},
			},
			want: []uint64{1, 2}, reason: BlockReqSlots, budget: 15328,
		},
		{
			name:   "priority low-first: priorities 5,1,3,1 ⇒ order 1(room 2),1(room 4),3(room 3),5(room 1); 3 req slots ⇒ req_slots after three",
			mutate: func(c *kvlayout.Config) { c.Pool.RequestSlots = 3; c.Admission.Priority = kvlayout.PriorityLowFirst },
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1, priority: 5}, {room: 2, prompt: 16, maxNew: 1, priority: 1},
				{room: 3, prompt: 16, maxNew: 1, priority: 3}, {room: 4, prompt: 16, maxNew: 1, priority: 1},
			},
			want: []uint64{2, 4, 3}, reason: BlockReqSlots, budget: 16384 - 3*16 - 3*512,
		},
		{
			name:   "priority high-first: priorities 5,1,3,1 ⇒ order 5(room 1),3(room 3),1(room 2); 3 req slots ⇒ req_slots",
			mutate: func(c *kvlayout.Config) { c.Pool.RequestSlots = 3; c.Admission.Priority = kvlayout.PriorityHighFirst },
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1, priority: 5}, {room: 2, prompt: 16, maxNew: 1, priority: 1},
				{room: 3, prompt: 16, maxNew: 1, priority: 3}, {room: 4, prompt: 16, maxNew: 1, priority: 1},
			},
			want: []uint64{1, 3, 2}, reason: BlockReqSlots, budget: 16384 - 3*16 - 3*512,
		},
		{
			name:   "FIFO ignores priority: arrival order 1,2,3 admitted; req_slots",
			mutate: func(c *kvlayout.Config) { c.Pool.RequestSlots = 3 },
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1, priority: 5}, {room: 2, prompt: 16, maxNew: 1, priority: 1},
				{room: 3, prompt: 16, maxNew: 1, priority: 3}, {room: 4, prompt: 16, maxNew: 1, priority: 1},
			},
			want: []uint64{1, 2, 3}, reason: BlockReqSlots, budget: 16384 - 3*16 - 3*512,
		},
		{
			name:    "priority head blocks: low-first, 1 running (63 pages): budget=14864; priority-0 room of 15000 tokens needs 15008+512=15520 > 14864 ⇒ tokens; the smaller priority-9 room behind it waits (max_bypass 0)",
			mutate:  func(c *kvlayout.Config) { c.Admission.Priority = kvlayout.PriorityLowFirst },
			running: []Request{req(101, 1000, 1)},
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1, priority: 9},
				{room: 2, prompt: 15000, maxNew: 1, priority: 0},
			},
			want: nil, reason: BlockTokens, budget: 14864,
		},
		{
			name:   "priority not-ready head skipped: low-first, priority-0 room waiting, priority-9 room admitted",
			mutate: func(c *kvlayout.Config) { c.Admission.Priority = kvlayout.PriorityLowFirst },
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1, priority: 9},
				{room: 2, prompt: 15000, maxNew: 1, priority: 0, notReady: true},
			},
			want: []uint64{1}, reason: BlockNone, budget: 16384 - 16 - 512,
		},
		{
			name:    "bypass, max_bypass 2: 1 running (63 pages), budget=14864; room 1 (15000) needs 15520 ⇒ set aside; room 2 (16) needs 528 ⇒ admit, budget=(960 pages)15360-1024=14336; room 3 ⇒ admit, budget=15344-1536=13808, room 1 bypassed twice ⇒ strict: room 4 waits, tokens",
			mutate:  func(c *kvlayout.Config) { c.Admission.MaxBypass = 2 },
			running: []Request{req(101, 1000, 1)},
			queue: []queued{
				{room: 1, prompt: 15000, maxNew: 1},
				{room: 2, prompt: 16, maxNew: 1},
				{room: 3, prompt: 16, maxNew: 1},
				{room: 4, prompt: 16, maxNew: 1},
			},
			want: []uint64{2, 3}, reason: BlockTokens, budget: 13808,
		},
		{
			name:    "bypass steps over at most 8 rooms per pass: 8 rooms of 15000 tokens set aside, the 16-token room 9 admitted, budget=14336; the queue then ends ⇒ tokens (the rooms set aside)",
			mutate:  func(c *kvlayout.Config) { c.Admission.MaxBypass = 32 },
			running: []Request{req(101, 1000, 1)},
			queue: []queued{
				{room: 1, prompt: 15000, maxNew: 1}, {room: 2, prompt: 15000, maxNew: 1},
				{room: 3, prompt: 15000, maxNew: 1}, {room: 4, prompt: 15000, maxNew: 1},
				{room: 5, prompt: 15000, maxNew: 1}, {room: 6, prompt: 15000, maxNew: 1},
				{room: 7, prompt: 15000, maxNew: 1}, {room: 8, prompt: 15000, maxNew: 1},
				{room: 9, prompt: 16, maxNew: 1},
			},
			want: []uint64{9}, reason: BlockTokens, budget: 14336,
		},
		{
			name:    "bypass lookahead exhausted: 9 rooms of 15000 tokens ahead of the 16-token room 10 ⇒ the ninth stops the pass, nothing admitted, tokens",
			mutate:  func(c *kvlayout.Config) { c.Admission.MaxBypass = 32 },
			running: []Request{req(101, 1000, 1)},
			queue: []queued{
				{room: 1, prompt: 15000, maxNew: 1}, {room: 2, prompt: 15000, maxNew: 1},
				{room: 3, prompt: 15000, maxNew: 1}, {room: 4, prompt: 15000, maxNew: 1},
				{room: 5, prompt: 15000, maxNew: 1}, {room: 6, prompt: 15000, maxNew: 1},
				{room: 7, prompt: 15000, maxNew: 1}, {room: 8, prompt: 15000, maxNew: 1},
				{room: 9, prompt: 15000, maxNew: 1}, {room: 10, prompt: 16, maxNew: 1},
			},
			want: nil, reason: BlockTokens, budget: 14864,
		},
		{
			name:   "bypass does not apply to a shared shortage: 2 req slots, max_bypass 32 ⇒ rooms 1, 2 admitted, req_slots, room 3 waits",
			mutate: func(c *kvlayout.Config) { c.Pool.RequestSlots = 2; c.Admission.MaxBypass = 32 },
			queue: []queued{
				{room: 1, prompt: 16, maxNew: 1}, {room: 2, prompt: 16, maxNew: 1}, {room: 3, prompt: 16, maxNew: 1},
			},
			want: []uint64{1, 2}, reason: BlockReqSlots, budget: 15328,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(kvlayout.KindGQA, 16, 1024, 8)
			if tc.mutate != nil {
				tc.mutate(&cfg)
			}
			l := newLedger(t, cfg, false)
			for _, r := range tc.running {
				runRoom(t, l, r, 1)
			}
			for _, q := range tc.queue {
				r := req(q.room, q.prompt, q.maxNew)
				r.Priority = q.priority
				mustNil(t, "enqueue", l.Enqueue(r))
				if !q.notReady {
					mustNil(t, "set ready", l.SetReady(q.room))
				}
			}
			got, reason, _ := admitRooms(t, l)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("admitted (-want +got):\n%s", diff)
			}
			if reason != tc.reason {
				t.Errorf("reason = %s, want %s", reason, tc.reason)
			}
			if s := l.Stats(); s.FullBudget != tc.budget || s.LastBlocked != tc.reason {
				t.Errorf("stats budget %d (want %d), last blocked %s", s.FullBudget, tc.budget, s.LastBlocked)
			}
			// A second pass changes nothing and stays O(1): same reason.
			if again, r2 := l.Admit(); len(again) != 0 || r2 != tc.reason {
				t.Errorf("second pass admitted %d rooms, reason %s", len(again), r2)
			}
			for _, r := range tc.running {
				mustNil(t, "release running", l.Release(r.Room))
			}
			for _, q := range tc.queue {
				mustNil(t, "release queued", l.Release(q.room))
			}
			assertFull(t, l)
		})
	}
}

// TestAdmitMetadataSlotShortage: with fewer metadata slots than request
// slots (a pool Validate refuses, built here on purpose) the metadata check
// stops the pass; StartRunning frees the slot (pop_transferred) and the next
// pass admits.
func TestAdmitMetadataSlotShortage(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 1024, 4)
	cfg.Pool.MetadataSlots = 1
	l := newLedger(t, cfg, true)
	for _, id := range []uint64{1, 2} {
		mustNil(t, "enqueue", l.Enqueue(req(id, 16, 1)))
		mustNil(t, "ready", l.SetReady(id))
	}
	got, reason, adm := admitRooms(t, l)
	if diff := cmp.Diff([]uint64{1}, got); diff != "" || reason != BlockMetadataSlots {
		t.Fatalf("first pass %v %s, want [1] metadata_slots", got, reason)
	}
	if adm[0].Alloc.MetadataSlot != 0 {
		t.Errorf("metadata slot %d, want 0", adm[0].Alloc.MetadataSlot)
	}
	mustNil(t, "start", l.StartRunning(1))
	got, reason, adm = admitRooms(t, l)
	if diff := cmp.Diff([]uint64{2}, got); diff != "" || reason != BlockNone {
		t.Fatalf("second pass %v %s, want [2] none", got, reason)
	}
	if adm[0].Alloc.MetadataSlot != 0 {
		t.Errorf("reused metadata slot %d, want 0", adm[0].Alloc.MetadataSlot)
	}
	releaseAll(t, l, 1, 2)
	assertFull(t, l)
}

// TestAdmitRetractedBlocksNew: pool of 64 pages × 16 = 1024 tokens, R = 64.
// Room 1 (480 tokens, 30 pages) is admitted. Room 2 (400 tokens, max_new 80:
// budget 34 × 16 − 64 = 480 ≥ max(464, 480)) runs and grows to 80 output
// tokens (seq 480 ⇒ 30 pages), consuming the reserved slack, and is
// retracted: fill_len = 400 + 79 = 479, full_required = 543. Resume budget =
// 34 pages × 16 = 544 − 64 × 1 active = 480 < 543 ⇒ not resumed, and room 3
// (16 tokens, which would physically fit) is not admitted: BlockRetracted.
// After room 1 is released the budget is 1024 − 0 ≥ 543 ⇒ room 2 resumes (30
// pages, no metadata slot); the retracted queue is empty so the same pass
// admits room 3: budget = 34 × 16 = 544 − max(64 × 1, 0) = 480 ≥ 16 + 64;
// afterwards 33 × 16 = 528 − 128 = 400.
func TestAdmitRetractedBlocksNew(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 64, 8)
	cfg.Admission.ReservedDecodeTokens = 64
	l := newLedger(t, cfg, false)
	mustNil(t, "enqueue 1", l.Enqueue(req(1, 480, 16)))
	mustNil(t, "ready 1", l.SetReady(1))
	if got, _, _ := admitRooms(t, l); !cmp.Equal(got, []uint64{1}) {
		t.Fatalf("room 1 not admitted: %v", got)
	}
	runRoom(t, l, req(2, 400, 80), 80)
	if s := l.Stats(); s.Pages.Used != 30+30 {
		t.Fatalf("pages used %d, want 60", s.Pages.Used)
	}
	mustNil(t, "retract", l.Retract(2))
	mustNil(t, "enqueue 3", l.Enqueue(req(3, 16, 16)))
	mustNil(t, "ready 3", l.SetReady(3))

	got, reason, _ := admitRooms(t, l)
	if len(got) != 0 || reason != BlockRetracted {
		t.Fatalf("pass with retracted room: %v %s, want [] retracted", got, reason)
	}
	if s := l.Stats(); s.FullBudget != 480 || s.Ready != 1 {
		t.Errorf("resume budget %d (want 480), ready %d", s.FullBudget, s.Ready)
	}

	mustNil(t, "release 1", l.Release(1))
	_, reason, adm := admitRooms(t, l)
	want := []struct {
		Room    uint64
		Resumed bool
		Pages   int
		Meta    int32
	}{{2, true, 30, -1}, {3, false, 1, 2}} // metadata FIFO: 0 (room 1), 1 (room 2, freed at start), then 2
	if len(adm) != len(want) || reason != BlockNone {
		t.Fatalf("pass after release: %d admissions, %s", len(adm), reason)
	}
	for i, w := range want {
		a := adm[i]
		if a.Room != w.Room || a.Resumed != w.Resumed || len(a.Alloc.Pages) != w.Pages || a.Alloc.MetadataSlot != w.Meta {
			t.Errorf("admission %d = room %d resumed %v pages %d meta %d, want %+v", i, a.Room, a.Resumed, len(a.Alloc.Pages), a.Alloc.MetadataSlot, w)
		}
	}
	if s := l.Stats(); s.FullBudget != 400 || s.Resumed != 1 || s.Admitted != 1 {
		t.Errorf("after pass: budget %d (want 400), resumed %d, admitted %d", s.FullBudget, s.Resumed, s.Admitted)
	}
	mustIs(t, "claim resumed room", l.Claim(2), errWrongState)
	mustNil(t, "start resumed", l.StartRunning(2))
	if r, _ := l.RoomRequest(2); r.OutputLen != 80 {
		t.Errorf("resumed room output %d, want 80", r.OutputLen)
	}
	releaseAll(t, l, 2, 3)
	assertFull(t, l)
}

// TestResumeInRetractionOrder: page 16, 64 pages (1024 tokens), R = 64.
// Running: room 2 (16 tokens, out 1 ⇒ 2 pages), room 3 (400, out 1 ⇒ 26
// pages), room 1 (320, grown to out 200 ⇒ seq 520 ⇒ 33 pages); 3 pages free.
// Retract 1 (fill 320+199 = 519, needs 583) then 2 (fill 16, needs 80): 38
// pages free = 608, budget = 608 − 64 × 1 active = 544 < 583 ⇒ room 1 stays
// and room 2, which would fit, waits behind it (retraction order).
// Releasing room 3 gives 1024 − 0 = 1024: room 1 resumes (33 pages, budget
// 1024−583 = 441), then room 2 (80 ≤ 441).
func TestResumeInRetractionOrder(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 64, 8)
	cfg.Admission.ReservedDecodeTokens = 64
	l := newLedger(t, cfg, false)
	runRoom(t, l, req(2, 16, 16), 1)
	runRoom(t, l, req(3, 400, 16), 1)
	runRoom(t, l, req(1, 320, 200), 1)
	if _, err := l.UpdateRunning(1, 200); err != nil {
		t.Fatalf("grow room 1: %v", err)
	}
	if s := l.Stats(); s.Pages.Free != 3 {
		t.Fatalf("free pages %d, want 3", s.Pages.Free)
	}
	mustNil(t, "retract 1", l.Retract(1))
	mustNil(t, "retract 2", l.Retract(2))
	got, reason, _ := admitRooms(t, l)
	if len(got) != 0 || reason != BlockRetracted {
		t.Fatalf("got %v %s, want nothing resumed, retracted", got, reason)
	}
	if s := l.Stats(); s.FullBudget != 544 || s.Retracted != 2 {
		t.Fatalf("budget %d (want 544), retracted %d", s.FullBudget, s.Retracted)
	}
	mustNil(t, "release 3", l.Release(3))
	got, reason, adm := admitRooms(t, l)
	if diff := cmp.Diff([]uint64{1, 2}, got); diff != "" || reason != BlockNone {
		t.Fatalf("resume order (-want +got):\n%s reason %s", diff, reason)
	}
	if len(adm[0].Alloc.Pages) != 33 || adm[0].Alloc.FillLen != 519 || !adm[0].Resumed || len(adm[1].Alloc.Pages) != 1 {
		t.Errorf("resumed allocations: room 1 %d pages fill %d, room 2 %d pages", len(adm[0].Alloc.Pages), adm[0].Alloc.FillLen, len(adm[1].Alloc.Pages))
	}
	// The new-admission part of the pass ran with no ready room:
	// (64−34) pages × 16 = 480 − max(64 × 2 resumed, 0) = 352.
	if s := l.Stats(); s.FullBudget != 352 {
		t.Errorf("budget after pass %d, want 352", s.FullBudget)
	}
	releaseAll(t, l, 1, 2)
	assertFull(t, l)
}

// TestBypassThenDrain: the head-of-line policy end to end. GQA, page 16,
// 1024 pages (16384 tokens), R = 512, admission.max_bypass = 2. A running
// room (prompt 1000 ⇒ 63 pages) leaves a budget of 15376 − 512 = 14864, so
// room 1 (15000 tokens: needs 15008 + 512 = 15520, which the empty pool
// holds) does not fit. Rooms 2 and 3 are admitted ahead of it; then it has
// been bypassed twice and blocks strictly: room 4 waits, also after rooms 2
// and 3 leave (the running room still holds 63 pages). When the running room
// ends the pool drains: room 1 is admitted first (16384 ≥ 15520; then 86
// pages = 1376 − 512 = 864 left) and room 4 behind it (528 ≤ 864).
func TestBypassThenDrain(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 1024, 8)
	cfg.Admission.MaxBypass = 2
	l := newLedger(t, cfg, false)
	runRoom(t, l, req(101, 1000, 1), 1)
	for _, r := range []Request{req(1, 15000, 1), req(2, 16, 1), req(3, 16, 1), req(4, 16, 1)} {
		mustNil(t, "enqueue", l.Enqueue(r))
		mustNil(t, "ready", l.SetReady(r.Room))
	}
	if got, reason, _ := admitRooms(t, l); !cmp.Equal(got, []uint64{2, 3}) || reason != BlockTokens {
		t.Fatalf("first pass %v %s, want [2 3] tokens", got, reason)
	}
	releaseAll(t, l, 2, 3)
	if got, reason, _ := admitRooms(t, l); len(got) != 0 || reason != BlockTokens {
		t.Fatalf("pass after two bypasses %v %s, want nothing (strict behind room 1), tokens", got, reason)
	}
	if st, _ := l.State(4); st != RoomReady {
		t.Fatalf("room 4 is %s, want ready (waiting behind room 1)", st)
	}
	mustNil(t, "release running", l.Release(101))
	got, reason, adm := admitRooms(t, l)
	if !cmp.Equal(got, []uint64{1, 4}) || reason != BlockNone {
		t.Fatalf("pass after the drain %v %s, want [1 4] none", got, reason)
	}
	if n := len(adm[0].Alloc.Pages); n != 938 {
		t.Errorf("room 1 got %d pages, want 938 (15000 tokens)", n)
	}
	if s := l.Stats(); s.FullBudget != 336 {
		t.Errorf("budget after the pass %d, want 336 (85 pages = 1360 − 2 × 512)", s.FullBudget)
	}
	releaseAll(t, l, 1, 4)
	assertFull(t, l)
}

// TestRetractWaitsForDecodeStep: GQA, page 16, 64 pages, R = 0. Rooms 1 and
// 2 (480 tokens, 30 pages each) run, 4 pages free. Room 1 cannot grow to
// output 200 (seq 680 ⇒ 43 pages: 13 more). Room 2 is retracted: its 30
// pages are free at once (34), but the next pass does not resume it — the
// pages are for room 1's growth, which the next UpdateRunning takes (21
// left). Room 2 then needs 480 > 21 × 16 = 336 and waits; once room 1 is
// released it resumes with 30 pages (CheckInvariants, run after every pass,
// proves no page has two owners).
func TestRetractWaitsForDecodeStep(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 64, 8)
	cfg.Admission.ReservedDecodeTokens = 0
	l := newLedger(t, cfg, false)
	runRoom(t, l, req(2, 480, 16), 0)
	runRoom(t, l, req(1, 480, 200), 0)
	if _, err := l.UpdateRunning(1, 200); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("grow before the retraction = %v, want ErrNoCapacity", err)
	}
	mustNil(t, "retract", l.Retract(2))
	if s := l.Stats(); s.Pages.Free != 34 || s.Retracted != 1 {
		t.Fatalf("after retract: %d pages free, %d retracted; want 34, 1", s.Pages.Free, s.Retracted)
	}
	if got, reason, _ := admitRooms(t, l); len(got) != 0 || reason != BlockRetracted {
		t.Fatalf("pass right after the retraction %v %s, want nothing, retracted", got, reason)
	}
	grown, err := l.UpdateRunning(1, 200)
	if err != nil || len(grown) != 13 {
		t.Fatalf("grow after the retraction = %d pages, %v; want 13", len(grown), err)
	}
	if got, reason, _ := admitRooms(t, l); len(got) != 0 || reason != BlockRetracted {
		t.Fatalf("pass after the growth %v %s, want nothing (480 > 336), retracted", got, reason)
	}
	mustNil(t, "release 1", l.Release(1))
	got, reason, adm := admitRooms(t, l)
	if !cmp.Equal(got, []uint64{2}) || reason != BlockNone || !adm[0].Resumed || len(adm[0].Alloc.Pages) != 30 {
		t.Fatalf("pass after the release %v %s %+v, want room 2 resumed with 30 pages", got, reason, adm)
	}
	mustNil(t, "start resumed", l.StartRunning(2))
	releaseAll(t, l, 2)
	assertFull(t, l)
}

// TestRetractLastRunningResumes: with no running room left nothing can grow
// into the freed pages, so the next pass resumes the retracted room.
func TestRetractLastRunningResumes(t *testing.T) {
	l := newLedger(t, testConfig(kvlayout.KindGQA, 16, 64, 8), false)
	runRoom(t, l, req(1, 100, 10), 3)
	mustNil(t, "retract", l.Retract(1))
	got, reason, adm := admitRooms(t, l)
	if !cmp.Equal(got, []uint64{1}) || reason != BlockNone || !adm[0].Resumed {
		t.Fatalf("pass %v %s, want room 1 resumed", got, reason)
	}
	mustNil(t, "start resumed", l.StartRunning(1))
	releaseAll(t, l, 1)
	assertFull(t, l)
}

// TestRetractNeverResumableRefused: GQA, page 16, 64 pages (1024 tokens),
// R = 64. A room grown to 1000 tokens would need fill_len 999 + 64 = 1063 >
// 1024 to resume, which not even an empty shard has: Retract refuses it
// (it would stay retracted forever and block every admission) and changes
// nothing; the room keeps running. At 900 tokens (899 + 64 ≤ 1024) it may.
func TestRetractNeverResumableRefused(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 64, 8)
	cfg.Admission.ReservedDecodeTokens = 64
	l := newLedger(t, cfg, false)
	runRoom(t, l, req(1, 100, 100), 1)
	if _, err := l.UpdateRunning(1, 900); err != nil {
		t.Fatal(err)
	}
	before := l.Stats()
	err := l.Retract(1)
	mustIs(t, "retract", err, errWrongState)
	if !strings.Contains(err.Error(), "could never resume: fill_len 999 + 64 reserved tokens > 1024 pool tokens") {
		t.Errorf("error %q does not say why", err)
	}
	if st, _ := l.State(1); st != RoomRunning || l.Stats() != before {
		t.Fatalf("refused retraction changed the ledger: %s", st)
	}
	mustNil(t, "hold", l.Hold(1)) // rebootstrap is still possible
	mustNil(t, "release", l.Release(1))
	runRoom(t, l, req(2, 100, 100), 1)
	if _, err := l.UpdateRunning(2, 800); err != nil {
		t.Fatal(err)
	}
	mustNil(t, "retract at 900 tokens", l.Retract(2))
	releaseAll(t, l, 2)
	assertFull(t, l)
}
