package kvmanager

import (
	"sync"

	"github.com/decodeplane/decodeplane/prealloc"
)

// shard is one decode DP shard: the unit of concurrency. Its mutex guards
// every field of its rooms, its retained terminal rooms, its staged rooms,
// its admission-due flag and what its deadline entries bound; a call on a
// room takes only its room's shard lock, and when it unlocks the shard's
// due admission pass runs (Manager.unlockShard). Its ledger has its own
// lock (taken under mu).
//
// rooms is also the shard's part of the room directory: it is written only
// with both mu and dirMu held (OpenRoom inserts, a forgotten room is
// deleted), so that a holder of mu may read it freely and a lookup that
// holds no shard lock (Manager.find) reads it under dirMu alone, which is
// never held for anything but the map operation. A room never changes
// shard; its shard is chosen at OpenRoom (routed_dp_rank, or room % dp).
type shard struct {
	idx int
	led *prealloc.Ledger

	mu sync.Mutex
	// dirMu guards rooms for readers that do not hold mu.
	dirMu sync.RWMutex
	rooms map[uint64]*room

	retained []*room                // terminal rooms, oldest first
	staged   map[uint64]*stagedRoom // staged rooms' handler state (staging.go), made on first use
	due      bool                   // an admission pass is due when the call holding mu unlocks
	claimDl  deadline               // the ledger's next claim deadline
	admitDl  deadline               // an admission pass right after a retraction
	// byPhase and byAddr count the shard's rooms by phase and by bootstrap
	// address (counts.go), so that Status, InFlight and RoomsFor walk no room.
	byPhase [PhaseHeld + 1]int
	byAddr  map[string]*addrRooms
}

func newShard(idx int, led *prealloc.Ledger) *shard {
	return &shard{idx: idx, led: led, rooms: map[uint64]*room{}}
}

// insert adds r to the shard's rooms (mu held).
func (sh *shard) insert(r *room) {
	sh.dirMu.Lock()
	sh.rooms[r.id] = r
	sh.dirMu.Unlock()
}

// forget removes r from the shard's rooms (mu held).
func (sh *shard) forget(r *room) {
	sh.dirMu.Lock()
	if sh.rooms[r.id] == r {
		delete(sh.rooms, r.id)
		sh.uncount(r)
	}
	sh.dirMu.Unlock()
}

// lookup reads the shard's rooms without holding mu.
func (sh *shard) lookup(id uint64) *room {
	sh.dirMu.RLock()
	r := sh.rooms[id]
	sh.dirMu.RUnlock()
	return r
}

// shardOf is a room's shard.
func (m *Manager) shardOf(r *room) *shard { return m.shards[r.decodeDP] }

// find locates a room without taking any shard lock: its home shard
// (room % dp) first, then the others. It returns nil when no shard holds it.
func (m *Manager) find(id uint64) (*shard, *room) {
	n := len(m.shards)
	home := int(id % uint64(n))
	for i := range n {
		sh := m.shards[(home+i)%n]
		if r := sh.lookup(id); r != nil {
			return sh, r
		}
	}
	return nil, nil
}

// lockRoom finds a room and locks its shard; it returns (nil, nil), with
// nothing locked, when the room does not exist. After the shard lock is
// taken the room is checked to still be the shard's (it may have been
// forgotten meanwhile; then the lookup starts again). The caller unlocks
// with m.unlockShard(sh).
func (m *Manager) lockRoom(id uint64) (*shard, *room) {
	for {
		sh, r := m.find(id)
		if r == nil {
			return nil, nil
		}
		sh.mu.Lock()
		if sh.rooms[id] == r {
			return sh, r
		}
		sh.mu.Unlock()
	}
}

// unlockShard runs the shard's due admission pass, then unlocks it. Every
// entry point that may end a room unlocks its shard with it.
func (m *Manager) unlockShard(sh *shard) {
	for sh.due && !m.closed.Load() {
		m.admitLocked(sh.idx) // clears the flag
	}
	sh.mu.Unlock()
}

// eachShard runs f on every shard, one shard lock at a time (unlocked with
// unlockShard, so that what f made due is admitted).
func (m *Manager) eachShard(f func(sh *shard)) {
	for _, sh := range m.shards {
		sh.mu.Lock()
		f(sh)
		m.unlockShard(sh)
	}
}

// retainCap is how many terminal rooms one shard keeps: rooms.max_retained
// split evenly across the shards (rounded up).
func (m *Manager) retainCap() int {
	n := len(m.shards)
	return (m.cfg.Rooms.MaxRetained + n - 1) / n
}
