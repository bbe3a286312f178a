package faults

import (
	"context"
	"fmt"
	"sync"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// holding are the phases in which a room holds pages for its hand-off or
// its decoding.
var holding = []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_ADMITTED, pb.RoomPhase_ROOM_PHASE_CLAIMED,
	pb.RoomPhase_ROOM_PHASE_TRANSFERRING, pb.RoomPhase_ROOM_PHASE_SUCCEEDED, pb.RoomPhase_ROOM_PHASE_FAILED}

// checkPages takes one sample of the daemon's rooms: every room that holds
// pages (a live hand-off, a running room, a failed one whose pages drain)
// is read with its pages, and no page of a decode DP shard may be held by
// two of them. A page seen twice is read again from both rooms before it
// counts (the rooms may have moved between the reads). With final set,
// every room has ended and its pages are reusable: the pool must be whole
// (every page free, nothing draining, nothing held for the engine).
func (s *Stage) checkPages(ctx context.Context, d *Daemon, final bool) error {
	s.mu.Lock()
	s.res.PagesChecked++
	s.mu.Unlock()
	list, err := d.rooms.ListRooms(ctx, &pb.ListRoomsRequest{Phases: holding, Limit: 100000})
	if err != nil {
		return fmt.Errorf("ListRooms: %w", err)
	}
	var ids []uint64
	for _, r := range list.GetRooms() {
		if r.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED && r.GetWaitingFor() == "" {
			continue // failed and given back
		}
		if r.GetNumPages() > 0 {
			ids = append(ids, r.GetRoom())
		}
	}
	rooms, err := d.roomPages(ctx, ids)
	if err != nil {
		return err
	}
	type key struct {
		dp   uint32
		page int32
	}
	owner := map[key]uint64{}
	for _, r := range rooms {
		for _, p := range r.GetPageIndices() {
			k := key{r.GetDecodeDpRank(), p}
			o, seen := owner[k]
			if !seen {
				owner[k] = r.GetRoom()
				continue
			}
			if twice, err := d.heldTwice(ctx, k.dp, p, o, r.GetRoom()); err != nil || twice {
				if err != nil {
					return err
				}
				return fmt.Errorf("page %d of decode DP shard %d is held by rooms %d and %d", p, k.dp, o, r.GetRoom())
			}
		}
	}
	if !final {
		return nil
	}
	return d.poolWhole(ctx)
}

// roomPages reads the rooms with their pages, 16 at a time.
func (d *Daemon) roomPages(ctx context.Context, ids []uint64) ([]*pb.Room, error) {
	out := make([]*pb.Room, len(ids))
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := d.rooms.GetRoom(ctx, &pb.GetRoomRequest{Room: id, IncludePages: true})
			if err != nil {
				select {
				case errs <- fmt.Errorf("GetRoom(%d): %w", id, err):
				default:
				}
				return
			}
			out[i] = r
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	return out, nil
}

// heldTwice reads rooms a and b again and reports whether both still hold
// page p of shard dp.
func (d *Daemon) heldTwice(ctx context.Context, dp uint32, p int32, a, b uint64) (bool, error) {
	rs, err := d.roomPages(ctx, []uint64{a, b})
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		live := r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || r.GetWaitingFor() != ""
		has := false
		for _, q := range r.GetPageIndices() {
			has = has || q == p
		}
		if !live || !has || r.GetDecodeDpRank() != dp || r.GetPhase() == pb.RoomPhase_ROOM_PHASE_RELEASED {
			return false, nil
		}
	}
	return true, nil
}

// poolWhole checks that every shard's pool is whole: every page free (the
// daemon owns them) or nothing held for the engine (the engine owns them).
func (d *Daemon) poolWhole(ctx context.Context) error {
	st, err := d.status(ctx)
	if err != nil {
		return fmt.Errorf("GetStatus: %w", err)
	}
	for _, sh := range st.GetShards() {
		if h := sh.GetHolds(); h != nil {
			if h.GetHeld() != 0 || h.GetDrainingPages() != 0 {
				return fmt.Errorf("shard %d: %d rooms still hold %d pages for the engine (%d draining) after every room ended", sh.GetDpRank(), h.GetHeld(), h.GetHeldPages(), h.GetDrainingPages())
			}
			continue
		}
		if sh.GetPagesFree() != sh.GetPagesTotal() || sh.GetDrainingPages() != 0 || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() {
			return fmt.Errorf("shard %d: %d of %d pages free (%d draining), %d of %d request slots free after every room ended",
				sh.GetDpRank(), sh.GetPagesFree(), sh.GetPagesTotal(), sh.GetDrainingPages(), sh.GetReqSlotsFree(), sh.GetReqSlotsTotal())
		}
	}
	return nil
}
