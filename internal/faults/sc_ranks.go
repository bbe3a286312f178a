package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// silentRank: traffic to a 4-rank instance; then rank 3 goes silent (no
// heartbeat, nothing sent) while ranks 0-2 claim and move a chunk of the
// rooms in flight; the engine aborts a tenth of them. After the instance
// is lost the rank comes back and new rooms succeed.
func silentRank(ctx context.Context, s *Stage) error {
	n := s.rooms()
	const addr = "10.12.0.1:8998"
	// Every room in flight is admitted at once (its pages only: no decode
	// reserve), so that each waits on the silent rank, none in the queue.
	d, err := s.startDaemon(ctx, "decodeplane", baseSets("admission.reserved_decode_tokens=0")...)
	if err != nil {
		return err
	}
	p, err := s.newPrefill(ctx, d, prefillSpec{addr: addr, instance: "prefill-4", tp: 4})
	if err != nil {
		return err
	}
	eng, err := s.newEngine(ctx, "engine", d, true)
	if err != nil {
		return err
	}
	before, stuck, after := roomIDs(1_000_000, n/4), roomIDs(2_000_000, n/2), roomIDs(3_000_000, n/4)
	if err := eng.Open(ctx, opens(addr, before)); err != nil {
		return err
	}
	if bad, some := failedSends(p.Deliver(ctx, before, 32)); bad > 0 {
		return fmt.Errorf("%d rooms failed before the fault: %s", bad, some)
	}
	if err := eng.Open(ctx, opens(addr, stuck)); err != nil {
		return err
	}
	if err := eng.waitPhase(ctx, stuck, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
		return err
	}
	s.fault("prefill rank 3 of 4 goes silent")
	silent := time.Now()
	p.Silence(3)
	for i := range 3 {
		cs, err := claimAll(ctx, p.ranks[i], stuck, 32, func(c *claim) error { return c.transfer(ctx, 0, 0, 1) })
		defer closeClaims(cs)
		if err != nil {
			return err
		}
	}
	aborted := every(stuck, 10)
	if err := eng.Abort(ctx, aborted); err != nil {
		return err
	}
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	if err := eng.wait(ctx, "ended", stuck, func(r *Room) bool { return !r.end().IsZero() }); err != nil {
		return err
	}
	lostAt := time.Now()
	if err := p.Revive(ctx, 3); err != nil {
		return err
	}
	if err := registered(ctx, d, addr, 4); err != nil {
		return err
	}
	if err := eng.Open(ctx, opens(addr, after)); err != nil {
		return err
	}
	if bad, some := failedSends(p.Deliver(ctx, after, 32)); bad > 0 {
		s.check(false, "%d rooms failed after the rank came back: %s", bad, some)
	}
	silentChecks(s, eng, without(stuck, aborted), silent, lostAt)
	return nil
}

// silentChecks: the rooms waiting on the silent rank failed PREFILL_LOST
// naming it, after heartbeat_interval × heartbeat_max_failures of silence
// (less the one cadence its last beat may have come before), not earlier.
func silentChecks(s *Stage, eng *Engine, lost []uint64, silent, lostAt time.Time) {
	limit := time.Duration(misses) * heartbeat
	var wrong []string
	var first, last time.Duration
	for _, id := range lost {
		r := eng.room(id)
		f := r.Failure
		if f.GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST || !strings.Contains(f.GetMessage(), "tp 3") {
			if len(wrong) < 3 {
				wrong = append(wrong, fmt.Sprintf("room %d: %s %v", id, r.Phase, f))
			}
			continue
		}
		took := r.Terminal.Sub(silent)
		if first == 0 || took < first {
			first = took
		}
		last = max(last, took)
	}
	s.check(len(wrong) == 0, "rooms waiting on the silent rank did not fail PREFILL_LOST naming tp 3: %s", strings.Join(wrong, "; "))
	s.check(first >= limit-heartbeat/2-100*time.Millisecond, "a room failed %s after the rank went silent: before heartbeat_interval × heartbeat_max_failures (%s)", dur(first), limit)
	s.note("rank silent → instance lost: first room failed after %s, last after %s (heartbeat %s × %d); rank back and serving %s after",
		dur(first), dur(last), heartbeat, misses, dur(time.Since(lostAt)))
}

// duplicateRoom: two engine streams open the same n room ids at once; a
// rank of another instance claims every room; a tenth is aborted, the
// rest delivered by their own prefill.
func duplicateRoom(ctx context.Context, s *Stage) error {
	n := s.rooms()
	const addrA, addrB = "10.13.0.1:8998", "10.13.0.2:8998"
	d, err := s.startDaemon(ctx, "decodeplane", baseSets()...)
	if err != nil {
		return err
	}
	a, err := s.newPrefill(ctx, d, prefillSpec{addr: addrA, instance: "prefill-a"})
	if err != nil {
		return err
	}
	b, err := s.newPrefill(ctx, d, prefillSpec{addr: addrB, instance: "prefill-b"})
	if err != nil {
		return err
	}
	e1, err := s.newEngine(ctx, "engine-1", d, true)
	if err != nil {
		return err
	}
	e2, err := s.newEngine(ctx, "engine-2", d, true)
	if err != nil {
		return err
	}
	ids := roomIDs(1_000_000, n)
	s.fault("every room id is opened on two engine streams at once")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, e := range []*Engine{e1, e2} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = e.Open(ctx, opens(addrA, ids)) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	owner := map[uint64]*Engine{}
	for _, id := range ids {
		r1, r2 := e1.room(id), e2.room(id)
		switch {
		case (r1.OpenErr == nil) == (r2.OpenErr == nil):
			s.check(false, "room %d: opened on both streams or on neither (%v, %v)", id, r1.OpenErr, r2.OpenErr)
		case r1.OpenErr == nil:
			owner[id] = e1
			s.check(strings.HasPrefix(r2.OpenErr.Error(), codes.AlreadyExists.String()), "room %d's second open: %v, want ALREADY_EXISTS", id, r2.OpenErr)
		default:
			owner[id] = e2
			s.check(strings.HasPrefix(r1.OpenErr.Error(), codes.AlreadyExists.String()), "room %d's second open: %v, want ALREADY_EXISTS", id, r1.OpenErr)
		}
	}
	refused := foreignClaims(ctx, s, b, ids)
	aborted := every(ids, 10)
	for _, id := range aborted {
		if e := owner[id]; e != nil {
			if err := e.Abort(ctx, []uint64{id}); err != nil {
				return err
			}
		}
	}
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	if bad, some := failedSends(a.Deliver(ctx, without(ids, aborted), 32)); bad > 0 {
		s.check(false, "%d rooms failed after the duplicate opens and foreign claims: %s", bad, some)
	}
	s.note("%d room ids opened twice at once: %d opens succeeded on engine-1, %d on engine-2; %d foreign claims refused",
		n, len(ids)-countOwned(owner, e2), countOwned(owner, e2), refused)
	return nil
}

func countOwned(owner map[uint64]*Engine, e *Engine) int {
	n := 0
	for _, o := range owner {
		if o == e {
			n++
		}
	}
	return n
}

// foreignClaims has a rank of another instance claim every room: each
// claim must be refused INVALID_ARGUMENT naming the bootstrap address.
func foreignClaims(ctx context.Context, s *Stage, b *Prefill, ids []uint64) int {
	refused := 0
	for _, id := range ids {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := b.ranks[0].AwaitDestination(cctx, &pb.AwaitDestinationRequest{Room: id})
		if err == nil {
			_, err = st.Next()
			st.Close()
		}
		cancel()
		if status.Code(err) == codes.InvalidArgument && strings.Contains(err.Error(), "bootstrap_addr") {
			refused++
			continue
		}
		s.check(false, "a claim of room %d by another instance's rank: %v, want INVALID_ARGUMENT naming rank.bootstrap_addr", id, err)
	}
	return refused
}
