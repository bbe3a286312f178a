package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// ReasonStaleAttempt is the ErrorInfo reason of an AckRoomEnd that names an
// attempt other than the room's current one.
const ReasonStaleAttempt = "STALE_ATTEMPT"

// AckRoomEnd is a prefill rank's acknowledgement that it stopped writing
// into a room's destination (kvmanager.Manager.AckRoomEnd). The
// incarnation is checked by the interceptor; the attempt here.
func (h *roomsService) AckRoomEnd(ctx context.Context, req *pb.AckRoomEndRequest) (*pb.AckRoomEndResponse, error) {
	res, err := h.m.AckRoomEnd(req.GetRoom(), rankFromProto(req.GetRank()), req.GetAttempt())
	if errors.Is(err, kvmanager.ErrStaleAttempt) {
		st := status.New(codes.FailedPrecondition, fmt.Sprintf("%v: the acknowledgement is for an earlier generation of the room and changes nothing", err))
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonStaleAttempt, Domain: ErrorDomain}); derr == nil {
			st = d
		}
		return nil, st.Err()
	}
	if err != nil {
		return nil, h.err(ctx, err)
	}
	return &pb.AckRoomEndResponse{Owed: res.Owed, Remaining: uint32(res.Remaining), Released: res.Released}, nil
}
