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
	return await(&Claim{m: m, room: id, rank: rank, ch: make(chan DestinationEvent, claimBuffer)})
}

// AwaitDestinationFunc is AwaitDestination for a multiplexed session: the
// claim's events go to sink (see ClaimSink) instead of Events. A claim
// refused at once is ended with its event (Refused set) and the error.
func (m *Manager) AwaitDestinationFunc(id uint64, rank RankID, sink ClaimSink) (*Claim, error) {
	return await(&Claim{m: m, room: id, rank: rank, sink: sink})
}

// await attaches c to its room, or queues it for the room's opening.
func await(c *Claim) (*Claim, error) {
	m, id, rank := c.m, c.room, c.rank
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
	ef := e.Apply(room.Attach{Rank: c.rank, Registered: sh.m.reg.RankRegistered(c.rank), Set: &e.s().attached})
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
	return m.shards.watch(id, history, false, nil)
}

// WatchOutcome streams one event of a room, its outcome: the transition
// to PhaseSucceeded, or the terminal one of a room that ends without
// succeeding (an outcome already reached is sent at once); Events is then
// closed. The events before it are neither sent nor built.
func (m *Manager) WatchOutcome(id uint64) (*Watcher, error) {
	return m.shards.watch(id, false, true, nil)
}

// WatchFunc is Watch (outcome false) or WatchOutcome (outcome true) for a
// multiplexed session: the events go to sink (see WatchSink), the ones
// already reached before WatchFunc returns.
func (m *Manager) WatchFunc(id uint64, history, outcome bool, sink WatchSink) (*Watcher, error) {
	return m.shards.watch(id, history, outcome, sink)
}

func (ss shardSet) watch(id uint64, history, outcome bool, sink WatchSink) (*Watcher, error) {
	sh, e := ss.lock(id)
	if e == nil {
		return nil, fmt.Errorf("watch room %d: %w", id, ErrRoomNotFound)
	}
	defer sh.unlock()
	steps := e.Steps()
	terminal := e.Phase().Terminal()
	// A room that ended keeps its watchers until its pages are reusable
	// (its last step says so).
	reusable := terminal && !e.ReleasePending()
	// The events already reached: every step (history), the current one, or
	// the outcome (none yet: at is -1) — and, for an outcome reached by a
	// room that ended before its pages were reusable, the step that says
	// they are now.
	first, last := len(steps)-1, len(steps)-1
	if history {
		first = 0
	}
	if outcome {
		first = -1
		for i, t := range steps {
			if t.Phase() == PhaseSucceeded || t.Phase().Terminal() {
				first = i
				break
			}
		}
		last = first
	}
	w := &Watcher{sink: sink, sh: sh, room: id, outcome: outcome, last: uint32(len(steps))}
	if sink == nil {
		n := watchBuffer + len(steps) - first
		if outcome {
			n = 2 // the outcome, and the step saying the pages are reusable
		}
		w.ch = make(chan RoomEvent, n)
	}
	if first >= 0 {
		snap := e.snapshot(false, false)
		texts := e.Texts()
		send := func(i int) bool {
			return w.send(RoomEvent{Room: snap, Transition: steps[i].Public(e.Addr(), texts), Terminal: terminalStep(steps, i),
				PagesReusable: reusable && i == len(steps)-1, Seq: uint32(i + 1)})
		}
		for i := first; i <= last; i++ {
			if !send(i) {
				return w, nil // the sink refused it: the watch ended (ErrSlowConsumer)
			}
		}
		if outcome && reusable && steps[first].Phase().Terminal() && last < len(steps)-1 && !send(len(steps)-1) {
			return w, nil
		}
	}
	if reusable || (outcome && first >= 0 && !terminal) {
		w.close(nil)
		return w, nil
	}
	e.s().watch(w)
	return w, nil
}

// terminalStep reports whether steps[i] is the room's terminal transition:
// the move into a terminal phase (a step after it, the one saying the
// pages are reusable, keeps the phase and is not).
func terminalStep(steps []room.Step, i int) bool {
	return steps[i].Phase().Terminal() && (i == 0 || !steps[i-1].Phase().Terminal())
}

// watch registers w for the room's next transitions.
func (s *subscribers) watch(w *Watcher) {
	if s.watchers == nil {
		s.watchers = make(map[*Watcher]struct{}, 1)
	}
	s.watchers[w] = struct{}{}
}
