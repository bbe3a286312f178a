package faults

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Result is one scenario's outcome and figures.
type Result struct {
	Scenario string `json:"scenario"`
	Variant  string `json:"variant"`
	// Rooms the scenario opened; Bound and Worst: the stated and the
	// observed worst time to a terminal state (from the later of the
	// room's opening and the fault), and the room that took it.
	Rooms     int           `json:"rooms"`
	Bound     time.Duration `json:"bound_ns"`
	Worst     time.Duration `json:"worst_ns"`
	WorstRoom uint64        `json:"worst_room"`
	// Aborted rooms and their abort → pages-reusable latency.
	Aborted       int           `json:"aborted"`
	ReusableP50   time.Duration `json:"reusable_p50_ns"`
	ReusableP99   time.Duration `json:"reusable_p99_ns"`
	ReusableBound time.Duration `json:"reusable_bound_ns,omitempty"`
	// Violations is decodeplane_page_reuse_violations_total summed over
	// every daemon the scenario ran.
	Violations float64 `json:"violations"`
	// LogLines the daemons and agents wrote, and their bound.
	LogLines int      `json:"log_lines"`
	LogBound LogBound `json:"log_bound"`
	LogLimit int      `json:"log_limit"`
	// PagesChecked is how many page samples were taken (each a full
	// listing of the rooms holding pages).
	PagesChecked int           `json:"pages_checked"`
	Notes        []string      `json:"notes,omitempty"`
	Failures     []string      `json:"failures,omitempty"`
	Took         time.Duration `json:"took_ns"`

	mu sync.Mutex
}

// Passed reports whether no check failed.
func (r *Result) Passed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Failures) == 0
}

// fail records a failed check.
func (r *Result) fail(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := fmt.Sprintf(format, a...)
	if !slices.Contains(r.Failures, msg) {
		r.Failures = append(r.Failures, msg)
	}
}

// note records a figure of the scenario's own.
func (r *Result) note(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Notes = append(r.Notes, fmt.Sprintf(format, a...))
}

// Report is the result as text: one line of figures, then the notes and
// the failures, indented.
func (r *Result) Report() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	verdict := "PASS"
	if len(r.Failures) > 0 {
		verdict = "FAIL"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s): %d rooms, worst %s of bound %s", verdict, r.Scenario, r.Variant, r.Rooms, dur(r.Worst), dur(r.Bound))
	if r.Aborted > 0 {
		fmt.Fprintf(&b, ", abort→reusable p50 %s p99 %s (%d aborted)", dur(r.ReusableP50), dur(r.ReusableP99), r.Aborted)
	} else {
		b.WriteString(", no abort")
	}
	fmt.Fprintf(&b, ", reuse violations %g, log lines %d of %d, %s\n", r.Violations, r.LogLines, r.LogLimit, dur(r.Took))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "    %s\n", n)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(&b, "    FAILED: %s\n", f)
	}
	return b.String()
}

// dur prints a duration with a precision fit for the figures.
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// percentile is the p-th percentile (0..100) of ds, sorted in place.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(float64(len(ds)-1) * p / 100)
	return ds[i]
}
