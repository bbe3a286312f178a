package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// --page-owner engine: the bench's decode engine owns the pages
// (kv_pool.owner: engine), as SGLang's and vLLM's schedulers do. It keeps
// its own free lists of pages and metadata rows per decode DP shard, and
// for every room allocates the pages of its prompt and a row once the room
// waits for them, declares them (Engine.OpenDeclareAndWait: on the shared
// EngineSession with --api stream, DeclareDestination with --api unary),
// and gives them back when it released the room, or, for a room that
// failed, once the room's last event says its pages are reusable (never
// earlier: a prefill rank may still write into them).

// benchAlloc is the decode engine's allocator.
type benchAlloc struct {
	pageSize int
	mu       sync.Mutex
	freed    chan struct{} // closed (and replaced) when something is freed
	shards   []benchFreeLists
	rooms    map[uint64]benchHeld
	// waited counts the declarations that waited for free pages.
	waited atomic.Int64
}

type benchFreeLists struct{ pages, rows []int32 }

type benchHeld struct {
	shard int
	pages []int32
	row   int32
}

// newBenchAlloc sizes the engine's free lists from the daemon's pool: every
// shard's pages (kv_pool) and metadata rows. Pools with state slots
// (hybrid kinds) are refused: the bench's engine allocates none.
func newBenchAlloc(st *pb.GetStatusResponse) (*benchAlloc, error) {
	l := st.GetLayout()
	if len(l.GetStateTypes()) > 0 {
		return nil, fmt.Errorf("--page-owner engine: the bench's decode engine allocates pages and metadata rows only, and the pool kind %s has state slots (%v): use an mha, gqa or mla pool", l.GetKind(), l.GetStateTypes())
	}
	a := &benchAlloc{pageSize: int(max(l.GetPageSize(), 1)), freed: make(chan struct{}), rooms: map[uint64]benchHeld{}}
	for _, sh := range st.GetShards() {
		var f benchFreeLists
		for p := int32(sh.GetPagesTotal()) - 1; p >= 0; p-- {
			f.pages = append(f.pages, p)
		}
		for r := int32(sh.GetMetadataSlotsTotal()) - 1; r >= 0; r-- {
			f.rows = append(f.rows, r)
		}
		a.shards = append(a.shards, f)
	}
	return a, nil
}

// declare is the engine's DeclareFunc: the pages of the room's prompt and
// a metadata row from its shard's free lists, waiting for them to be freed
// when there are not enough (until ctx ends).
func (a *benchAlloc) declare(ctx context.Context, r *pb.Room) (*pb.DeclareDestinationRequest, error) {
	shard := int(r.GetDecodeDpRank())
	n := (int(r.GetPromptLen()) + a.pageSize - 1) / a.pageSize
	waited := false
	for {
		a.mu.Lock()
		if shard >= len(a.shards) {
			a.mu.Unlock()
			return nil, fmt.Errorf("room %d is on decode DP shard %d; the daemon reported %d shards", r.GetRoom(), shard, len(a.shards))
		}
		f := &a.shards[shard]
		if len(f.pages) >= n && len(f.rows) > 0 {
			k := len(f.pages) - n
			h := benchHeld{shard: shard, pages: append([]int32(nil), f.pages[k:]...), row: f.rows[len(f.rows)-1]}
			f.pages, f.rows = f.pages[:k], f.rows[:len(f.rows)-1]
			a.rooms[r.GetRoom()] = h
			a.mu.Unlock()
			return &pb.DeclareDestinationRequest{Room: r.GetRoom(), PageIndices: h.pages, MetadataSlot: h.row}, nil
		}
		freed := a.freed
		a.mu.Unlock()
		if !waited {
			waited = true
			a.waited.Add(1)
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, fmt.Errorf("room %d: waiting for %d free pages on decode DP shard %d: %w", r.GetRoom(), n, shard, ctx.Err())
		}
	}
}

// free gives a room's pages and row back (nothing when none were
// allocated for it).
func (a *benchAlloc) free(room uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.rooms[room]
	if !ok {
		return
	}
	delete(a.rooms, room)
	f := &a.shards[h.shard]
	f.pages = append(f.pages, h.pages...)
	f.rows = append(f.rows, h.row)
	close(a.freed)
	a.freed = make(chan struct{})
}

// held reports whether pages are allocated for room.
func (a *benchAlloc) held(room uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.rooms[room]
	return ok
}

// end gives room's pages back once no prefill rank may write into them: at
// once for a room the engine released (done), else after the room's last
// event (pages reusable) on a watch of the room, bounded by timeout; a
// room the daemon does not know (never opened) has nothing held. A watch
// that cannot end it keeps the pages out of the free lists: reusing them
// could let a late write land in another room's KV.
func (a *benchAlloc) end(e *client.Engine, room uint64, done bool, timeout time.Duration) error {
	if !a.held(room) {
		return nil
	}
	if done {
		a.free(room)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w, err := e.WatchRoom(ctx, &pb.WatchRoomRequest{Room: room})
	if errors.Is(err, client.ErrNotFound) {
		a.free(room)
		return nil
	}
	if err != nil {
		return fmt.Errorf("room %d: waiting for its pages to be reusable: %w", room, err)
	}
	defer w.Close()
	for {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) || ev.GetPagesReusable() {
			a.free(room)
			return nil
		}
		if err != nil {
			return fmt.Errorf("room %d: waiting for its pages to be reusable: %w", room, err)
		}
	}
}

// report tells the daemon what the engine has free on every shard
// (ReportCapacity): routers read it as the daemon's capacity.
func (a *benchAlloc) report(ctx context.Context, e *client.Engine) error {
	a.mu.Lock()
	reps := make([]*pb.ReportCapacityRequest, len(a.shards))
	for i, f := range a.shards {
		reps[i] = &pb.ReportCapacityRequest{DecodeDpRank: uint32(i), TokensFree: uint64(len(f.pages) * a.pageSize),
			PagesFree: uint64(len(f.pages)), MetadataSlotsFree: uint32(len(f.rows)), ReqSlotsFree: uint32(len(f.rows))}
	}
	a.mu.Unlock()
	for _, r := range reps {
		if _, err := e.ReportCapacity(ctx, r); err != nil {
			return fmt.Errorf("ReportCapacity(shard %d): %w", r.GetDecodeDpRank(), err)
		}
	}
	return nil
}
