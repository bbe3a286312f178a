package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Scenario is one named fault: what it injects, what it proves, its two
// variants and the function that runs it.
type Scenario struct {
	// Name is how it is picked (`decodeplane faults lost-ack`).
	Name string
	// Fault is the fault injected, in one line.
	Fault string
	// Proves is what passing it shows.
	Proves string
	// Short runs under `make test` (a few seconds); Full is what
	// TESTING.md's table records.
	Short, Full Variant
	run         func(ctx context.Context, s *Stage) error
}

// Variant is one size of a scenario.
type Variant struct {
	// Rooms is how many rooms the scenario opens (each scenario reads it
	// as its scale).
	Rooms int
	// Bound is the most time any room may take to reach a terminal state
	// from the later of its opening and the fault.
	Bound time.Duration
	// Reusable, when set, bounds the p99 of abort → pages reusable.
	Reusable time.Duration
	// Logs bounds the lines the daemons and agents write.
	Logs LogBound
}

// LogBound is the most log lines (at INFO and above) the daemons and
// agents of a scenario may write, whatever the number of rooms: a failure
// that hits many rooms is logged once per cause per interval with a count
// (internal/stormlog), its per-room detail is in the rooms' events.
type LogBound struct {
	Fixed int
}

func (b LogBound) lines() int { return b.Fixed }

func (b LogBound) String() string {
	return fmt.Sprintf("at most %d", b.Fixed)
}

// Binaries are the programs the scenarios run.
type Binaries struct {
	Daemon string // decodeplane
	Agent  string // decodeplane-agent
	Etcd   string // decodeplane-dev-etcd
}

// Options shape Run.
type Options struct {
	Bins Binaries
	// Full runs the full variants instead of the short ones.
	Full bool
	// Dir is where each scenario's files go (a temporary directory when
	// empty); Keep keeps them, with every process's output.
	Dir  string
	Keep bool
	// JSON prints one JSON object per scenario instead of a line.
	JSON bool
	// Progress receives progress lines (nil: none).
	Progress io.Writer
}

// Scenarios lists every scenario, in the order they run.
func Scenarios() []*Scenario {
	return slices.Concat(prefillScenarios(), transferScenarios(), stormScenarios(), etcdScenarios(), daemonScenarios())
}

// Lookup returns the scenarios named (every one when names is empty), or
// an error naming the unknown ones and the known ones.
func Lookup(names []string) ([]*Scenario, error) {
	all := Scenarios()
	if len(names) == 0 {
		return all, nil
	}
	var out []*Scenario
	var unknown []string
	for _, n := range names {
		i := slices.IndexFunc(all, func(s *Scenario) bool { return s.Name == n })
		if i < 0 {
			unknown = append(unknown, n)
			continue
		}
		out = append(out, all[i])
	}
	if len(unknown) > 0 {
		known := make([]string, len(all))
		for i, s := range all {
			known[i] = s.Name
		}
		return nil, fmt.Errorf("unknown scenario %s (known: %s)", strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	return out, nil
}

// List writes every scenario: its name, fault and what it proves, and
// its two variants.
func List(w io.Writer) {
	for _, s := range Scenarios() {
		fmt.Fprintf(w, "%s\n  fault:  %s\n  proves: %s\n  short:  %s\n  full:   %s\n", s.Name, s.Fault, s.Proves, s.Short, s.Full)
	}
}

func (v Variant) String() string {
	out := fmt.Sprintf("%d rooms, bound %v, log lines %s", v.Rooms, v.Bound, v.Logs)
	if v.Reusable > 0 {
		out += fmt.Sprintf(", abort → reusable p99 %v", v.Reusable)
	}
	return out
}

// Run runs the scenarios one after the other and reports each; it
// returns how many failed.
func Run(ctx context.Context, scs []*Scenario, o Options, w io.Writer) int {
	root := o.Dir
	if root == "" {
		dir, err := os.MkdirTemp("", "decodeplane-faults-")
		if err != nil {
			fmt.Fprintf(w, "FAIL: %v\n", err)
			return len(scs)
		}
		root = dir
		if !o.Keep {
			defer os.RemoveAll(dir)
		}
	}
	failed := 0
	for _, sc := range scs {
		res := RunOne(ctx, sc, o, filepath.Join(root, sc.Name))
		if !res.Passed() {
			failed++
		}
		if o.JSON {
			b, _ := json.Marshal(res)
			fmt.Fprintln(w, string(b))
		} else {
			fmt.Fprint(w, res.Report())
		}
	}
	return failed
}

// RunOne runs one scenario in dir and returns its result.
func RunOne(ctx context.Context, sc *Scenario, o Options, dir string) *Result {
	v := sc.Short
	variant := "short"
	if o.Full {
		v, variant = sc.Full, "full"
	}
	res := &Result{Scenario: sc.Name, Variant: variant, Bound: v.Bound, ReusableBound: v.Reusable, LogBound: v.Logs}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.fail("%v", err)
		return res
	}
	// A scenario that hangs is cut: its rooms' own bounds are far below.
	ctx, cancel := context.WithTimeout(ctx, 3*v.Bound+2*time.Minute)
	defer cancel()
	s := newStage(sc, v, o, dir, res)
	start := time.Now()
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		return sc.run(ctx, s)
	}()
	if err != nil {
		res.fail("%v", err)
	}
	s.finish(ctx)
	res.Took = time.Since(start)
	if !res.Passed() && o.Keep {
		res.Notes = append(res.Notes, "process output kept in "+dir)
	}
	return res
}
