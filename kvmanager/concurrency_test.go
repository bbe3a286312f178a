package kvmanager

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentRooms drives 1,000 rooms through two decode shards from
// goroutines: each room needs all four prefill ranks (prefill TP 4 → decode
// TP 1, GQA), each rank claims and sends two chunks, and decode workers
// release every room that succeeded. Admission is bounded by the ledgers'
// 256 req slots, so rooms queue and are admitted as others are released.
func TestConcurrentRooms(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const (
			rooms   = 1000
			workers = 8 // per prefill rank, and decode workers
		)
		h := newHarness(t, withShards(2))
		in := instance{addr: addrA, tp: 4}
		h.register(in)
		ranks := ranksOf(in)
		for i := range rooms {
			room := uint64(i + 1)
			if _, _, err := h.m.OpenRoom(context.Background(), OpenRequest{
				RID: fmt.Sprintf("rid-%d", room), Addr: addrA, Room: room, PrefillDP: -1, DecodeDP: -1,
				PromptLen: 100 + i%300, MaxNewTokens: 64,
			}); err != nil {
				t.Fatalf("OpenRoom(%d) = %v", room, err)
			}
		}
		errs := make(chan error, rooms*len(ranks)+rooms)
		var wg sync.WaitGroup
		// Prefill side: every rank has workers; worker w handles rooms ≡ w.
		for _, rk := range ranks {
			for w := range workers {
				wg.Go(func() {
					for room := uint64(w + 1); room <= rooms; room += workers {
						if err := sendRoom(h.m, room, rk); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
		// Decode side: release each room once it succeeded.
		for w := range workers {
			wg.Go(func() {
				for room := uint64(w + 1); room <= rooms; room += workers {
					if err := releaseWhenDone(h.m, room); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		st := h.m.Status()
		if st.RoomsByPhase[PhaseReleased] != rooms || len(st.RoomsByPhase) != 1 {
			t.Errorf("rooms by phase = %v, want %d released", st.RoomsByPhase, rooms)
		}
		h.assertClean()
	})
}

// sendRoom is one prefill rank's side of a room: claim, then two chunks.
func sendRoom(m *Manager, room uint64, rk RankID) error {
	c, err := m.AwaitDestination(room, rk)
	if err != nil {
		return fmt.Errorf("AwaitDestination(%d, %s) = %w", room, rk, err)
	}
	defer c.Close()
	ev, ok := <-c.Events()
	if !ok || ev.Destination == nil {
		return fmt.Errorf("room %d, %s: got %+v (open %v), want a destination", room, rk, ev, ok)
	}
	d := ev.Destination
	c.Delivered(d)
	half := len(d.Pages) / 2
	for i, part := range [][2]int{{0, half}, {half, len(d.Pages) - half}} {
		req := ChunkRequest{Room: room, Rank: rk, Index: i, PageOffset: part[0], NumPages: part[1], Last: i == 1}
		if req.Last {
			req.Marker = room
		}
		if _, _, err := m.Transfer(context.Background(), req); err != nil {
			return fmt.Errorf("Transfer(room %d, %s, chunk %d) = %w", room, rk, i, err)
		}
	}
	return nil
}

// releaseWhenDone watches a room and releases it once it succeeded.
func releaseWhenDone(m *Manager, room uint64) error {
	w, err := m.Watch(room, false)
	if err != nil {
		return fmt.Errorf("Watch(%d) = %w", room, err)
	}
	defer w.Close()
	for ev := range w.Events() {
		switch ev.Transition.Phase {
		case PhaseSucceeded:
			if _, _, err := m.ReleaseRoom(room); err != nil {
				return fmt.Errorf("ReleaseRoom(%d) = %w", room, err)
			}
			return nil
		case PhaseFailed:
			return fmt.Errorf("room %d failed: %s", room, ev.Room.Failure.Message)
		}
	}
	return fmt.Errorf("room %d: watch ended (%v) before success", room, w.Err())
}
