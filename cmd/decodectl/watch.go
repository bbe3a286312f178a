package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// minTermRedraw bounds how often a watch redraws a terminal, whatever
// --interval says: at most four screens a second.
const minTermRedraw = 250 * time.Millisecond

// The size a watch assumes for a terminal whose size cannot be read.
const defaultRows, defaultCols = 24, 80

// watch lists rooms every --interval until ctx ends (an interrupt), which is
// a clean exit. On a terminal each refresh replaces the screen (ANSI clear)
// with a table that fits it: the header stays, the newest rooms come first,
// rows are cut to the width instead of wrapping and the rooms that do not
// fit are counted on a last "… N more rooms" line; the size is read at every
// redraw, a resize (SIGWINCH) redraws at once, and the screen is redrawn
// at most four times a second (minTermRedraw), however short --interval is.
// Otherwise (a pipe, a file, | tee) the table is printed once and each
// later refresh prints one line per room that appeared, changed or left the
// list, and nothing when nothing changed: a log of changes instead of a
// table a second. With -o json each refresh is one line, a whole ListRooms
// answer, on a terminal or not (scripts want snapshots). The first failure
// ends the watch; later ones are printed on stderr and the watch goes on (a
// daemon restarting) against the last answer that came.
func (x *cli) watch(ctx context.Context, list func(context.Context) (*pb.ListRoomsResponse, error)) error {
	term := isTerminal(x.stdout)
	screen := term && !x.opts.json()
	interval := x.opts.interval
	var resized <-chan os.Signal
	if screen {
		interval = max(interval, minTermRedraw)
		var stop func()
		resized, stop = notifyResize()
		defer stop()
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last *pb.ListRoomsResponse
	var drawn time.Time
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
			if screen {
				// An empty screen that says when: the error is on stderr.
				x.header(&out, true, interval)
			}
		case x.opts.json():
			b, merr := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
			if merr != nil {
				return merr
			}
			out.Write(append(b, '\n'))
		case term:
			rows, cols := defaultRows, defaultCols
			if f, ok := x.stdout.(*os.File); ok {
				if r, c := termSize(f); r > 0 && c > 0 {
					rows, cols = r, c
				}
			}
			if werr := x.screen(&out, resp, interval, rows, cols); werr != nil {
				return werr
			}
		case last == nil:
			x.header(&out, false, interval)
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
			drawn = time.Now()
		}
		if err != nil {
			fmt.Fprintf(x.stderr, "decodectl: %s (retrying every %s)\n", describeError(err), interval)
		}
		// A resize redraws at the new size at once, or minTermRedraw
		// after the last screen if that was sooner.
		var soon <-chan time.Time
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return nil
			case <-ticker.C:
				waiting = false
			case <-soon:
				waiting = false
			case <-resized:
				if wait := minTermRedraw - time.Since(drawn); wait <= 0 {
					waiting = false
				} else if soon == nil {
					soon = time.After(wait)
				}
			}
		}
	}
}

// header starts a watch's screen (clearing it on a terminal): what is
// watched, how often, and when.
func (x *cli) header(w io.Writer, clear bool, interval time.Duration) {
	if clear {
		io.WriteString(w, "\x1b[H\x1b[2J")
	}
	fmt.Fprintf(w, "Every %s: decodectl rooms at %s    %s\n\n", interval, x.opts.addr, x.now().Format("2006-01-02 15:04:05"))
}

// screen renders one terminal screen of a watch for a terminal of rows x
// cols: the header, then the rooms table with as many rooms as fit (the
// first ones of the answer: the newest, unless --oldest), then "showing N
// of TOTAL rooms", or "… M more rooms" when some did not fit. It writes at
// most rows-1 lines (a last newline on the bottom row would scroll the
// header away), none longer than cols.
func (x *cli) screen(w io.Writer, resp *pb.ListRoomsResponse, interval time.Duration, rows, cols int) error {
	var b bytes.Buffer
	x.header(&b, false, interval)
	rooms := resp.GetRooms()
	total := max(uint64(resp.GetTotal()), uint64(len(rooms)))
	// Lines left for the table's header, its rows and the last line.
	room := rows - 1 - 2 - 2
	switch {
	case total == 0:
		b.WriteString("No rooms.\n")
	case room < 1:
		fmt.Fprintf(&b, "%d rooms: the terminal is too small to list them\n", total)
	default:
		fit := min(len(rooms), room)
		if err := writeRoomsTable(&b, rooms[:fit], x.now()); err != nil {
			return err
		}
		if fit < len(rooms) {
			fmt.Fprintf(&b, "… %d more rooms (showing %d of %d)\n", total-uint64(fit), fit, total)
		} else {
			fmt.Fprintf(&b, "showing %d of %d rooms\n", fit, total)
		}
	}
	io.WriteString(w, "\x1b[H\x1b[2J")
	lines := strings.SplitAfter(b.String(), "\n")
	for i, line := range lines {
		if i >= rows-1 {
			break
		}
		io.WriteString(w, clip(line, cols))
	}
	return nil
}

// clip cuts a line (with or without its newline) to cols characters,
// ending it with "…" when it was longer.
func clip(line string, cols int) string {
	body, nl := strings.CutSuffix(line, "\n")
	if utf8.RuneCountInString(body) > cols {
		r := []rune(body)
		body = string(r[:max(cols-1, 0)]) + "…"
	}
	if nl {
		return body + "\n"
	}
	return body
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
