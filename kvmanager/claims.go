package kvmanager

import (
	"fmt"

	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// AwaitDestination registers a prefill rank's claim on a room. A claim for a
// room not opened yet waits (bounded by timeouts.bootstrap) for OpenRoom;
// a rank that a registered instance lacks is refused at once, opened room
// or not (an instance unknown or still registering is not refused: its
// ranks may claim before the last one registered).
func (m *Manager) AwaitDestination(id uint64, rank RankID) (*Claim, error) {
	c := &Claim{m: m, room: id, rank: rank, ch: make(chan DestinationEvent, claimBuffer)}
	for {
		if sh, e := m.shards.lock(id); e != nil {
			// An open room checks the source first (another address or
			// DP rank: INVALID_ARGUMENT), then the registration.
			err := sh.attach(e, c)
			sh.unlock()
			if err != nil {
				return nil, err
			}
			return c, nil
		}
		if !m.reg.RankRegistered(rank) {
			return nil, room.ErrRankNotRegistered(id, rank)
		}
		queued, err := m.pend.queue(c)
		if queued || err != nil {
			return c, err
		}
		// The room was opened meanwhile: attach to it.
	}
}

// attach binds a claim to an open room and replays what the rank has
// missed (destination, end); a newer claim of the same rank supersedes the
// older one (mu held).
func (sh *shard) attach(e *entry, c *Claim) error {
	ef := e.Apply(room.Attach{Rank: c.rank, Registered: sh.m.reg.RankRegistered(c.rank)})
	if ef.Err != nil {
		c.finish(*ef.Reply)
		return ef.Err
	}
	k := c.rank.Key()
	s := e.s()
	if old := s.claims.get(k); old != nil && old != c {
		old.finish(DestinationEvent{Failure: &Failure{Code: FailureUnspecified, Message: "superseded by a newer AwaitDestination from the same rank"}})
		s.claims.remove(k)
	}
	if ef.Reply != nil {
		c.finish(*ef.Reply)
		return nil
	}
	s.claims.set(k, c)
	if ef.Offer != room.OfferNone {
		sh.offer(e, &ef)
	}
	return nil
}

// Watch streams a room's transitions: its current state (every earlier
// transition when history is set), then each transition until terminal.
func (m *Manager) Watch(id uint64, history bool) (*Watcher, error) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return nil, fmt.Errorf("watch room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	steps := e.Steps()
	first := len(steps) - 1
	if history {
		first = 0
	}
	w := &Watcher{ch: make(chan RoomEvent, watchBuffer+len(steps)-first), sh: sh, room: id, last: uint32(len(steps))}
	snap := e.snapshot(false, false)
	texts := e.Texts()
	terminal := e.Phase().Terminal()
	for i := first; i < len(steps); i++ {
		w.ch <- RoomEvent{Room: snap, Transition: steps[i].Public(e.Addr(), texts), Terminal: terminal && i == len(steps)-1, Seq: uint32(i + 1)}
	}
	if terminal {
		w.close(nil)
		return w, nil
	}
	e.s().watch(w)
	return w, nil
}

// WatchOutcome streams one event of a room, its outcome: the transition
// to PhaseSucceeded, or the terminal one of a room that ends without
// succeeding (an outcome already reached is sent at once); Events is then
// closed. The events before it are neither sent nor built.
func (m *Manager) WatchOutcome(id uint64) (*Watcher, error) {
	sh, e := m.shards.lock(id)
	if e == nil {
		return nil, fmt.Errorf("watch room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	steps := e.Steps()
	w := &Watcher{ch: make(chan RoomEvent, 1), sh: sh, room: id, outcome: true, last: uint32(len(steps))}
	at := -1
	for i, t := range steps {
		if t.Phase() == PhaseSucceeded {
			at = i
			break
		}
	}
	terminal := e.Phase().Terminal()
	if at < 0 && terminal {
		at = len(steps) - 1
	}
	if at >= 0 {
		w.ch <- RoomEvent{Room: e.snapshot(false, false), Transition: steps[at].Public(e.Addr(), e.Texts()),
			Terminal: terminal && at == len(steps)-1, Seq: uint32(at + 1)}
		w.close(nil)
		return w, nil
	}
	e.s().watch(w)
	return w, nil
}

// watch registers w for the room's next transitions.
func (s *subscribers) watch(w *Watcher) {
	if s.watchers == nil {
		s.watchers = make(map[*Watcher]struct{}, 1)
	}
	s.watchers[w] = struct{}{}
}
