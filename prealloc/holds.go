package prealloc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Holds is the hand-off ledger of one decode DP shard whose pages the decode
// engine allocates (kv_pool.owner: engine). It allocates nothing: the engine
// declares each room's destination (its pages beyond the decode prefix, its
// metadata row, its state slots), and the ledger holds what a declaration
// names from the declaration until the room's hand-off ends — at success
// (the engine decodes in those pages), or at a failure's end, after its
// drain (every prefill rank that may still write acknowledged, or the
// deferred timeout passed). A declaration naming a page, row or slot still
// held by another room is refused (a *HeldError naming the index and the
// holder) and changes nothing: a write of one hand-off can never land in
// pages another hand-off may still write (sglang#35049, #38961). Rooms open
// and not declared yet are counted against admission.max_queued.
//
// Indices are bounded by the engine's pool as kv_pool describes it (pages,
// metadata slots, the SWA pool's pages, the Mamba state slots); the tables
// are sized by it once, so a declaration allocates nothing but its room's
// record. Safe for concurrent use (one leaf lock; the room manager calls it
// under a shard's lock, the capacity readers alone).
type Holds struct {
	mu        sync.Mutex
	shard     int
	maxQueued int
	draining  bool

	pages []uint64 // page → the room holding it (0: none; room 0 is never a room)
	meta  []uint64 // metadata row → room
	state map[kvlayout.StateType][]uint64
	types []kvlayout.StateType // the pool's state types, each declared once

	rooms  map[uint64]*holding
	queued int

	held, drainingRooms int
	heldPages           int64
	drainingPages       int64
	refused             uint64
}

// holding is what one declared room holds.
type holding struct {
	pages    []int32
	meta     int32
	state    []kvlayout.StateIndices
	draining bool
}

// Declared is a destination a decode engine allocated for a room: its
// pages beyond the decode prefix in token order, its metadata row, and its
// state indices per state type of the pool's kind.
type Declared struct {
	Pages        []int32
	MetadataSlot int32
	State        []kvlayout.StateIndices
}

// ErrHeld: a declaration names a page, row or slot another room's hand-off
// still holds. FailedPrecondition. The error is a *HeldError.
var ErrHeld = errors.New("still held by another room's hand-off")

// HeldError names what a refused declaration found held, and by whom.
type HeldError struct {
	Room     uint64 // the room that declared
	What     string // "page", "metadata slot", or the state type's name and "slot"
	Index    int32
	Holder   uint64
	Draining bool // the holder failed and waits for its prefill ranks' acknowledgements
}

func (e *HeldError) Error() string {
	why := "its hand-off has not ended"
	if e.Draining {
		why = "it failed and its pages are draining: a prefill rank may still write into them until it acknowledges (AckRoomEnd) or release.deferred_timeout passes"
	}
	return fmt.Sprintf("declare destination of room %d: %s %d is still held by room %d (%s); reuse it only once that room's pages are reusable", e.Room, e.What, e.Index, e.Holder, why)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// NewHolds builds the hand-off ledger of DP shard shard for the engine's
// pool cfg describes.
func NewHolds(cfg kvlayout.Config, shard int) (*Holds, error) {
	nPages, _, nMeta, err := checkSizes(cfg)
	if err != nil {
		return nil, err
	}
	h := &Holds{shard: shard, maxQueued: cfg.Admission.MaxQueued, pages: make([]uint64, nPages), meta: make([]uint64, nMeta),
		state: map[kvlayout.StateType][]uint64{}, rooms: map[uint64]*holding{}}
	if h.maxQueued <= 0 {
		h.maxQueued = defaultMaxQueued
	}
	p := cfg.Pool
	h.types = p.Kind.StateTypes()
	for _, st := range h.types {
		switch st {
		case kvlayout.StateSWA:
			h.state[st] = make([]uint64, max(p.SWA.TotalTokens/int64(p.PageSize), 0))
		case kvlayout.StateMamba:
			h.state[st] = make([]uint64, max(p.Mamba.StateSlots, 0))
		case kvlayout.StateDSA:
			h.state[st] = make([]uint64, nPages) // the indexer's pages share the KV pages' numbering
		}
	}
	return h, nil
}

// Enqueue counts a room opened and not declared yet; ErrQueueFull when
// admission.max_queued rooms wait, ErrDraining once Drain was called.
func (h *Holds) Enqueue(room uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return fmt.Errorf("enqueue room %d: %w", room, ErrDraining)
	}
	if h.queued >= h.maxQueued {
		return fmt.Errorf("enqueue room %d: %d rooms wait for their destination: %w", room, h.queued, ErrQueueFull)
	}
	h.queued++
	return nil
}

// Check checks a declaration without taking anything: every index in the
// pool's range, none named twice, none held by another room.
func (h *Holds) Check(room uint64, d Declared) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.check(room, d)
}

func (h *Holds) check(room uint64, d Declared) error {
	if _, ok := h.rooms[room]; ok {
		return fmt.Errorf("declare destination of room %d: %w", room, errRoomExists)
	}
	// The indices are marked with room in their tables while they are
	// checked (a mark met again is an index named twice) and unmarked
	// before returning: nothing is allocated, nothing changes.
	n, err := h.mark(h.pages, d.Pages, room, "page_indices", "page", "the pool's %d pages")
	defer unmark(h.pages, d.Pages[:n])
	if err != nil {
		return err
	}
	if d.MetadataSlot < 0 || int(d.MetadataSlot) >= len(h.meta) {
		return kvlayout.Invalidf("metadata_slot", "%d is outside the pool's %d metadata slots (allowed 0..%d)", d.MetadataSlot, len(h.meta), len(h.meta)-1)
	}
	if holder := h.meta[d.MetadataSlot]; holder != 0 {
		return h.heldError(room, "metadata slot", d.MetadataSlot, holder)
	}
	for _, t := range h.types {
		if !slices.ContainsFunc(d.State, func(s kvlayout.StateIndices) bool { return s.Type == t }) {
			return kvlayout.Invalidf("state", "names no %s indices: the pool's kind holds %s state, declared once per type (one entry per state type of the pool)", t, stateTypeNames(h.types))
		}
	}
	for si, s := range d.State {
		tab, ok := h.state[s.Type]
		if !ok {
			return kvlayout.Invalidf(fmt.Sprintf("state[%d].type", si), "%s is not a state of this pool (its state types: %s)", s.Type, stateTypeNames(h.types))
		}
		if s.Type == kvlayout.StateDSA {
			continue // the indexer's pages follow the KV pages, checked above
		}
		n, err := h.mark(tab, s.Indices, room, fmt.Sprintf("state[%d].indices", si), s.Type.String()+" slot", "the pool's %d "+s.Type.String()+" slots")
		defer unmark(tab, s.Indices[:n])
		if err != nil {
			return err
		}
	}
	return nil
}

// mark checks idx against tab (the holder of each index): each in range,
// none named twice, none held by another room. It marks the ones it
// checked with room and returns how many (the caller unmarks them).
func (h *Holds) mark(tab []uint64, idx []int32, room uint64, field, what, pool string) (int, error) {
	for i, v := range idx {
		if v < 0 || int(v) >= len(tab) {
			return i, kvlayout.Invalidf(fmt.Sprintf("%s[%d]", field, i), "%s %d is outside "+pool+" (allowed 0..%d)", what, v, len(tab), len(tab)-1)
		}
		switch holder := tab[v]; holder {
		case 0:
			tab[v] = room
		case room:
			return i, kvlayout.Invalidf(fmt.Sprintf("%s[%d]", field, i), "%s %d is named twice", what, v)
		default:
			return i, h.heldError(room, what, v, holder)
		}
	}
	return len(idx), nil
}

// unmark clears what mark marked.
func unmark(tab []uint64, idx []int32) {
	for _, v := range idx {
		tab[v] = 0
	}
}

// stateTypeNames lists state types for a message ("none" for a pool
// without).
func stateTypeNames(ts []kvlayout.StateType) string {
	if len(ts) == 0 {
		return "none"
	}
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.String()
	}
	return strings.Join(names, ", ")
}

func (h *Holds) heldError(room uint64, what string, index int32, holder uint64) error {
	h.refused++
	draining := false
	if hd := h.rooms[holder]; hd != nil {
		draining = hd.draining
	}
	return &HeldError{Room: room, What: what, Index: index, Holder: holder, Draining: draining}
}

// Declare holds what d names for room (Check first; nothing changes when
// it refuses). The room leaves the queue. The slices are copied.
func (h *Holds) Declare(room uint64, d Declared) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.check(room, d); err != nil {
		return err
	}
	hd := &holding{pages: append([]int32(nil), d.Pages...), meta: d.MetadataSlot, state: cloneStateIndices(d.State)}
	for _, p := range hd.pages {
		h.pages[p] = room
	}
	h.meta[hd.meta] = room
	for _, s := range hd.state {
		if s.Type == kvlayout.StateDSA {
			continue
		}
		for _, v := range s.Indices {
			h.state[s.Type][v] = room
		}
	}
	h.rooms[room] = hd
	h.queued = max(h.queued-1, 0)
	h.held++
	h.heldPages += int64(len(hd.pages))
	return nil
}

func cloneStateIndices(in []kvlayout.StateIndices) []kvlayout.StateIndices {
	out := make([]kvlayout.StateIndices, len(in))
	for i, s := range in {
		out[i] = kvlayout.StateIndices{Type: s.Type, Indices: append([]int32(nil), s.Indices...)}
	}
	return out
}

// Drain marks a declared room's holds as draining: it failed while a
// prefill rank may still write into them; they stay held until Release.
func (h *Holds) Drain(room uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.rooms[room]
	if hd == nil {
		return fmt.Errorf("drain room %d: %w", room, errUnknownRoom)
	}
	if !hd.draining {
		hd.draining = true
		h.drainingRooms++
		h.drainingPages += int64(len(hd.pages))
	}
	return nil
}

// Release ends room's hand-off: what it holds may be declared again (or,
// for a room never declared, it leaves the queue). Releasing a room the
// ledger does not know is errUnknownRoom, never a double release.
func (h *Holds) Release(room uint64, declared bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.rooms[room]
	if hd == nil {
		if declared {
			return fmt.Errorf("release room %d: %w", room, errUnknownRoom)
		}
		h.queued = max(h.queued-1, 0)
		return nil
	}
	for _, p := range hd.pages {
		h.pages[p] = 0
	}
	h.meta[hd.meta] = 0
	for _, s := range hd.state {
		if s.Type == kvlayout.StateDSA {
			continue
		}
		for _, v := range s.Indices {
			h.state[s.Type][v] = 0
		}
	}
	if hd.draining {
		h.drainingRooms--
		h.drainingPages -= int64(len(hd.pages))
	}
	h.held--
	h.heldPages -= int64(len(hd.pages))
	delete(h.rooms, room)
	return nil
}

// StopTaking stops the ledger taking new rooms (Enqueue returns
// ErrDraining); declarations of rooms already open go on.
func (h *Holds) StopTaking() {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
}

// HoldStats are the hand-off ledger's figures.
type HoldStats struct {
	Shard int
	// Queued counts the rooms opened and not declared yet.
	Queued int
	// Held counts the declared rooms whose hand-off has not ended, and
	// HeldPages the pages they hold; Draining and DrainingPages are the
	// part of them that failed and wait for acknowledgements.
	Held, Draining           int
	HeldPages, DrainingPages int64
	// Pages and MetadataSlots are the engine's pool as kv_pool describes it.
	Pages, MetadataSlots int64
	// Refused counts the declarations refused because something they named
	// was still held by another room.
	Refused uint64
}

// Stats returns the hand-off ledger's figures.
func (h *Holds) Stats() HoldStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HoldStats{Shard: h.shard, Queued: h.queued, Held: h.held, Draining: h.drainingRooms, HeldPages: h.heldPages,
		DrainingPages: h.drainingPages, Pages: int64(len(h.pages)), MetadataSlots: int64(len(h.meta)), Refused: h.refused}
}

// Holder returns the room holding page p (0: none, or p outside the pool).
func (h *Holds) Holder(p int32) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p < 0 || int(p) >= len(h.pages) {
		return 0
	}
	return h.pages[p]
}
