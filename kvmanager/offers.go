package kvmanager

import (
	"sync"
	"sync/atomic"

	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// Offers: the manager claims rooms for a prefill rank that asked for them
// (OfferRooms), so that a rank which does not know which daemon of a fleet
// owns a room learns it from the owner (the decode side tells the prefill
// where to write, as SGLang's decode pushes its TransferInfo). An offered
// claim is an ordinary claim (AwaitDestinationFunc's) that the manager
// makes itself: of every room of the rank's instance and DP rank that is
// open and handing off when the rank subscribes, and of every room whose
// DP rank resolves to the rank's while it is subscribed.

// OfferSink makes the sink of a claim the manager makes for a subscribed
// rank (OfferRooms): it is called with the claim before the claim is
// attached, with the room's shard lock held, and must not block or call
// the Manager. The sink gets the claim's events as AwaitDestinationFunc's
// does: the destination at admission (at once when the room has one), then
// the room's end. A claim is offered only to a rank the room would accept
// (its instance, DP rank and registration), so no refusal reaches it.
type OfferSink func(c *Claim) ClaimSink

// offers are the ranks subscribed to their rooms, by instance address,
// prefill DP rank and rank key. Its lock is taken under a shard's (and
// alone by OfferRooms and a subscription's stop); the registry's is taken
// under it.
type offers struct {
	mu sync.RWMutex
	// n counts the subscriptions: the room path takes no lock without one.
	n      atomic.Int64
	byAddr map[string]map[int]map[ranks.RankKey]*offerSub
}

// offerSub is one rank's subscription.
type offerSub struct {
	rank RankID
	sink OfferSink
	dead bool // stopped (under offers.mu)
}

// OfferRooms subscribes rank to the rooms this manager holds for it until
// the returned stop is called: every room of the rank's instance and DP
// rank that is open, DP-resolved and still handing off (queued, admitted,
// claimed or transferring) is claimed for it now, superseding the rank's
// earlier claim of the room (a second AwaitDestination's rule), and every
// room whose DP rank resolves to the rank's later is claimed for it then,
// unless the rank has a claim of that room already. Each claim's sink is
// sink's. A newer subscription of the same rank replaces this one (its
// claims stand until they end or are superseded). After stop returns no
// claim is made for the subscription any more; the claims it made stand
// until their owner closes them.
func (m *Manager) OfferRooms(rank RankID, sink OfferSink) (stop func()) {
	sub := &offerSub{rank: rank, sink: sink}
	o := &m.offers
	o.mu.Lock()
	if o.byAddr == nil {
		o.byAddr = map[string]map[int]map[ranks.RankKey]*offerSub{}
	}
	byDP := o.byAddr[rank.Addr]
	if byDP == nil {
		byDP = map[int]map[ranks.RankKey]*offerSub{}
		o.byAddr[rank.Addr] = byDP
	}
	byKey := byDP[rank.DP]
	if byKey == nil {
		byKey = map[ranks.RankKey]*offerSub{}
		byDP[rank.DP] = byKey
	}
	if old := byKey[rank.Key()]; old != nil {
		old.dead = true
	} else {
		o.n.Add(1)
	}
	byKey[rank.Key()] = sub
	o.mu.Unlock()
	m.shards.each(func(sh *shard) {
		o.mu.RLock()
		defer o.mu.RUnlock()
		if sub.dead {
			return
		}
		for _, e := range sh.rooms {
			if e.Addr() == rank.Addr && e.PrefillDP() == rank.DP && handingOff(e.Phase()) {
				sh.offerTo(e, sub, true)
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { o.stop(sub) }) }
}

// handingOff reports the phases of a DP-resolved room whose hand-off has
// not ended: what a subscription's first claims are made of.
func handingOff(p Phase) bool {
	switch p {
	case PhaseQueued, PhaseAdmitted, PhaseClaimed, PhaseTransferring:
		return true
	}
	return false
}

// stop ends sub: no claim is made for it once stop returned.
func (o *offers) stop(sub *offerSub) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if sub.dead {
		return
	}
	sub.dead = true
	r := sub.rank
	byDP := o.byAddr[r.Addr]
	byKey := byDP[r.DP]
	if byKey[r.Key()] != sub {
		return
	}
	delete(byKey, r.Key())
	o.n.Add(-1)
	if len(byKey) == 0 {
		delete(byDP, r.DP)
	}
	if len(byDP) == 0 {
		delete(o.byAddr, r.Addr)
	}
}

// offerResolved offers a room whose DP rank just resolved to the ranks
// subscribed to it that have no claim of it (the room's shard lock held).
func (sh *shard) offerResolved(e *entry) {
	o := &sh.m.offers
	if o.n.Load() == 0 {
		return
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, sub := range o.byAddr[e.Addr()][e.PrefillDP()] {
		if e.subs != nil && e.subs.claims.get(sub.rank.Key()) != nil {
			continue // the rank's own claim stands
		}
		sh.offerTo(e, sub, false)
	}
}

// offerTo claims room e for sub's rank (the room's shard lock and the
// offers' lock held): unless the rank's current claim of the room is
// already sub's, the room is not one the rank may claim, or (supersede
// false) the rank has a claim of it.
func (sh *shard) offerTo(e *entry, sub *offerSub, supersede bool) {
	k := sub.rank.Key()
	if e.subs != nil {
		if c := e.subs.claims.get(k); c != nil && (c.offer == sub || !supersede) {
			return
		}
	}
	if e.Addr() != sub.rank.Addr || e.PrefillDP() != sub.rank.DP || !sh.m.reg.RankRegistered(sub.rank) {
		return
	}
	c := &Claim{m: sh.m, room: e.ID(), rank: sub.rank, offer: sub}
	c.sink = sub.sink(c)
	if c.sink == nil {
		return
	}
	if err := sh.attach(e, c); err != nil {
		sh.m.invariant("offer a room to a subscribed rank", e.ID(), err)
	}
}
