package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// enginePool is the simulated decode engine's own allocator when it owns
// the pages (kv_pool.owner: engine): free pages and metadata rows, and
// what each room holds. A room's pages come back when the engine is done
// with them: when the room's event says they are reusable.
type enginePool struct {
	mu    sync.Mutex
	pages []int32
	rows  []int32
	held  map[uint64]engineHold
}

type engineHold struct {
	pages []int32
	row   int32
}

func newEnginePool(pages, rows int) *enginePool {
	p := &enginePool{held: map[uint64]engineHold{}}
	for i := range pages {
		p.pages = append(p.pages, int32(i))
	}
	for i := range rows {
		p.rows = append(p.rows, int32(i))
	}
	return p
}

// alloc takes n pages and a row for room.
func (p *enginePool) alloc(room uint64, n int) (engineHold, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pages) < n || len(p.rows) == 0 {
		return engineHold{}, fmt.Errorf("the engine's pool is out of pages (%d free, %d needed) or rows (%d free)", len(p.pages), n, len(p.rows))
	}
	h := engineHold{pages: append([]int32(nil), p.pages[:n]...), row: p.rows[0]}
	p.pages, p.rows = p.pages[n:], p.rows[1:]
	p.held[room] = h
	return h, nil
}

// free gives room's pages and row back (its pages are reusable).
func (p *enginePool) free(room uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.held[room]; ok {
		p.pages = append(p.pages, h.pages...)
		p.rows = append(p.rows, h.row)
		delete(p.held, room)
	}
}

func (p *enginePool) holding(room uint64) (engineHold, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[room]
	return h, ok
}

// declareAll waits until each room waits for its destination and declares
// one from the engine's pool, 16 at a time.
func declareAll(ctx context.Context, d *Daemon, eng *Engine, pool *enginePool, ids []uint64) error {
	if err := eng.waitPhase(ctx, ids, pb.RoomPhase_ROOM_PHASE_QUEUED); err != nil {
		return err
	}
	errs := make(chan error, len(ids))
	sem := make(chan struct{}, 16)
	for _, id := range ids {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			h, err := pool.alloc(id, roomPages)
			if err == nil {
				_, err = d.rooms.DeclareDestination(ctx, &pb.DeclareDestinationRequest{Room: id, PageIndices: h.pages, MetadataSlot: h.row})
			}
			if err != nil {
				err = fmt.Errorf("declare room %d: %w", id, err)
			}
			errs <- err
		}()
	}
	var all []error
	for range ids {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// kill9EngineOwner: rooms before; then hand-offs in flight (declared,
// claimed, a chunk written by the prefill itself) when the daemon is
// killed; it restarts with a resync wait and the engine re-declares them;
// their rank acknowledges half; a declaration naming a page still
// draining is refused; new rooms run in free pages.
func kill9EngineOwner(ctx context.Context, s *Stage) error {
	n := s.rooms()
	pages := n * roomPages
	d, err := s.startDaemon(ctx, "decodeplane", baseSets("kv_pool.owner=engine", fmt.Sprintf("kv_pool.total_pages=%d", pages),
		fmt.Sprintf("kv_pool.request_slots=%d", 2*n), fmt.Sprintf("kv_pool.metadata_slots=%d", 2*n))...)
	if err != nil {
		return err
	}
	a, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.51.0.1:8998", instance: "engine-moved"})
	if err != nil {
		return err
	}
	w, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.51.0.2:8998", instance: "self-writer"})
	if err != nil {
		return err
	}
	pool := newEnginePool(pages, 2*n)
	eng, err := s.newEngine(ctx, "engine", d, true)
	if err != nil {
		return err
	}
	eng.onReusable = pool.free
	before, inflight, fresh := roomIDs(1_000_000, n/4), roomIDs(2_000_000, n/2), roomIDs(3_000_000, n/4)
	if err := engineRooms(ctx, d, eng, pool, a, before); err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	if err := eng.Open(ctx, opens(w.spec.addr, inflight)); err != nil {
		return err
	}
	if err := declareAll(ctx, d, eng, pool, inflight); err != nil {
		return err
	}
	cs, err := claimAll(ctx, w.ranks[0], inflight, 32, func(c *claim) error { return c.report(ctx, 0, 0, 2) })
	defer closeClaims(cs)
	if err != nil {
		return err
	}
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	s.fault("the daemon is killed (kill -9) with hand-offs in flight, and started again with engine.resync_timeout")
	if err := d.Kill(ctx); err != nil {
		return err
	}
	if err := d.Restart(ctx, "engine.resync_timeout=30s"); err != nil {
		return err
	}
	restarted := time.Now()
	if err := registered(ctx, d, w.spec.addr, 1); err != nil { // its ranks owe acknowledgements only once it is known
		return err
	}
	if err := resyncInFlight(ctx, d, pool, inflight, w.spec.addr); err != nil {
		return err
	}
	if err := eng.Reconnect(ctx); err != nil {
		return err
	}
	acked := every(inflight, 2)
	for _, id := range acked {
		if _, err := w.ranks[0].AckRoomEnd(ctx, id, &pb.Destination{Attempt: 1}); err != nil {
			return fmt.Errorf("AckRoomEnd(%d) after the restart: %w", id, err)
		}
	}
	// The new room is a's: a must be known to the new daemon again, or the
	// room fails for want of its prefill before it is declared.
	if err := registered(ctx, d, a.spec.addr, 1); err != nil {
		return err
	}
	heldRefused(ctx, s, d, pool, without(inflight, acked), 4_000_000, a.spec.addr, eng)
	if err := engineRooms(ctx, d, eng, pool, a, fresh); err != nil {
		s.check(false, "after the restart: %v", err)
	}
	if err := eng.waitSettled(ctx); err != nil {
		return err
	}
	engineOwnerChecks(s, eng, inflight, acked, restarted)
	return nil
}

// engineRooms opens rooms of the prefill p, declares them and delivers
// them; the engine releases each as it succeeds.
func engineRooms(ctx context.Context, d *Daemon, eng *Engine, pool *enginePool, p *Prefill, ids []uint64) error {
	if err := eng.Open(ctx, opens(p.spec.addr, ids)); err != nil {
		return err
	}
	if err := declareAll(ctx, d, eng, pool, ids); err != nil {
		return err
	}
	if bad, some := failedSends(p.Deliver(ctx, ids, 32)); bad > 0 {
		return fmt.Errorf("%d rooms failed: %s", bad, some)
	}
	return nil
}

// resyncInFlight re-declares the hand-offs in flight, as the engine holds
// them, and ends the resync.
func resyncInFlight(ctx context.Context, d *Daemon, pool *enginePool, ids []uint64, addr string) error {
	dp := uint32(0)
	var rooms []*pb.ResyncRoom
	for _, id := range ids {
		h, ok := pool.holding(id)
		if !ok {
			return fmt.Errorf("the engine holds nothing for room %d", id)
		}
		rooms = append(rooms, &pb.ResyncRoom{Room: id, Rid: fmt.Sprintf("req-%d", id), PromptLen: promptLen, MaxNewTokens: maxNewToken,
			InFlight: true, PageIndices: h.pages, MetadataSlot: h.row, BootstrapAddr: addr, PrefillDpRank: &dp})
	}
	resp, err := d.C.Engine().Resync(ctx, rooms)
	if err != nil {
		return fmt.Errorf("Resync: %w", err)
	}
	if resp.GetDeclared() != uint32(len(ids)) || !resp.GetAdmitting() {
		return fmt.Errorf("Resync adopted %d rooms (admitting %v), want %d", resp.GetDeclared(), resp.GetAdmitting(), len(ids))
	}
	return nil
}

// heldRefused: a new room declared with a page of a hand-off still
// draining is refused PAGE_HELD naming it (the engine's pool would never
// do it; this is the daemon's guard across the restart).
func heldRefused(ctx context.Context, s *Stage, d *Daemon, pool *enginePool, draining []uint64, room uint64, addr string, eng *Engine) {
	h, ok := pool.holding(draining[len(draining)-1])
	if !ok || !eng.room(draining[len(draining)-1]).Reusable.IsZero() {
		s.note("no hand-off was still draining to try a declaration against")
		return
	}
	if err := eng.Open(ctx, opens(addr, []uint64{room})); err != nil {
		s.check(false, "%v", err)
		return
	}
	if err := eng.waitPhase(ctx, []uint64{room}, pb.RoomPhase_ROOM_PHASE_QUEUED); err != nil {
		s.check(false, "%v", err)
		return
	}
	_, err := d.rooms.DeclareDestination(ctx, &pb.DeclareDestinationRequest{Room: room, PageIndices: h.pages, MetadataSlot: int32(2*len(draining) + 1)})
	s.check(status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "still held by room"),
		"declaring a page of a draining hand-off = %v, want FAILED_PRECONDITION PAGE_HELD (room %d: %v %v)", err, room, eng.room(room).Phase, eng.room(room).Failure)
	if err := eng.Abort(ctx, []uint64{room}); err != nil {
		s.check(false, "%v", err)
	}
}

// engineOwnerChecks: the acknowledged hand-offs' pages were reusable at
// once, the others at release.deferred_timeout after the restart, not
// before.
func engineOwnerChecks(s *Stage, eng *Engine, inflight, acked []uint64, restarted time.Time) {
	var early int
	var ackedMax, expiredMin time.Duration
	for _, id := range inflight {
		r := eng.room(id)
		if r.Reusable.IsZero() {
			continue
		}
		after := r.Reusable.Sub(restarted)
		if contains(acked, id) {
			ackedMax = max(ackedMax, after)
			continue
		}
		if expiredMin == 0 || after < expiredMin {
			expiredMin = after
		}
		if after < deferred-200*time.Millisecond {
			early++
		}
	}
	s.check(early == 0, "%d re-declared hand-offs whose rank never acknowledged had their pages reusable before release.deferred_timeout", early)
	s.note("after the restart: %d acknowledged hand-offs reusable within %s, %d others from %s (release.deferred_timeout %s)",
		len(acked), dur(ackedMax), len(inflight)-len(acked), dur(expiredMin), deferred)
}
