package main

import (
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// ackEnd is what a conforming prefill does when a room it holds staging
// regions of fails (deferred release, AckRoomEnd): each of its n ranks
// acknowledges that it writes nothing more into the room's attempt 1. It
// checks that the ranks that still held an unreported region owed one,
// and that the last acknowledgement released the room.
func (c *cluster) ackEnd(p *prefill, room uint64, n int, owing ...int) {
	t := c.t
	t.Helper()
	owes := map[int]bool{}
	for _, r := range owing {
		owes[r] = true
	}
	released := false
	for r := range n {
		res, err := c.rooms.AckRoomEnd(ctxT(t), &pb.AckRoomEndRequest{Room: room, Rank: p.rank(r), Attempt: 1})
		if err != nil {
			t.Fatalf("AckRoomEnd(room %d, rank %d): %v", room, r, err)
		}
		if res.GetOwed() != owes[r] {
			t.Errorf("AckRoomEnd(room %d, rank %d): owed %v, want %v", room, r, res.GetOwed(), owes[r])
		}
		released = released || res.GetReleased()
	}
	if !released {
		t.Errorf("room %d: no acknowledgement released it", room)
	}
}
