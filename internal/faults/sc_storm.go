package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

func stormScenarios() []*Scenario {
	return []*Scenario{
		{
			Name: "abort-storm",
			Fault: "the engine aborts every room within a second, its rooms spread over every phase: waiting for their prefill's registration, " +
				"for their DP rank, queued, admitted, claimed, transferring (engine-moved), transferring (prefill-written, acknowledging), running",
			Proves: "every room fails ABORTED at once, each phase's resources come back (a prefill-written room's once its rank acknowledges, not at the " +
				"deferred timeout), the pool is whole again, and the daemon keeps its pace through the storm",
			Short: Variant{Rooms: 800, Bound: 10 * time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 40}},
			Full:  Variant{Rooms: 10000, Bound: 20 * time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 40}},
			run:   abortStorm,
		},
		{
			Name:  "slow-consumer-engine",
			Fault: "the decode engine stops reading its EngineSession while its rooms go on (thousands of events pile up)",
			Proves: "the daemon cuts the stream (RESOURCE_EXHAUSTED slow consumer) instead of buffering without bound, the rooms go on unharmed, " +
				"and a new stream's Watch re-delivers exactly the events missed: none skipped, none twice",
			Short: Variant{Rooms: 3000, Bound: 30 * time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 30}},
			Full:  Variant{Rooms: 10000, Bound: 60 * time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 30}},
			run:   slowEngine,
		},
		{
			Name:  "slow-consumer-prefill",
			Fault: "a prefill rank claims thousands of rooms on its PrefillSession and stops reading it",
			Proves: "the daemon cuts the session (RESOURCE_EXHAUSTED slow consumer), the claims whose destination was sent stay and the others are withdrawn, " +
				"and the rank's new session claims every room again and delivers it",
			Short: Variant{Rooms: 1200, Bound: 30 * time.Second, Reusable: 2 * time.Second, Logs: LogBound{Fixed: 30}},
			Full:  Variant{Rooms: 6000, Bound: 60 * time.Second, Reusable: 3 * time.Second, Logs: LogBound{Fixed: 30}},
			run:   slowPrefill,
		},
	}
}

// stormPhases are the groups of the abort storm, one per phase.
var stormPhases = []string{"waiting_prefill", "resolving_dp", "queued", "admitted", "claimed", "transferring", "prefill-written", "running"}

// abortStorm puts k rooms in each phase, then aborts them all at once.
func abortStorm(ctx context.Context, s *Stage) error {
	k := s.rooms() / len(stormPhases)
	holders := 5 * k // admitted, claimed, transferring, prefill-written, running: one request slot each
	d, err := s.startDaemon(ctx, "decodeplane", baseSets(fmt.Sprintf("kv_pool.request_slots=%d", holders), "kv_pool.pre_alloc_slots=0",
		fmt.Sprintf("kv_pool.total_pages=%d", 2*holders*roomPages), "timeouts.prefill_info_attempts=15", "timeouts.prefill_info_backoff=1s",
		"timeouts.prefill_info_backoff_max=4s", "admission.max_queued=100000", "admission.reserved_decode_tokens=0")...)
	if err != nil {
		return err
	}
	p, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.30.0.1:8998", instance: "engine-moved"})
	if err != nil {
		return err
	}
	self, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.30.0.3:8998", instance: "self-writer"})
	if err != nil {
		return err
	}
	dp2, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.30.0.2:8998", instance: "dp2", dp: 2, lb: "round_robin"})
	if err != nil {
		return err
	}
	eng, err := s.newEngine(ctx, "engine", d, false)
	if err != nil {
		return err
	}
	g := map[string][]uint64{}
	for i, ph := range stormPhases {
		g[ph] = roomIDs(uint64(1_000_000*(i+1)), k)
	}
	stop, err := stormSetup(ctx, s, eng, g, p, self, dp2)
	defer stop()
	if err != nil {
		return err
	}
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	var all []uint64
	for _, ph := range stormPhases {
		all = append(all, g[ph]...)
	}
	s.fault(fmt.Sprintf("the engine aborts %d rooms, %d in each of %d phases", len(all), k, len(stormPhases)))
	start := time.Now()
	if err := eng.Abort(ctx, all); err != nil {
		return err
	}
	replied := time.Since(start)
	s.check(replied < 5*time.Second, "the %d aborts took %s to be answered", len(all), dur(replied))
	if err := eng.waitSettled(ctx); err != nil {
		return err
	}
	stormChecks(s, eng, g, replied)
	return nil
}

// stormSetup opens each group's rooms and brings them to their phase; the
// returned function ends what it started.
func stormSetup(ctx context.Context, s *Stage, eng *Engine, g map[string][]uint64, p, self, dp2 *Prefill) (func(), error) {
	var claims []*claim
	hctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() { cancel(); wg.Wait(); closeClaims(claims) }
	step := func(ids []uint64, addr string, phase pb.RoomPhase) error {
		if err := eng.Open(ctx, opens(addr, ids)); err != nil {
			return err
		}
		return eng.waitPhase(ctx, ids, phase)
	}
	admitted := pb.RoomPhase_ROOM_PHASE_ADMITTED
	if err := step(g["running"], p.spec.addr, admitted); err != nil {
		return stop, err
	}
	if bad, some := failedSends(p.Deliver(ctx, g["running"], 64)); bad > 0 {
		return stop, fmt.Errorf("%d rooms did not start running: %s", bad, some)
	}
	for _, ph := range []string{"admitted", "claimed", "transferring"} {
		if err := step(g[ph], p.spec.addr, admitted); err != nil {
			return stop, err
		}
	}
	if err := step(g["prefill-written"], self.spec.addr, admitted); err != nil {
		return stop, err
	}
	cs, err := claimAll(ctx, p.ranks[0], g["claimed"], 64, nil)
	claims = append(claims, cs...)
	if err != nil {
		return stop, err
	}
	cs, err = claimAll(ctx, p.ranks[0], g["transferring"], 64, func(c *claim) error { return c.transfer(ctx, 0, 0, 1) })
	claims = append(claims, cs...)
	if err != nil {
		return stop, err
	}
	// The prefill-written rooms: ReportRoom moves chunk 0 and blocks in
	// chunk 1 until the room's end stops it; it then acknowledges.
	for _, id := range g["prefill-written"] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = self.ranks[0].ReportRoom(hctx, id, client.SendOptions{ChunkPages: 2, Move: func(wctx context.Context, ch client.Chunk) (uint64, error) {
				if ch.Index > 0 {
					<-wctx.Done()
					return 0, wctx.Err()
				}
				return ch.Bytes(), nil
			}})
		}()
	}
	if err := eng.waitPhase(ctx, g["prefill-written"], pb.RoomPhase_ROOM_PHASE_TRANSFERRING); err != nil {
		return stop, err
	}
	if err := step(g["queued"], p.spec.addr, pb.RoomPhase_ROOM_PHASE_QUEUED); err != nil {
		return stop, err
	}
	if err := step(g["waiting_prefill"], "10.30.9.9:8998", pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL); err != nil {
		return stop, err
	}
	return stop, step(g["resolving_dp"], dp2.spec.addr, pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK)
}

// stormChecks: every room failed ABORTED; the prefill-written rooms'
// pages came back with their rank's acknowledgement, well before the
// deferred timeout; the figures per phase.
func stormChecks(s *Stage, eng *Engine, g map[string][]uint64, replied time.Duration) {
	var notAborted []string
	var parts []string
	for _, ph := range stormPhases {
		var ds []time.Duration
		for _, id := range g[ph] {
			r := eng.room(id)
			if r.Failure.GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED && len(notAborted) < 3 {
				notAborted = append(notAborted, fmt.Sprintf("room %d (%s): %s %v", id, ph, r.Phase, r.Failure))
			}
			if !r.Reusable.IsZero() {
				ds = append(ds, r.Reusable.Sub(r.Aborted))
			}
		}
		p99 := percentile(ds, 99)
		parts = append(parts, fmt.Sprintf("%s %s", ph, dur(p99)))
		if ph == "prefill-written" {
			s.check(p99 < deferred-500*time.Millisecond, "prefill-written rooms' pages came back after p99 %s: their ranks' acknowledgements did not end the drain (release.deferred_timeout %s)", dur(p99), deferred)
		}
	}
	s.check(len(notAborted) == 0, "rooms did not fail ABORTED: %s", strings.Join(notAborted, "; "))
	s.note("all %d aborts answered in %s; abort → pages reusable p99 by phase: %s", eng.countOpened(), dur(replied), strings.Join(parts, ", "))
}

// countOpened counts the rooms the engine opened.
func (e *Engine) countOpened() int {
	n := 0
	for _, r := range e.snapshot() {
		if r.OpenErr == nil {
			n++
		}
	}
	return n
}
