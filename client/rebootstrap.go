package client

import (
	"context"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// ContinueGenerationResumed is ContinueGeneration with, per re-enqueued
// room, what the decode engine needs to request its prefill's recompute:
// the prefill's generate_url (http://host:prefill_http_port/generate) and
// the prefill DP rank the room is pinned to. The daemon does not have the
// prompt; the engine POSTs it there. Never retried automatically.
func (c *Client) ContinueGenerationResumed(ctx context.Context) ([]*pb.ResumedRoom, error) {
	resp, err := invoke(ctx, c, pb.Rooms_ContinueGeneration_FullMethodName, &pb.ContinueGenerationRequest{}, c.rooms.ContinueGeneration)
	if err != nil {
		return nil, err
	}
	return resp.GetResumed(), nil
}
