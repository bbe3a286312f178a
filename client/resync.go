package client

import (
	"context"
	"fmt"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Resync re-declares, after a daemon restart, the rooms the decode engine
// still runs (Rooms.Resync): the rooms go in calls of at most
// pb.MaxResyncRooms, the last with done, after which the daemon admits. It
// returns the daemon's last answer. A call refused part-way (the error
// names rooms[i] of that call) stops Resync; the rooms of earlier calls,
// and those before i, stay adopted. ErrFailedPrecondition: admission has
// already started (no engine.resync_timeout, done already sent, or the
// wait expired), or a page or slot is held by another declared room.
// Never retried automatically.
func (c *Client) Resync(ctx context.Context, rooms []*pb.ResyncRoom) (*pb.ResyncResponse, error) {
	for start := 0; ; start += pb.MaxResyncRooms {
		end := min(start+pb.MaxResyncRooms, len(rooms))
		req := &pb.ResyncRequest{Rooms: rooms[start:end], Done: end == len(rooms)}
		resp, err := invoke(ctx, c, pb.Rooms_Resync_FullMethodName, req, c.rooms.Resync)
		if err != nil {
			return nil, fmt.Errorf("resync rooms %d..%d of %d: %w", start, end, len(rooms), err)
		}
		if req.Done {
			return resp, nil
		}
	}
}
