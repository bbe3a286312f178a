package prealloc

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// putRoomIn takes room id (prompt 700, max_new 10) to state st. Room 100
// must be running already (the bystander whose decode-step report lets a
// retracted room resume).
func putRoomIn(t *testing.T, l *Ledger, id uint64, st RoomState) {
	t.Helper()
	mustNil(t, "enqueue", l.Enqueue(req(id, 700, 10)))
	if st != RoomWaiting {
		mustNil(t, "ready", l.SetReady(id))
	}
	if st == RoomWaiting || st == RoomReady {
		return
	}
	if got, _, _ := admitRooms(t, l); !cmp.Equal(got, []uint64{id}) {
		t.Fatalf("admitted %v", got)
	}
	switch st {
	case RoomAdmitted:
		return
	case RoomClaimed:
		mustNil(t, "claim", l.Claim(id))
		return
	}
	mustNil(t, "start", l.StartRunning(id))
	if _, err := l.UpdateRunning(id, 40); err != nil {
		t.Fatal(err)
	}
	switch st {
	case RoomRetracted:
		mustNil(t, "retract", l.Retract(id))
	case RoomHeld:
		mustNil(t, "hold", l.Hold(id))
	case RoomResumed:
		mustNil(t, "retract", l.Retract(id))
		if _, err := l.UpdateRunning(100, 5); err != nil {
			t.Fatal(err)
		}
		if adm, _ := l.Admit(); len(adm) != 1 || !adm[0].Resumed {
			t.Fatalf("resume: %+v", adm)
		}
	}
	if got, _ := l.State(id); got != st {
		t.Fatalf("room in state %s, want %s", got, st)
	}
}

// TestDrainFromEveryHoldingState: DrainRoom from admitted, claimed, resumed
// and running keeps exactly what the room holds (its metadata slot and
// marker too when it has one), takes it out of every live-request term
// (state counts, retractable, the claim deadline), refuses every other
// operation, is idempotent, and Release then frees everything once.
func TestDrainFromEveryHoldingState(t *testing.T) {
	for _, kind := range []kvlayout.Kind{kvlayout.KindHybridSWA, kvlayout.KindHybridLinear, kvlayout.KindGQA} {
		for _, st := range []RoomState{RoomAdmitted, RoomClaimed, RoomResumed, RoomRunning} {
			t.Run(kind.String()+"/"+st.String(), func(t *testing.T) {
				cfg := testConfig(kind, 16, 1024, 8)
				cfg.Admission.ClaimTimeout = time.Minute
				l := newLedger(t, cfg, false)
				runRoom(t, l, req(100, 300, 10), 5)
				before := l.Stats()
				putRoomIn(t, l, 1, st)
				held := l.Stats()
				alloc, _ := l.Allocation(1)
				pages := slices.Clone(alloc.Pages)
				if st == RoomAdmitted || st == RoomClaimed {
					// The transfer view; the room holds every page of its fill.
					l.mu.Lock()
					pages = slices.Clone(l.rooms[1].pages)
					l.mu.Unlock()
				}

				mustNil(t, "drain", l.DrainRoom(1))
				checkInv(t, l)
				mustNil(t, "drain again", l.DrainRoom(1))
				if got, _ := l.State(1); got != RoomDraining {
					t.Fatalf("state %s, want draining", got)
				}
				s := l.Stats()
				if s.Draining != 1 || s.Admitted+s.Claimed+s.Resumed+s.Running != 1 {
					t.Errorf("counts: %d draining, %d admitted %d claimed %d resumed %d running; want 1 draining, the bystander running",
						s.Draining, s.Admitted, s.Claimed, s.Resumed, s.Running)
				}
				if s.Retractable != before.Retractable {
					t.Errorf("retractable %d, want the bystander's %d", s.Retractable, before.Retractable)
				}
				// Nothing freed: the pools are exactly as while the room held them.
				if s.Pages.Used != held.Pages.Used || s.SWAPages.Used != held.SWAPages.Used || s.ReqSlots.Used != held.ReqSlots.Used ||
					s.MetaSlots.Used != held.MetaSlots.Used || s.MambaSlots.Used != held.MambaSlots.Used {
					t.Errorf("pools changed by drain:\nheld %+v\nnow  %+v", held, s)
				}
				wantMeta := int64(0)
				if st == RoomAdmitted || st == RoomClaimed {
					wantMeta = 1
				}
				if s.Pages.Draining != int64(len(pages)) || s.ReqSlots.Draining != 1 || s.MetaSlots.Draining != wantMeta ||
					s.Pages.Draining != s.Pages.Used-before.Pages.Used || s.SWAPages.Draining != s.SWAPages.Used-before.SWAPages.Used ||
					s.MambaSlots.Draining != s.MambaSlots.Used-before.MambaSlots.Used {
					t.Errorf("draining shares: pages %d (holds %d), req %d, meta %d (want %d), swa %d, mamba %d; stats %+v",
						s.Pages.Draining, len(pages), s.ReqSlots.Draining, s.MetaSlots.Draining, wantMeta, s.SWAPages.Draining, s.MambaSlots.Draining, s)
				}
				if kind == kvlayout.KindHybridLinear && s.MambaSlots.Draining != 3 {
					t.Errorf("mamba slots draining %d, want 3", s.MambaSlots.Draining)
				}
				if kind == kvlayout.KindHybridSWA && s.SWAPages.Draining == 0 {
					t.Errorf("no SWA pages draining")
				}
				a, ok := l.Allocation(1)
				if !ok || !slices.Equal(a.Pages, pages) || (a.MetadataSlot >= 0) != (wantMeta == 1) {
					t.Errorf("allocation while draining: %v %+v, want every page %v", ok, a, pages)
				}
				// A draining room is no longer a request.
				mustIs(t, "set ready", l.SetReady(1), errWrongState)
				mustIs(t, "claim", l.Claim(1), errWrongState)
				mustIs(t, "start", l.StartRunning(1), errWrongState)
				_, err := l.UpdateRunning(1, 50)
				mustIs(t, "update", err, errWrongState)
				mustIs(t, "retract", l.Retract(1), errWrongState)
				mustIs(t, "hold", l.Hold(1), errWrongState)
				if got := l.ResumeHeld(); len(got) != 0 {
					t.Errorf("resumed held %v", got)
				}
				if s2 := l.Stats(); s2.Pages != s.Pages || s2.Draining != 1 {
					t.Errorf("refused operations changed the ledger:\n%+v\n%+v", s, s2)
				}
				checkInv(t, l)

				mustNil(t, "release", l.Release(1))
				mustIs(t, "second release", l.Release(1), errUnknownRoom)
				mustIs(t, "drain released", l.DrainRoom(1), errUnknownRoom)
				checkInv(t, l)
				after := l.Stats()
				after.LastBlocked, after.FullBudget, after.SWABudget = before.LastBlocked, before.FullBudget, before.SWABudget
				if diff := cmp.Diff(before, after); diff != "" {
					t.Errorf("stats after release differ from before the room (-before +after):\n%s", diff)
				}
				l.mu.Lock()
				for _, p := range pages {
					if !l.pages.isFree(p) {
						t.Errorf("page %d not free after release", p)
					}
				}
				l.mu.Unlock()
				mustNil(t, "release bystander", l.Release(100))
				assertFull(t, l)
			})
		}
	}
}

// TestDrainRefusedWithoutAllocation: a room that holds nothing cannot
// drain (the caller releases it); nothing changes.
func TestDrainRefusedWithoutAllocation(t *testing.T) {
	for _, st := range []RoomState{RoomWaiting, RoomReady, RoomRetracted, RoomHeld} {
		t.Run(st.String(), func(t *testing.T) {
			l := newLedger(t, testConfig(kvlayout.KindGQA, 16, 1024, 8), false)
			runRoom(t, l, req(100, 300, 10), 5)
			putRoomIn(t, l, 1, st)
			before := l.Stats()
			mustIs(t, "drain", l.DrainRoom(1), errWrongState)
			if got, _ := l.State(1); got != st {
				t.Errorf("state %s, want %s", got, st)
			}
			if diff := cmp.Diff(before, l.Stats()); diff != "" {
				t.Errorf("refused drain changed stats:\n%s", diff)
			}
			checkInv(t, l)
			releaseAll(t, l, 1, 100)
			assertFull(t, l)
		})
	}
	l := newLedger(t, testConfig(kvlayout.KindGQA, 16, 64, 4), false)
	mustIs(t, "drain unknown", l.DrainRoom(9), errUnknownRoom)
}

// TestDrainingPagesNeverAdmitted: the pages of a draining room are not
// given to another room until Release; with them released the waiting room
// is admitted at once, onto those pages. The draining room counts in no
// budget term but the used pages: no R reserved for it.
func TestDrainingPagesNeverAdmitted(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 64, 4) // 1024 tokens
	cfg.Admission.ReservedDecodeTokens = 64
	cfg.Admission.ClipMaxNewTokens = 64
	l := newLedger(t, cfg, false)
	mustNil(t, "enqueue", l.Enqueue(req(1, 640, 32))) // 40 pages
	mustNil(t, "ready", l.SetReady(1))
	_, _, adm := admitRooms(t, l)
	if len(adm) != 1 {
		t.Fatalf("admitted %+v", adm)
	}
	drained := slices.Clone(adm[0].Alloc.Pages)
	mustNil(t, "claim", l.Claim(1))
	mustNil(t, "drain", l.DrainRoom(1))

	// Budget: 24 free pages × 16 tokens, nothing active (the draining room
	// reserves no decode tokens).
	if _, reason := l.Admit(); reason != BlockNone {
		t.Fatalf("empty pass: %s", reason)
	}
	if got, want := l.Stats().FullBudget, int64(24*16); got != want {
		t.Errorf("full budget with a draining room: %d, want %d (free tokens, no R for it)", got, want)
	}
	// Room 2 needs 30 pages: only with room 1's pages back.
	mustNil(t, "enqueue", l.Enqueue(req(2, 480, 32)))
	mustNil(t, "ready", l.SetReady(2))
	for i := 0; i < 3; i++ {
		got, reason, _ := admitRooms(t, l)
		if len(got) != 0 || reason != BlockTokens {
			t.Fatalf("pass %d with room 1 draining: admitted %v (%s), want none (tokens)", i, got, reason)
		}
	}
	// Small rooms fit beside it, never on its pages.
	for id := uint64(3); id <= 4; id++ {
		mustNil(t, "release 2", l.Release(2))
		mustNil(t, "enqueue", l.Enqueue(req(id, 16*8, 8)))
		mustNil(t, "ready", l.SetReady(id))
		_, _, adm := admitRooms(t, l)
		if len(adm) != 1 {
			t.Fatalf("small room %d: %+v", id, adm)
		}
		for _, p := range adm[0].Alloc.Pages {
			if slices.Contains(drained, p) {
				t.Fatalf("room %d was given page %d of draining room 1", id, p)
			}
		}
		mustNil(t, "re-enqueue 2", l.Enqueue(req(2, 480, 32)))
		mustNil(t, "ready 2", l.SetReady(2))
	}
	releaseAll(t, l, 3, 4)
	mustNil(t, "release draining", l.Release(1))
	got, reason, adm := admitRooms(t, l)
	if !cmp.Equal(got, []uint64{2}) {
		t.Fatalf("after release: admitted %v (%s), want [2]", got, reason)
	}
	reused := 0
	for _, p := range adm[0].Alloc.Pages {
		if slices.Contains(drained, p) {
			reused++
		}
	}
	if reused == 0 {
		t.Errorf("room 2 got none of the released pages: %v", adm[0].Alloc.Pages)
	}
	releaseAll(t, l, 2)
	assertFull(t, l)
}

// TestDrainOneReleaseAnother: of two admitted rooms whose claims ended
// (the room manager's claim timeout), the one a prefill rank may still
// write into drains (pages held, out of the budget) until Release, the
// other is released at once.
func TestDrainOneReleaseAnother(t *testing.T) {
	cfg := testConfig(kvlayout.KindGQA, 16, 1024, 8)
	l := newLedger(t, cfg, false)
	for _, id := range []uint64{1, 2} {
		mustNil(t, "enqueue", l.Enqueue(req(id, 100, 1)))
		mustNil(t, "ready", l.SetReady(id))
	}
	admitRooms(t, l)
	used := l.Stats().Pages.Used
	mustNil(t, "drain", l.DrainRoom(1))
	mustNil(t, "release", l.Release(2))
	if st, ok := l.State(1); !ok || st != RoomDraining {
		t.Fatalf("kept room: state %s %v, want draining", st, ok)
	}
	if _, ok := l.State(2); ok {
		t.Errorf("room 2 not kept: still in the ledger")
	}
	s := l.Stats()
	if s.Draining != 1 || s.Pages.Draining == 0 || s.Pages.Used != used/2 || s.Pages.Draining != s.Pages.Used {
		t.Fatalf("stats %+v: want room 1's pages (half of %d) held and draining", s, used)
	}
	mustNil(t, "invariants", l.CheckInvariants())
	mustNil(t, "release", l.Release(1))
	if s := l.Stats(); s.Pages.Used != 0 || s.Draining != 0 {
		t.Fatalf("after release: %+v", s)
	}
}
