package client

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The request's deadline. OpenRoom and OpenAndWait send the daemon what
// their context's deadline leaves (OpenRoomRequest.timeout), so that the
// room's hand-off is bounded by it: each phase's bound is capped by what is
// left, and a room whose budget ends fails with
// FAILURE_CODE_DEADLINE_EXCEEDED naming the phase that used it. The budget
// sent is what the context has left when the open is sent (each attempt
// anew), less a reserve for the answer's way back (a twentieth, at most
// 100 ms), so that the daemon's account of the failure reaches the caller
// before its context ends. A timeout the request carries already is kept
// when it is shorter.

// maxDeadlineReserve bounds the reserve kept for the answer's way back.
const maxDeadlineReserve = 100 * time.Millisecond

// withDeadline is req with the timeout ctx's deadline leaves (a copy when
// it changes; req itself when ctx has no deadline or req's own timeout is
// shorter).
func withDeadline(ctx context.Context, req *pb.OpenRoomRequest) *pb.OpenRoomRequest {
	dl, ok := ctx.Deadline()
	if !ok {
		return req
	}
	left := time.Until(dl)
	budget := left - min(left/20, maxDeadlineReserve)
	budget = min(max(budget.Truncate(time.Millisecond), pb.MinRoomTimeout), pb.MaxRoomTimeout)
	if own := req.GetTimeout(); own != nil && (!own.IsValid() || own.AsDuration() <= budget) {
		return req // the caller's own, shorter (or for the daemon to refuse)
	}
	if req == nil {
		req = &pb.OpenRoomRequest{}
	} else {
		req = proto.CloneOf(req)
	}
	req.Timeout = durationpb.New(budget)
	return req
}
