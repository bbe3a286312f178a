package faults

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Reconnect opens a new stream (after the old one was cut, or the daemon
// restarted) and watches every room that has not settled again, from the
// last event it saw — or, when the daemon's incarnation changed, from its
// start: a room the new daemon does not know died with the old one (Gone,
// now). Succeeded rooms not released yet are released again.
func (e *Engine) Reconnect(ctx context.Context) error {
	e.sendMu.Lock()
	if e.cancel != nil {
		e.cancel()
	}
	ended := e.ended
	e.sendMu.Unlock()
	<-ended
	st, err := e.d.status(ctx)
	if err != nil {
		return fmt.Errorf("%s: GetStatus: %w", e.name, err)
	}
	e.mu.Lock()
	restarted := e.inc != 0 && st.GetIncarnation() != e.inc
	e.inc = st.GetIncarnation()
	var watch []*pb.EngineWatchRoom
	var release []uint64
	for _, r := range e.rooms {
		if r.settled() {
			continue
		}
		if restarted {
			r.LastSeq = 0
		}
		watch = append(watch, &pb.EngineWatchRoom{Room: r.ID, After: r.LastSeq})
		if e.autoRelease && !r.Succeeded.IsZero() && r.Terminal.IsZero() {
			release = append(release, r.ID)
		}
	}
	e.mu.Unlock()
	if err := e.connect(ctx); err != nil {
		return err
	}
	sort.Slice(watch, func(i, j int) bool { return watch[i].Room < watch[j].Room })
	// A watch replays each room's missed events onto the stream: batches
	// of 256 rooms, each answered (its replay read) before the next, keep
	// the replay within the session's queue however many rooms there are.
	now := time.Now()
	for batch := range slices.Chunk(watch, 256) {
		op := &pb.EngineRequest{Op: &pb.EngineRequest_Watch{Watch: &pb.EngineWatch{Rooms: batch}}}
		err = e.do(ctx, []*pb.EngineRequest{op}, func(rep *pb.EngineReply) {
			for _, res := range rep.GetResults() {
				if res.GetCode() == int32(codes.NotFound) {
					e.setGone(res.GetRoom(), now)
				}
			}
		})
		if err != nil {
			break
		}
	}
	for _, id := range release {
		e.releases <- id
	}
	return err
}

func (e *Engine) setGone(id uint64, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.rooms[id]; r != nil && r.Gone.IsZero() && r.Terminal.IsZero() {
		r.Gone = at
	}
	close(e.changed)
	e.changed = make(chan struct{})
}

// snapshot copies every room's record, by room id.
func (e *Engine) snapshot() []Room {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Room, 0, len(e.rooms))
	for _, r := range e.rooms {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// room is one room's record (zero when unknown).
func (e *Engine) room(id uint64) Room {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.rooms[id]; r != nil {
		return *r
	}
	return Room{}
}

// wait waits until ok holds for every room in ids (every room the engine
// knows when ids is nil), or returns an error naming up to five that do
// not and their phases.
func (e *Engine) wait(ctx context.Context, what string, ids []uint64, ok func(*Room) bool) error {
	for {
		e.mu.Lock()
		var behind []*Room
		check := func(r *Room) {
			if r == nil || !ok(r) {
				behind = append(behind, r)
			}
		}
		if ids == nil {
			for _, r := range e.rooms {
				check(r)
			}
		} else {
			for _, id := range ids {
				check(e.rooms[id])
			}
		}
		changed := e.changed
		e.mu.Unlock()
		if len(behind) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			var names []string
			for _, r := range behind[:min(5, len(behind))] {
				if r == nil {
					names = append(names, "a room the engine never opened")
					continue
				}
				names = append(names, fmt.Sprintf("%d (%s)", r.ID, strings.TrimPrefix(r.Phase.String(), "ROOM_PHASE_")))
			}
			return fmt.Errorf("%s: %d rooms never %s, e.g. %s", e.name, len(behind), what, strings.Join(names, ", "))
		}
	}
}

// waitSettled waits until every room ended with its pages reusable (or
// died with its daemon, or was never opened).
func (e *Engine) waitSettled(ctx context.Context) error {
	return e.wait(ctx, "ended with their pages reusable", nil, func(r *Room) bool { return r.settled() })
}

// waitPhase waits until every room of ids reached one of the phases (or
// a later state: ended).
func (e *Engine) waitPhase(ctx context.Context, ids []uint64, phases ...pb.RoomPhase) error {
	names := make([]string, len(phases))
	for i, p := range phases {
		names[i] = strings.TrimPrefix(p.String(), "ROOM_PHASE_")
	}
	return e.wait(ctx, "reached "+strings.Join(names, " or "), ids, func(r *Room) bool {
		return slices.Contains(phases, r.Phase) || !r.end().IsZero()
	})
}

// close ends the stream and the releaser.
func (e *Engine) close() {
	e.ResumeReading()
	close(e.stop)
	e.sendMu.Lock()
	if e.cancel != nil {
		e.cancel()
	}
	e.sendMu.Unlock()
}

// failures counts the rooms that failed by failure code.
func (e *Engine) failures() map[pb.FailureCode]int {
	out := map[pb.FailureCode]int{}
	for _, r := range e.snapshot() {
		if r.Phase == pb.RoomPhase_ROOM_PHASE_FAILED && r.Failure != nil {
			out[r.Failure.GetCode()]++
		}
	}
	return out
}

// counts summarizes the rooms by outcome (the failures by code), for the
// notes.
func (e *Engine) counts() string {
	var released, failed, gone, refused, dups, gaps int
	codes := map[string]int{}
	for _, r := range e.snapshot() {
		switch {
		case r.OpenErr != nil:
			refused++
		case !r.Gone.IsZero():
			gone++
		case r.Phase == pb.RoomPhase_ROOM_PHASE_RELEASED:
			released++
		case r.Phase == pb.RoomPhase_ROOM_PHASE_FAILED:
			failed++
			codes[strings.ToLower(strings.TrimPrefix(r.Failure.GetCode().String(), "FAILURE_CODE_"))]++
		}
		dups += r.Dups
		gaps += r.Gaps
	}
	out := fmt.Sprintf("%s: %d released, %d failed", e.name, released, failed)
	if len(codes) > 0 {
		var cs []string
		for c, n := range codes {
			cs = append(cs, fmt.Sprintf("%s %d", c, n))
		}
		sort.Strings(cs)
		out += " (" + strings.Join(cs, ", ") + ")"
	}
	if gone > 0 {
		out += fmt.Sprintf(", %d gone with the killed daemon", gone)
	}
	if refused > 0 {
		out += fmt.Sprintf(", %d refused at open", refused)
	}
	if dups > 0 || gaps > 0 {
		out += fmt.Sprintf(", %d events seen twice, %d skipped", dups, gaps)
	}
	return out
}
