package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

func prefillScenarios() []*Scenario {
	return []*Scenario{
		{
			Name:  "lost-ack",
			Fault: "the engine aborts rooms whose prefill rank wrote part of their KV by itself, and the rank never acknowledges the end (AckRoomEnd)",
			Proves: "a failed room's pages stay out of every other room until release.deferred_timeout (no early reuse while the silent rank may still write), " +
				"then come back by themselves: rooms queued behind them are admitted into them, and the expired acknowledgements are counted",
			Short: Variant{Rooms: 48, Bound: deferred + 8*time.Second, Reusable: deferred + 2*time.Second, Logs: LogBound{Fixed: 30}},
			Full:  Variant{Rooms: 2000, Bound: deferred + 20*time.Second, Reusable: deferred + 3*time.Second, Logs: LogBound{Fixed: 30}},
			run:   lostAck,
		},
		{
			Name:  "prefill-restart",
			Fault: "a prefill instance (2 ranks) restarts on the same bootstrap address and rank endpoints with a new instance_id, rooms in every hand-off phase",
			Proves: "every room of the old instance that had not succeeded fails at once (PREFILL_LOST), none waits for a timeout; " +
				"rooms opened after it go to the new instance and succeed",
			Short: Variant{Rooms: 64, Bound: 8 * time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 30}},
			Full:  Variant{Rooms: 4000, Bound: 20 * time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 30}},
			run:   func(ctx context.Context, s *Stage) error { return prefillSwap(ctx, s, false) },
		},
		{
			Name:  "prefill-replaced",
			Fault: "a prefill instance behind one stable bootstrap address (a Service) is replaced by another: new instance_id, new rank endpoints, TP 2 → 4",
			Proves: "the old instance's rooms fail at once (PREFILL_LOST) instead of waiting for ranks that no longer exist; " +
				"rooms opened after it are planned for the new layout (4 ranks) and succeed",
			Short: Variant{Rooms: 64, Bound: 8 * time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 30}},
			Full:  Variant{Rooms: 4000, Bound: 20 * time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 30}},
			run:   func(ctx context.Context, s *Stage) error { return prefillSwap(ctx, s, true) },
		},
		{
			Name:  "silent-rank",
			Fault: "one prefill rank of four stops heartbeating and sending mid-traffic; it comes back later",
			Proves: "the instance is declared lost after heartbeat_interval × heartbeat_max_failures of that rank's silence, not before, " +
				"every room waiting on it fails naming the silent rank, and the instance serves again once the rank re-registers",
			Short: Variant{Rooms: 64, Bound: misses*heartbeat + 6*time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 40}},
			Full:  Variant{Rooms: 2000, Bound: misses*heartbeat + 10*time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 40}},
			run:   silentRank,
		},
		{
			Name:  "duplicate-room",
			Fault: "every room id is opened twice at once (two engine streams) and claimed by a rank of another prefill instance too",
			Proves: "exactly one open per room id succeeds (the other is ALREADY_EXISTS), the foreign claims are refused without touching the room, " +
				"and each room completes once, in pages of its own",
			// Each refused foreign claim is a failed call, which the daemon
			// logs ("finished call"), and each aborted room a line.
			Short: Variant{Rooms: 64, Bound: 8 * time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 30}},
			Full:  Variant{Rooms: 4000, Bound: 20 * time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 30}},
			run:   duplicateRoom,
		},
	}
}

// lostAck: n rooms fill the pool exactly; their prefill rank claims them
// and reports a chunk it wrote itself; the engine aborts them all, and the
// rank never acknowledges. n more rooms of a well-behaved prefill queue
// behind the draining pages.
func lostAck(ctx context.Context, s *Stage) error {
	n := s.rooms()
	d, err := s.startDaemon(ctx, "decodeplane", baseSets(poolFor(n), "admission.reserved_decode_tokens=0")...)
	if err != nil {
		return err
	}
	liar, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.10.0.1:8998", instance: "never-acks"})
	if err != nil {
		return err
	}
	good, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.10.0.2:8998", instance: "good"})
	if err != nil {
		return err
	}
	eng, err := s.newEngine(ctx, "engine", d, true)
	if err != nil {
		return err
	}
	a, b := roomIDs(1_000_000, n), roomIDs(2_000_000, n)
	if err := eng.Open(ctx, opens(liar.spec.addr, a)); err != nil {
		return err
	}
	if err := eng.waitPhase(ctx, a, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
		return err
	}
	claims, err := claimAll(ctx, liar.ranks[0], a, 32, func(c *claim) error { return c.report(ctx, 0, 0, 2) })
	defer closeClaims(claims)
	if err != nil {
		return err
	}
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	s.fault("the engine aborts every room; their prefill rank never acknowledges")
	if err := eng.Abort(ctx, a); err != nil {
		return err
	}
	if err := eng.Open(ctx, opens(good.spec.addr, b)); err != nil {
		return err
	}
	if err := s.checkPages(ctx, d, false); err != nil { // the draining rooms hold their pages
		return err
	}
	sends := good.Deliver(ctx, b, 32)
	if bad, some := failedSends(sends); bad > 0 {
		s.check(false, "%d of the rooms queued behind the draining pages failed: %s", bad, some)
	}
	lostAckChecks(ctx, s, d, eng, a, b)
	return nil
}

// lostAckChecks: the aborted rooms ended at once, their pages came back
// only at the deferred bound, and no queued room was admitted before.
func lostAckChecks(ctx context.Context, s *Stage, d *Daemon, eng *Engine, a, b []uint64) {
	var early, notAborted int
	var firstReusable time.Time
	for _, id := range a {
		r := eng.room(id)
		if r.Failure.GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED {
			notAborted++
		}
		if !r.Reusable.IsZero() && r.Reusable.Sub(r.Aborted) < deferred-200*time.Millisecond {
			early++
		}
		if !r.Reusable.IsZero() && (firstReusable.IsZero() || r.Reusable.Before(firstReusable)) {
			firstReusable = r.Reusable
		}
	}
	s.check(notAborted == 0, "%d aborted rooms did not fail ABORTED", notAborted)
	s.check(early == 0, "%d aborted rooms' pages were reusable before release.deferred_timeout (%s) although their rank never acknowledged", early, deferred)
	var before int
	for _, id := range b {
		if r := eng.room(id); !r.Admitted.IsZero() && r.Admitted.Before(firstReusable) {
			before++
		}
	}
	s.check(before == 0, "%d queued rooms were admitted before any aborted room's pages were reusable (the pool held only those)", before)
	expired, err := d.metric(ctx, "decodeplane_room_end_acks_total")
	s.check(err == nil && expired >= float64(len(a)), "decodeplane_room_end_acks_total = %g (%v), want ≥ %d (every owed acknowledgement expired)", expired, err, len(a))
	s.note("%d rooms aborted with an acknowledgement owed, pages back after release.deferred_timeout %s; %d rooms admitted into them after",
		len(a), deferred, len(b))
}

// prefillSwap: traffic to a 2-rank instance, then rooms in every hand-off
// phase (queued behind a full pool, admitted, claimed, a chunk moved) when
// the instance restarts with a new instance_id (or is replaced by a
// 4-rank instance on other hosts); the engine aborts a tenth of them at
// that moment; rooms opened after go to the new instance.
func prefillSwap(ctx context.Context, s *Stage, replaced bool) error {
	n := s.rooms()
	const addr = "10.11.0.1:8998"
	d, err := s.startDaemon(ctx, "decodeplane", baseSets(poolFor(n/2), "admission.reserved_decode_tokens=0")...)
	if err != nil {
		return err
	}
	old, err := s.newPrefill(ctx, d, prefillSpec{addr: addr, instance: "prefill-1", tp: 2})
	if err != nil {
		return err
	}
	eng, err := s.newEngine(ctx, "engine", d, true)
	if err != nil {
		return err
	}
	warm, inflight, after := roomIDs(1_000_000, n/4), roomIDs(2_000_000, n/2+n/8), roomIDs(3_000_000, n/4)
	if err := eng.Open(ctx, opens(addr, warm)); err != nil {
		return err
	}
	if bad, some := failedSends(old.Deliver(ctx, warm, 32)); bad > 0 {
		return fmt.Errorf("%d rooms failed before the fault: %s", bad, some)
	}
	// n/2 rooms fill the pool, n/8 more queue behind them.
	if err := eng.Open(ctx, opens(addr, inflight)); err != nil {
		return err
	}
	admitted := inflight[:n/2]
	if err := eng.waitPhase(ctx, admitted, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
		return err
	}
	for i, rank := range old.ranks {
		cs, err := claimAll(ctx, rank, admitted[:n/4], 32, func(c *claim) error {
			if i == 0 && c.room%2 == 0 {
				return c.transfer(ctx, 0, 0, 1)
			}
			return nil
		})
		defer closeClaims(cs)
		if err != nil {
			return err
		}
	}
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	spec := prefillSpec{addr: addr, instance: "prefill-2", tp: 2}
	what := "the prefill instance restarts with a new instance_id"
	if replaced {
		spec, what = prefillSpec{addr: addr, instance: "prefill-other", tp: 4, host: "10.11.9.9"}, "the prefill instance is replaced by a 4-rank one on other hosts"
	}
	s.fault(what)
	aborted := every(inflight, 10)
	if err := eng.Abort(ctx, aborted); err != nil {
		return err
	}
	old.Close()
	nw, err := s.newPrefill(ctx, d, spec)
	if err != nil {
		return err
	}
	if err := eng.wait(ctx, "ended", inflight, func(r *Room) bool { return !r.end().IsZero() }); err != nil {
		return err
	}
	if err := eng.Open(ctx, opens(addr, after)); err != nil {
		return err
	}
	if bad, some := failedSends(nw.Deliver(ctx, after, 32)); bad > 0 {
		s.check(false, "%d rooms of the new instance failed: %s", bad, some)
	}
	swapChecks(ctx, s, d, eng, without(inflight, aborted))
	return nil
}

// swapChecks: the old instance's rooms failed PREFILL_LOST, within a
// second of the new registration.
func swapChecks(ctx context.Context, s *Stage, d *Daemon, eng *Engine, lost []uint64) {
	var wrong []string
	var slowest time.Duration
	for _, id := range lost {
		r := eng.room(id)
		if r.Failure.GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST {
			if len(wrong) < 3 {
				wrong = append(wrong, fmt.Sprintf("room %d: %s %v", id, r.Phase, r.Failure))
			}
			continue
		}
		slowest = max(slowest, r.Terminal.Sub(s.faultTime()))
	}
	s.check(len(wrong) == 0, "rooms of the old instance did not fail PREFILL_LOST: %s", strings.Join(wrong, "; "))
	s.check(slowest < 3*time.Second, "the old instance's last room failed %s after the fault; the replacement's registration should end them at once", dur(slowest))
	changes, err := d.metric(ctx, "decodeplane_prefill_incarnation_changes_total")
	s.check(err == nil && changes >= 1, "decodeplane_prefill_incarnation_changes_total = %g (%v), want ≥ 1", changes, err)
	s.note("%d rooms of the old instance failed PREFILL_LOST within %s of the fault", len(lost), dur(slowest))
}

// registered waits until d knows the instance at addr complete with ranks
// ranks.
func registered(ctx context.Context, d *Daemon, addr string, ranks int) error {
	return poll(ctx, "the instance at "+addr+" registered again", func() (bool, error) {
		st, err := d.status(ctx)
		if err != nil {
			return false, err
		}
		i := slices.IndexFunc(st.GetPrefills(), func(p *pb.PrefillStatus) bool { return p.GetBootstrapAddr() == addr })
		return i >= 0 && int(st.GetPrefills()[i].GetRegisteredRanks()) == ranks && st.GetPrefills()[i].GetExpectedRanks() == uint32(ranks), nil
	})
}
