package bench

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// The summary as a table, for people (--json writes benchJSON instead).

// writeTable prints the summary for people.
func (s *benchSummary) writeTable(w io.Writer) {
	s.writeRooms(w)
	s.writeLatency(w)
	s.writeCost(w)
	s.writeMessages(w)
	s.writeBare(w)
}

// writeRooms writes where the bench ran and how many rooms ended how.
func (s *benchSummary) writeRooms(w io.Writer) {
	lc := s.lifecycle
	where := "in-process daemon on " + s.target
	if !s.inProcess {
		where = "daemon at " + s.target
	}
	fmt.Fprintf(w, "decodeplane bench: %s\n", where)
	for _, l := range s.setup {
		fmt.Fprintf(w, "  %s\n", l)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-26s %d\n", "rooms ok", lc.ok)
	fmt.Fprintf(w, "%-26s %d\n", "rooms failed", lc.failed)
	for reason, f := range lc.reasons {
		fmt.Fprintf(w, "  %-24s %d  (e.g. %s)\n", reason, f.Count, benchTruncate(f.Example, 140))
	}
	switch {
	case lc.interrupted && s.o.rateMode():
		fmt.Fprintf(w, "%-26s %s\n", "stopped", "by signal; rooms in flight finished")
	case lc.interrupted:
		fmt.Fprintf(w, "%-26s %s\n", "interrupted", "yes: the figures cover the rooms that finished")
	}
	fmt.Fprintf(w, "%-26s %.2f s\n", "wall time", lc.wall.Seconds())
	fmt.Fprintf(w, "%-26s %.0f\n", "rooms/s", s.rps)
	for _, d := range s.byDaemon {
		fmt.Fprintf(w, "  %-24s %d rooms succeeded, %d handed off there by every prefill rank (told only the room)\n", "on "+d.Addr, d.Rooms, d.Routed)
	}
	fmt.Fprintln(w)
}

// writeLatency writes the rooms' latency percentiles.
func (s *benchSummary) writeLatency(w io.Writer) {
	lc := s.lifecycle
	fmt.Fprintf(w, "%-26s %9s %9s %9s %9s\n", "latency (ms)", "p50", "p90", "p99", "max")
	for _, row := range []struct {
		name string
		d    []time.Duration
	}{
		{"open -> destination", lc.openDest},
		{"destination -> success", lc.destSucc},
		{"lifecycle (open->release)", lc.life},
		{"last chunk -> engine told", lc.chunkTold},
	} {
		p := benchPercentilesMS(row.d)
		fmt.Fprintf(w, "%-26s %9.3f %9.3f %9.3f %9.3f\n", row.name, p.P50, p.P90, p.P99, p.Max)
	}
	fmt.Fprintln(w)
}

// writeCost writes what a room cost the bench's process (and the
// daemon's, from its metrics) in CPU and allocations.
func (s *benchSummary) writeCost(w io.Writer) {
	lc := s.lifecycle
	fmt.Fprintf(w, "%-26s %.1f µs  (%s)\n", "CPU per room", s.perRoom(float64(lc.usage.cpu))/1e3, s.cpuScope())
	fmt.Fprintf(w, "%-26s %.0f objects, %s  (runtime/metrics heap allocations, whole process)\n", "heap allocs per room",
		s.perRoom(float64(lc.usage.allocObjects)), benchBytes(s.perRoom(float64(lc.usage.allocBytes))))
	fmt.Fprintf(w, "%-26s %.0f%%  (the Go runtime's estimate)\n", "GC share of CPU", 100*s.gcShare())
	if d := lc.daemon; d != nil {
		if !s.inProcess {
			fmt.Fprintf(w, "%-26s %.1f µs CPU, %.0f objects, %s per room  (its process_cpu_seconds_total, go_memstats_*)\n", "daemon",
				s.perRoom(d.cpuSeconds)*1e6, s.perRoom(d.mallocs), benchBytes(s.perRoom(d.allocBytes)))
		}
		fmt.Fprintf(w, "%-26s %.0f passes  (decodeplane_admission_blocked_total; %.0f rooms admitted)\n", "admission blocked", d.admissionBlock, d.admitted)
	}
	if lc.hbErrors > 0 {
		fmt.Fprintf(w, "%-26s %d\n", "heartbeat errors", lc.hbErrors)
	}
	fmt.Fprintln(w)
}

// writeMessages writes the messages a room took, per kind.
func (s *benchSummary) writeMessages(w io.Writer) {
	fmt.Fprintf(w, "%-26s %.2f unary calls (%s)\n", "messages per room", s.mix.Unary, s.methodList(benchRoomUnary, false))
	streams := slices.Concat(benchRoomStreams, benchRoomSessions)
	fmt.Fprintf(w, "%-26s %.2f stream opens (%s)\n", "", s.mix.StreamOpens, s.methodList(streams, false))
	fmt.Fprintf(w, "%-26s %.2f stream messages received (%s)\n", "", s.mix.StreamMessages, s.methodList(streams, true))
	if s.mix.StreamSent > 0 {
		fmt.Fprintf(w, "%-26s %.2f session messages sent (%s)\n", "", s.mix.StreamSent, s.sentList())
	}
	fmt.Fprintf(w, "%-26s %.2f messages in all, both ways\n", "", s.mix.Total)
	fmt.Fprintln(w)
}

// writeBare writes the bare-gRPC measurement, its bound for the run's
// mix and the ratios, or why it was not measured.
func (s *benchSummary) writeBare(w io.Writer) {
	b := s.bare
	if b == nil {
		fmt.Fprintf(w, "%-26s not measured: %s\n", "bare gRPC", s.bareSkipped)
		return
	}
	fmt.Fprintf(w, "bare gRPC: a separate server in this process, %s; concurrency %d over %d connections, %s measured per test\n",
		b.Options, b.Concurrency, b.Conns, b.Duration)
	assumed := ""
	if !s.inProcess {
		assumed = "; --target: the daemon is taken to trace as the bench does"
	}
	fmt.Fprintf(w, "  otelgrpc handlers as this run has them: on the %s (client.New always installs the client's; the daemon its server's only when it traces%s); the bound and ratio use these\n", b.Otelgrpc, assumed)
	if m := b.Mix; m != nil {
		fmt.Fprintf(w, "  stream mix per room, from %s:\n", m.Source)
		for _, r := range []struct {
			name string
			m    benchBareSessionMix
		}{{"EngineSession", m.Engine}, {"PrefillSession", m.Prefill}} {
			fmt.Fprintf(w, "    %-14s x %.2f streams: %.2f sent (%.0f B), %.2f received (%.0f B) per stream\n",
				r.name, r.m.Streams, r.m.Sent, r.m.SentBytes, r.m.Received, r.m.ReceivedBytes)
		}
	}
	for _, bb := range []*benchBare{b, s.bareNoOtel} {
		if bb == nil {
			continue
		}
		results := []benchBareResult{bb.Unary, bb.StreamOpen, bb.StreamK, bb.StreamMsg}
		if bb.Mix != nil {
			results = []benchBareResult{bb.StreamMix}
		}
		fmt.Fprintf(w, "  otelgrpc on %s:\n", bb.Otelgrpc)
		for _, r := range results {
			rate := fmt.Sprintf("%10.0f /s", r.PerSecond)
			if r.Negligible {
				rate = fmt.Sprintf("%13s", "negligible")
			}
			fmt.Fprintf(w, "    %-40s %s   %6.1f µs CPU, %5.1f allocs, %s each\n", r.Name, rate, r.CPUMicrosPerOp, r.AllocsPerOp, benchBytes(r.BytesPerOp))
			if r.SentPerOp > 0 || r.ReceivedPerOp > 0 {
				fmt.Fprintf(w, "    %-40s %.2f sent, %.2f received per room (counted)\n", "", r.SentPerOp, r.ReceivedPerOp)
			}
		}
	}
	if s.bound > 0 {
		if b.Mix != nil {
			fmt.Fprintf(w, "%-26s %.0f rooms/s  (bare rooms of the stream mix, otelgrpc on %s)\n", "bare bound for this mix", s.bound, b.Otelgrpc)
		} else {
			msgRate := fmt.Sprintf("%.0f", b.StreamMsg.PerSecond)
			if b.StreamMsg.Negligible {
				msgRate = "inf"
			}
			fmt.Fprintf(w, "%-26s %.0f rooms/s = 1 / (%.2f unary/%.0f + %.2f opens/%.0f + %.2f more messages/%s)  (otelgrpc on %s)\n", "bare bound for this mix", s.bound,
				s.mix.Unary, b.Unary.PerSecond, s.mix.StreamOpens, b.StreamOpen.PerSecond, s.extraMessages(), msgRate, b.Otelgrpc)
		}
		fmt.Fprintf(w, "%-26s %.3f  (measured %.0f rooms/s / bare bound %.0f rooms/s)\n", "ratio", s.ratio, s.rps, s.bound)
	}
	if s.boundNoOtel > 0 {
		fmt.Fprintf(w, "%-26s %.0f rooms/s  (no otelgrpc handler; ratio %.3f)\n", "bare bound, no otelgrpc", s.boundNoOtel, s.ratioNoOtel)
	}
	if s.cpuRatio > 0 {
		fmt.Fprintf(w, "%-26s %.3f  (bare CPU for this mix %.1f µs / measured %.1f µs per room; steadier than the ratio on a busy machine)\n",
			"CPU ratio", s.cpuRatio, s.cpuBound*1e6, s.roomCPU()*1e6)
	}
	if s.cpuRatioNoOtel > 0 {
		fmt.Fprintf(w, "%-26s %.3f  (bare CPU without otelgrpc %.1f µs / measured %.1f µs per room)\n",
			"CPU ratio, no otelgrpc", s.cpuRatioNoOtel, s.cpuBoundNoOtel*1e6, s.roomCPU()*1e6)
	}
}
