// Command decodeplane-faults runs decodeplane's fault scenarios: named,
// repeatable faults (a lost acknowledgement, a dropped completion, a
// prefill restarted or replaced, a silent rank, an abort storm, etcd
// stopped or partitioned, a daemon killed or paused, ...) injected into
// the real binaries, each with its pass criteria (internal/faults).
//
//	decodeplane-faults --list
//	decodeplane-faults [--full] [--json] [--keep] [--dir DIR] [--bin DIR] [SCENARIO...]
//
// Users run it as `decodeplane faults ...`: the daemon binary runs this one
// from its own directory, so that the daemon links none of the suite. It
// runs the daemon (decodeplane), the reference transfer agent
// (decodeplane-agent) and the development etcd (decodeplane-dev-etcd) from
// --bin (default: the directory of this executable; `make build` puts them
// all in bin/). Without SCENARIO it runs every scenario. Each prints one
// line, PASS or FAIL with its figures, then its notes and what failed.
//
// Exit codes: 0 every scenario passed, 1 one failed, 2 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/decodeplane/decodeplane/internal/buildinfo"
	"github.com/decodeplane/decodeplane/internal/faults"
)

// version and commit are set at build time (make build).
var version, commit = "dev", ""

func init() { version, commit = buildinfo.Resolve(version, commit) }

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("faults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: decodeplane faults [flags] [SCENARIO...]

Runs the named fault scenarios (all of them without SCENARIO) against the
real binaries: each starts what it needs (daemons, the reference transfer
agent, the development etcd, a simulated decode engine and prefill fleet),
injects its fault and checks the outcome: every room ends within the
scenario's bound, no page is held twice, the daemon's reuse counter
(decodeplane_page_reuse_violations_total) stays 0, the daemons' log lines
stay within the scenario's bound, and the abort → pages-reusable latency.
--list says what each scenario injects and proves. The short variants run
in seconds (make test runs them); --full runs the variants TESTING.md
records.

Flags:
`)
		fs.PrintDefaults()
	}
	list := fs.Bool("list", false, "list the scenarios: what each injects and proves, and its variants")
	full := fs.Bool("full", false, "run the full variants (thousands of rooms) instead of the short ones")
	asJSON := fs.Bool("json", false, "print one JSON object per scenario instead of a line")
	keep := fs.Bool("keep", false, "keep the scenarios' directories (every process's output)")
	dir := fs.String("dir", "", "where the scenarios' directories go (default: a temporary directory)")
	bin := fs.String("bin", "", "the directory of decodeplane, decodeplane-agent and decodeplane-dev-etcd (default: this executable's)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(stdout, buildinfo.Line("decodeplane-faults", version, commit))
		return exitOK
	}
	if *list {
		faults.List(stdout)
		return exitOK
	}
	scs, err := faults.Lookup(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "decodeplane faults: %v\n", err)
		return exitUsage
	}
	bins, err := binaries(*bin)
	if err != nil {
		fmt.Fprintf(stderr, "decodeplane faults: %v\n", err)
		return exitFailure
	}
	o := faults.Options{Bins: bins, Full: *full, Dir: *dir, Keep: *keep, JSON: *asJSON}
	if !*quiet {
		o.Progress = stderr
	}
	if failed := faults.Run(ctx, scs, o, stdout); failed > 0 {
		fmt.Fprintf(stderr, "decodeplane faults: %d of %d scenarios failed\n", failed, len(scs))
		return exitFailure
	}
	return exitOK
}

// binaries finds the programs the scenarios run in dir (default: the
// directory of this executable).
func binaries(dir string) (faults.Binaries, error) {
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			return faults.Binaries{}, fmt.Errorf("the path of this executable: %w", err)
		}
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dir = filepath.Dir(exe)
	}
	b := faults.Binaries{Daemon: filepath.Join(dir, "decodeplane"), Agent: filepath.Join(dir, "decodeplane-agent"), Etcd: filepath.Join(dir, "decodeplane-dev-etcd")}
	for _, p := range []string{b.Daemon, b.Agent, b.Etcd} {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			return b, fmt.Errorf("%s is missing: the scenarios run the daemon, the reference agent and the development etcd from %s; build them all with `make build` (or go build -o DIR/ ./cmd/... and --bin DIR)", p, dir)
		}
	}
	return b, nil
}
