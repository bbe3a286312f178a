package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/sessiontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// sessionScenario is scenario's five rooms driven on the streams: opened,
// released and aborted on a decode engine's EngineSession (driven on the
// wire, sessiontest), handed off on the prefill rank's PrefillSession (the
// client's SendRoom, which rides the rank's shared session under
// TransportStreams). It returns the daemon and the engine session's room
// events, read as they come (the session's reader must never stall).
func sessionScenario(t *testing.T) (*testDaemon, <-chan *pb.EngineRoomEvent) {
	t.Helper()
	d := startDaemon(t, daemonConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	es, err := sessiontest.OpenEngine(ctx, d.c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan *pb.EngineRoomEvent, 1024)
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(events)
		for {
			ev, err := es.Next()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	t.Cleanup(func() {
		es.Close()
		<-read
	})
	p := d.register(t, prefillRank(prefillA, 1, 0))

	open := func(addr string, room uint64, prompt uint32) {
		t.Helper()
		_, err := es.Open(testCtx(t), &pb.OpenRoomRequest{
			Rid: fmt.Sprintf("req-%d", room), BootstrapAddr: addr, Room: room, PromptLen: prompt, MaxNewTokens: 128,
		})
		if err != nil {
			t.Fatalf("open room %d on the engine session: %v", room, err)
		}
	}
	succeed := func(room uint64, prompt uint32) {
		t.Helper()
		open(prefillA, room, prompt)
		if _, err := p.SendRoom(testCtx(t), room, client.SendOptions{ChunkPages: 4}); err != nil {
			t.Fatalf("send room %d on the prefill session: %v", room, err)
		}
	}
	succeed(1, 1000)
	succeed(2, 300)
	if _, err := es.Release(testCtx(t), &pb.ReleaseRoomRequest{Room: 2}); err != nil {
		t.Fatal(err)
	}
	open(prefillA, 3, 500)
	if _, err := es.Abort(testCtx(t), &pb.AbortRoomRequest{Room: 3}); err != nil {
		t.Fatal(err)
	}
	open(prefillA, 4, 200)
	open(prefillB, 5, 200)
	return d, events
}

// clockRE matches what depends on the clock in a room's output: the
// opening's and update's times, ages, timeline offsets, and the deadline a
// waiting room is bounded by ("until 2026-01-02T15:04:05Z"), and the time
// per phase.
var clockRE = regexp.MustCompile(`Phase times:.*|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC|\(\S+ ago\)|\+\d+\.\d{3}s|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)

// TestRoomsOverSessions: decodectl shows rooms driven on the sessions as it
// shows the same rooms driven by the unary API (scenario, on another
// daemon): the rooms table row for row, each room's detail and timeline
// line for line (clock aside); and decodectl abort of a room opened on an
// engine session reaches that session as the room's failed, terminal event.
func TestRoomsOverSessions(t *testing.T) {
	t.Parallel()
	unary := scenario(t)
	stream, events := sessionScenario(t)

	rows := func(d *testDaemon, args ...string) [][]string {
		t.Helper()
		var out [][]string
		for _, line := range strings.Split(d.mustCtl(t, append([]string{"rooms"}, args...)...), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && f[0] != "ROOM" {
				f = append(f[:4:4], f[5:]...) // the age depends on the clock
			}
			out = append(out, f)
		}
		return out
	}
	for _, args := range [][]string{nil, {"--live"}, {"--phase", "failed"}} {
		want, got := rows(unary, args...), rows(stream, args...)
		if len(want) < 3 {
			t.Fatalf("rooms %v of the unary daemon lists nothing:\n%v", args, want)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("rooms %v: the session-driven rooms (+) differ from the unary-driven ones (-):\n%s", args, diff)
		}
	}
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		want := clockRE.ReplaceAllString(unary.mustCtl(t, "room", id, "--pages"), "<clock>")
		got := clockRE.ReplaceAllString(stream.mustCtl(t, "room", id, "--pages"), "<clock>")
		if diff := cmp.Diff(strings.Split(want, "\n"), strings.Split(got, "\n")); diff != "" {
			t.Errorf("room %s: the session-driven room (+) differs from the unary-driven one (-):\n%s", id, diff)
		}
	}

	// Aborting the admitted room 4 (opened on the session): the same answer
	// as for the unary room, and the session hears it.
	want := unary.mustCtl(t, "abort", "4", "--reason", "operator: stuck")
	if got := stream.mustCtl(t, "abort", "4", "--reason", "operator: stuck"); got != want || want != "room 4 aborted: failed (aborted: operator: stuck)\n" {
		t.Errorf("abort 4 of the session's room = %q, of the unary room %q", got, want)
	}
	ctx := testCtx(t)
	for {
		var ev *pb.EngineRoomEvent
		select {
		case ev = <-events:
		case <-ctx.Done():
			t.Fatal("the engine session never told room 4's abort")
		}
		if ev == nil {
			t.Fatal("the engine session ended before telling room 4's abort")
		}
		if ev.GetRoom() != 4 || !ev.GetEvent().GetTerminal() {
			continue
		}
		r := ev.GetEvent().GetRoom()
		if ph := ev.GetEvent().GetTransition().GetPhase(); ph != pb.RoomPhase_ROOM_PHASE_FAILED ||
			r.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED || r.GetFailure().GetMessage() != "operator: stuck" {
			t.Errorf("room 4's terminal event on the session: phase %s, failure %v; want FAILED, aborted with \"operator: stuck\"", ph, r.GetFailure())
		}
		break
	}
	if diff := cmp.Diff(rows(unary, "--phase", "failed"), rows(stream, "--phase", "failed")); diff != "" {
		t.Errorf("rooms --phase failed after the aborts (-unary +session):\n%s", diff)
	}
}
