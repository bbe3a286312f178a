package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/prealloc"
)

// Running rooms: the decode engine's step (ReportRunning: growth, then the
// shard's admission), retraction (RETRACT, SGLang T20; REBOOTSTRAP, T21)
// and rebootstrap (ContinueGeneration, T22–T23).
//
// A REBOOTSTRAP retraction holds a running room (pages freed) until
// ContinueGeneration, which starts its next attempt on the prefill DP rank
// it was bound to (the binding survives the retraction: sglang#40730/#40731).
// The daemon does not have the prompt, so it cannot ask the prefill to
// recompute: ContinueGenerationResumed gives the decode engine, per resumed
// room, what it needs to POST the request to the prefill's /generate (the
// prefill's HTTP endpoint: the host of its bootstrap address and the
// prefill_http_port it registered with; the pinned DP rank). The prefill
// then claims the new attempt's destination and sends its KV as on a first
// attempt (T23). A retracted room is bounded by timeouts.retracted and a
// held room by timeouts.held, both from the retraction (the room's own
// deadline); when the bound passes the room fails with
// FailureRetractTimeout and a message naming the setting.

// Usage is a running room's output length.
type Usage struct {
	Room      uint64
	OutputLen int
}

// Grown are the pages a running room gained.
type Grown struct {
	Room     uint64
	NewPages []int32
}

// ReportRunning grows running rooms' allocations to their output lengths.
// Rooms that could not grow (no pages) are listed in noCapacity: the engine
// should retract one (RetractRoom), whose pages this growth then takes
// first. Unknown or non-running rooms are in notRunning. It is the engine's
// decode step: once every listed room has grown, each shard with a listed
// running room runs an admission pass (SGLang's process_decode_queue after
// the batch), which resumes the rooms retracted before this report when
// their pages and reserve fit, then admits queued rooms. When the decode
// engine owns the pages (kv_pool.owner: engine) its own allocator grows
// them: ErrEngineOwnsPages.
func (m *Manager) ReportRunning(usage []Usage) (grown []Grown, noCapacity, notRunning []uint64, err error) {
	if m.dec.Pool.Owner == kvlayout.OwnerEngine {
		return nil, nil, nil, fmt.Errorf("report running: %w", ErrEngineOwnsPages)
	}
	var stepped []bool // shards with a running room in this report
	for _, u := range usage {
		sh, e := m.shards.lock(u.Room)
		if e == nil {
			notRunning = append(notRunning, u.Room)
			continue
		}
		if e.Phase() != PhaseSucceeded {
			sh.unlock()
			notRunning = append(notRunning, u.Room)
			continue
		}
		if stepped == nil {
			stepped = make([]bool, len(m.shards))
		}
		stepped[sh.idx] = true
		pages, err := sh.led.UpdateRunning(e.ID(), u.OutputLen)
		switch {
		case errors.Is(err, prealloc.ErrNoCapacity):
			noCapacity = append(noCapacity, u.Room)
		case err != nil:
			notRunning = append(notRunning, u.Room)
		case len(pages) > 0:
			sh.handOut(e, pages, -1, nil)
			e.Apply(room.Grow{Pages: pages})
			grown = append(grown, Grown{Room: e.ID(), NewPages: slices.Clone(pages)})
		}
		sh.unlock()
	}
	for shard, ok := range stepped {
		if ok {
			sh := m.shards[shard]
			sh.mu.Lock()
			sh.admit()
			sh.unlock()
		}
	}
	return grown, noCapacity, notRunning, nil
}

// RetractMode says what RetractRoom does with a running room.
type RetractMode int

// Retract modes.
const (
	// RetractCPU: the engine keeps a CPU copy; the room resumes (gets pages
	// again) before any new admission.
	RetractCPU RetractMode = iota + 1
	// RetractRebootstrap: held until ContinueGeneration, then re-bootstrapped
	// from its prefill (pause_generation in retract mode).
	RetractRebootstrap
)

// RetractResumeAfter bounds how long a RETRACT room waits when nothing else
// runs on its shard: the next admission pass (a ReportRunning, an OpenRoom,
// a release) or this long after the retraction, whichever comes first.
const RetractResumeAfter = time.Second

// RetractRoom takes a running room's pages back at once.
//
// RetractCPU: the pages, req slot and state slots return to the pool and the
// room is PhaseRetracted (Poll stays Success) until an admission pass
// resumes it. It never resumes inside this call: while other rooms run on
// its shard it waits for the engine's next ReportRunning, whose growth gets
// the freed pages first (SGLang: retract, the batch grows, then
// resume_retracted_reqs); it then resumes, before any new admission, when
// fill_len + R fits the budget, with pages the ledger hands out afresh
// (GetRoom with pages shows them). With no other running room on the shard
// an admission pass runs RetractResumeAfter after the call. A room that
// could not resume even on an empty shard is refused
// (prealloc.ErrWrongState) and keeps running.
//
// RetractRebootstrap: the room is held (pages freed) until
// ContinueGeneration; new rooms may be admitted into its pages at once.
func (m *Manager) RetractRoom(id uint64, mode RetractMode) (RoomSnapshot, error) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return RoomSnapshot{}, fmt.Errorf("retract room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	if m.dec.Pool.Owner == kvlayout.OwnerEngine {
		return RoomSnapshot{}, fmt.Errorf("retract room %d: %w", id, ErrEngineOwnsPages)
	}
	if err := e.CanRetract(); err != nil {
		return RoomSnapshot{}, err
	}
	now := m.clock.Now()
	switch mode {
	case RetractCPU:
		if err := sh.led.Retract(id); err != nil {
			return RoomSnapshot{}, fmt.Errorf("retract room %d: %w", id, err)
		}
		sh.exec(e, room.Retract{Now: now})
		if sh.led.Stats().Running == 0 {
			// Nothing left on the shard to grow into the pages: resume (or
			// not) at the next pass, at the latest RetractResumeAfter from
			// now, so that the pages are visibly free meanwhile (for a room
			// being admitted, or an engine reading the pool).
			m.dl.set(&sh.admitDl, dlAdmit, now.Add(RetractResumeAfter), 0, sh)
		}
	case RetractRebootstrap:
		if err := sh.led.Hold(id); err != nil {
			return RoomSnapshot{}, fmt.Errorf("hold room %d: %w", id, err)
		}
		sh.exec(e, room.Retract{Now: now, Held: true})
	default:
		return RoomSnapshot{}, invalid("mode", "must be RETRACT or REBOOTSTRAP")
	}
	return e.snapshot(false, false), nil
}

// Resumed is one room ContinueGeneration re-enqueued, with what the decode
// engine needs to request its prefill's recompute.
type Resumed struct {
	Room    uint64
	RID     string
	Attempt uint32 // the new attempt (the destination's generation)
	Phase   Phase  // after the re-enqueue (Failed when it could not start again)
	// PrefillAddr is the prefill's bootstrap address (host:port).
	PrefillAddr string
	// PrefillHTTPHost and PrefillHTTPPort are the prefill's HTTP server
	// (the bootstrap host, the registration's prefill_http_port; port 0:
	// the prefill is not registered or registered no HTTP port);
	// GenerateURL is http://host:port/generate ("" without a port).
	PrefillHTTPHost string
	PrefillHTTPPort int
	GenerateURL     string
	// PrefillDP is the prefill DP rank the room is pinned to (-1: none was
	// resolved).
	PrefillDP int
}

// ContinueGeneration re-enqueues every held room as a rebootstrap request
// (SGLang T22): a new attempt that bootstraps again from the same prefill DP
// rank. ContinueGenerationResumed also says, per room, where the engine
// requests the prefill's recompute.
func (m *Manager) ContinueGeneration(ctx context.Context) []uint64 {
	var ids []uint64
	for _, rs := range m.ContinueGenerationResumed(ctx) {
		ids = append(ids, rs.Room)
	}
	return ids
}

// ContinueGenerationResumed is ContinueGeneration with, per resumed room,
// its prefill's HTTP endpoint and pinned DP rank, read under the room's
// shard lock right after the re-enqueue.
func (m *Manager) ContinueGenerationResumed(ctx context.Context) []Resumed {
	var out []Resumed
	m.shards.each(func(sh *shard) {
		resumed := sh.led.ResumeHeld()
		back := make(map[uint64]bool, len(resumed))
		for _, id := range resumed {
			back[id] = true
		}
		// The held rooms the ledger dropped instead of re-queueing (it
		// refuses a request that can no longer fit the pool) fail.
		for _, e := range sh.sorted(func(e *entry) bool { return e.Phase() == PhaseHeld && !back[e.ID()] }) {
			if _, known := sh.led.State(e.ID()); known {
				continue // the ledger still holds it
			}
			req := e.led.Request() // its lengths as the decode engine last reported them
			sh.exec(e, room.Fail{Now: m.clock.Now(), LedgerGone: true, Failure: Failure{Code: FailureUnspecified, Message: fmt.Sprintf(
				"rebootstrap of room %d refused at ContinueGeneration: prompt %d + output %d tokens exceed the decode pool", e.ID(), req.PromptLen, req.OutputLen)}})
		}
		for _, id := range resumed {
			if e := sh.rooms[id]; e != nil {
				ef := e.Apply(room.Rebootstrap{Now: m.clock.Now()})
				sh.startSpan(ctx, e) // the new attempt's span, from its first step
				sh.apply(e, &ef)
				sh.toPrefill(e)
			}
		}
		for _, id := range resumed {
			e := sh.rooms[id]
			if e == nil {
				out = append(out, Resumed{Room: id, Phase: PhaseFailed, PrefillDP: -1})
				continue
			}
			host, port, url := prefillHTTP(m.reg, e.Addr())
			out = append(out, Resumed{Room: e.ID(), RID: e.Request().RID, Attempt: e.Attempt(), Phase: e.Phase(), PrefillAddr: e.Addr(),
				PrefillHTTPHost: host, PrefillHTTPPort: port, GenerateURL: url, PrefillDP: e.PrefillDP()})
		}
	})
	return out
}

// prefillHTTP is the HTTP endpoint of the prefill instance at addr: the
// bootstrap address's host and the registration's prefill_http_port (0 and
// "" when the instance is not registered or gave no port).
func prefillHTTP(reg *registry.Registry, addr string) (host string, port int, generateURL string) {
	host = addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if info, ok := reg.Info(addr); ok && info.HTTPPort > 0 {
		port = info.HTTPPort
		generateURL = "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/generate"
	}
	return host, port, generateURL
}
