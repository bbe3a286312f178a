package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Stage is one scenario's run: its processes, engines and prefills, the
// time of its fault and the figures the common checks collect.
type Stage struct {
	sc  *Scenario
	v   Variant
	o   Options
	dir string
	res *Result

	mu       sync.Mutex
	procs    []*proc // every process started, stopped at the end
	logged   []*proc // the daemons and agents: their lines are counted
	daemons  []*Daemon
	engines  []*Engine
	prefills []*Prefill
	closers  []func() // connections and the like, closed at the end
	faultAt  time.Time
	started  time.Time
	// violations is each daemon process's last scrape of the reuse
	// counter (a killed daemon's is its last before the kill).
	violations map[*proc]float64
}

func newStage(sc *Scenario, v Variant, o Options, dir string, res *Result) *Stage {
	return &Stage{sc: sc, v: v, o: o, dir: dir, res: res, started: time.Now(), violations: map[*proc]float64{}}
}

// rooms is the variant's scale.
func (s *Stage) rooms() int { return s.v.Rooms }

// full reports whether the full variant runs.
func (s *Stage) full() bool { return s.o.Full }

// progress writes a progress line.
func (s *Stage) progress(format string, a ...any) {
	if s.o.Progress == nil {
		return
	}
	fmt.Fprintf(s.o.Progress, "  %-24s %6.1fs  %s\n", s.sc.Name, time.Since(s.started).Seconds(), fmt.Sprintf(format, a...))
}

// fault marks the moment the fault is injected: rooms opened before it
// are bounded from it.
func (s *Stage) fault(what string) {
	s.mu.Lock()
	if s.faultAt.IsZero() {
		s.faultAt = time.Now()
	}
	s.mu.Unlock()
	s.progress("fault: %s", what)
}

// faultTime is when the fault was injected (zero before).
func (s *Stage) faultTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faultAt
}

// check records a failed scenario check when ok is false.
func (s *Stage) check(ok bool, format string, a ...any) {
	if !ok {
		s.res.fail(format, a...)
	}
}

// note records one of the scenario's own figures.
func (s *Stage) note(format string, a ...any) { s.res.note(format, a...) }

// finish runs the common checks and stops every process.
func (s *Stage) finish(ctx context.Context) {
	defer s.teardown()
	wctx, cancel := context.WithTimeout(ctx, max(s.v.Bound, 10*time.Second))
	defer cancel()
	for _, e := range s.engines {
		if err := e.waitSettled(wctx); err != nil {
			s.res.fail("%v", err)
		}
	}
	s.roomFigures()
	s.abortFigures()
	for _, e := range s.engines {
		s.res.note("%s", e.counts())
	}
	for _, d := range s.daemons {
		if d.p.running() {
			s.scrapeViolations(ctx, d)
			if err := s.checkPages(ctx, d, true); err != nil {
				s.res.fail("%s: %v", d.name, err)
			}
		}
	}
	var total float64
	for _, v := range s.violations {
		total += v
	}
	s.res.Violations = total
	s.check(total == 0, "decodeplane_page_reuse_violations_total is %g, want 0", total)
	s.stopLogged()
	lines, debug := 0, 0
	for _, p := range s.logged {
		n, d := p.out.count()
		lines, debug = lines+n, debug+d
	}
	if debug > 0 {
		s.res.note("%d lines at DEBUG not counted (a process run at debug level)", debug)
	}
	s.res.LogLines, s.res.LogLimit = lines, s.v.Logs.lines()
	s.check(lines <= s.res.LogLimit, "the daemons and agents wrote %d log lines, bound %d (%d rooms)", lines, s.res.LogLimit, s.res.Rooms)
}

// roomFigures checks that every room the engines opened reached a terminal
// state within the bound, and records the worst.
func (s *Stage) roomFigures() {
	fault := s.faultTime()
	var live, unusable, events []string
	for _, e := range s.engines {
		for _, r := range e.snapshot() {
			if r.OpenErr != nil {
				continue
			}
			s.res.Rooms++
			from := r.Opened
			if !fault.IsZero() && fault.After(from) {
				from = fault
			}
			end := r.end()
			if end.IsZero() {
				live = append(live, fmt.Sprintf("%d on %s (%s)", r.ID, e.name, r.Phase))
				continue
			}
			if took := end.Sub(from); took > s.res.Worst {
				s.res.Worst, s.res.WorstRoom = took, r.ID
			}
			if r.Gone.IsZero() && r.Reusable.IsZero() {
				unusable = append(unusable, fmt.Sprintf("%d on %s (%s)", r.ID, e.name, r.Phase))
			}
			if r.Dups > 0 || r.Gaps > 0 {
				events = append(events, fmt.Sprintf("%d on %s (%d twice, %d skipped)", r.ID, e.name, r.Dups, r.Gaps))
			}
		}
	}
	s.check(len(live) == 0, "%d rooms never reached a terminal state: %s", len(live), some(live))
	s.check(len(unusable) == 0, "%d rooms ended but their pages never became reusable: %s", len(unusable), some(unusable))
	s.check(len(events) == 0, "%d rooms' events did not each come once, in order: %s", len(events), some(events))
	s.check(s.res.Rooms > 0, "no room was opened")
	s.check(s.res.Worst <= s.v.Bound, "room %d took %s to reach a terminal state, bound %s", s.res.WorstRoom, dur(s.res.Worst), dur(s.v.Bound))
}

// some lists the first three of items, and how many more.
func some(items []string) string {
	if len(items) <= 3 {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:3], ", "), len(items)-3)
}

// abortFigures computes the abort → pages-reusable latency of the rooms the
// engines aborted.
func (s *Stage) abortFigures() {
	var ds []time.Duration
	for _, e := range s.engines {
		for _, r := range e.snapshot() {
			if r.Aborted.IsZero() || r.OpenErr != nil {
				continue
			}
			if r.Reusable.IsZero() {
				if r.Gone.IsZero() {
					s.res.fail("room %d on %s was aborted and its pages never became reusable (phase %s)", r.ID, e.name, r.Phase)
				}
				continue
			}
			ds = append(ds, max(r.Reusable.Sub(r.Aborted), 0))
		}
	}
	s.res.Aborted = len(ds)
	s.res.ReusableP50, s.res.ReusableP99 = percentile(ds, 50), percentile(ds, 99)
	if s.v.Reusable > 0 && len(ds) > 0 {
		s.check(s.res.ReusableP99 <= s.v.Reusable, "abort → pages reusable p99 %s, bound %s", dur(s.res.ReusableP99), dur(s.v.Reusable))
	}
}

// teardown stops every engine, prefill and process.
// stopLogged stops the daemons and agents still running with SIGTERM, the
// last started first (a daemon before the agent it uses), and waits for
// each, so that the summaries their storm loggers still hold (a count of
// the events since the cause's last line) are written and counted. One
// that does not exit within signal's bound is killed, and that is a
// failure.
func (s *Stage) stopLogged() {
	for _, p := range slices.Backward(s.logged) {
		if !p.running() {
			continue
		}
		if err := p.signal(syscall.SIGTERM); err != nil {
			s.res.fail("stopping %v", err)
		}
	}
}

func (s *Stage) teardown() {
	for _, e := range s.engines {
		e.close()
	}
	for _, p := range s.prefills {
		p.Close()
	}
	for _, d := range s.daemons {
		d.closeClient()
	}
	s.mu.Lock()
	procs, closers := s.procs, s.closers
	s.mu.Unlock()
	for _, f := range closers {
		f()
	}
	for _, p := range procs {
		if p.running() {
			_ = p.cmd.Process.Kill() // a stopped (SIGSTOP) process dies of it too
			<-p.exited
		}
		p.file.Close()
	}
}
