package faults

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The settings every scenario's daemons share: SGLang's waits shortened to
// what a scenario can watch (a 2 s heartbeat that two misses end, three
// registration retries, 3 s for a failed room's acknowledgements), a pool
// of pageSize-token pages, and the rest at their defaults.
const (
	heartbeat   = 2 * time.Second
	misses      = 2
	deferred    = 3 * time.Second
	promptLen   = 256 // tokens: 4 pages of 64
	roomPages   = 4
	maxNewToken = 8
)

// baseSets are the settings every daemon starts with; a scenario's own
// come after them and win.
func baseSets(extra ...string) []string {
	return append([]string{
		"timeouts.heartbeat_interval=" + heartbeat.String(), fmt.Sprintf("timeouts.heartbeat_max_failures=%d", misses),
		"timeouts.prefill_info_attempts=3", "timeouts.prefill_info_backoff=200ms", "timeouts.prefill_info_backoff_max=400ms",
		"timeouts.bootstrap=60s", "timeouts.waiting=60s", "admission.claim_timeout=60s",
		"release.deferred_timeout=" + deferred.String(),
		"kv_pool.total_tokens=0", "kv_pool.total_pages=8192", "kv_pool.request_slots=4096", "rooms.max_retained=100000",
	}, extra...)
}

// poolFor is the kv_pool.total_pages setting of a pool that holds exactly
// rooms rooms (with admission.reserved_decode_tokens=0): their pages, and
// one page for the last one's max_new_tokens, which the budget counts
// (SGLang's origin + max_new_tokens) but no whole room fits in.
func poolFor(rooms int) string { return fmt.Sprintf("kv_pool.total_pages=%d", rooms*roomPages+1) }

// roomIDs are n room ids from base on.
func roomIDs(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// opens are OpenRoom requests for rooms of the prefill at addr.
func opens(addr string, ids []uint64) []*pb.OpenRoomRequest {
	out := make([]*pb.OpenRoomRequest, len(ids))
	for i, id := range ids {
		out[i] = &pb.OpenRoomRequest{Rid: fmt.Sprintf("req-%d", id), BootstrapAddr: addr, Room: id, PromptLen: promptLen, MaxNewTokens: maxNewToken}
	}
	return out
}

// every is each k-th of ids (k >= 1), starting with the first.
func every(ids []uint64, k int) []uint64 {
	var out []uint64
	for i := 0; i < len(ids); i += k {
		out = append(out, ids[i])
	}
	return out
}

// without is ids less drop.
func without(ids, drop []uint64) []uint64 {
	return slices.DeleteFunc(slices.Clone(ids), func(id uint64) bool { return slices.Contains(drop, id) })
}

// claim is one prefill rank's claim on a room, driven step by step (a
// prefill that writes by itself: ReportTransfer).
type claim struct {
	room uint64
	rank *client.Prefill
	st   *client.DestinationStream
	dest *pb.Destination
}

// claimRoom claims room as rank and waits for its destination.
func claimRoom(ctx context.Context, rank *client.Prefill, room uint64) (*claim, error) {
	st, err := rank.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Incarnation: rank.Incarnation()})
	if err != nil {
		return nil, fmt.Errorf("AwaitDestination(%d): %w", room, err)
	}
	ev, err := st.Next()
	if err != nil || ev.Destination == nil {
		st.Close()
		return nil, fmt.Errorf("AwaitDestination(%d) = %+v, %v; want a destination", room, ev, err)
	}
	return &claim{room: room, rank: rank, st: st, dest: ev.Destination}, nil
}

// report reports chunk index of the claim's pages [off, off+n) as moved by
// the prefill itself (not the last chunk).
func (c *claim) report(ctx context.Context, index, off, n int) error {
	ch := client.Chunk{Destination: c.dest, Index: index, PageOffset: off, NumPages: n}
	_, err := c.rank.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: c.room, ChunkIndex: uint32(index), PageOffset: uint32(off),
		NumPages: uint32(n), Success: true, Bytes: ch.Bytes(), Attempt: c.dest.GetAttempt(), Incarnation: c.dest.GetIncarnation()})
	if err != nil {
		return fmt.Errorf("ReportTransfer(room %d chunk %d): %w", c.room, index, err)
	}
	return nil
}

// transfer moves chunk index of the claim's pages [off, off+n) with the
// daemon's engine (not the last chunk).
func (c *claim) transfer(ctx context.Context, index, off, n int) error {
	_, err := c.rank.Transfer(ctx, &pb.TransferRequest{Room: c.room, ChunkIndex: uint32(index), PageOffset: uint32(off), NumPages: uint32(n),
		Attempt: c.dest.GetAttempt(), Incarnation: c.dest.GetIncarnation()})
	if err != nil {
		return fmt.Errorf("Transfer(room %d chunk %d): %w", c.room, index, err)
	}
	return nil
}

// claimAll claims every room as rank, conc at a time; then (with
// chunks) reports or transfers the first page of each.
func claimAll(ctx context.Context, rank *client.Prefill, rooms []uint64, conc int, then func(*claim) error) ([]*claim, error) {
	out := make([]*claim, len(rooms))
	errs := make(chan error, len(rooms))
	sem := make(chan struct{}, conc)
	for i, room := range rooms {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			c, err := claimRoom(ctx, rank, room)
			if err == nil && then != nil {
				err = then(c)
			}
			out[i] = c
			errs <- err
		}()
	}
	var first error
	for range rooms {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return out, first
}

// closeClaims ends the claims' streams.
func closeClaims(cs []*claim) {
	for _, c := range cs {
		if c != nil {
			c.st.Close()
		}
	}
}

// poll calls f every 50 ms until it reports done or ctx ends (for state
// that nothing streams: a metric, a status).
func poll(ctx context.Context, what string, f func() (bool, error)) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		ok, err := f()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// hold keeps a fault in place for d (the fault's stated duration: real
// time, as the processes under it live it), or until ctx ends.
func hold(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
