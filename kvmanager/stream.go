package kvmanager

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// watchBuffer is how many events a watch stream may fall behind before it is
// dropped with ErrSlowConsumer: a room's whole hand-off (about a dozen
// transitions, a rebootstrap a few more) fits, so only a watcher that stopped
// reading is dropped.
const watchBuffer = 16

// Watcher is one watch of a room: a WatchRoom stream (Events) or a
// subscription of a multiplexed session (WatchSink).
type Watcher struct {
	ch   chan RoomEvent
	sink WatchSink // instead of ch
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
	if w.sink != nil {
		if w.sink.Event(ev) {
			return true
		}
		w.close(ErrSlowConsumer)
		return false
	}
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
		if w.sink != nil {
			w.sink.End(err)
			return
		}
		close(w.ch)
	})
}

// WatchSink receives a watched room's events on a multiplexed session
// instead of a channel. Both methods are called with the room's shard lock
// held, in the room's order: they must not block or call the Manager.
type WatchSink interface {
	// Event takes one event; false when it cannot (its queue is full): the
	// watch then ends with ErrSlowConsumer.
	Event(RoomEvent) bool
	// End is the watch's end, once: nil after the room's terminal event
	// (or the outcome) or Close, ErrSlowConsumer when Event refused one.
	End(err error)
}

// ClaimSink receives a claim's events on a multiplexed session instead of
// a channel: the destination (again for a new attempt), then the room's
// end (a Failure or Done event, the last). It is called with the room's
// shard lock (or the pending claims' lock) held: it must not block or call
// the Manager. Close calls nothing.
type ClaimSink func(DestinationEvent)

// Close stops watching.
func (w *Watcher) Close() {
	w.sh.mu.Lock()
	defer w.sh.mu.Unlock()
	if e := w.sh.rooms[w.room]; e != nil && e.subs != nil {
		delete(e.subs.watchers, w)
	}
	w.close(nil)
}

// claimBuffer holds a room's destination and its end.
const claimBuffer = 4

// Claim is one prefill rank's AwaitDestination stream: the claim on a room.
type Claim struct {
	m      *Manager
	room   uint64
	rank   RankID
	ch     chan DestinationEvent
	sink   ClaimSink // instead of ch
	ended  bool      // its end was given to sink (or it was closed)
	once   sync.Once
	expiry deadline // while waiting for OpenRoom: fails the claim at timeouts.bootstrap
	// offer is the subscription the manager made the claim for (offers.go),
	// nil for a claim of the rank's own.
	offer *offerSub
}

// Offered reports a claim the manager made for a subscribed rank
// (OfferRooms).
func (c *Claim) Offered() bool { return c.offer != nil }

// Room is the claimed room.
func (c *Claim) Room() uint64 { return c.room }

// Events delivers the destination, then the room's end. The channel is
// closed after a Failure or Done event, or on Close.
func (c *Claim) Events() <-chan DestinationEvent { return c.ch }

// Rank is the claiming rank.
func (c *Claim) Rank() RankID { return c.rank }

// queue adds an event without blocking; called with the lock of what holds
// the claim held (the room's shard, or the pending claims').
// The buffer is sized so that a room never queues more than it holds.
func (c *Claim) queue(ev DestinationEvent) {
	if c.sink != nil {
		if !c.ended {
			c.sink(ev)
		}
		return
	}
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
		c.end()
	})
}

// end closes the claim's channel, or stops its sink; under once.
func (c *Claim) end() {
	if c.sink != nil {
		c.ended = true
		return
	}
	close(c.ch)
}

// Delivered tells the manager the destination was written to the stream: the
// rank has claimed the room. Call it after each Destination event is sent.
func (c *Claim) Delivered(d *Destination) {
	if d == nil {
		return
	}
	m := c.m
	sh, e := m.shards.lock(c.room)
	if e == nil {
		return
	}
	defer sh.unlock()
	sh.exec(e, room.Delivered{Now: m.clock.Now(), Rank: c.rank.Key(), Attempt: d.Attempt})
}

// Close ends the claim (the stream ended). Claims already made stand.
//
// A claim waiting for its room is taken off the pending claims first; one
// that is not there any more is (or is being) attached to its room by
// OpenRoom under the room's shard lock, which Close takes next: either way
// nothing holds the claim when its channel closes.
func (c *Claim) Close() {
	m := c.m
	m.dl.clear(&c.expiry)
	m.pend.remove(c)
	if sh, e := m.shards.lock(c.room); e != nil {
		k := c.rank.Key()
		if s := e.subs; s != nil && s.claims.get(k) == c {
			s.claims.remove(k)
			e.Apply(room.Detach{Rank: k})
		}
		c.once.Do(c.end)
		sh.mu.Unlock()
		return
	}
	c.once.Do(c.end)
}

// pendingClaims are the claims for rooms not opened yet: OpenRoom takes
// them, timeouts.bootstrap fails them. A leaf lock.
type pendingClaims struct {
	m     *Manager
	mu    sync.Mutex
	rooms map[uint64][]*Claim
	count int
}

// maxPendingClaims bounds claims waiting for rooms that are not open yet
// (each holds a gRPC stream of ~14 KiB: 8,192 of them stay near 110 MiB).
const maxPendingClaims = 8192

// queue queues a claim for a room not opened yet; false (and no error) when
// the room is open by now. Under the pending claims' lock the room is
// looked up again: OpenRoom inserts the room before it takes the claims
// waiting for it, so that a claim is either seen here or taken there.
func (p *pendingClaims) queue(c *Claim) (bool, error) {
	m := p.m
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, e := m.shards.find(c.room); e != nil {
		return false, nil
	}
	id := c.room
	if m.draining.Load() || m.closed.Load() {
		return false, fmt.Errorf("await destination of room %d: %w", id, ErrDraining)
	}
	if p.count >= maxPendingClaims {
		return false, &RetryError{Err: fmt.Errorf("await destination of room %d: %w (%d)", id, ErrTooManyWaiters, p.count), RetryAfter: time.Second}
	}
	p.rooms[id] = append(p.rooms[id], c)
	p.count++
	m.dl.set(&c.expiry, dlPendingClaim, m.clock.Now().Add(m.cfg.Timeouts.Bootstrap), 0, c)
	return true, nil
}

// take removes and returns the claims waiting for id.
func (p *pendingClaims) take(id uint64) []*Claim {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := p.rooms[id]
	if cs != nil {
		delete(p.rooms, id)
		p.count -= len(cs)
	}
	return cs
}

// remove takes c off the pending claims; false when it is not there.
func (p *pendingClaims) remove(c *Claim) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := p.rooms[c.room]
	i := slices.Index(cs, c)
	if i < 0 {
		return false
	}
	p.rooms[c.room] = slices.Delete(cs, i, i+1)
	p.count--
	if len(p.rooms[c.room]) == 0 {
		delete(p.rooms, c.room)
	}
	return true
}

// expire fails a claim whose room was never opened within
// timeouts.bootstrap (the heap's dlPendingClaim entry).
func (p *pendingClaims) expire(c *Claim) {
	m := p.m
	if m.closed.Load() || !p.remove(c) {
		return
	}
	c.finish(DestinationEvent{Failure: &Failure{Code: FailureBootstrapTimeout, Message: fmt.Sprintf(
		"Request %d timed out after %.1fs in KVPoll.Bootstrapping: the decode side never opened the room", c.room, m.cfg.Timeouts.Bootstrap.Seconds())}})
}

// failAll ends every claim waiting for a room never opened with
// FailureShutdown and returns how many it ended.
func (p *pendingClaims) failAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]uint64, 0, len(p.rooms))
	for id := range p.rooms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	n := 0
	for _, id := range ids {
		for _, c := range p.rooms[id] {
			p.m.dl.clear(&c.expiry)
			c.finish(DestinationEvent{Failure: &Failure{Code: FailureShutdown, Message: shutdownMessage(
				fmt.Sprintf("decodeplane shut down before room %d was opened", id), strconv.FormatUint(id, 10))}})
			n++
		}
		delete(p.rooms, id)
	}
	p.count = 0
	return n
}

// len is how many claims wait for rooms not opened yet.
func (p *pendingClaims) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}
