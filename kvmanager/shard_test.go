package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
)

// blockingObserver blocks the first admission pass of one shard once armed:
// the pass runs under that shard's lock, so the shard stays locked until
// release is closed.
type blockingObserver struct {
	NopObserver
	shard   int
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (o *blockingObserver) AdmissionPass(shard, admitted int, blocked prealloc.BlockReason) {
	if shard == o.shard && o.armed.CompareAndSwap(true, false) {
		close(o.entered)
		<-o.release
	}
}

// TestShardDoesNotWaitForAnotherShard holds shard 0's lock (its admission
// pass blocks in the observer, inside OpenRoom) and walks a whole room on
// shard 1 meanwhile: open, claim, transfer, success, snapshot, release.
// The room's id is even, so its lookups first probe shard 0's directory.
// It runs on real time (outside a bubble): a goroutine blocked on a mutex
// is not durably blocked, so the guard below is the only way for a
// regression to fail instead of hanging.
func TestShardDoesNotWaitForAnotherShard(t *testing.T) {
	obs := &blockingObserver{shard: 0, entered: make(chan struct{}), release: make(chan struct{})}
	h := newHarness(t, withShards(2), withObserver(obs))
	defer h.m.Shutdown(endedContext())
	release := sync.OnceFunc(func() { close(obs.release) })
	defer release() // before Shutdown, which takes every shard's lock in turn
	in := instance{addr: addrA}
	h.register(in)
	rk := ranksOf(in)[0]

	obs.armed.Store(true)
	blocked := make(chan error, 1)
	go func() {
		_, _, err := h.m.OpenRoom(context.Background(), OpenRequest{RID: "r2", Addr: addrA, Room: 2, PrefillDP: -1, DecodeDP: 0, PromptLen: 1000, MaxNewTokens: 128})
		blocked <- err
	}()
	<-obs.entered
	if h.m.shards[0].mu.TryLock() {
		h.m.shards[0].mu.Unlock()
		t.Fatal("shard 0's lock is free while its admission pass is blocked")
	}

	done := make(chan error, 1)
	go func() { done <- walkRoom(h.m, 4, 1, rk) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a room on shard 1 waited for shard 0's lock")
	}
	select {
	case err := <-blocked:
		t.Fatalf("OpenRoom on shard 0 returned (%v) while its admission pass was blocked", err)
	default:
	}
	release()
	if err := <-blocked; err != nil {
		t.Fatalf("OpenRoom(2) = %v", err)
	}
	if s := h.snapshot(2); s.Phase != PhaseAdmitted || s.DecodeDP != 0 {
		t.Errorf("room 2: %s on shard %d, want admitted on shard 0", s.Phase, s.DecodeDP)
	}
}

// walkRoom is one room's whole hand-off on a decode shard, by one prefill
// rank (tp = dp = pp = 1): open, claim, one last chunk, success, GetRoom,
// release; the claim stream's end is checked.
func walkRoom(m *Manager, room uint64, shard int, rk RankID) error {
	s, _, err := m.OpenRoom(context.Background(), OpenRequest{RID: fmt.Sprintf("rid-%d", room), Addr: rk.Addr, Room: room, PrefillDP: -1, DecodeDP: shard, PromptLen: 1000, MaxNewTokens: 128})
	if err != nil {
		return fmt.Errorf("OpenRoom(%d) = %w", room, err)
	}
	if s.DecodeDP != shard {
		return fmt.Errorf("room %d opened on shard %d, want %d", room, s.DecodeDP, shard)
	}
	c, err := m.AwaitDestination(room, rk)
	if err != nil {
		return fmt.Errorf("AwaitDestination(%d) = %w", room, err)
	}
	defer c.Close()
	ev := <-c.Events()
	if ev.Destination == nil {
		return fmt.Errorf("room %d: claim got %+v, want a destination", room, ev)
	}
	c.Delivered(ev.Destination)
	if _, _, err := m.Transfer(context.Background(), ChunkRequest{Room: room, Rank: rk, NumPages: len(ev.Destination.Pages), Last: true, Marker: room}); err != nil {
		return fmt.Errorf("Transfer(%d) = %w", room, err)
	}
	if ev := <-c.Events(); ev.Done == nil || *ev.Done != PhaseSucceeded {
		return fmt.Errorf("room %d: claim ended with %+v, want done (succeeded)", room, ev)
	}
	if g, err := m.GetRoom(room, false); err != nil || g.Phase != PhaseSucceeded {
		return fmt.Errorf("GetRoom(%d) = %s, %v; want succeeded", room, g.Phase, err)
	}
	if _, _, err := m.ReleaseRoom(room); err != nil {
		return fmt.Errorf("ReleaseRoom(%d) = %w", room, err)
	}
	return nil
}

// TestShardsInParallel drives rooms on four shards at once from real
// goroutines: each shard's rooms are opened (routed to it), claimed,
// transferred and released by workers of their own, one room in eight is
// aborted instead, pairs of OpenRoom race for the same room id on two
// shards (exactly one wins), and a scraper reads Status, ListRooms,
// InFlight and GetRoom throughout. At the end every room ended as its
// worker decided, on the shard it was routed to, and every ledger is full.
func TestShardsInParallel(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const (
			shards   = 4
			perShard = 200
			racing   = 50
		)
		h := newHarness(t, withShards(shards))
		in := instance{addr: addrA}
		h.register(in)
		rk := ranksOf(in)[0]
		errs := make(chan error, shards*perShard+2*racing+1)
		var wg sync.WaitGroup
		for sh := range shards {
			for w := range 2 {
				wg.Go(func() {
					for i := w; i < perShard; i += 2 {
						room := uint64(1 + i*shards + (sh+1)%shards) // rooms whose home (room % dp) is another shard
						if i%8 == 7 {
							if _, _, err := h.m.OpenRoom(context.Background(), OpenRequest{RID: "a", Addr: addrA, Room: room, PrefillDP: -1, DecodeDP: sh, PromptLen: 100, MaxNewTokens: 16}); err != nil {
								errs <- err
								return
							}
							if _, _, err := h.m.AbortRoom(room, ""); err != nil {
								errs <- err
							}
							continue
						}
						if err := walkRoom(h.m, room, sh, rk); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
		var won atomic.Int64
		for i := range racing {
			room := uint64(100_000 + i)
			for k := range 2 {
				wg.Go(func() {
					_, _, err := h.m.OpenRoom(context.Background(), OpenRequest{RID: "race", Addr: addrA, Room: room, PrefillDP: -1, DecodeDP: (i + k) % shards, PromptLen: 100, MaxNewTokens: 16})
					switch {
					case err == nil:
						won.Add(1)
						if _, _, err := h.m.AbortRoom(room, ""); err != nil {
							errs <- err
						}
					case !errors.Is(err, ErrRoomExists):
						errs <- fmt.Errorf("racing OpenRoom(%d) = %w, want success or ErrRoomExists", room, err)
					}
				})
			}
		}
		stop := make(chan struct{})
		var scraper sync.WaitGroup
		scraper.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for p, n := range h.m.Status().RoomsByPhase {
					if n <= 0 {
						errs <- fmt.Errorf("Status: %d rooms %s", n, p)
						return
					}
				}
				h.m.InFlight()
				live, _ := h.m.ListRooms(ListFilter{LiveOnly: true, Limit: 10})
				for _, s := range live {
					if s.Phase.Terminal() {
						errs <- fmt.Errorf("ListRooms(LiveOnly) listed room %d %s", s.Room, s.Phase)
						return
					}
				}
				h.m.GetRoom(1, true) //nolint:errcheck // not found or any phase: only the race detector judges it
			}
		})
		wg.Wait()
		close(stop)
		scraper.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if n := won.Load(); n != racing {
			t.Errorf("%d racing OpenRooms won for %d room ids, want exactly one per id", n, racing)
		}
		aborted := shards * (perShard / 8)
		st := h.m.Status()
		if st.RoomsByPhase[PhaseReleased] != shards*perShard-aborted || st.RoomsByPhase[PhaseFailed] != aborted+racing || len(st.RoomsByPhase) != 2 {
			t.Errorf("rooms by phase = %v, want %d released and %d failed", st.RoomsByPhase, shards*perShard-aborted, aborted+racing)
		}
		all, total := h.m.ListRooms(ListFilter{})
		if total != shards*perShard+racing {
			t.Errorf("ListRooms total %d, want %d", total, shards*perShard+racing)
		}
		for _, s := range all {
			if s.Room < 100_000 && int(s.Room-1)%shards != (s.DecodeDP+1)%shards {
				t.Errorf("room %d on shard %d, not the shard it was routed to", s.Room, s.DecodeDP)
			}
		}
		h.assertClean()
	})
}

// TestClaimRacesOpenRoom races AwaitDestination, and the close of a claim
// waiting for its room, with the room's OpenRoom on another shard than
// its home: a claim is either attached by OpenRoom or attaches itself,
// never stranded among the pending claims (checked once every call
// returned; it would end with the bootstrap timeout instead of a
// destination), and a closed claim is never attached (its closed channel
// would be sent to). Rooms beyond the shards' request slots are admitted as
// the claims of earlier ones (never delivered) time out at
// admission.claim_timeout on the bubble's clock.
func TestClaimRacesOpenRoom(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const rooms = 2000
		// Every room is admitted at once (4,096 request slots per shard for
		// its 2,000 rooms): a room's claim must see its destination without
		// waiting for others to end.
		h := newHarness(t, withShards(2), withDecode(func(d *kvlayout.Config) { d.Pool.RequestSlots = 4096 }))
		in := instance{addr: addrA}
		h.register(in)
		rk := ranksOf(in)[0]
		open := func(room uint64) error {
			_, _, err := h.m.OpenRoom(context.Background(), OpenRequest{RID: "r", Addr: addrA, Room: room, PrefillDP: -1, DecodeDP: int(room+1) % 2, PromptLen: 16, MaxNewTokens: 16})
			return err
		}
		errs := make(chan error, 4*rooms)
		claims := make(chan *Claim, rooms)
		var calls sync.WaitGroup
		for room := uint64(1); room <= rooms; room++ {
			calls.Go(func() {
				c, err := h.m.AwaitDestination(room, rk)
				if err != nil {
					errs <- err
					return
				}
				claims <- c
			})
			calls.Go(func() {
				if err := open(room); err != nil {
					errs <- err
				}
			})
		}
		// Claims that close while their room opens.
		for room := uint64(rooms + 1); room <= 2*rooms; room++ {
			c, err := h.m.AwaitDestination(room, rk)
			if err != nil {
				t.Fatal(err)
			}
			calls.Go(c.Close)
			calls.Go(func() {
				if err := open(room); err != nil {
					errs <- err
				}
			})
		}
		calls.Wait()
		close(claims)
		if n := h.m.pendingCount(); n != 0 {
			t.Errorf("%d claims still pending after every room opened", n)
			h.m.Shutdown(endedContext()) // ends them
		}
		for c := range claims {
			if ev := <-c.Events(); ev.Destination == nil {
				t.Errorf("room %d: the claim got %+v, want its destination", c.room, ev)
			}
			c.Close()
		}
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		h.m.lockAll()
		for id, e := range h.m.allRooms() {
			if id > rooms && e.subs != nil && e.subs.claims.get(rk.Key()) != nil {
				t.Errorf("room %d holds a claim that was closed", id)
			}
		}
		h.m.unlockAll()
		for room := uint64(1); room <= 2*rooms; room++ {
			h.m.AbortRoom(room, "")
		}
		h.assertClean()
	})
}
