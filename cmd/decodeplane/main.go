// Command decodeplane is the decode-side control plane daemon for
// prefill/decode disaggregated LLM serving.
//
//	decodeplane serve    [--config FILE] [--listen ADDR] [flags]   run the daemon
//	decodeplane validate [--config FILE] [--explain] [flags]       check a configuration
//	decodeplane bench    [flags]                                    benchmark the control path (runs decodeplane-bench)
//	decodeplane faults   [--list] [--full] [SCENARIO...]            run the fault scenarios (runs decodeplane-faults)
//	decodeplane version
//
// Exit codes: 0 success, 1 runtime failure, 2 invalid configuration or usage,
// 3 serve stopped on SIGINT/SIGTERM but the graceful stop was cut short
// (rooms failed with FAILURE_CODE_SHUTDOWN, or server.shutdown_timeout ended
// GracefulStop).
//
// Under systemd (Type=notify, $NOTIFY_SOCKET set) serve sends READY=1 once
// its listeners serve and STOPPING=1 when SIGINT/SIGTERM starts the drain
// (sdnotify.go; deploy/systemd/decodeplane.service).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/decodeplane/decodeplane/internal/buildinfo"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/telemetry"
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (make build: the git tag and commit);
// init completes them from Go's VCS stamp (internal/buildinfo).
var version, commit = "dev", ""

func init() { version, commit = buildinfo.Resolve(version, commit) }

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitCutShort: serve stopped on a signal but had to fail rooms or
	// claims with FAILURE_CODE_SHUTDOWN, or GracefulStop hit its deadline.
	exitCutShort = 3
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

func run(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		return cmdServe(args[1:], environ, stdout, stderr)
	case "validate":
		return cmdValidate(args[1:], environ, stdout, stderr)
	case "bench":
		return cmdBench(args[1:], environ, stdout, stderr)
	case "faults":
		return cmdFaults(args[1:], environ, stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, buildinfo.Line("decodeplane", version, commit))
		return exitOK
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "decodeplane: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `decodeplane — the decode-side control plane for PD-disaggregated LLM serving

Usage:
  decodeplane serve    [--config FILE] [--listen ADDR] [flags]   run the daemon
  decodeplane validate [--config FILE] [--explain] [flags]       check a configuration, print every problem
  decodeplane bench    [flags]                                    benchmark the control path against bare gRPC
  decodeplane faults   [--list] [--full] [SCENARIO...]            run the named fault scenarios against the real binaries
  decodeplane version                                             the release tag, commit and Go version

Configuration precedence: defaults < --config file < environment (SGLANG_* then
DECODEPLANE_*) < flags. Run 'decodeplane validate --explain' to see every key,
its value and where it came from. 'decodeplane <command> -h' lists the flags.
`)
}

// loadConfig loads and validates; it returns the problems as one list.
func loadConfig(cf *config.Flags, environ []string) (*config.Loaded, []error) {
	l, err := config.Load(cf.Path, environ, cf.Overrides)
	var problems []error
	if err != nil {
		problems = append(problems, config.Flatten(err)...)
	}
	if err := l.Config.Validate(); err != nil {
		problems = append(problems, config.Flatten(err)...)
	}
	// The OTEL_* variables serve reads at startup, checked here too so that
	// validate reports everything serve would refuse.
	problems = append(problems, telemetry.CheckEnv(environ)...)
	return l, problems
}

func cmdValidate(args, environ []string, stdout, stderr io.Writer) int {
	cf := config.NewFlags("validate", stderr)
	explain := cf.FS.Bool("explain", false, "print every key, its effective value and where it came from")
	if err := cf.Parse(args, environ); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane validate: %v\n", err)
		return exitUsage
	}
	l, problems := loadConfig(cf, environ)
	if *explain {
		config.PrintExplain(stdout, l)
	}
	if len(problems) > 0 {
		config.PrintProblems(stderr, l, problems)
		return exitUsage
	}
	config.PrintWarnings(stderr, l.Warnings())
	src := "the embedded defaults"
	if cf.Path != "" {
		src = cf.Path
	}
	overrides := 0
	for _, k := range l.Keys() {
		if s := l.Sources[k]; strings.HasPrefix(s, "env ") || strings.HasPrefix(s, "flag ") {
			overrides++
		}
	}
	if overrides == 1 {
		src += " with 1 setting from the environment or flags"
	} else if overrides > 1 {
		src += fmt.Sprintf(" with %d settings from the environment or flags", overrides)
	}
	layout := l.Config.Decode().Layout()
	fmt.Fprintf(stdout, "configuration is valid (%s): %s, transfer path %s (backend %s), dp %d, staging %v\n",
		src, layout, l.Config.Transfer.Path, l.Config.Transfer.Backend, l.Config.Parallel.DP, l.Config.Staging.Enabled)
	return exitOK
}
