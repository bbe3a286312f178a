package kvmanager

import (
	"errors"
	"fmt"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/prealloc"
)

// When the decode engine owns the pages (kv_pool.owner: engine), it
// allocates each room's destination itself — SGLang's and vLLM's
// schedulers always do — and declares it (DeclareDestination); the daemon
// runs everything else: bootstrap, DP rank, claims, coverage, deadlines,
// aborts, the drain. Its shards hold what the declarations name
// (prealloc.Holds) instead of allocating: a page, row or slot is held from
// its declaration until its room's hand-off ends, and a declaration naming
// one still held is refused. There is no admission budget and no growth
// of running rooms (the engine's own scheduler does both): ReportRunning
// and RetractRoom are refused, and the capacity routers read is what the
// engine reports (ReportCapacity).

// ErrEngineOwnsPages: an operation that moves pages the decode engine owns
// (kv_pool.owner: engine): ReportRunning's growth, RetractRoom.
// FailedPrecondition.
var ErrEngineOwnsPages = errors.New("the decode engine owns the pages (kv_pool.owner: engine): its own scheduler grows and retracts running requests")

// ErrHeld: a declaration names a page, row or slot another room's hand-off
// still holds (a *prealloc.HeldError names it and the holder).
// FailedPrecondition.
var ErrHeld = prealloc.ErrHeld

// Declaration is a destination the decode engine allocated for a room: the
// pages beyond its decode prefix in token order, its metadata row, its
// state indices per state type of the pool, and the decode prefix's length
// in tokens (page-aligned).
type Declaration struct {
	Room            uint64
	Pages           []int32
	MetadataSlot    int32
	State           []kvlayout.StateIndices
	DecodePrefixLen int
}

// DeclareDestination admits a room with the destination the decode engine
// allocated (kv_pool.owner: engine): it must wait for it (its prefill known
// and its DP rank resolved, phase queued); the pages are checked against
// the room (exactly those of the tokens beyond the decode prefix) and the
// hand-off ledger (nothing held by another room: a *prealloc.HeldError,
// ErrHeld, naming the index and the holder, and nothing changes). The room
// is then admitted (SGLang T11) and its destination offered to the prefill
// ranks as if the daemon had chosen it. A retried declaration of the same
// destination answers already.
func (m *Manager) DeclareDestination(d Declaration) (snap RoomSnapshot, already bool, err error) {
	sh, e := m.shards.lock(d.Room)
	if e == nil {
		return RoomSnapshot{}, false, fmt.Errorf("declare destination of room %d: %w", d.Room, ErrRoomNotFound)
	}
	defer sh.unlock()
	fill, already, err := e.CheckDeclaration(d.Pages, d.MetadataSlot, d.DecodePrefixLen)
	if err != nil || already {
		return e.snapshot(false, false), already, err
	}
	layouts, err := sh.declLayouts(m.layoutDropped)
	if err != nil {
		return RoomSnapshot{}, false, err
	}
	if err := sh.holds.Declare(d.Room, prealloc.Declared{Pages: d.Pages, MetadataSlot: d.MetadataSlot, State: d.State}); err != nil {
		if errors.Is(err, prealloc.ErrHeld) {
			m.obs.DeclarationRefused(sh.idx)
		}
		return RoomSnapshot{}, false, err
	}
	sh.handOut(e, d.Pages, d.MetadataSlot, d.State)
	sh.exec(e, room.Admitted{Now: m.clock.Now(), Pages: d.Pages, FillLen: fill, MetadataSlot: d.MetadataSlot, State: d.State,
		DecodePrefixLen: d.DecodePrefixLen, Staged: e.Staging() && m.stg.ringBytes() > 0, Layouts: layouts})
	return e.snapshot(false, false), false, nil
}

// EngineCapacity is a decode DP shard's capacity as the decode engine sees
// it (kv_pool.owner: engine): what its own allocator and scheduler have
// free, reported with ReportCapacity and published exactly as the daemon's
// own capacity is (WatchCapacity, the fleet's capacity record, metrics).
type EngineCapacity struct {
	TokensFree    int64
	PagesFree     int64
	ReqSlotsFree  int64
	MetaSlotsFree int64
	StateSlots    int64 // free state slots of the pool's kind (0 when it has none)
	QueueDepth    int   // requests the engine has queued and not admitted
	Running       int
}

// ReportCapacity records the decode engine's view of shard's capacity
// (kv_pool.owner: engine); with the daemon as the owner the capacity is
// the ledger's own and the report is refused.
func (m *Manager) ReportCapacity(shard int, c EngineCapacity) error {
	if m.dec.Pool.Owner != kvlayout.OwnerEngine {
		return fmt.Errorf("report capacity: %w: kv_pool.owner is daemon: the daemon's ledger is the capacity (set kv_pool.owner: engine for an engine that allocates its pages)", ErrWrongState)
	}
	if shard < 0 || shard >= len(m.shards) {
		return invalid("decode_dp_rank", "%d is out of range: this daemon hosts %d decode DP shards (allowed 0..%d)", shard, len(m.shards), len(m.shards)-1)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"tokens_free", c.TokensFree}, {"pages_free", c.PagesFree}, {"req_slots_free", c.ReqSlotsFree}, {"metadata_slots_free", c.MetaSlotsFree},
		{"state_slots_free", c.StateSlots}, {"queue_depth", int64(c.QueueDepth)}, {"running", int64(c.Running)}} {
		if f.v < 0 {
			return invalid(f.name, "%d must be >= 0", f.v)
		}
	}
	m.shards[shard].engineCap.Store(&c)
	return nil
}
