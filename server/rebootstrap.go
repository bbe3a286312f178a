package server

import (
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// continueGenerationToProto is ContinueGeneration's answer: the resumed
// rooms, and per room what the decode engine needs to request its prefill's
// recompute (the prefill's HTTP endpoint, the pinned DP rank).
func continueGenerationToProto(resumed []kvmanager.Resumed) *pb.ContinueGenerationResponse {
	out := &pb.ContinueGenerationResponse{Rooms: make([]uint64, 0, len(resumed)), Resumed: make([]*pb.ResumedRoom, 0, len(resumed))}
	for _, r := range resumed {
		out.Rooms = append(out.Rooms, r.Room)
		out.Resumed = append(out.Resumed, &pb.ResumedRoom{
			Room: r.Room, Rid: r.RID, Attempt: r.Attempt, Phase: phaseToProto(r.Phase),
			PrefillBootstrapAddr: r.PrefillAddr, PrefillHttpHost: r.PrefillHTTPHost,
			PrefillHttpPort: uint32(max(0, min(r.PrefillHTTPPort, 65535))), GenerateUrl: r.GenerateURL,
			PrefillDpRank: int32(max(-1, min(r.PrefillDP, 1<<31-1))),
		})
	}
	return out
}
