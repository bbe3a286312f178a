package server

import (
	"context"
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Resync is the decode engine's re-declaration of its running rooms after a
// daemon restart (kvmanager/resync.go; the proto's Rooms.Resync). The
// request's bounds were checked by its Validate.
func (h *roomsService) Resync(ctx context.Context, req *pb.ResyncRequest) (*pb.ResyncResponse, error) {
	rooms := make([]kvmanager.ResyncRoom, len(req.GetRooms()))
	for i, r := range req.GetRooms() {
		pdp := -1
		if r.PrefillDpRank != nil {
			pdp = int(r.GetPrefillDpRank())
		}
		rooms[i] = kvmanager.ResyncRoom{
			Room: r.GetRoom(), RID: r.GetRid(), PromptLen: int(r.GetPromptLen()), OutputLen: int(r.GetOutputLen()),
			MaxNewTokens: int(r.GetMaxNewTokens()), DecodeDP: int(r.GetDecodeDpRank()), ReqSlot: r.GetReqSlot(),
			Pages: r.GetPageIndices(), SWAPages: r.GetSwaPageIndices(), MambaSlots: r.GetMambaSlots(),
			Addr: r.GetBootstrapAddr(), PrefillDP: pdp,
		}
	}
	n, st, err := h.m.Resync(rooms, req.GetDone())
	if err != nil {
		return nil, h.err(ctx, fmt.Errorf("resync (%d rooms of this call adopted before it): %w", n, err))
	}
	return &pb.ResyncResponse{Adopted: uint32(n), Declared: uint32(st.Declared), Pages: uint64(st.Pages), Admitting: !st.Waiting}, nil
}

// resyncReadiness is the readiness text while admission waits for the
// engine's resync ("" when it does not wait).
func resyncReadiness(m *kvmanager.Manager) string {
	if m == nil {
		return ""
	}
	st := m.ResyncStatus()
	if !st.Waiting {
		return ""
	}
	return fmt.Sprintf("waiting for the decode engine's resync (%d rooms declared so far), until %s", st.Declared, st.Until.UTC().Format(time.RFC3339))
}
