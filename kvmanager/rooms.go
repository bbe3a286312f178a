package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/prealloc"
)

// OpenRequest opens a room (OpenRoom).
type OpenRequest struct {
	RID  string
	Addr string
	Room uint64
	// PrefillDP is the router's hint (disagg_prefill_dp_rank), -1 if none.
	PrefillDP int
	// DecodeDP is the decode shard (routed_dp_rank), -1 for room % dp.
	DecodeDP       int
	PromptLen      int
	OutputLen      int
	MaxNewTokens   int
	Priority       int
	Rebootstrap    bool
	IdempotencyKey string
	// Timeout is the request's time budget from now (0: none; else 1 ms to
	// room.MaxTimeout, in whole milliseconds): its hand-off must succeed
	// within it, and it caps every configured bound of the first attempt
	// (room/budget.go).
	Timeout time.Duration
}

// OpenRoom admits a request to the decode side. It returns at once: the
// room then waits for its prefill's registration, its DP rank and admission.
// Capacity errors leave nothing allocated and nothing queued:
// prealloc.ErrExceedsCapacity (a *prealloc.CapacityError with SGLang's
// message) for a request its shard could not admit even when empty (see
// prealloc's Enqueue), ErrQueueFull when admission.max_queued rooms wait.
func (m *Manager) OpenRoom(ctx context.Context, req OpenRequest) (RoomSnapshot, bool, error) {
	for {
		if sh, e := m.shards.lock(req.Room); e != nil {
			snap, idem, err := existingRoom(e, req)
			sh.unlock()
			return snap, idem, err
		}
		if m.draining.Load() || m.closed.Load() {
			return RoomSnapshot{}, false, fmt.Errorf("open room %d: %w", req.Room, ErrDraining)
		}
		shard := req.DecodeDP
		if shard < 0 {
			shard = int(req.Room % uint64(len(m.shards)))
		} else if shard >= len(m.shards) {
			return RoomSnapshot{}, false, invalid("decode_dp_rank", "%d is out of range: this daemon hosts %d decode DP shards (allowed 0..%d)", shard, len(m.shards), len(m.shards)-1)
		}
		if t := req.Timeout; t != 0 && (t < time.Millisecond || t > MaxRoomTimeout) {
			return RoomSnapshot{}, false, invalid("timeout", "%s is out of range (allowed %s..%s, or none)", t, time.Millisecond, MaxRoomTimeout)
		}
		if inst, ok := m.reg.Instance(req.Addr); ok && inst.Complete && req.PrefillDP >= inst.Topology.DP {
			return RoomSnapshot{}, false, invalid("prefill_dp_rank", "%d is out of range: %s has dp_size %d (allowed 0..%d)", req.PrefillDP, req.Addr, inst.Topology.DP, inst.Topology.DP-1)
		}
		if snap, err, again := m.shards[shard].open(ctx, req); !again {
			return snap, false, err
		}
		// Another OpenRoom of the same id raced this one onto another shard:
		// the next try sees it.
	}
}

// existingRoom answers an OpenRoom for a room that exists.
func existingRoom(e *entry, req OpenRequest) (RoomSnapshot, bool, error) {
	// Before the draining check: a retry of an OpenRoom that succeeded
	// must learn that the room exists.
	if req.IdempotencyKey != "" && e.IdempotencyKey() == req.IdempotencyKey {
		return e.snapshot(false, false), true, nil
	}
	return RoomSnapshot{}, false, fmt.Errorf("open room %d (rid %q): %w (rid %q, phase %s)", req.Room, req.RID, ErrRoomExists, e.Request().RID, e.Phase())
}

// open opens a room on the shard: enqueued in its ledger (which checks the
// capacity first), its span started, the claims that waited for it
// attached, then on to its prefill. again: the id was opened on another
// shard meanwhile.
func (sh *shard) open(ctx context.Context, req OpenRequest) (_ RoomSnapshot, _ error, again bool) {
	m := sh.m
	addr := req.Addr
	if inst, ok := m.reg.Instance(addr); ok {
		addr = inst.Addr // one copy of the address per instance, not one per room
	}
	e := &entry{}
	sh.mu.Lock()
	defer sh.unlock()
	if m.draining.Load() || m.closed.Load() {
		// Shutdown drains, then visits each shard under its lock: a room
		// inserted after that visit would escape its first pass.
		return RoomSnapshot{}, fmt.Errorf("open room %d: %w", req.Room, ErrDraining), false
	}
	// The room id is unique across the shards: look again, and insert, under
	// openMu. Calls that find the room now wait for this shard's lock and
	// see it opened (or gone, when the ledger refuses it below).
	m.openMu.Lock()
	if _, other := m.shards.find(req.Room); other != nil {
		m.openMu.Unlock()
		return RoomSnapshot{}, nil, true
	}
	opened := e.Apply(room.Open{Now: m.clock.Now(), ID: req.Room, Addr: addr, DecodeDP: sh.idx, HintDP: req.PrefillDP, Params: m.params,
		IdempotencyKey: req.IdempotencyKey, Timeout: req.Timeout,
		Request: room.Request{RID: req.RID, PromptLen: req.PromptLen, OutputLen: req.OutputLen, MaxNewTokens: req.MaxNewTokens,
			Priority: req.Priority, Rebootstrap: req.Rebootstrap}})
	sh.insert(e)
	m.openMu.Unlock()
	preq := prealloc.Request{Room: req.Room, RID: req.RID, PromptLen: req.PromptLen, OutputLen: req.OutputLen,
		MaxNewTokens: req.MaxNewTokens, Priority: req.Priority, Rebootstrap: req.Rebootstrap}
	var err error
	if sh.holds != nil {
		err = sh.holds.Enqueue(req.Room) // the engine admits and allocates: the room waits for its declaration
	} else {
		err = sh.led.EnqueueEntry(&e.led, preq) // the room's ledger record lives in its entry
	}
	if err != nil {
		sh.forget(e)
		if errors.Is(err, prealloc.ErrQueueFull) {
			err = &RetryError{Err: err, RetryAfter: time.Second}
		}
		return RoomSnapshot{}, fmt.Errorf("open room %d on decode shard %d: %w", req.Room, sh.idx, err), false
	}
	// The room's opening (T1) was applied before its ledger record existed;
	// its effects (counts, observer, spans) are carried out now.
	sh.startSpan(ctx, e)
	sh.apply(e, &opened)
	for _, c := range m.pend.take(e.ID()) {
		m.dl.clear(&c.expiry)
		sh.attach(e, c)
	}
	sh.toPrefill(e)
	return e.snapshot(false, false), nil, false
}

// sorted is the shard's rooms keep selects (nil: every room), in room
// order (mu held).
func (sh *shard) sorted(keep func(*entry) bool) []*entry {
	out := make([]*entry, 0, len(sh.rooms))
	for _, e := range sh.rooms {
		if keep == nil || keep(e) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *entry) int { return compareU64(a.ID(), b.ID()) })
	return out
}

// fail fails a room with f (mu held).
func (sh *shard) fail(e *entry, f Failure) {
	sh.exec(e, room.Fail{Now: sh.m.clock.Now(), Failure: f, SelfWriter: sh.m.selfWriters.known(e.Addr())})
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// AbortRoom fails a room in any phase (held rebootstrap included) with
// "Aborted by AbortReq." or reason. Aborting a finished room is a no-op.
func (m *Manager) AbortRoom(id uint64, reason string) (RoomSnapshot, bool, error) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return RoomSnapshot{}, false, fmt.Errorf("abort room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	if e.Phase().Terminal() {
		return e.snapshot(false, false), true, nil
	}
	msg := "Aborted by AbortReq."
	if reason != "" {
		msg = reason
	}
	sh.fail(e, Failure{Code: FailureAborted, Message: msg})
	return e.snapshot(false, false), false, nil
}

// ReleaseRoom returns a successful room's pages; idempotent.
func (m *Manager) ReleaseRoom(id uint64) (pages int, already bool, err error) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return 0, false, fmt.Errorf("release room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	if already, err := e.CanRelease(); already || err != nil {
		return 0, already, err
	}
	pages = len(e.Pages())
	sh.exec(e, room.Release{Now: m.clock.Now(), Why: "released by the decode engine"})
	return pages, false, nil
}

// GetRoom returns a room's state and timeline.
func (m *Manager) GetRoom(id uint64, withPages bool) (RoomSnapshot, error) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return RoomSnapshot{}, fmt.Errorf("get room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	snap := e.snapshot(true, withPages)
	snap.Coverage = e.Coverage()
	snap.WaitingFor = e.WaitingFor(sh.waitView(e))
	snap.PhaseTimes = e.PhaseTimes(time.Time{}) // its timeline's: the same whenever it is read
	return snap, nil
}

// waitView is what a room's waiting_for reads beyond the room (mu held).
func (sh *shard) waitView(e *entry) room.WaitView {
	m := sh.m
	var v room.WaitView
	switch e.Phase() {
	case PhaseWaitingPrefill:
		if inst, ok := m.reg.Instance(e.Addr()); ok {
			v.Registered, v.Expected = inst.Registered, inst.Expected
		}
	case PhaseQueued:
		if m.rs.gated.Load() {
			v.ResyncUntil = m.ResyncStatus().Until
		}
		v.Blocked = sh.led.Stats().LastBlocked.String()
	}
	if e.Attempt() > 1 {
		_, _, v.GenerateURL = prefillHTTP(m.reg, e.Addr())
	}
	return v
}

// ListFilter selects rooms for ListRooms.
type ListFilter struct {
	Phases   []Phase
	Addr     string
	LiveOnly bool
	Limit    int
	// NewestFirst orders by open time, newest first; Limit then keeps the
	// most recent rooms.
	NewestFirst bool
}

// ListRooms returns matching rooms, oldest first (or newest first), and the
// total before Limit.
func (m *Manager) ListRooms(f ListFilter) ([]RoomSnapshot, int) {
	// Each shard in turn: its matching rooms are rendered under its lock,
	// then every shard's are sorted together.
	var out []RoomSnapshot
	var opened []int64 // out[i]'s open time, to the nanosecond
	m.shards.each(func(sh *shard) {
		for _, e := range sh.rooms {
			if f.Addr != "" && e.Addr() != f.Addr {
				continue
			}
			if f.LiveOnly && e.Phase().Terminal() {
				continue
			}
			if len(f.Phases) > 0 && !slices.Contains(f.Phases, e.Phase()) {
				continue
			}
			out = append(out, e.snapshot(false, false))
			opened = append(opened, e.Opened())
		}
	})
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(i, j int) bool {
		a, b := idx[i], idx[j]
		if f.NewestFirst {
			a, b = b, a
		}
		if opened[a] != opened[b] {
			return opened[a] < opened[b]
		}
		return out[a].Room < out[b].Room
	})
	total := len(out)
	if f.Limit > 0 && len(idx) > f.Limit {
		idx = idx[:f.Limit]
	}
	sorted := make([]RoomSnapshot, len(idx))
	for i, k := range idx {
		sorted[i] = out[k]
	}
	return sorted, total
}

// HoldSuccess adds a condition the room's success waits for (for example a
// staged chunk still scattering). ReleaseHold removes it.
func (m *Manager) HoldSuccess(id uint64, gate string) error {
	sh, e := m.shards.lock(id)
	if e == nil {
		return fmt.Errorf("hold success of room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	return sh.exec(e, room.Gate{Now: m.clock.Now(), Name: gate, Hold: true}).Err
}

// ReleaseHold removes a success condition; a non-nil failure fails the room.
func (m *Manager) ReleaseHold(id uint64, gate string, failure *Failure) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return
	}
	defer sh.unlock()
	sh.exec(e, room.Gate{Now: m.clock.Now(), Name: gate, Failure: failure, SelfWriter: m.selfWriters.known(e.Addr())})
}

// OnRoomEnd runs f exactly once when the room's resources are released, on
// every exit path (release, failure, abort, timeout, shutdown). f runs with
// the room's shard lock held and must not call back into the manager.
func (m *Manager) OnRoomEnd(id uint64, f func()) error {
	sh, e := m.shards.lock(id)
	if e == nil {
		return fmt.Errorf("on end of room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	if e.Phase().Terminal() && !e.ReleasePending() {
		f()
		return nil
	}
	s := e.s()
	s.onEnd = append(s.onEnd, f)
	return nil
}

// Poll returns a room's KVPoll (Failed for an unknown room).
func (m *Manager) Poll(id uint64) KVPoll {
	if sh, e := m.shards.lock(id); e != nil {
		defer sh.unlock()
		return e.Phase().Poll()
	}
	return PollFailed
}
