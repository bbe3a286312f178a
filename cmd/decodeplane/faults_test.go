package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

// `decodeplane faults` runs decodeplane-faults next to it, passing the
// arguments, the output and the exit code through.
func TestFaultsRunsTheSiblingBinary(t *testing.T) {
	e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-faults")
	bin := decodeplaneBinary(t)
	list := exec.Command(bin, "faults", "--list")
	list.Env = e2eEnviron()
	out, err := list.Output()
	if err != nil || !strings.Contains(string(out), "abort-storm\n  fault:  ") || !strings.Contains(string(out), "daemon-paused\n") {
		t.Fatalf("decodeplane faults --list: %v\n%s", err, out)
	}
	unknown := exec.Command(bin, "faults", "no-such-scenario")
	unknown.Env = e2eEnviron()
	var stderr strings.Builder
	unknown.Stderr = &stderr
	err = unknown.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitUsage || !strings.Contains(stderr.String(), "unknown scenario no-such-scenario") {
		t.Fatalf("decodeplane faults no-such-scenario: %v, want exit %d naming it\n%s", err, exitUsage, stderr.String())
	}
}
