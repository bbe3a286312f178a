package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
)

// engineOwner makes the decode engine the page owner (kv_pool.owner:
// engine) of drainPool's 24 pages.
func engineOwner(c *kvlayout.Config) { engineOwnerPages(24)(c) }

// engineOwnerPages is an engine-owned pool of pages pages.
func engineOwnerPages(pages int64) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) {
		smallPool(pages)(c)
		c.Pool.Owner = kvlayout.OwnerEngine
	}
}

// declare declares pages [first, first+n) and metadata row slot for room.
func (h *harness) declare(room uint64, first, n int32, slot int32) (RoomSnapshot, bool, error) {
	d := Declaration{Room: room, MetadataSlot: slot}
	for p := first; p < first+n; p++ {
		d.Pages = append(d.Pages, p)
	}
	return h.m.DeclareDestination(d)
}

// holdStats is shard i's hand-off ledger.
func (h *harness) holdStats(i int) prealloc.HoldStats {
	h.t.Helper()
	hs := h.m.Status().Holds
	if i >= len(hs) {
		h.t.Fatalf("Status().Holds has %d shards; want the engine's hand-off ledger of shard %d", len(hs), i)
	}
	return hs[i].HoldStats
}

// TestEngineOwnerDeclaredRoomSucceeds: a room of an engine-owned pool
// stops before admission and waits for the engine's declaration; the
// declared pages become its destination as the daemon's own would, the
// prefill ranks claim and fill them, and at success the hold ends (the
// engine decodes in its pages) while the daemon's allocator stays empty.
func TestEngineOwnerDeclaredRoomSucceeds(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(engineOwner))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		s := h.wantPhase(1, PhaseQueued)
		if !strings.Contains(s.WaitingFor, "declaration of the destination it allocated (DeclareDestination)") {
			t.Fatalf("waiting_for = %q, want the engine's declaration", s.WaitingFor)
		}
		if hs := h.holdStats(0); hs.Queued != 1 || hs.Held != 0 {
			t.Fatalf("holds = %+v, want 1 queued", hs)
		}
		snap, already, err := h.declare(1, 4, 16, 7)
		if err != nil || already {
			t.Fatalf("DeclareDestination = %v, already %v", err, already)
		}
		if snap.Phase != PhaseAdmitted {
			t.Fatalf("phase after the declaration = %s, want admitted", snap.Phase)
		}
		if _, already, err := h.declare(1, 4, 16, 7); err != nil || !already {
			t.Fatalf("the same declaration again = %v, already %v; want already", err, already)
		}
		for _, d := range h.claimAll(1) {
			if len(d.Pages) != 16 || d.Pages[0] != 4 || d.Pages[15] != 19 || d.MetadataSlot != 7 {
				t.Fatalf("destination = pages %v slot %d, want the declared pages 4..19 and row 7", d.Pages, d.MetadataSlot)
			}
		}
		if hs := h.holdStats(0); hs.Held != 1 || hs.HeldPages != 16 {
			t.Fatalf("holds while transferring = %+v, want 1 room holding 16 pages", hs)
		}
		h.sendAll(1)
		h.wantPhase(1, PhaseSucceeded)
		if hs := h.holdStats(0); hs.Held != 0 || hs.HeldPages != 0 {
			t.Fatalf("holds after success = %+v, want none: the engine decodes in its pages", hs)
		}
		h.release(1)
		h.assertClean()
	})
}

// TestEngineOwnerHeldPageRefused: a declaration naming a page, a metadata
// row another room's hand-off still holds is refused naming the index and
// the holder, changes nothing (the room stays queued, the refusal is
// counted), and the same pages are accepted once the holder's hand-off
// ended.
func TestEngineOwnerHeldPageRefused(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(engineOwnerPages(40)))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.open(addrA, 2)
		if _, _, err := h.declare(1, 0, 16, 0); err != nil {
			t.Fatal(err)
		}
		_, _, err := h.declare(2, 8, 16, 1)
		var he *prealloc.HeldError
		if !errors.Is(err, ErrHeld) || !errors.As(err, &he) || he.Holder != 1 || he.Index != 8 {
			t.Fatalf("declaring page 8 of room 1's = %v, want ErrHeld naming page 8 and room 1", err)
		}
		if !strings.Contains(err.Error(), "page 8") || !strings.Contains(err.Error(), "room 1") {
			t.Fatalf("message %q does not name the page and the holder", err)
		}
		h.wantPhase(2, PhaseQueued)
		if _, _, err := h.declare(2, 16, 16, 0); !errors.Is(err, ErrHeld) {
			t.Fatalf("declaring room 1's metadata row = %v, want ErrHeld", err)
		}
		if hs := h.holdStats(0); hs.Refused != 2 || hs.Held != 1 || hs.HeldPages != 16 || hs.Queued != 1 {
			t.Fatalf("holds = %+v, want 2 refused and only room 1 held", hs)
		}
		h.complete(1)
		if _, _, err := h.declare(2, 8, 16, 0); err != nil {
			t.Fatalf("declaring room 1's pages after its hand-off ended = %v", err)
		}
		h.complete(2)
		h.release(1)
		h.release(2)
		h.assertClean()
	})
}

// TestEngineOwnerDeclarationChecks: what a declaration may name is checked
// against the room before the hand-off ledger: the pages of exactly the
// tokens beyond the decode prefix, a room that waits for its destination,
// a daemon-owned pool refuses the call.
func TestEngineOwnerDeclarationChecks(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(engineOwner))
		h.register(instance{addr: addrA})
		if _, _, err := h.declare(9, 0, 16, 0); !errors.Is(err, ErrRoomNotFound) {
			t.Fatalf("declaring an unknown room = %v, want ErrRoomNotFound", err)
		}
		h.open(addrA, 1)
		for _, n := range []int32{15, 17} {
			if _, _, err := h.declare(1, 0, n, 0); err == nil {
				t.Fatalf("declaring %d pages of a 16-page room was accepted", n)
			}
		}
		if _, _, err := h.m.DeclareDestination(Declaration{Room: 1, Pages: []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 99}}); err == nil {
			t.Fatal("a page beyond the pool was accepted")
		}
		if _, _, err := h.m.DeclareDestination(Declaration{Room: 1, Pages: []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 14}}); err == nil {
			t.Fatal("a page named twice was accepted")
		}
		h.wantPhase(1, PhaseQueued)
		if hs := h.holdStats(0); hs.Held != 0 || hs.Refused != 0 {
			t.Fatalf("holds after refused declarations = %+v, want nothing held and no held-page refusal", hs)
		}
		if _, _, err := h.declare(1, 0, 16, 0); err != nil {
			t.Fatal(err)
		}
		if _, _, err := h.declare(1, 1, 16, 0); err == nil {
			t.Fatal("a second, different destination of an admitted room was accepted")
		}
		if err := h.m.ReportCapacity(1, EngineCapacity{}); err == nil {
			t.Fatal("ReportCapacity of a shard this daemon does not host was accepted")
		}
		if err := h.m.ReportCapacity(0, EngineCapacity{PagesFree: -1}); err == nil || !strings.Contains(err.Error(), "pages_free") {
			t.Fatalf("ReportCapacity with pages_free -1 = %v, want the field named", err)
		}
		h.m.AbortRoom(1, "")
		h.assertClean()
	})

	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.declare(1, 0, 16, 0); !errors.Is(err, ErrWrongState) {
			t.Fatalf("DeclareDestination with the daemon as owner = %v, want ErrWrongState", err)
		}
		if err := h.m.ReportCapacity(0, EngineCapacity{}); !errors.Is(err, ErrWrongState) {
			t.Fatalf("ReportCapacity with the daemon as owner = %v, want ErrWrongState", err)
		}
		h.m.AbortRoom(1, "")
		h.assertClean()
	})
}

// TestEngineOwnerFailedRoomDrains: a failed room whose prefill rank
// received the destination holds its pages until the rank acknowledges the
// end (or release.deferred_timeout passes): a declaration naming them is
// refused until then, and the room's watchers see "pages reusable" as the
// last event — only then.
func TestEngineOwnerFailedRoomDrains(t *testing.T) {
	for _, ack := range []bool{true, false} {
		name := map[bool]string{true: "acked", false: "deferred timeout"}[ack]
		t.Run(name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(engineOwner), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
				h.register(instance{addr: addrA})
				h.open(addrA, 1)
				h.open(addrA, 2)
				if _, _, err := h.declare(1, 0, 16, 0); err != nil {
					t.Fatal(err)
				}
				w, err := h.m.Watch(1, false)
				if err != nil {
					t.Fatal(err)
				}
				rank := h.requiredRanks(1)[0]
				h.claim(1, rank)
				if err := h.reportChunk(1, rank, 0, 0, 4, false); err != nil {
					t.Fatal(err)
				}
				if _, _, err := h.m.AbortRoom(1, "client went away"); err != nil {
					t.Fatal(err)
				}
				h.wantPhase(1, PhaseFailed)
				if hs := h.holdStats(0); hs.Draining != 1 || hs.DrainingPages != 16 {
					t.Fatalf("holds after the abort = %+v, want room 1's 16 pages draining", hs)
				}
				if _, _, err := h.declare(2, 0, 16, 1); !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "draining") {
					t.Fatalf("declaring a draining room's pages = %v, want ErrHeld saying it drains", err)
				}
				if c := h.m.Capacity()[0]; c.DrainingPages != 16 {
					t.Fatalf("capacity draining_pages = %d, want 16", c.DrainingPages)
				}
				terminals := 0
				reusable := func() bool {
					for {
						select {
						case ev, ok := <-w.Events():
							if !ok {
								return false
							}
							if ev.Terminal {
								terminals++
							}
							if ev.PagesReusable {
								if ev.Terminal || ev.Transition.Phase != PhaseFailed {
									t.Errorf("the pages-reusable event = %+v, want a step of the failed room that is not its terminal transition", ev.Transition)
								}
								return true
							}
						default:
							return false
						}
					}
				}
				if reusable() {
					t.Fatal("pages reusable before the drain ended")
				}
				if ack {
					if res, err := h.m.AckRoomEnd(1, rank, 1); err != nil || !res.Released {
						t.Fatalf("AckRoomEnd = %+v, %v; want released", res, err)
					}
				} else {
					advance(30*time.Second - time.Millisecond)
					if reusable() {
						t.Fatal("pages reusable before release.deferred_timeout")
					}
					advance(time.Millisecond)
				}
				if !reusable() {
					t.Fatal("no pages-reusable event after the drain ended")
				}
				if terminals != 1 {
					t.Fatalf("%d events with terminal set, want 1 (the failure)", terminals)
				}
				// A late outcome watcher gets the outcome and the step
				// that says the pages are reusable.
				ow, err := h.m.WatchOutcome(1)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for ev := range ow.Events() {
					got = append(got, fmt.Sprintf("%s terminal=%v reusable=%v", ev.Transition.Phase, ev.Terminal, ev.PagesReusable))
				}
				if want := []string{"failed terminal=true reusable=false", "failed terminal=false reusable=true"}; !slices.Equal(got, want) {
					t.Fatalf("late outcome watch = %q, want %q", got, want)
				}
				if _, _, err := h.declare(2, 0, 16, 1); err != nil {
					t.Fatalf("declaring the pages once reusable = %v", err)
				}
				h.complete(2)
				h.release(2)
				h.assertClean()
				if hs := h.holdStats(0); hs.Held != 0 || hs.Draining != 0 || hs.Queued != 0 {
					t.Fatalf("holds at the end = %+v, want none", hs)
				}
			})
		})
	}
}

// TestEngineOwnerRefusesPageMoves: with the engine as owner the daemon
// neither grows running rooms nor retracts them; the error says why.
func TestEngineOwnerRefusesPageMoves(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(engineOwner))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.declare(1, 0, 16, 0); err != nil {
			t.Fatal(err)
		}
		h.complete(1)
		if _, _, _, err := h.m.ReportRunning([]Usage{{Room: 1, OutputLen: 500}}); !errors.Is(err, ErrEngineOwnsPages) {
			t.Fatalf("ReportRunning = %v, want ErrEngineOwnsPages", err)
		}
		if _, err := h.m.RetractRoom(1, RetractCPU); !errors.Is(err, ErrEngineOwnsPages) {
			t.Fatalf("RetractRoom = %v, want ErrEngineOwnsPages", err)
		}
		h.release(1)
		h.assertClean()
	})
}

// TestEngineOwnerCapacity: the capacity routers read is the engine's last
// report (0 free and blocked_by engine_unreported before the first one);
// the pool's size and the draining pages are the daemon's own.
func TestEngineOwnerCapacity(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(engineOwner))
		c := h.m.Capacity()[0]
		if c.BlockedBy != BlockedUnreported || c.TokensFree != 0 || c.PagesFree != 0 || c.PagesTotal != 24 {
			t.Fatalf("capacity before a report = %+v, want 0 free of 24 pages, blocked by %s", c, BlockedUnreported)
		}
		rep := EngineCapacity{TokensFree: 640, PagesFree: 10, ReqSlotsFree: 3, MetaSlotsFree: 5, QueueDepth: 2, Running: 4}
		if err := h.m.ReportCapacity(0, rep); err != nil {
			t.Fatal(err)
		}
		c = h.m.Capacity()[0]
		want := ShardCapacity{Shard: 0, PageSize: 64, TokensTotal: 24 * 64, PagesTotal: 24, TokensFree: 640, PagesFree: 10,
			ReqSlotsTotal: c.ReqSlotsTotal, ReqSlotsFree: 3, QueueDepth: 2, BlockedBy: "none", Running: 4,
			ReservedDecodeTokens: h.dec.Admission.ReservedDecodeTokens}
		if c != want {
			t.Fatalf("capacity after a report = %+v\nwant %+v", c, want)
		}
		if st := h.m.ShardStats()[0]; st.MetaSlots.Free != 5 || st.Pages.Free != 10 || st.Pages.Used != 14 {
			t.Fatalf("shard stats = %+v, want the engine's free figures", st)
		}
		// The rooms waiting for a declaration count when the engine
		// reports fewer.
		h.register(instance{addr: addrA})
		for r := uint64(1); r <= 3; r++ {
			h.open(addrA, r)
		}
		if c := h.m.Capacity()[0]; c.QueueDepth != 3 {
			t.Fatalf("queue depth = %d, want the 3 rooms waiting for a declaration", c.QueueDepth)
		}
		for r := uint64(1); r <= 3; r++ {
			h.m.AbortRoom(r, "")
		}
		h.assertClean()
	})
}

// inFlight is a hand-off the engine still had in flight, of 1000 prompt
// tokens (16 pages of 64) from first on.
func inFlight(room uint64, first int32, slot int32) ResyncRoom {
	d := ResyncRoom{Room: room, RID: fmt.Sprintf("rid-%d", room), PromptLen: 1000, MaxNewTokens: 128, Addr: addrA, PrefillDP: 0,
		InFlight: true, MetadataSlot: slot}
	for p := first; p < first+16; p++ {
		d.Pages = append(d.Pages, p)
	}
	return d
}

// TestEngineOwnerResyncHoldsInFlightHandoffs: after a restart the engine
// re-declares the hand-offs it still had in flight; the new daemon holds
// their pages draining — a declaration naming one is refused — until the
// prefill ranks acknowledge (when its instance is known) or
// release.deferred_timeout passes, and then says the pages are reusable.
func TestEngineOwnerResyncHoldsInFlightHandoffs(t *testing.T) {
	for _, known := range []bool{false, true} {
		name := map[bool]string{false: "prefill unknown: the bound", true: "prefill known: its ranks' acks"}[known]
		t.Run(name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t, withDecode(engineOwnerPages(40)), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
				h.m.HoldForResync(time.Minute)
				if known {
					h.register(instance{addr: addrA})
				}
				if n, _, err := h.m.Resync([]ResyncRoom{inFlight(5, 0, 3)}, true); n != 1 || err != nil {
					t.Fatalf("Resync = %d, %v", n, err)
				}
				s := h.wantPhase(5, PhaseFailed)
				if s.Failure == nil || s.Failure.Code != FailureShutdown || !strings.Contains(s.Failure.Message, "inherited at the decode engine's resync") {
					t.Fatalf("failure = %+v, want the inherited hand-off's", s.Failure)
				}
				if hs := h.holdStats(0); hs.Draining != 1 || hs.DrainingPages != 16 {
					t.Fatalf("holds = %+v, want room 5's 16 pages draining", hs)
				}
				w, err := h.m.Watch(5, false)
				if err != nil {
					t.Fatal(err)
				}
				if !known {
					h.register(instance{addr: addrA})
				}
				h.open(addrA, 6)
				if _, _, err := h.declare(6, 8, 16, 4); !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "held by room 5") {
					t.Fatalf("declaring an inherited hand-off's page = %v, want ErrHeld naming room 5", err)
				}
				if _, _, err := h.declare(6, 20, 16, 3); !errors.Is(err, ErrHeld) {
					t.Fatalf("declaring its metadata row = %v, want ErrHeld", err)
				}
				if known {
					rank := RankID{Addr: addrA}
					if res, err := h.m.AckRoomEnd(5, rank, 7); err != nil || !res.Owed || !res.Released {
						t.Fatalf("AckRoomEnd of the inherited hand-off (any attempt) = %+v, %v; want owed and released", res, err)
					}
				} else {
					advance(30*time.Second - time.Millisecond)
					if hs := h.holdStats(0); hs.Draining != 1 {
						t.Fatalf("holds before release.deferred_timeout = %+v, want room 5 draining", hs)
					}
					advance(time.Millisecond)
				}
				var last RoomEvent
				for ev := range w.Events() {
					last = ev
				}
				if !last.PagesReusable {
					t.Fatalf("the watch ended with %+v, want the pages-reusable event", last)
				}
				if _, _, err := h.declare(6, 8, 16, 3); err != nil {
					t.Fatalf("declaring the pages once reusable = %v", err)
				}
				h.complete(6)
				h.release(6)
				h.assertClean()
			})
		})
	}
}

// TestEngineOwnerResyncRefusals: an engine-owned pool's resync takes only
// hand-offs in flight, a daemon-owned one only running rooms; two in-flight
// hand-offs naming the same page are refused at the second, naming it.
func TestEngineOwnerResyncRefusals(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(engineOwnerPages(40)), withConfig(func(c *Config) { c.Release.DeferredTimeout = 30 * time.Second }))
		h.m.HoldForResync(time.Minute)
		running := inFlight(5, 0, 3)
		running.InFlight = false
		if _, _, err := h.m.Resync([]ResyncRoom{running}, false); err == nil || !strings.Contains(err.Error(), "rooms[0].in_flight") {
			t.Fatalf("a running room in an engine-owned pool's resync = %v, want rooms[0].in_flight named", err)
		}
		n, _, err := h.m.Resync([]ResyncRoom{inFlight(5, 0, 3), inFlight(6, 15, 4)}, false)
		var he *prealloc.HeldError
		if n != 1 || !errors.As(err, &he) || he.Index != 15 || he.Holder != 5 || !strings.Contains(err.Error(), "rooms[1].page_indices") {
			t.Fatalf("Resync of two hand-offs sharing page 15 = %d, %v; want the second refused naming page 15, room 5 and rooms[1]", n, err)
		}
		short := inFlight(7, 20, 5)
		short.Pages = short.Pages[:15]
		if _, _, err := h.m.Resync([]ResyncRoom{short}, true); err == nil || !strings.Contains(err.Error(), "rooms[0].page_indices") {
			t.Fatalf("a hand-off one page short = %v, want rooms[0].page_indices named", err)
		}
		h.m.Shutdown(context.Background())
	})
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.m.HoldForResync(time.Minute)
		if _, _, err := h.m.Resync([]ResyncRoom{inFlight(5, 0, 3)}, true); err == nil || !strings.Contains(err.Error(), "rooms[0].in_flight") {
			t.Fatalf("an in-flight hand-off in a daemon-owned pool's resync = %v, want rooms[0].in_flight named", err)
		}
	})
}
