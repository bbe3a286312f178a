package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/decodeplane/decodeplane/internal/testing/ptytest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// frameWriter collects a watch's output and calls onFrame after each write
// (the watch writes each frame at once); it stands for the operator, who
// interrupts the watch from onFrame.
type frameWriter struct {
	buf     bytes.Buffer
	frames  int
	onFrame func(n int)
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	w.frames++
	w.onFrame(w.frames)
	return len(p), nil
}

// watchDaemon is the scenario with a count of the ListRooms calls served;
// onList runs after each (before its answer leaves) with the count.
func watchDaemon(t *testing.T, onList func(n int64)) (*testDaemon, *atomic.Int64) {
	calls := &atomic.Int64{}
	count := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if info.FullMethod == pb.Rooms_ListRooms_FullMethodName {
			onList(calls.Add(1))
		}
		return resp, err
	})
	return scenario(t, daemonConfig{serverOptions: []grpc.ServerOption{count}}), calls
}

var changeLine = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  `)

// TestWatch: into a pipe, the table once, then one line per change, and
// nothing for a refresh that changed nothing.
func TestWatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// quietFrom is the ListRooms count when the changes were printed; three
	// refreshes later the operator interrupts.
	var quietFrom atomic.Int64
	d, calls := watchDaemon(t, func(n int64) {
		// (After 500 refreshes in any case: a broken watch fails, not hangs.)
		if q := quietFrom.Load(); q > 0 && n >= q+3 || n >= 500 {
			cancel()
		}
	})
	// After the first frame room 9 opens (newest first with --limit 5, it
	// pushes room 1 out of the list) and room 4 is aborted.
	w := &frameWriter{}
	w.onFrame = func(n int) {
		switch n {
		case 1:
			d.open(t, prefillA, 9, 200)
			if _, err := d.c.Engine().AbortRoom(testCtx(t), &pb.AbortRoomRequest{Room: 4}); err != nil {
				t.Error(err)
			}
		case 2:
			quietFrom.Store(calls.Load())
		}
	}
	var stderr bytes.Buffer
	code := runContext(ctx, []string{"rooms", "-w", "--interval", "10ms", "--addr", d.addr, "--limit", "5"}, nil, w, &stderr)
	if code != exitOK || stderr.Len() != 0 {
		t.Fatalf("rooms -w: exit %d, stderr %q", code, stderr.String())
	}
	out := w.buf.String()
	if strings.Contains(out, "\x1b[") {
		t.Errorf("the watch cleared a screen that is not a terminal:\n%q", out)
	}
	if w.frames != 2 {
		t.Errorf("%d writes, want 2 (the table, then the changes; nothing while nothing changed):\n%s", w.frames, out)
	}
	table, changes, ok := strings.Cut(out, "stdout is not a terminal: from now on one line per room that appears, changes or leaves the list.\n")
	if !ok || !strings.HasPrefix(table, "Every 10ms: decodectl rooms at "+d.addr+"    ") {
		t.Fatalf("the watch does not start with the table and the note:\n%s", out)
	}
	if diff := cmp.Diff([]string{"5", "4", "3", "2", "1"}, roomRows(table)); diff != "" {
		t.Errorf("first table (-want +got):\n%s\n%s", diff, table)
	}
	if !strings.Contains(table, "ROOM  RID    STATE") || !strings.HasSuffix(table, "showing 5 of 5 rooms\n\n") {
		t.Errorf("first table:\n%s", table)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSuffix(changes, "\n"), "\n") {
		if !changeLine.MatchString(line) {
			t.Errorf("change line %q does not start with the time", line)
		}
		got = append(got, changeLine.ReplaceAllString(line, ""))
	}
	want := []string{
		"room 9 (req-9): new, admitted, KVPoll WaitingForInput, prefill " + prefillA + "/dp0, 4 pages",
		"room 4 (req-4): admitted -> failed, KVPoll Failed, prefill " + prefillA + "/dp0, 4 pages, aborted: Aborted by AbortReq.",
		"room 1 (req-1): no longer listed (it left the filter, expired or fell past --limit)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("changes (-want +got):\n%s\n%s", diff, changes)
	}
}

func TestWatchJSON(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &frameWriter{onFrame: func(n int) {
		if n == 2 {
			cancel()
		}
	}}
	var stderr bytes.Buffer
	if code := runContext(ctx, []string{"--addr", d.addr, "-o", "json", "rooms", "--watch", "--interval", "10ms"}, nil, w, &stderr); code != exitOK {
		t.Fatalf("rooms --watch -o json: exit %d, stderr %q", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines (one document per frame), got:\n%s", w.buf.String())
	}
	for _, l := range lines {
		var resp pb.ListRoomsResponse
		if err := protojson.Unmarshal([]byte(l), &resp); err != nil || resp.GetTotal() != 5 {
			t.Errorf("frame %q: %v, total %d", l, err, resp.GetTotal())
		}
	}
}

func TestWatchFirstFailure(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	var stdout, stderr bytes.Buffer
	// The first refresh failing ends the watch: there is nothing to show.
	code := runContext(t.Context(), []string{"rooms", "-w", "--addr", d.addr, "--phase", "failed", "--prefill", "not an address"}, nil, &stdout, &stderr)
	if code != exitFailure || stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "decodectl: rooms: InvalidArgument: ") {
		t.Errorf("rooms -w with a bad filter: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// TestWatchTerminal: on a terminal every refresh redraws the whole table,
// changed or not.
func TestWatchTerminal(t *testing.T) {
	t.Parallel()
	master, tty, err := ptytest.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer master.Close()
	d := scenario(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const clear = "\x1b[H\x1b[2J"
	read := make(chan string, 1)
	go func() {
		// The operator interrupts after three screens; the terminal reads
		// EIO once closed.
		var out []byte
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			out = append(out, buf[:n]...)
			if strings.Count(string(out), clear) >= 4 {
				cancel()
			}
			if err != nil {
				if !errors.Is(err, syscall.EIO) {
					t.Errorf("reading the terminal: %v", err)
				}
				read <- strings.ReplaceAll(string(out), "\r\n", "\n")
				return
			}
		}
	}()
	var stderr bytes.Buffer
	code := runContext(ctx, []string{"rooms", "-w", "--interval", "10ms", "--addr", d.addr}, nil, tty, &stderr)
	tty.Close()
	out := <-read
	if code != exitOK || stderr.Len() != 0 {
		t.Fatalf("rooms -w: exit %d, stderr %q", code, stderr.String())
	}
	screens := strings.Split(out, clear)
	if len(screens) < 4 || screens[0] != "" {
		t.Fatalf("want screens that each start by clearing the terminal, got:\n%q", out)
	}
	for _, s := range screens[1:4] {
		if !strings.HasPrefix(s, "Every 250ms: decodectl rooms at "+d.addr) || !cmp.Equal(roomRows(s), []string{"5", "4", "3", "2", "1"}) ||
			!strings.HasSuffix(s, "showing 5 of 5 rooms\n") {
			t.Errorf("screen:\n%s", s)
		}
	}
}

func TestWriteRoomChanges(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 8, 50, 2, 0, time.Local)
	dp := uint32(1)
	room := func(id uint64, phase pb.RoomPhase, pages uint32, opened time.Time) *pb.Room {
		return &pb.Room{Room: id, Rid: "r", Phase: phase, Poll: pb.KVPoll_KV_POLL_WAITING_FOR_INPUT, BootstrapAddr: prefillA,
			PrefillDpRank: &dp, NumPages: pages, OpenedAt: timestamppb.New(opened), UpdatedAt: timestamppb.New(opened)}
	}
	t0 := now.Add(-time.Minute)
	prev := []*pb.Room{room(1, pb.RoomPhase_ROOM_PHASE_ADMITTED, 4, t0), room(2, pb.RoomPhase_ROOM_PHASE_QUEUED, 0, t0)}
	// Only the times moved (ages, updated_at): nothing to print.
	same := []*pb.Room{room(2, pb.RoomPhase_ROOM_PHASE_QUEUED, 0, t0.Add(time.Second)), room(1, pb.RoomPhase_ROOM_PHASE_ADMITTED, 4, t0)}
	var b bytes.Buffer
	writeRoomChanges(&b, prev, same, now)
	if b.Len() != 0 {
		t.Errorf("unchanged rooms printed:\n%s", b.String())
	}
	// Room 1 grew (same phase), room 2 left, room 3 is new; a room without
	// a rid is named by its number alone.
	cur := []*pb.Room{room(3, pb.RoomPhase_ROOM_PHASE_ADMITTED, 2, now), room(1, pb.RoomPhase_ROOM_PHASE_ADMITTED, 6, t0)}
	cur[0].Rid = ""
	writeRoomChanges(&b, prev, cur, now)
	want := "2026-12-01 08:50:02  room 3: new, admitted, KVPoll WaitingForInput, prefill " + prefillA + "/dp1, 2 pages\n" +
		"2026-12-01 08:50:02  room 1 (r): admitted, KVPoll WaitingForInput, prefill " + prefillA + "/dp1, 6 pages\n" +
		"2026-12-01 08:50:02  room 2 (r): no longer listed (it left the filter, expired or fell past --limit)\n"
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
}
