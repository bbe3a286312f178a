package kvmanager

import (
	"sync"
)

// watchBuffer is how many events a watch stream may fall behind before it is
// dropped with ErrSlowConsumer: a room's whole hand-off (about a dozen
// transitions, a rebootstrap a few more) fits, so only a watcher that stopped
// reading is dropped.
const watchBuffer = 16

// Watcher is one WatchRoom stream.
type Watcher struct {
	ch   chan RoomEvent
	once sync.Once
	err  error  // guarded by sh.mu
	sh   *shard // the room's shard
	room uint64
	// outcome: WatchOutcome's watcher, sent only the room's outcome.
	outcome bool
	// last is the room's last event's seq when the watch began.
	last uint32
}

// OutcomeOnly reports a WatchOutcome watcher: its one event is its last.
func (w *Watcher) OutcomeOnly() bool { return w.outcome }

// Last is the seq (RoomEvent.Seq) of the room's last event when the watch
// began: the events after it are the live ones.
func (w *Watcher) Last() uint32 { return w.last }

// Events delivers the room's events; it is closed after the terminal event,
// when the watcher falls behind (Err returns ErrSlowConsumer) or on Close.
func (w *Watcher) Events() <-chan RoomEvent { return w.ch }

// Err reports why Events was closed early (nil after the terminal event).
func (w *Watcher) Err() error {
	w.sh.mu.Lock()
	defer w.sh.mu.Unlock()
	return w.err
}

// send queues an event without blocking; false means the watcher was dropped.
// Called with the room's shard lock held.
func (w *Watcher) send(ev RoomEvent) bool {
	select {
	case w.ch <- ev:
		return true
	default:
		w.close(ErrSlowConsumer)
		return false
	}
}

// close ends the stream; called with the room's shard lock held.
func (w *Watcher) close(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.ch)
	})
}

// Close stops watching.
func (w *Watcher) Close() {
	w.sh.mu.Lock()
	defer w.sh.mu.Unlock()
	if r := w.sh.rooms[w.room]; r != nil {
		delete(r.watching(), w)
	}
	w.close(nil)
}

// claimBuffer holds a room's destination and its end.
const claimBuffer = 4

// Claim is one prefill rank's AwaitDestination stream: the claim on a room.
type Claim struct {
	m       *Manager
	room    uint64
	rank    RankID
	ch      chan DestinationEvent
	once    sync.Once
	attempt uint32   // attempt of the destination last queued
	acked   uint32   // attempt whose destination was delivered
	expiry  deadline // while waiting for OpenRoom: fails the claim at timeouts.bootstrap
}

// stopExpiry takes the pending claim's deadline off the heap.
func (c *Claim) stopExpiry() { c.m.clearDeadlineLocked(&c.expiry) }

// Events delivers the destination, then the room's end. The channel is
// closed after a Failure or Done event, or on Close.
func (c *Claim) Events() <-chan DestinationEvent { return c.ch }

// Rank is the claiming rank.
func (c *Claim) Rank() RankID { return c.rank }

// queue adds an event without blocking; called with the lock of what holds
// the claim held (the room's shard, or the pending claims').
// The buffer is sized so that a room never queues more than it holds.
func (c *Claim) queue(ev DestinationEvent) {
	select {
	case c.ch <- ev:
	default:
		// Only possible for a claim that stopped reading; its stream is gone.
	}
}

// finish queues a final event and closes the stream; lock held.
func (c *Claim) finish(ev DestinationEvent) {
	c.once.Do(func() {
		c.queue(ev)
		close(c.ch)
	})
}

// Delivered tells the manager the destination was written to the stream: the
// rank has claimed the room. Call it after each Destination event is sent.
func (c *Claim) Delivered(d *Destination) {
	c.m.delivered(c, d)
}

// Close ends the claim (the stream ended). Claims already made stand.
//
// A claim waiting for its room is taken off the pending claims first; one
// that is not there any more is (or is being) attached to its room by
// OpenRoom under the room's shard lock, which Close takes next: either way
// nothing holds the claim when its channel closes.
func (c *Claim) Close() {
	m := c.m
	c.stopExpiry()
	m.pend.mu.Lock()
	if cs := m.pend.rooms[c.room]; cs != nil {
		for i, x := range cs {
			if x == c {
				m.pend.rooms[c.room] = append(cs[:i], cs[i+1:]...)
				m.pend.count--
				break
			}
		}
		if len(m.pend.rooms[c.room]) == 0 {
			delete(m.pend.rooms, c.room)
		}
	}
	m.pend.mu.Unlock()
	if sh, r := m.lockRoom(c.room); r != nil {
		if r.claims.get(c.rank.Key()) == c {
			r.claims.remove(c.rank.Key())
		}
		c.once.Do(func() { close(c.ch) })
		sh.mu.Unlock()
		return
	}
	c.once.Do(func() { close(c.ch) })
}
