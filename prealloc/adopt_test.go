package prealloc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// freeLists snapshots the free lists in order (white-box): a refused Adopt
// must leave them exactly as they were.
func freeLists(l *Ledger) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ring := func(r *slotRing) []int32 {
		out := make([]int32, r.avail())
		for i := range out {
			out[i] = r.at(i)
		}
		return out
	}
	return fmt.Sprint(l.pages.free, l.pages.pos, l.swaPages.free, l.swaPages.pos, ring(&l.reqSlots), l.reqSlots.pos, ring(&l.mambaS), l.mambaS.pos)
}

func adoptReq(room uint64, prompt, output int) Request {
	r := req(room, prompt, 64)
	r.OutputLen = output
	return r
}

// TestAdoptThenAdmit: adopted rooms are running rooms that own exactly the
// named pages and req slots; admission then fills the rest of the pool and
// never hands out an adopted page or row.
func TestAdoptThenAdmit(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 64, 8)
	cfg.Admission.ReservedDecodeTokens = 16
	cfg.Admission.ClipMaxNewTokens = 16
	l := newLedger(t, cfg, false)
	adopted := map[int32]uint64{}
	rows := map[int32]bool{}
	for _, a := range []Adoption{
		{Request: adoptReq(1, 40, 8), ReqSlot: 3, Pages: []int32{0, 63, 17}}, // 48 tokens: 3 pages
		{Request: adoptReq(2, 16, 1), ReqSlot: 8, Pages: []int32{5, 6}},      // 17 tokens: 2 pages
		{Request: adoptReq(3, 0, 0), ReqSlot: 1, Pages: nil},                 // nothing yet
		{Request: adoptReq(4, 100, 60), ReqSlot: 2, Pages: seq(30, 10)},      // 160 tokens: 10 pages
	} {
		mustNil(t, "adopt", l.Adopt(a))
		for _, p := range a.Pages {
			adopted[p] = a.Request.Room
		}
		rows[a.ReqSlot] = true
		checkInv(t, l)
		if st, _ := l.State(a.Request.Room); st != RoomRunning {
			t.Fatalf("room %d adopted in state %s", a.Request.Room, st)
		}
		al, _ := l.Allocation(a.Request.Room)
		if !slices.Equal(al.Pages, a.Pages) || al.ReqSlot != a.ReqSlot || al.MetadataSlot != -1 {
			t.Fatalf("room %d allocation %+v, want pages %v row %d", a.Request.Room, al, a.Pages, a.ReqSlot)
		}
		if got, _ := l.RoomRequest(a.Request.Room); got != a.Request {
			t.Fatalf("request %+v, want %+v", got, a.Request)
		}
	}
	s := l.Stats()
	if s.Running != 4 || s.Pages.Used != 15 || s.ReqSlots.Used != 4 || s.Retractable != 48+17+0+160 {
		t.Fatalf("after adoption: %+v", s)
	}
	// Admit small rooms until the pool is exhausted.
	var admitted []uint64
	for id := uint64(10); ; id++ {
		mustNil(t, "enqueue", l.Enqueue(req(id, 32, 8)))
		mustNil(t, "ready", l.SetReady(id))
		_, reason, adm := admitRooms(t, l)
		if len(adm) == 0 {
			if reason != BlockTokens && reason != BlockReqSlots {
				t.Fatalf("stopped by %s", reason)
			}
			mustNil(t, "release queued", l.Release(id))
			break
		}
		for _, a := range adm {
			for _, p := range a.Alloc.Pages {
				if owner, ok := adopted[p]; ok {
					t.Fatalf("room %d admitted onto page %d of adopted room %d", a.Room, p, owner)
				}
			}
			if rows[a.Alloc.ReqSlot] {
				t.Fatalf("room %d admitted onto adopted req slot %d", a.Room, a.Alloc.ReqSlot)
			}
			admitted = append(admitted, a.Room)
		}
	}
	if len(admitted) != 4 { // 8 rows − 4 adopted
		t.Errorf("admitted %d rooms beside the adopted ones, want 4 (the free rows)", len(admitted))
	}
	releaseAll(t, l, admitted...)
	releaseAll(t, l, 1, 2, 3, 4)
	assertFull(t, l)
}

func seq(from, n int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = from + int32(i)
	}
	return out
}

// TestAdoptConflicts: every refusal names its problem, returns the
// sentinel to branch on, and changes nothing (free lists in the same order).
func TestAdoptConflicts(t *testing.T) {
	type tc struct {
		name string
		kind kvlayout.Kind
		a    Adoption
		want error
		msg  string
	}
	rb := adoptReq(50, 16, 0)
	rb.Rebootstrap = true
	bad := adoptReq(50, -1, 0)
	cases := []tc{
		{"page out of range high", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{10, 64}}, ErrInvalidRequest, "page 64 out of range (0..63)"},
		{"page out of range low", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{-1, 10}}, ErrInvalidRequest, "page -1 out of range"},
		{"page named twice", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 40, 0), ReqSlot: 5, Pages: []int32{20, 21, 20}}, ErrInvalidRequest, "page 20 named twice"},
		{"page held by an admitted room", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{40, 0}}, ErrOwned, "page 0 is held by room 1"},
		{"page held by an adopted room", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{61, 40}}, ErrOwned, "page 61 is held by room 2"},
		{"too few pages", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 32, 1), ReqSlot: 5, Pages: []int32{40, 41}}, ErrInvalidRequest, "2 pages for 33 tokens (prompt 32 + output 1) at page size 16, want 3"},
		{"too many pages", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40, 41}}, ErrInvalidRequest, "want 1"},
		{"req slot 0 (padding)", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 0, Pages: []int32{40}}, ErrInvalidRequest, "req slot 0 out of range (1..8)"},
		{"req slot too high", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 9, Pages: []int32{40}}, ErrInvalidRequest, "req slot 9 out of range"},
		{"req slot held", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 7, Pages: []int32{40}}, ErrOwned, "req slot 7 is held by room 2"},
		{"room exists", kvlayout.KindGQA, Adoption{Request: adoptReq(2, 16, 0), ReqSlot: 5, Pages: []int32{40}}, errRoomExists, "adopt room 2"},
		{"rebootstrap", kvlayout.KindGQA, Adoption{Request: rb, ReqSlot: 5, Pages: []int32{40}}, ErrInvalidRequest, "not a rebootstrap"},
		{"negative prompt", kvlayout.KindGQA, Adoption{Request: bad, ReqSlot: 5}, ErrInvalidRequest, "prompt length -1"},
		{"SWA pages for a pool without", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40}, SWAPages: []int32{1}}, ErrInvalidRequest, "kind gqa has no SWA pool"},
		{"mamba slots for a pool without", kvlayout.KindGQA, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40}, MambaSlots: []int32{1}}, ErrInvalidRequest, "needs 0"},
		// hybrid-swa: window 256, 64 SWA pages of 16.
		{"SWA pages missing", kvlayout.KindHybridSWA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{40, 41}}, ErrInvalidRequest, "0 SWA pages for 2 pages, want 2..2"},
		{"SWA pages short of the window", kvlayout.KindHybridSWA, Adoption{Request: adoptReq(50, 400, 0), ReqSlot: 5, Pages: seq(30, 25), SWAPages: seq(30, 10)}, ErrInvalidRequest, "10 SWA pages for 25 pages, want 16..25"},
		{"SWA page named twice", kvlayout.KindHybridSWA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{40, 41}, SWAPages: []int32{9, 9}}, ErrInvalidRequest, "swa page 9 named twice"},
		{"SWA page held", kvlayout.KindHybridSWA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{40, 41}, SWAPages: []int32{9, 0}}, ErrOwned, "swa page 0 is held by room 1"},
		{"SWA page out of range", kvlayout.KindHybridSWA, Adoption{Request: adoptReq(50, 32, 0), ReqSlot: 5, Pages: []int32{40, 41}, SWAPages: []int32{9, 64}}, ErrInvalidRequest, "swa page 64 out of range (0..63)"},
		// hybrid-linear: 3 slots per request, 24 slots.
		{"mamba slots missing", kvlayout.KindHybridLinear, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40}}, ErrInvalidRequest, "0 mamba slots given, kind hybrid-linear needs 3"},
		{"mamba slot named twice", kvlayout.KindHybridLinear, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40}, MambaSlots: []int32{20, 21, 20}}, ErrInvalidRequest, "mamba slot 20 named twice"},
		{"mamba slot held", kvlayout.KindHybridLinear, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40}, MambaSlots: []int32{20, 0, 21}}, ErrOwned, "mamba slot 0 is held by room 1"},
		{"mamba slot out of range", kvlayout.KindHybridLinear, Adoption{Request: adoptReq(50, 16, 0), ReqSlot: 5, Pages: []int32{40}, MambaSlots: []int32{20, 24, 21}}, ErrInvalidRequest, "mamba slot 24 out of range (0..23)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(c.kind, 16, 64, 8)
			if c.kind == kvlayout.KindHybridSWA {
				cfg.Pool.SWA.TotalTokens = 64 * 16
			}
			l := newLedger(t, cfg, false)
			// Room 1 admitted (pages from 0, row 1, first state slots), room
			// 2 adopted on page 61 and row 7.
			mustNil(t, "enqueue", l.Enqueue(req(1, 32, 8)))
			mustNil(t, "ready", l.SetReady(1))
			if got, _, _ := admitRooms(t, l); len(got) != 1 {
				t.Fatalf("admitted %v", got)
			}
			a2 := Adoption{Request: adoptReq(2, 16, 0), ReqSlot: 7, Pages: []int32{61}}
			if c.kind == kvlayout.KindHybridSWA {
				a2.SWAPages = []int32{61}
			}
			if c.kind == kvlayout.KindHybridLinear {
				a2.MambaSlots = []int32{23, 22, 12}
			}
			mustNil(t, "adopt 2", l.Adopt(a2))
			before, lists := l.Stats(), freeLists(l)
			err := l.Adopt(c.a)
			if !errors.Is(err, c.want) || err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("adopt: got %v, want %v containing %q", err, c.want, c.msg)
			}
			if diff := cmp.Diff(before, l.Stats()); diff != "" {
				t.Errorf("refused adopt changed stats:\n%s", diff)
			}
			if got := freeLists(l); got != lists {
				t.Errorf("refused adopt changed the free lists:\n%s\n%s", lists, got)
			}
			if _, ok := l.State(50); ok {
				t.Errorf("room 50 exists after a refused adopt")
			}
			checkInv(t, l)
			releaseAll(t, l, 1, 2)
			assertFull(t, l)
		})
	}
}

// TestAdoptedRoomLifecycle: an adopted room is any running room. It grows
// (onto free pages), its release returns exactly its pages and row, it
// retracts and resumes, holds, drains; the same pages can be adopted again.
func TestAdoptedRoomLifecycle(t *testing.T) {
	for _, kind := range []kvlayout.Kind{kvlayout.KindGQA, kvlayout.KindHybridSWA, kvlayout.KindHybridLinear, kvlayout.KindHybridMLA} {
		t.Run(kind.String(), func(t *testing.T) {
			cfg := testConfig(kind, 16, 64, 8)
			cfg.Admission.ReservedDecodeTokens = 16
			cfg.Admission.ClipMaxNewTokens = 64
			if kind == kvlayout.KindHybridSWA {
				cfg.Pool.SWA = kvlayout.SWAConfig{Window: 32, TotalTokens: 64 * 16}
			}
			l := newLedger(t, cfg, false)
			a := Adoption{Request: adoptReq(1, 90, 10), ReqSlot: 4, Pages: []int32{9, 3, 50, 20, 11, 12, 33}} // 100 tokens
			switch kind {
			case kvlayout.KindHybridSWA:
				// Window start floor((100−32)/16) = 4: pages 4..6 at least;
				// the engine still holds page 3's SWA page too.
				a.SWAPages = []int32{8, 2, 7, 40}
			case kvlayout.KindHybridLinear:
				a.MambaSlots = []int32{5, 0, 17}
			}
			cycle := func() {
				mustNil(t, "adopt", l.Adopt(a))
				checkInv(t, l)
				l.mu.Lock()
				for _, p := range a.Pages {
					if l.pages.isFree(p) {
						t.Errorf("adopted page %d still free", p)
					}
				}
				l.mu.Unlock()
				mustNil(t, "release", l.Release(1))
				assertFull(t, l)
				l.mu.Lock()
				for _, p := range a.Pages {
					if !l.pages.isFree(p) {
						t.Errorf("page %d not free after release", p)
					}
				}
				l.mu.Unlock()
			}
			cycle()
			cycle() // the same pages again

			mustNil(t, "adopt", l.Adopt(a))
			al, _ := l.Allocation(1)
			if kind == kvlayout.KindHybridLinear && (!cmp.Equal(al.State[0].Indices, []int32{5}) || !cmp.Equal(al.MambaPingPong, []int32{0, 17})) {
				t.Errorf("mamba view %+v", al)
			}
			if kind == kvlayout.KindHybridSWA && !cmp.Equal(al.State[0].Indices, a.SWAPages) {
				t.Errorf("swa view %+v", al.State)
			}
			np, err := l.UpdateRunning(1, 30) // 120 tokens: 8 pages
			if err != nil || len(np) != 1 || slices.Contains(a.Pages, np[0]) {
				t.Fatalf("growth %v %v", np, err)
			}
			if kind == kvlayout.KindHybridSWA {
				// evict before floor((120−1−32−16)/16) = 4: SWA page of seq page 3 goes.
				al, _ := l.Allocation(1)
				if want := []int32{2, 7, 40}; !cmp.Equal(al.State[0].Indices[:3], want) || len(al.State[0].Indices) != 4 {
					t.Errorf("swa after growth %v, want %v + one new", al.State[0].Indices, want)
				}
			}
			checkInv(t, l)
			mustNil(t, "retract", l.Retract(1))
			if adm, _ := l.Admit(); len(adm) != 1 || !adm[0].Resumed {
				t.Fatalf("resume: %+v", adm)
			}
			mustNil(t, "start", l.StartRunning(1))
			mustNil(t, "hold", l.Hold(1))
			mustNil(t, "release held", l.Release(1))
			assertFull(t, l)
			mustNil(t, "adopt", l.Adopt(a))
			mustNil(t, "drain", l.DrainRoom(1))
			if s := l.Stats(); s.Draining != 1 || s.Pages.Draining != 7 || s.Running != 0 {
				t.Errorf("drained adopted room: %+v", s)
			}
			mustNil(t, "release", l.Release(1))
			assertFull(t, l)
		})
	}
}

// TestTakeSlotKeepsFIFO: taking a specific free row moves only the oldest
// free row (the next pop) into its place.
func TestTakeSlotKeepsFIFO(t *testing.T) {
	r := newSlotRing(1, 6) // 1..6
	r.pop()                // 1
	r.push(1)              // 2 3 4 5 6 1
	r.takeSlot(5)          // 2 moves into 5's place: 3 4 2 6 1
	var got []int32
	for r.avail() > 0 {
		got = append(got, r.pop())
	}
	if want := []int32{3, 4, 2, 6, 1}; !slices.Equal(got, want) {
		t.Errorf("pop order %v, want %v", got, want)
	}
	s := newPageStack(5) // pops 0 1 2 3 4
	s.takePage(3)        // 0 (the top) moves into 3's place
	if got := s.take(nil, 4); !slices.Equal(got, []int32{1, 2, 0, 4}) {
		t.Errorf("page pop order %v", got)
	}
}

// TestAdoptAllocs: adopting a running room into a caller-owned Entry and
// releasing it allocates nothing in steady state (page lists recycled).
func TestAdoptAllocs(t *testing.T) {
	for _, kind := range []kvlayout.Kind{kvlayout.KindGQA, kvlayout.KindHybridSWA, kvlayout.KindHybridLinear} {
		t.Run(kind.String(), func(t *testing.T) {
			cfg := typicalConfig()
			cfg.Pool.Kind = kind
			a := Adoption{Request: adoptReq(1, 4000, 96), ReqSlot: 700, Pages: seq(1000, 64)}
			if kind == kvlayout.KindHybridSWA {
				cfg.Pool.SWA = kvlayout.SWAConfig{Window: 1024, TotalTokens: 1 << 20}
				a.SWAPages = seq(5000, 17)
			}
			if kind == kvlayout.KindHybridLinear {
				cfg.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 3 * 1024, ExtraBuffer: true, PingPong: 2}
				a.MambaSlots = []int32{9, 99, 999}
			}
			l := newLedger(t, cfg, false)
			var e Entry
			cycle := func() {
				if err := l.AdoptEntry(&e, a); err != nil {
					t.Fatal(err)
				}
				if err := l.Release(1); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 10; i++ {
				cycle()
			}
			if n := testing.AllocsPerRun(1000, cycle); n != 0 {
				t.Errorf("adopt/release: %.2f allocs, want 0", n)
			}
			assertFull(t, l)
		})
	}
}
