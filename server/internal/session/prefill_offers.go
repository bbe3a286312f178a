package session

import (
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Offers (prefill_session.proto, Session: Offers): a session whose hello
// asked for them is subscribed to its rank's rooms (kvmanager's
// OfferRooms), and every claim the room manager makes for it is an offer
// on the session: the offer event (claim_seq 0, offer set), then the
// claim's events under claim_seq 0, as a claim op's. The session keeps its
// offered claims by room (offers) beside its claim ops' (claims): they end
// as those do; a claim op of an offered room makes the room manager
// supersede the offer, whose end then comes under claim_seq 0.

// subscribe subscribes the session to its rank's rooms, right after the
// welcome and before any op: the offers of the rooms open now are queued
// first, outside the queue's bound (a rank may hold more rooms than the
// queue), and the sender sends them once it starts.
func (ss *prefillSession) subscribe() {
	ss.mu.Lock()
	ss.scanning = true
	ss.mu.Unlock()
	ss.stopOffers = ss.t.OfferRooms(ss.rank, ss.offered)
	ss.mu.Lock()
	ss.scanning = false
	ss.mu.Unlock()
}

// offered is the session's kvmanager.OfferSink: the room manager claimed
// c's room for the session's rank. It queues the offer and returns the
// claim's sink; nil (no claim) once the session is closed.
func (ss *prefillSession) offered(c *kvmanager.Claim) kvmanager.ClaimSink {
	room := c.Room()
	sc := &prefillClaim{ss: ss, room: room, c: c, ready: true}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return nil
	}
	ss.offers[room] = sc // an earlier offer of the room was superseded by this one
	ss.pushLocked(prefillItem{ev: &pb.PrefillEvent{Event: &pb.PrefillEvent_Room{Room: &pb.PrefillRoomEvent{
		Room: room, Offer: true}}}})
	ss.h.count("offer", nil)
	return sc.event
}
