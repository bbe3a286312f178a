package faults

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// batchTimeout bounds each copy batch at the transfer agent in the
// scenarios that use one.
const batchTimeout = 2 * time.Second

func transferScenarios() []*Scenario {
	return []*Scenario{
		{
			Name:  "dropped-completion",
			Fault: "the transfer agent accepts the copy batches of a quarter of the rooms and never completes them (--fault-hold-rooms)",
			Proves: "each such room fails TRANSFER_FAILED once transfer.delegate.batch_timeout passes, its batch is cancelled at the agent before its pages are reusable, " +
				"and the other rooms, before and after, move their bytes through the agent and succeed",
			Short: Variant{Rooms: 48, Bound: batchTimeout + 8*time.Second, Reusable: batchTimeout + 3*time.Second, Logs: LogBound{Fixed: 40}},
			Full:  Variant{Rooms: 800, Bound: batchTimeout + 20*time.Second, Reusable: batchTimeout + 5*time.Second, Logs: LogBound{Fixed: 40}},
			run:   droppedCompletion,
		},
		{
			Name:  "agent-restart",
			Fault: "the transfer agent is killed (kill -9) with copy batches in flight, then started again on the same port",
			Proves: "the rooms whose batches it may have accepted fail TRANSFER_FAILED and keep their pages until the batch deadline (a late write cannot land in a reused page); " +
				"the daemon reports NOT_SERVING while the agent is gone, registers its buffers again when it is back, and new rooms succeed",
			Short: Variant{Rooms: 48, Bound: batchTimeout + 10*time.Second, Reusable: batchTimeout + 3*time.Second, Logs: LogBound{Fixed: 60}},
			Full:  Variant{Rooms: 800, Bound: batchTimeout + 20*time.Second, Reusable: batchTimeout + 5*time.Second, Logs: LogBound{Fixed: 60}},
			run:   agentRestart,
		},
	}
}

// agentStage is a daemon on the delegated path, its agent, a 1-rank
// prefill with its buffer at the agent, and an engine.
type agentStage struct {
	a   *Agent
	d   *Daemon
	p   *Prefill
	eng *Engine
}

func startAgentStage(ctx context.Context, s *Stage, held []uint64, addr string) (*agentStage, error) {
	a, err := s.startAgent(ctx, holdFlag(held)...)
	if err != nil {
		return nil, err
	}
	d, err := s.startDaemon(ctx, "decodeplane", baseSets(agentSets(a.Addr, batchTimeout.String())...)...)
	if err != nil {
		return nil, err
	}
	p, err := s.newPrefill(ctx, d, prefillSpec{addr: addr, instance: "prefill", pageSize: agentPageSize})
	if err != nil {
		return nil, err
	}
	if err := p.useAgent(ctx, a); err != nil {
		return nil, err
	}
	eng, err := s.newEngine(ctx, "engine", d, true)
	if err != nil {
		return nil, err
	}
	return &agentStage{a: a, d: d, p: p, eng: eng}, nil
}

// deliverAll opens rooms and delivers them; every one must succeed.
func (g *agentStage) deliverAll(ctx context.Context, rooms []uint64) error {
	if err := g.eng.Open(ctx, opens(g.p.spec.addr, rooms)); err != nil {
		return err
	}
	if bad, some := failedSends(g.p.Deliver(ctx, rooms, 16)); bad > 0 {
		return fmt.Errorf("%d rooms failed: %s", bad, some)
	}
	return nil
}

// waitHeld waits until the agent logged a held batch of every room of
// held (each at debug level: holdFlag runs it there).
func (g *agentStage) waitHeld(ctx context.Context, held []uint64) error {
	what := fmt.Sprintf("logging a held batch of each of %d rooms", len(held))
	return g.a.p.waitOutput(ctx, what, func(out []byte) bool {
		seen := heldRooms(out)
		for _, room := range held {
			if !seen[room] {
				return false
			}
		}
		return true
	})
}

// heldRooms are the rooms of the agent's "batch held" lines in out.
func heldRooms(out []byte) map[uint64]bool {
	seen := map[uint64]bool{}
	for line := range bytes.Lines(out) {
		if !bytes.Contains(line, []byte("batch held")) {
			continue
		}
		_, after, ok := bytes.Cut(line, []byte(" room="))
		if !ok {
			continue
		}
		end := bytes.IndexFunc(after, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(after)
		}
		if room, err := strconv.ParseUint(string(after[:end]), 10, 64); err == nil {
			seen[room] = true
		}
	}
	return seen
}

// droppedCompletion: rooms before, then rooms of which a quarter have
// their batches held by the agent (a tenth of those aborted by the engine
// while held), then rooms after.
func droppedCompletion(ctx context.Context, s *Stage) error {
	n := s.rooms()
	before, during, after := roomIDs(1_000_000, n/4), roomIDs(2_000_000, n/2), roomIDs(3_000_000, n/4)
	held := every(during, 4)
	g, err := startAgentStage(ctx, s, held, "10.20.0.1:8998")
	if err != nil {
		return err
	}
	if err := g.deliverAll(ctx, before); err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	s.fault("the agent holds the batches of a quarter of the rooms")
	if err := g.eng.Open(ctx, opens(g.p.spec.addr, during)); err != nil {
		return err
	}
	sent := make(chan map[uint64]error, 1)
	go func() { sent <- g.p.Deliver(ctx, during, len(during)) }()
	if err := g.waitHeld(ctx, held); err != nil {
		return err
	}
	aborted := every(held, 10)
	if err := g.eng.Abort(ctx, aborted); err != nil {
		return err
	}
	if err := s.checkPages(ctx, g.d, false); err != nil {
		return err
	}
	res := <-sent
	// The agent ends a batch at its deadline ("deadline exceeded"), or the
	// daemon cancels it there after batch_timeout and a grace.
	heldChecks(s, g.eng, res, held, aborted, "deadline exceeded", "did not complete within transfer.delegate.batch_timeout")
	if err := g.deliverAll(ctx, after); err != nil {
		s.check(false, "after the fault: %v", err)
	}
	s.note("%d rooms held at the agent (%d aborted while held)", len(held), len(aborted))
	return nil
}

// heldChecks: the rooms whose batches were held failed TRANSFER_FAILED
// with the reason, not before the batch timeout; the others succeeded.
func heldChecks(s *Stage, eng *Engine, res map[uint64]error, held, aborted []uint64, reasons ...string) {
	var wrong, early []string
	for room, err := range res {
		isHeld := false
		for _, h := range held {
			isHeld = isHeld || h == room
		}
		r := eng.room(room)
		switch {
		case !isHeld && err != nil:
			wrong = append(wrong, fmt.Sprintf("room %d (not held): %v", room, err))
		case isHeld && !contains(aborted, room):
			if r.Failure.GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !containsAny(r.Failure.GetMessage(), reasons) {
				wrong = append(wrong, fmt.Sprintf("room %d: %s %v", room, r.Phase, r.Failure))
			}
			if !r.Terminal.IsZero() && r.Terminal.Sub(r.Opened) < batchTimeout-200*time.Millisecond {
				early = append(early, fmt.Sprint(room))
			}
		}
	}
	if len(wrong) > 3 {
		wrong = append(wrong[:3], fmt.Sprintf("and %d more", len(wrong)-3))
	}
	s.check(len(wrong) == 0, "rooms did not end as their batches did: %s", strings.Join(wrong, "; "))
	s.check(len(early) == 0, "held rooms failed before transfer.delegate.batch_timeout (%s): %s", batchTimeout, strings.Join(early, ", "))
}

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// agentRestart: rooms before; then rooms in flight, a quarter of them with
// a batch the agent holds, when the agent is killed; it starts again on
// the same port; rooms after.
func agentRestart(ctx context.Context, s *Stage) error {
	n := s.rooms()
	before, during, after := roomIDs(1_000_000, n/4), roomIDs(2_000_000, n/2), roomIDs(3_000_000, n/4)
	held := every(during, 4)
	g, err := startAgentStage(ctx, s, held, "10.21.0.1:8998")
	if err != nil {
		return err
	}
	if err := g.deliverAll(ctx, before); err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	if err := g.eng.Open(ctx, opens(g.p.spec.addr, during)); err != nil {
		return err
	}
	sent := make(chan map[uint64]error, 1)
	go func() { sent <- g.p.Deliver(ctx, during, len(during)) }()
	if err := g.waitHeld(ctx, held); err != nil {
		return err
	}
	if err := g.eng.waitPhase(ctx, without(during, held), pb.RoomPhase_ROOM_PHASE_RELEASED); err != nil {
		return err
	}
	aborted := every(held, 10)
	if err := g.eng.Abort(ctx, aborted); err != nil {
		return err
	}
	s.fault("the agent is killed with batches in flight")
	killed := time.Now()
	if err := g.a.Kill(); err != nil {
		return err
	}
	if err := waitHealth(ctx, g.d, healthpb.HealthCheckResponse_NOT_SERVING); err != nil {
		return err
	}
	res := <-sent
	if err := s.checkPages(ctx, g.d, false); err != nil {
		return err
	}
	if err := g.a.Restart(ctx); err != nil {
		return err
	}
	if err := waitHealth(ctx, g.d, healthpb.HealthCheckResponse_SERVING); err != nil {
		return err
	}
	back := time.Since(killed)
	if err := g.p.useAgent(ctx, g.a); err != nil { // the new agent's memory is new
		return err
	}
	agentRestartChecks(s, g.eng, res, held, aborted, killed)
	if err := g.deliverAll(ctx, after); err != nil {
		s.check(false, "after the agent came back: %v", err)
	}
	s.note("agent killed with %d rooms' batches held (%d aborted just before); daemon SERVING again %s after the kill", len(held), len(aborted), dur(back))
	return nil
}

// agentRestartChecks: the held rooms failed TRANSFER_FAILED naming the
// agent, and their pages were not reusable before the batch deadline.
func agentRestartChecks(s *Stage, eng *Engine, res map[uint64]error, held, aborted []uint64, killed time.Time) {
	var wrong, early []string
	for _, room := range without(held, aborted) {
		r := eng.room(room)
		if r.Failure.GetCode() != pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED || !strings.Contains(r.Failure.GetMessage(), "agent") {
			wrong = append(wrong, fmt.Sprintf("room %d: %s %v", room, r.Phase, r.Failure))
		}
		// The batch was submitted at most batchTimeout before the kill: its
		// deadline is after r.Opened + batchTimeout at the earliest.
		if !r.Reusable.IsZero() && r.Reusable.Before(r.Opened.Add(batchTimeout-200*time.Millisecond)) {
			early = append(early, fmt.Sprint(room))
		}
	}
	for room, err := range res {
		if !contains(held, room) && err != nil && len(wrong) < 6 {
			wrong = append(wrong, fmt.Sprintf("room %d (not held): %v", room, err))
		}
	}
	if len(wrong) > 3 {
		wrong = append(wrong[:3], fmt.Sprintf("and %d more", len(wrong)-3))
	}
	s.check(len(wrong) == 0, "rooms did not end as the agent's death left them: %s", strings.Join(wrong, "; "))
	s.check(len(early) == 0, "rooms whose batches the dead agent held had their pages reusable before the batch deadline: %s", strings.Join(early, ", "))
}

// waitHealth waits until the daemon's gRPC health is want.
func waitHealth(ctx context.Context, d *Daemon, want healthpb.HealthCheckResponse_ServingStatus) error {
	hc := healthpb.NewHealthClient(d.C.Conn())
	return poll(ctx, "the daemon's health "+want.String(), func() (bool, error) {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == want, err
	})
}
