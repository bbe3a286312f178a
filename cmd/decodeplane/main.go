// Command decodeplane is the decode-side control plane daemon for
// prefill/decode disaggregated LLM serving.
//
//	decodeplane serve    [--config FILE] [--listen ADDR] [flags]   run the daemon
//	decodeplane validate [--config FILE] [--explain] [flags]       check a configuration
//	decodeplane bench    [flags]                                    benchmark the control path
//	decodeplane version
//
// Exit codes: 0 success, 1 runtime failure, 2 invalid configuration or usage,
// 3 serve stopped on SIGINT/SIGTERM but the graceful stop was cut short
// (rooms failed with FAILURE_CODE_SHUTDOWN, or server.shutdown_timeout ended
// GracefulStop).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/decodeplane/decodeplane/prealloc"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "decodeplane %s\n", version)
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
  decodeplane version

Configuration precedence: defaults < --config file < environment (SGLANG_* then
DECODEPLANE_*) < flags. Run 'decodeplane validate --explain' to see every key,
its value and where it came from. 'decodeplane <command> -h' lists the flags.
`)
}

// configFlags are the flags shared by serve and validate.
type configFlags struct {
	path      string
	overrides Overrides
	fs        *flag.FlagSet
	sets      setFlag
}

type setFlag struct{ pairs *[]FlagSetting }

func (s setFlag) String() string { return "" }
func (s setFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", v)
	}
	*s.pairs = append(*s.pairs, FlagSetting{Flag: "--set " + k, Key: strings.TrimSpace(k), Value: val})
	return nil
}

// keyFlag is a flag bound to one configuration key.
type keyFlag struct {
	name, key string
	pairs     *[]FlagSetting
}

func (k keyFlag) String() string { return "" }
func (k keyFlag) Set(v string) error {
	*k.pairs = append(*k.pairs, FlagSetting{Flag: "--" + k.name, Key: k.key, Value: v})
	return nil
}

// boolKeyFlag is a keyFlag that may be given without a value (--reflection).
type boolKeyFlag struct{ keyFlag }

func (boolKeyFlag) IsBoolFlag() bool { return true }

func newConfigFlags(name string, stderr io.Writer) *configFlags {
	cf := &configFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	cf.fs.SetOutput(stderr)
	cf.sets = setFlag{pairs: &cf.overrides.Pairs}
	cf.fs.StringVar(&cf.path, "config", "", "configuration file (YAML); default: $DECODEPLANE_CONFIG, else the embedded defaults")
	for _, kf := range []struct{ name, key, usage string }{
		{"listen", "server.listen", "gRPC listen address (server.listen, default 127.0.0.1:7600)"},
		{"metrics-listen", "server.metrics_listen", "Prometheus /metrics address (server.metrics_listen, default 127.0.0.1:7601; empty disables)"},
		{"transfer-path", "transfer.path", "transfer path: sim or delegate (transfer.path)"},
		{"agent", "transfer.delegate.target", "transfer agent address for the delegate path (transfer.delegate.target)"},
		{"log-level", "log.level", "log level: debug, info, warn, error (log.level)"},
		{"log-format", "log.format", "log format: text or json (log.format)"},
		{"tls-cert", "server.tls.cert_file", "serve gRPC over TLS with this PEM certificate (server.tls.cert_file)"},
		{"tls-key", "server.tls.key_file", "the PEM private key of --tls-cert (server.tls.key_file)"},
		{"tls-client-ca", "server.tls.client_ca_file", "mutual TLS: verify client certificates against this PEM CA bundle (server.tls.client_ca_file)"},
	} {
		cf.fs.Var(keyFlag{name: kf.name, key: kf.key, pairs: &cf.overrides.Pairs}, kf.name, kf.usage)
	}
	cf.fs.Var(boolKeyFlag{keyFlag{name: "reflection", key: "server.reflection", pairs: &cf.overrides.Pairs}}, "reflection", "register gRPC server reflection (server.reflection, default true); --reflection=false turns it off")
	cf.fs.Var(cf.sets, "set", "set any configuration key: --set kv_pool.kind=mla (repeatable)")
	return cf
}

func (cf *configFlags) parse(args, environ []string) error {
	if err := cf.fs.Parse(args); err != nil {
		return err
	}
	if cf.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(cf.fs.Args(), " "))
	}
	if cf.path == "" {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, "DECODEPLANE_CONFIG="); ok {
				cf.path = v
			}
		}
	}
	return nil
}

// loadConfig loads and validates; it returns the problems as one list.
func loadConfig(cf *configFlags, environ []string) (*Loaded, []error) {
	l, err := Load(cf.path, environ, cf.overrides)
	var problems []error
	if err != nil {
		problems = append(problems, flatten(err)...)
	}
	if err := l.Config.Validate(); err != nil {
		problems = append(problems, flatten(err)...)
	}
	// The OTEL_* variables serve reads at startup, checked here too so that
	// validate reports everything serve would refuse.
	env := otelEnv{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "OTEL_") {
			env[k] = v
		}
	}
	_, _, otelErrs := checkOTelEnv(env)
	problems = append(problems, otelErrs...)
	return l, problems
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// printProblems renders every problem with the source of the value.
func printProblems(w io.Writer, l *Loaded, problems []error) {
	n := len(problems)
	plural := "s"
	if n == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "decodeplane: the configuration has %d problem%s:\n", n, plural)
	for i, p := range problems {
		var ce *prealloc.ConfigError
		if errors.As(p, &ce) {
			src := l.Sources[ce.Key]
			if src == "" {
				src = "derived"
			}
			fmt.Fprintf(w, "\n  %d. %s = %s   (from %s)\n", i+1, ce.Key, prealloc.FormatValue(ce.Value), describeSource(l, ce.Key, src))
			fmt.Fprintf(w, "     %s\n", ce.Problem)
			if ce.Fix != "" {
				fmt.Fprintf(w, "     fix: %s\n", ce.Fix)
			}
			continue
		}
		fmt.Fprintf(w, "\n  %d. %v\n", i+1, p)
	}
	fmt.Fprintln(w)
}

func describeSource(l *Loaded, key, src string) string {
	if name, ok := strings.CutPrefix(src, "env "); ok {
		if v, ok := l.env[name]; ok && !l.byKey[key].secret {
			return fmt.Sprintf("env %s=%q", name, v)
		}
	}
	return src
}

func printWarnings(w io.Writer, warnings []prealloc.Warning) {
	for _, wn := range warnings {
		fmt.Fprintf(w, "warning: %s\n", wn)
	}
}

func cmdValidate(args, environ []string, stdout, stderr io.Writer) int {
	cf := newConfigFlags("validate", stderr)
	explain := cf.fs.Bool("explain", false, "print every key, its effective value and where it came from")
	if err := cf.parse(args, environ); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane validate: %v\n", err)
		return exitUsage
	}
	l, problems := loadConfig(cf, environ)
	if *explain {
		printExplain(stdout, l)
	}
	if len(problems) > 0 {
		printProblems(stderr, l, problems)
		return exitUsage
	}
	printWarnings(stderr, l.Warnings())
	src := "the embedded defaults"
	if cf.path != "" {
		src = cf.path
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

func printExplain(w io.Writer, l *Loaded) {
	width := 0
	for _, k := range l.Keys() {
		width = max(width, len(k))
	}
	fmt.Fprintf(w, "%-*s  %-24s  %s\n", width, "KEY", "VALUE", "SOURCE")
	for _, k := range l.Keys() {
		fmt.Fprintf(w, "%-*s  %-24s  %s\n", width, k, l.Value(k), l.Sources[k])
	}
	iv, mf := l.Config.Timeouts.EffectiveHeartbeat()
	if iv != l.Config.Timeouts.HeartbeatInterval || mf != l.Config.Timeouts.HeartbeatMaxFailures {
		fmt.Fprintf(w, "\neffective heartbeat after SGLang's floors: interval %s, max failures %d\n", iv, mf)
	}
	fmt.Fprintln(w)
}
