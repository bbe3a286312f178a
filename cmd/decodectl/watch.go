package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// watch lists rooms every --interval until ctx ends (an interrupt), which is
// a clean exit. On a terminal each refresh replaces the screen (ANSI clear)
// with the whole table. Otherwise (a pipe, a file, | tee) the table is
// printed once and each later refresh prints one line per room that
// appeared, changed or left the list, and nothing when nothing changed: a log
// of changes instead of a table a second. With -o json each refresh is one
// line, a whole ListRooms answer, on a terminal or not (scripts want
// snapshots). The first failure ends the watch; later ones are printed on
// stderr and the watch goes on (a daemon restarting) against the last
// answer that came.
func (x *cli) watch(ctx context.Context, list func(context.Context) (*pb.ListRoomsResponse, error)) error {
	term := isTerminal(x.stdout)
	ticker := time.NewTicker(x.opts.interval)
	defer ticker.Stop()
	var last *pb.ListRoomsResponse
	for n := 0; ; n++ {
		resp, err := list(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && n == 0 {
			return err
		}
		var out bytes.Buffer
		switch {
		case err != nil:
			if term && !x.opts.json() {
				// An empty screen that says when: the error is on stderr.
				x.header(&out, true)
			}
		case x.opts.json():
			b, merr := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
			if merr != nil {
				return merr
			}
			out.Write(append(b, '\n'))
		case term:
			x.header(&out, true)
			if werr := writeRoomList(&out, resp, x.now()); werr != nil {
				return werr
			}
		case last == nil:
			x.header(&out, false)
			if werr := writeRoomList(&out, resp, x.now()); werr != nil {
				return werr
			}
			fmt.Fprintf(&out, "\nstdout is not a terminal: from now on one line per room that appears, changes or leaves the list.\n")
		default:
			writeRoomChanges(&out, last.GetRooms(), resp.GetRooms(), x.now())
		}
		if err == nil {
			last = resp
		}
		if out.Len() > 0 {
			if _, werr := x.stdout.Write(out.Bytes()); werr != nil {
				return werr
			}
		}
		if err != nil {
			fmt.Fprintf(x.stderr, "decodectl: %s (retrying every %s)\n", describeError(err), x.opts.interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// header starts a watch's screen (clearing it on a terminal): what is
// watched, how often, and when.
func (x *cli) header(w io.Writer, clear bool) {
	if clear {
		io.WriteString(w, "\x1b[H\x1b[2J")
	}
	fmt.Fprintf(w, "Every %s: decodectl rooms at %s    %s\n\n", x.opts.interval, x.opts.addr, x.now().Format("2006-01-02 15:04:05"))
}

// roomView is what a rooms row shows of a room, its age aside: a room whose
// view is unchanged has not changed for the watch.
type roomView struct {
	rid, phase, poll, prefill, failure string
	pages                              uint32
}

func viewOf(r *pb.Room) roomView {
	return roomView{rid: r.GetRid(), phase: phaseName(r.GetPhase()), poll: pollName(r.GetPoll()), prefill: prefillCell(r),
		failure: failureCell(r), pages: r.GetNumPages()}
}

// writeRoomChanges prints one line per room of cur that is not in prev or
// whose view changed (in cur's order), then one per room of prev that is no
// longer listed, each stamped with now:
//
//	2026-12-01 08:50:02  room 9 (req-9): new, waiting_prefill, KVPoll Bootstrapping, prefill 10.0.0.1:8998, 0 pages
//	2026-12-01 08:50:03  room 9 (req-9): waiting_prefill -> admitted, KVPoll WaitingForInput, prefill 10.0.0.1:8998/dp0, 4 pages
//	2026-12-01 08:50:04  room 4 (req-4): no longer listed (it left the filter, expired or fell past --limit)
//
// It prints nothing when nothing changed.
func writeRoomChanges(w io.Writer, prev, cur []*pb.Room, now time.Time) {
	at := now.Format("2006-01-02 15:04:05")
	before := make(map[uint64]roomView, len(prev))
	for _, r := range prev {
		before[r.GetRoom()] = viewOf(r)
	}
	listed := make(map[uint64]bool, len(cur))
	name := func(id uint64, rid string) string {
		if rid == "" {
			return fmt.Sprintf("room %d", id)
		}
		return fmt.Sprintf("room %d (%s)", id, rid)
	}
	for _, r := range cur {
		id := r.GetRoom()
		listed[id] = true
		v := viewOf(r)
		old, seen := before[id]
		if seen && old == v {
			continue
		}
		state := "new, " + v.phase
		if seen {
			state = v.phase
			if old.phase != v.phase {
				state = old.phase + " -> " + v.phase
			}
		}
		parts := []string{state, "KVPoll " + v.poll, "prefill " + v.prefill, fmt.Sprintf("%d pages", v.pages)}
		if v.failure != "" {
			parts = append(parts, v.failure)
		}
		fmt.Fprintf(w, "%s  %s: %s\n", at, name(id, v.rid), strings.Join(parts, ", "))
	}
	for _, r := range prev {
		if id := r.GetRoom(); !listed[id] {
			fmt.Fprintf(w, "%s  %s: no longer listed (it left the filter, expired or fell past --limit)\n", at, name(id, r.GetRid()))
		}
	}
}
