package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/internal/bench"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

// The tests run `decodeplane bench` through run, as main does: cmdBench then
// runs decodeplane-bench from benchDir. TestMain points benchDir at a
// directory where decodeplane-bench is a link to this test binary, and the
// test binary started under that name is the bench (benchChild). So the
// in-process tests go through the real hand-over (arguments, environment,
// output, exit code) without building a second binary; the end-to-end tests
// below run the real pair.

// benchChild runs the bench and exits with its code when this process was
// started as decodeplane-bench; otherwise it returns at once.
func benchChild() {
	if filepath.Base(os.Args[0]) == benchCommand {
		os.Exit(bench.Main(version, os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
	}
}

// useTestBinaryAsBench sets benchDir to a fresh directory holding
// decodeplane-bench, a link to this test binary, and returns the function
// that removes it.
func useTestBinaryAsBench() func() {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "the test binary: %v\n", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "decodeplane-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Symlink(exe, filepath.Join(dir, benchCommand)); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	benchDir = dir
	return func() { os.RemoveAll(dir) }
}

// A directory without decodeplane-bench is an error that names the binary
// and how to build it.
func TestFindBench(t *testing.T) {
	dir := t.TempDir()
	_, err := findBench(dir)
	if err == nil || !strings.Contains(err.Error(), "decodeplane-bench") || !strings.Contains(err.Error(), "make build") ||
		!strings.Contains(err.Error(), filepath.Join(dir, "decodeplane-bench")) {
		t.Fatalf("findBench(empty dir) = %v, want an error naming %s and make build", err, filepath.Join(dir, "decodeplane-bench"))
	}
	if err := os.Mkdir(filepath.Join(dir, "decodeplane-bench"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := findBench(dir); err == nil {
		t.Fatal("findBench accepted a directory named decodeplane-bench")
	}
	other := t.TempDir()
	want := filepath.Join(other, "decodeplane-bench")
	if err := os.WriteFile(want, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := findBench(other); err != nil || got != want {
		t.Fatalf("findBench = %q, %v; want %q", got, err, want)
	}
}

// The daemon binary runs the bench binary next to it, passing the
// arguments, the output and the exit code through.
func TestBenchRunsTheSiblingBinary(t *testing.T) {
	e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-bench")
	bin := decodeplaneBinary(t)
	cmd := exec.Command(bin, "bench", "--rooms", "-1")
	cmd.Env = e2eEnviron()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitUsage || !strings.HasPrefix(stderr.String(), "decodeplane bench: ") {
		t.Fatalf("decodeplane bench --rooms -1: %v, want exit %d\n%s", err, exitUsage, stderr.String())
	}
}

// Without decodeplane-bench next to it, decodeplane bench says what is
// missing and how to build it.
func TestBenchWithoutItsBinary(t *testing.T) {
	src := decodeplaneBinary(t)
	bin := filepath.Join(t.TempDir(), "decodeplane")
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "bench", "--rooms", "10")
	cmd.Env = e2eEnviron()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitFailure {
		t.Fatalf("decodeplane bench without decodeplane-bench: %v, want exit %d\n%s", err, exitFailure, stderr.String())
	}
	for _, want := range []string{"decodeplane-bench", filepath.Join(filepath.Dir(bin), "decodeplane-bench"), "make build"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}
