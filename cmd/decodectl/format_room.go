package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// This file renders rooms for people: the rooms table, one room with its
// pages, coverage, deadline, phase times and timeline.

// prefillCell is a room's prefill instance and DP rank: "host:port/dp1", or
// the address alone while the DP rank is unresolved.
func prefillCell(r *pb.Room) string {
	if r.PrefillDpRank == nil {
		return r.GetBootstrapAddr()
	}
	return fmt.Sprintf("%s/dp%d", r.GetBootstrapAddr(), r.GetPrefillDpRank())
}

// failureCell is a failed room's reason, short: "aborted: Aborted by AbortReq.".
func failureCell(r *pb.Room) string {
	f := r.GetFailure()
	if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED && f == nil {
		return ""
	}
	s := failureName(f.GetCode())
	if m := f.GetMessage(); m != "" {
		s += ": " + m
	}
	return truncate(s, 60)
}

// writeRoomsTable renders rooms as a table, one line per room.
func writeRoomsTable(w io.Writer, rooms []*pb.Room, now time.Time) error {
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "ROOM\tRID\tSTATE\tKVPOLL\tAGE\tPREFILL\tPAGES\tFAILURE\n")
		for _, r := range rooms {
			rid := r.GetRid()
			if rid == "" {
				rid = "-"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.GetRoom(), rid, phaseName(r.GetPhase()), pollName(r.GetPoll()),
				age(r.GetOpenedAt(), now), prefillCell(r), r.GetNumPages(), failureCell(r))
		}
	})
}

// writeRoomList renders a ListRooms answer: the table and "showing N of
// TOTAL rooms".
func writeRoomList(w io.Writer, resp *pb.ListRoomsResponse, now time.Time) error {
	rooms := resp.GetRooms()
	total := max(uint64(resp.GetTotal()), uint64(len(rooms)))
	if total == 0 {
		_, err := fmt.Fprintln(w, "No rooms.")
		return err
	}
	if err := writeRoomsTable(w, rooms, now); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "showing %d of %d rooms\n", len(rooms), total)
	return err
}

// offset renders a transition's time from the room's opening: "+1.204s".
func offset(at, opened *timestamppb.Timestamp) string {
	if !isSet(at) || !isSet(opened) {
		return "-"
	}
	return fmt.Sprintf("%+.3fs", at.AsTime().Sub(opened.AsTime()).Seconds())
}

// formatPages renders page indices in order, runs of consecutive ascending
// pages as "a-b": "3-6,1,9-10".
func formatPages(pages []int32) string {
	var parts []string
	for i := 0; i < len(pages); {
		j := i
		for j+1 < len(pages) && pages[j+1] == pages[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(int(pages[i])))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", pages[i], pages[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// formatPhaseTimes renders the time each phase of a room's hand-off took,
// their sum and the request's budget: "waiting_prefill 0s, queued 12ms,
// admitted 1.988s (2s in all, of a 2s budget)".
func formatPhaseTimes(pts []*pb.PhaseTime, budget *durationpb.Duration) string {
	parts := make([]string, len(pts))
	var sum time.Duration
	for i, pt := range pts {
		d := pt.GetSpent().AsDuration()
		sum += d
		parts[i] = phaseName(pt.GetPhase()) + " " + d.Round(time.Millisecond).String()
	}
	all := sum.Round(time.Millisecond).String() + " in all"
	if budget != nil {
		all += ", of a " + budget.AsDuration().String() + " budget"
	}
	return strings.Join(parts, ", ") + " (" + all + ")"
}

// formatCoverage renders one prefill rank's page coverage of a room.
func formatCoverage(c *pb.RankCoverage) string {
	out := fmt.Sprintf("prefill cp %d tp %d pp %d: %d/%d pages landed, %s", c.GetCpRank(), c.GetTpRank(), c.GetPpRank(),
		c.GetPagesLanded(), c.GetPagesRequired(), humanBytes(c.GetBytes()))
	switch {
	case !c.GetClaimed():
		out += ", not claimed"
	case c.GetLastLanded():
		out += ", last chunk landed"
	}
	return out
}

// writeRoom renders a room's details, its failure, and its timeline: one
// line per transition with the offset from the room's opening, phase,
// KVPoll, SGLang transition and note.
func writeRoom(w io.Writer, r *pb.Room, showPages bool, now time.Time) error {
	err := table(w, func(tw io.Writer) {
		fmt.Fprintf(tw, "Room:\t%d\n", r.GetRoom())
		fmt.Fprintf(tw, "RID:\t%s\n", r.GetRid())
		fmt.Fprintf(tw, "State:\t%s (KVPoll %s)\n", phaseName(r.GetPhase()), pollName(r.GetPoll()))
		pre := r.GetBootstrapAddr()
		if r.PrefillDpRank != nil {
			pre += fmt.Sprintf(", dp rank %d (%s)", r.GetPrefillDpRank(), ruleName(r.GetDpRankRule()))
		} else {
			pre += ", dp rank unresolved"
		}
		fmt.Fprintf(tw, "Prefill:\t%s\n", pre)
		dec := fmt.Sprintf("dp shard %d", r.GetDecodeDpRank())
		if r.GetMetadataSlot() >= 0 {
			dec += fmt.Sprintf(", metadata slot %d", r.GetMetadataSlot())
		}
		fmt.Fprintf(tw, "Decode:\t%s\n", dec)
		fmt.Fprintf(tw, "Request:\tprompt %d tokens, max new tokens %d, priority %d\n", r.GetPromptLen(), r.GetMaxNewTokens(), r.GetPriority())
		fmt.Fprintf(tw, "Pages:\t%d\n", r.GetNumPages())
		if showPages {
			p := formatPages(r.GetPageIndices())
			if p == "" {
				p = "none held"
			}
			fmt.Fprintf(tw, "Page indices:\t%s\n", p)
		}
		fmt.Fprintf(tw, "Transferred:\t%d chunks, %s\n", r.GetChunksDone(), humanBytes(r.GetBytesTransferred()))
		for _, c := range r.GetCoverage() {
			fmt.Fprintf(tw, "Coverage:\t%s\n", formatCoverage(c))
		}
		if wf := r.GetWaitingFor(); wf != "" {
			fmt.Fprintf(tw, "Waiting for:\t%s\n", wf)
		}
		if r.GetStaging() {
			fmt.Fprintf(tw, "Staging:\tyes\n")
		}
		fmt.Fprintf(tw, "Opened:\t%s (%s ago)\n", timestamp(r.GetOpenedAt()), age(r.GetOpenedAt(), now))
		fmt.Fprintf(tw, "Updated:\t%s (%s after opening)\n", timestamp(r.GetUpdatedAt()), offset(r.GetUpdatedAt(), r.GetOpenedAt()))
		if to := r.GetTimeout(); to != nil {
			fmt.Fprintf(tw, "Deadline:\t%s (timeout %s from opening; it bounds the first attempt's hand-off)\n", timestamp(r.GetDeadline()), to.AsDuration())
		}
		if pt := r.GetPhaseTimes(); len(pt) > 0 {
			fmt.Fprintf(tw, "Phase times:\t%s\n", formatPhaseTimes(pt, r.GetTimeout()))
		}
		if r.GetAttempt() > 1 {
			fmt.Fprintf(tw, "Attempt:\t%d (rebootstrapped)\n", r.GetAttempt())
		}
		if t := r.GetTraceId(); t != "" {
			fmt.Fprintf(tw, "Trace:\t%s\n", t)
		}
		if f := r.GetFailure(); f != nil || r.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED {
			msg := fmt.Sprintf("%s: %s", failureName(f.GetCode()), f.GetMessage())
			if f.GetFromAnotherRank() {
				msg += " (reported by another prefill rank)"
			}
			fmt.Fprintf(tw, "Failure:\t%s\n", msg)
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(r.GetTransitions()) == 0 {
		_, err := fmt.Fprintln(w, "No transitions recorded.")
		return err
	}
	fmt.Fprintln(w, "Timeline:")
	return writeTimeline(w, r)
}

// writeTimeline renders a room's transitions, one per line. The ATTEMPT
// column appears when the room was rebootstrapped.
func writeTimeline(w io.Writer, r *pb.Room) error {
	attempts := false
	for _, t := range r.GetTransitions() {
		attempts = attempts || t.GetAttempt() > 1
	}
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "  OFFSET\tPHASE\tKVPOLL\tSGLANG\t")
		if attempts {
			fmt.Fprint(tw, "ATTEMPT\t")
		}
		fmt.Fprint(tw, "NOTE\n")
		for _, t := range r.GetTransitions() {
			sg := t.GetSglang()
			if sg == "" {
				sg = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t", offset(t.GetAt(), r.GetOpenedAt()), phaseName(t.GetPhase()), pollName(t.GetPoll()), sg)
			if attempts {
				fmt.Fprintf(tw, "%d\t", t.GetAttempt())
			}
			fmt.Fprintf(tw, "%s\n", t.GetNote())
		}
	})
}
