package config

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Flatten lists the problems of a joined error (errors.Join, nested).
func Flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// PrintProblems renders every problem with its key, value, the source of
// the value and the fix.
func PrintProblems(w io.Writer, l *Loaded, problems []error) {
	n := len(problems)
	plural := "s"
	if n == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "decodeplane: the configuration has %d problem%s:\n", n, plural)
	for i, p := range problems {
		var ce *kvlayout.ConfigError
		if errors.As(p, &ce) {
			src := l.Sources[ce.Key]
			if src == "" {
				src = "derived"
			}
			fmt.Fprintf(w, "\n  %d. %s = %s   (from %s)\n", i+1, ce.Key, kvlayout.FormatValue(ce.Value), describeSource(l, ce.Key, src))
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

// PrintWarnings prints one line per warning.
func PrintWarnings(w io.Writer, warnings []kvlayout.Warning) {
	for _, wn := range warnings {
		fmt.Fprintf(w, "warning: %s\n", wn)
	}
}

// PrintExplain prints every key, its effective value and its source
// (validate --explain).
func PrintExplain(w io.Writer, l *Loaded) {
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

// UsageError is a startup problem the operator fixes in the configuration
// or the environment (exit 2), e.g. a malformed OTEL_* variable or a
// transfer path this build lacks.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }
