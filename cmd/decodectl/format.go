package main

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// This file renders the daemon's answers for people. Every function takes
// the current time (for ages) so that tests can pin it.

// table writes tab-separated rows aligned in columns, without trailing
// spaces (an empty last cell would otherwise pad the line).
func table(w io.Writer, fill func(tw io.Writer)) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fill(tw)
	if err := tw.Flush(); err != nil {
		return err
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line == "" {
			continue
		}
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	_, err := w.Write(out.Bytes())
	return err
}

// phaseName is a phase as decodectl (and the daemon's rooms_by_phase)
// names it: lowercase, without the ROOM_PHASE_ prefix ("resolving_dp_rank").
func phaseName(p pb.RoomPhase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "ROOM_PHASE_"))
}

// joinPhases lists the phase names for the help.
func joinPhases() string { return strings.Join(phaseNames(), ", ") }

// pollNames are SGLang's KVPoll names (disaggregation/base/conn.py).
var pollNames = map[pb.KVPoll]string{
	pb.KVPoll_KV_POLL_FAILED:            "Failed",
	pb.KVPoll_KV_POLL_BOOTSTRAPPING:     "Bootstrapping",
	pb.KVPoll_KV_POLL_WAITING_FOR_INPUT: "WaitingForInput",
	pb.KVPoll_KV_POLL_TRANSFERRING:      "Transferring",
	pb.KVPoll_KV_POLL_SUCCESS:           "Success",
}

// pollName is a KVPoll status by SGLang's name.
func pollName(p pb.KVPoll) string {
	if n, ok := pollNames[p]; ok {
		return n
	}
	return p.String()
}

// ruleName is a DP-rank rule in lowercase ("single_dp", "follow_room"),
// or "-" when unset.
func ruleName(r pb.DPRankRule) string {
	if r == pb.DPRankRule_DP_RANK_RULE_UNSPECIFIED {
		return "-"
	}
	return strings.ToLower(strings.TrimPrefix(r.String(), "DP_RANK_RULE_"))
}

// failureName is a failure code in lowercase ("aborted", "waiting_timeout").
func failureName(c pb.FailureCode) string {
	return strings.ToLower(strings.TrimPrefix(c.String(), "FAILURE_CODE_"))
}

// humanDuration renders d for people: 850ms, 4.2s, 42s, 3m07s, 5h02m, 3d04h.
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// age is how long ago ts was, for people; "-" when unset.
func age(ts *timestamppb.Timestamp, now time.Time) string {
	if !isSet(ts) {
		return "-"
	}
	return humanDuration(now.Sub(ts.AsTime()))
}

// isSet reports whether ts holds a real time (the daemon sends Go's zero
// time for "never").
func isSet(ts *timestamppb.Timestamp) bool {
	return ts != nil && ts.IsValid() && !ts.AsTime().IsZero() && ts.AsTime().Year() > 1
}

// humanBytes renders a byte count with binary units: 512 B, 1.5 KiB, 3.0 GiB.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// percent renders part/total as a percentage with one decimal.
func percent(part, total uint64) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(total))
}

// truncate cuts s to n runes, ending with "…" when it was longer.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// timestamp renders ts in the local zone with milliseconds.
func timestamp(ts *timestamppb.Timestamp) string {
	if !isSet(ts) {
		return "-"
	}
	return ts.AsTime().Local().Format("2006-01-02 15:04:05.000 MST")
}

// yesNo renders a bool for people.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// writeStatus renders Admin.GetStatus: the daemon, its rooms by phase, one
// line per shard and per prefill instance, and with showConfig the effective
// configuration. health is the standard gRPC health status.
func writeStatus(w io.Writer, st *pb.GetStatusResponse, health string, showConfig bool, now time.Time) error {
	ready := "no"
	if st.GetReady() {
		ready = "yes"
	}
	if r := st.GetReadiness(); r != "" {
		ready += " (" + r + ")"
	}
	uptime := humanDuration(st.GetUptime().AsDuration())
	if isSet(st.GetStartedAt()) {
		uptime += ", since " + timestamp(st.GetStartedAt())
	}
	err := table(w, func(tw io.Writer) {
		fmt.Fprintf(tw, "Version:\t%s\n", st.GetVersion())
		fmt.Fprintf(tw, "Incarnation:\t%x (new at every daemon start)\n", st.GetIncarnation())
		fmt.Fprintf(tw, "Ready:\t%s\n", ready)
		fmt.Fprintf(tw, "Health:\t%s\n", health)
		if st.GetDraining() {
			fmt.Fprintf(tw, "Draining:\tyes (new rooms are refused)\n")
		}
		fmt.Fprintf(tw, "Uptime:\t%s\n", uptime)
		fmt.Fprintf(tw, "Transfer path:\t%s\n", st.GetTransferPath())
		fmt.Fprintf(tw, "KV layout:\t%s\n", formatLayout(st.GetLayout()))
		if o := formatOwner(st.GetLayout().GetPageOwner()); o != "" {
			fmt.Fprintf(tw, "Page owner:\t%s\n", o)
		}
		fmt.Fprintf(tw, "Rooms:\t%s\n", formatRoomsByPhase(st.GetRoomsByPhase()))
		if n := st.GetPendingClaims(); n > 0 {
			fmt.Fprintf(tw, "Pending claims:\t%d (prefill claims waiting for rooms not opened yet)\n", n)
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(st.GetShards()) == 0 {
		fmt.Fprintln(w, "No shards (the daemon serves no room manager).")
	} else if err := writeShards(w, st.GetShards()); err != nil {
		return err
	}
	if hasHolds(st.GetShards()) {
		fmt.Fprintln(w)
		if err := writeHolds(w, st.GetShards()); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if len(st.GetPrefills()) == 0 {
		fmt.Fprintln(w, "No prefill instances registered.")
	} else if err := writePrefills(w, st.GetPrefills(), now); err != nil {
		return err
	}
	if showConfig {
		fmt.Fprintln(w)
		return writeConfig(w, st.GetConfig())
	}
	return nil
}

// formatLayout renders the KV layout on one line.
func formatLayout(l *pb.KVLayout) string {
	if l == nil {
		return "-"
	}
	var b strings.Builder
	b.WriteString(l.GetKind())
	if l.GetIsMla() && l.GetKind() != "mla" {
		b.WriteString(" (MLA)")
	}
	fmt.Fprintf(&b, ", %d layers", l.GetNumLayers())
	if l.GetIsMla() {
		fmt.Fprintf(&b, ", latent dim %d", l.GetHeadDim())
	} else {
		fmt.Fprintf(&b, ", %d KV heads per rank (%d total) x %d dim", l.GetHeadsPerRank(), l.GetTotalKvHeads(), l.GetHeadDim())
	}
	fmt.Fprintf(&b, ", %s", l.GetKvCacheDtype())
	fmt.Fprintf(&b, ", page %d tokens", l.GetPageSize())
	if l.GetTotalPages() > 0 {
		fmt.Fprintf(&b, ", %d pages per shard", l.GetTotalPages())
	}
	if l.GetTokenBytes() > 0 {
		fmt.Fprintf(&b, ", %s per token", humanBytes(l.GetTokenBytes()))
	}
	fmt.Fprintf(&b, "; tp %d dp %d pp %d", l.GetAttnTpSize(), l.GetDpSize(), l.GetPpSize())
	if l.GetDcpSize() > 1 {
		fmt.Fprintf(&b, " dcp %d", l.GetDcpSize())
	}
	if len(l.GetStateTypes()) > 0 {
		var names []string
		for _, s := range l.GetStateTypes() {
			names = append(names, strings.ToLower(strings.TrimPrefix(s.String(), "STATE_TYPE_")))
		}
		fmt.Fprintf(&b, "; state %s", strings.Join(names, "+"))
	}
	if l.GetStagingEnabled() {
		b.WriteString("; staging on")
	}
	return b.String()
}

// formatOwner says who allocates the pages (KVLayout.page_owner; "" from a
// daemon that does not report it).
func formatOwner(owner string) string {
	switch owner {
	case "":
		return ""
	case "daemon":
		return "daemon (OpenRoom admits each room and chooses its pages)"
	case "engine":
		return "engine (the decode engine allocates each room's pages and declares them: DeclareDestination)"
	}
	return owner
}

// hasHolds reports whether a shard reports a hand-off ledger (the engine
// owns the pages).
func hasHolds(shards []*pb.ShardStatus) bool {
	for _, s := range shards {
		if s.GetHolds() != nil {
			return true
		}
	}
	return false
}

// writeHolds renders the hand-off ledger of each shard whose pages the
// decode engine owns: the rooms waiting for their declaration, what the
// declared rooms hold until their hand-off ends, the part of it draining,
// the declarations refused because another room still held what they
// named, and whether the engine reported its capacity.
func writeHolds(w io.Writer, shards []*pb.ShardStatus) error {
	fmt.Fprintln(w, "Hand-off ledger (pages the engine declared, held until each hand-off ends):")
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "SHARD\tWAITING FOR DECLARATION\tHELD ROOMS/PAGES\tDRAINING ROOMS/PAGES\tREFUSED (PAGE HELD)\tCAPACITY REPORTED\n")
		for _, s := range shards {
			h := s.GetHolds()
			if h == nil {
				continue
			}
			fmt.Fprintf(tw, "%d\t%d\t%d/%d\t%d/%d\t%d\t%s\n", s.GetDpRank(), h.GetQueued(), h.GetHeld(), h.GetHeldPages(),
				h.GetDraining(), h.GetDrainingPages(), h.GetDeclarationsRefused(), yesNo(h.GetCapacityReported()))
		}
	})
}

// formatRoomsByPhase renders the room counts in lifecycle order ("3 total:
// transferring 1, succeeded 2"); phases the client does not know come last,
// sorted.
func formatRoomsByPhase(m map[string]uint32) string {
	var total uint64
	var parts []string
	seen := map[string]bool{}
	for _, name := range phaseNames() {
		seen[name] = true
		if n := m[name]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", name, n))
			total += uint64(n)
		}
	}
	var other []string
	for name, n := range m {
		if !seen[name] && n > 0 {
			other = append(other, fmt.Sprintf("%s %d", name, n))
			total += uint64(n)
		}
	}
	slices.Sort(other)
	parts = append(parts, other...)
	if total == 0 {
		return "none"
	}
	return fmt.Sprintf("%d total: %s", total, strings.Join(parts, ", "))
}

// writeShards renders one line per decode DP shard's ledger.
func writeShards(w io.Writer, shards []*pb.ShardStatus) error {
	var stateSlots, retracted, draining bool
	for _, s := range shards {
		stateSlots = stateSlots || s.GetStateSlotsTotal() > 0
		retracted = retracted || s.GetRetracted() > 0 || s.GetHeld() > 0
		draining = draining || s.GetDrainingRooms() > 0
	}
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "SHARD\tPAGES USED\tREQ SLOTS\tMETA SLOTS")
		if stateSlots {
			fmt.Fprint(tw, "\tSTATE SLOTS")
		}
		fmt.Fprint(tw, "\tQUEUE WAIT/READY\tADMITTED/CLAIMED/RUNNING")
		if retracted {
			fmt.Fprint(tw, "\tRETRACTED/HELD")
		}
		if draining { // ended rooms waiting for AckRoomEnd
			fmt.Fprint(tw, "\tDRAINING ROOMS/PAGES")
		}
		fmt.Fprint(tw, "\tBLOCKED BY\n")
		for _, s := range shards {
			used := s.GetPagesTotal() - min(s.GetPagesFree(), s.GetPagesTotal())
			fmt.Fprintf(tw, "%d\t%d/%d (%s)\t%s\t%s", s.GetDpRank(), used, s.GetPagesTotal(), percent(used, s.GetPagesTotal()),
				usedOf(uint64(s.GetReqSlotsFree()), uint64(s.GetReqSlotsTotal())),
				usedOf(uint64(s.GetMetadataSlotsFree()), uint64(s.GetMetadataSlotsTotal())))
			if stateSlots {
				fmt.Fprintf(tw, "\t%s", usedOf(s.GetStateSlotsFree(), s.GetStateSlotsTotal()))
			}
			fmt.Fprintf(tw, "\t%d/%d\t%d/%d/%d", s.GetWaiting(), s.GetQueued(), s.GetAdmitted(), s.GetClaimed(), s.GetRunning())
			if retracted {
				fmt.Fprintf(tw, "\t%d/%d", s.GetRetracted(), s.GetHeld())
			}
			if draining {
				fmt.Fprintf(tw, "\t%d/%d", s.GetDrainingRooms(), s.GetDrainingPages())
			}
			blocked := s.GetBlockedBy()
			if blocked == "" {
				blocked = "-"
			}
			fmt.Fprintf(tw, "\t%s\n", blocked)
		}
	})
}

// usedOf renders "used/total" from free and total.
func usedOf(free, total uint64) string {
	return fmt.Sprintf("%d/%d", total-min(free, total), total)
}

// writePrefills renders one line per prefill instance, then one line per
// instance with ranks whose heartbeat is overdue (liveness is per rank).
func writePrefills(w io.Writer, prefills []*pb.PrefillStatus, now time.Time) error {
	if err := writePrefillTable(w, prefills, now); err != nil {
		return err
	}
	for _, p := range prefills {
		if len(p.GetSilentRanks()) == 0 {
			continue
		}
		var parts []string
		for _, s := range p.GetSilentRanks() {
			r := s.GetRank()
			parts = append(parts, fmt.Sprintf("dp %d cp %d tp %d pp %d for %s (%d missed)", r.GetDpRank(), r.GetCpRank(), r.GetTpRank(), r.GetPpRank(),
				humanDuration(s.GetSilentFor().AsDuration()), s.GetMissedHeartbeats()))
		}
		if more := int(p.GetSilentRankCount()) - len(parts); more > 0 {
			parts = append(parts, fmt.Sprintf("and %d more", more))
		}
		if _, err := fmt.Fprintf(w, "%s silent ranks: %s\n", p.GetBootstrapAddr(), strings.Join(parts, ", ")); err != nil {
			return err
		}
	}
	return nil
}

func writePrefillTable(w io.Writer, prefills []*pb.PrefillStatus, now time.Time) error {
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "PREFILL\tRANKS\tTP/DP/PP\tLIVENESS\tLAST HEARTBEAT\tMISSED\tACTIVE ROOMS\n")
		for _, p := range prefills {
			par := fmt.Sprintf("%d/%d/%d", p.GetAttnTpSize(), p.GetDpSize(), p.GetPpSize())
			if p.GetAttnCpSize() > 1 {
				par += fmt.Sprintf(" cp%d", p.GetAttnCpSize())
			}
			live, beat, missed := prefillLiveness(p, now)
			fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\t%d\n", p.GetBootstrapAddr(), p.GetRegisteredRanks(), p.GetExpectedRanks(),
				par, live, beat, missed, p.GetActiveRooms())
		}
	})
}

// prefillLiveness is a prefill's LIVENESS, LAST HEARTBEAT and MISSED
// cells. With the memory registry ("heartbeats") the daemon counts each
// rank's heartbeats; in a fleet ("lease ID", hex as etcdctl prints it) the
// instance's etcd lease decides, kept alive by heartbeats to any daemon:
// the last heartbeat is the last one this daemon heard ("none here" when
// the ranks beat to another daemon) and nothing is counted missed here.
func prefillLiveness(p *pb.PrefillStatus, now time.Time) (live, beat, missed string) {
	if p.GetLiveness() == "lease" {
		live, beat = fmt.Sprintf("lease %x", p.GetLeaseId()), "none here"
		if isSet(p.GetLastHeartbeat()) {
			beat = age(p.GetLastHeartbeat(), now) + " ago here"
		}
		return live, beat, "-"
	}
	live, beat = "heartbeats", "never"
	if p.GetLiveness() == "" {
		live = "-" // a daemon that does not say
	}
	if isSet(p.GetLastHeartbeat()) {
		beat = age(p.GetLastHeartbeat(), now) + " ago"
	}
	return live, beat, fmt.Sprint(p.GetMissedHeartbeats())
}

// writeConfig renders the effective configuration with each value's source.
func writeConfig(w io.Writer, cfg []*pb.ConfigValue) error {
	if len(cfg) == 0 {
		_, err := fmt.Fprintln(w, "No configuration reported by the daemon.")
		return err
	}
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "KEY\tVALUE\tSOURCE\n")
		for _, c := range cfg {
			v := c.GetValue()
			if v == "" {
				v = `""`
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.GetKey(), v, c.GetSource())
		}
	})
}

// writeAbort renders an AbortRoom answer.
func writeAbort(w io.Writer, resp *pb.AbortRoomResponse, id uint64) error {
	r := resp.GetRoom()
	if resp.GetAlreadyTerminal() {
		_, err := fmt.Fprintf(w, "room %d had already ended (%s); nothing to abort\n", id, phaseName(r.GetPhase()))
		return err
	}
	_, err := fmt.Fprintf(w, "room %d aborted: %s (%s: %s)\n", id, phaseName(r.GetPhase()), failureName(r.GetFailure().GetCode()), r.GetFailure().GetMessage())
	return err
}

// writeDrain renders a Drain answer.
func writeDrain(w io.Writer, resp *pb.DrainResponse) error {
	n := resp.GetRoomsInFlight()
	var err error
	switch n {
	case 0:
		_, err = fmt.Fprintln(w, "draining: new rooms are refused (health NOT_SERVING); no rooms in flight")
	case 1:
		_, err = fmt.Fprintln(w, "draining: new rooms are refused (health NOT_SERVING); 1 room still in flight")
	default:
		_, err = fmt.Fprintf(w, "draining: new rooms are refused (health NOT_SERVING); %d rooms still in flight\n", n)
	}
	return err
}

// writeLookup renders a LookupDPRanks answer: each resolved room with its
// DP rank and rule, then the unresolved rooms.
func writeLookup(w io.Writer, resp *pb.LookupDPRanksResponse) error {
	if len(resp.GetResolved()) > 0 {
		err := table(w, func(tw io.Writer) {
			fmt.Fprint(tw, "ROOM\tDP RANK\tRULE\n")
			for _, r := range resp.GetResolved() {
				fmt.Fprintf(tw, "%d\t%d\t%s\n", r.GetRoom(), r.GetDpRank(), ruleName(r.GetRule()))
			}
		})
		if err != nil {
			return err
		}
	}
	if u := resp.GetUnresolved(); len(u) > 0 {
		ids := make([]string, len(u))
		for i, id := range u {
			ids[i] = strconv.FormatUint(id, 10)
		}
		_, err := fmt.Fprintf(w, "unresolved (no rule applies yet): %s\n", strings.Join(ids, " "))
		return err
	}
	return nil
}
