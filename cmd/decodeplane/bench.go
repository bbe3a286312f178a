package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
)

// benchCommand is the benchmark's own binary. `decodeplane bench ARGS` runs
// `decodeplane-bench ARGS` from the directory of this executable, as git
// runs git-foo, so that the daemon binary links neither the client library
// nor the bench.
const benchCommand = "decodeplane-bench"

// benchDir is the directory cmdBench runs decodeplane-bench from; empty
// means the directory of this executable. The tests set it.
var benchDir string

// cmdBench runs decodeplane-bench with args and environ, its output going
// to stdout and stderr, and returns its exit code. A bench killed by a
// signal exits 128 + the signal's number, as a shell reports it.
func cmdBench(args, environ []string, stdout, stderr io.Writer) int {
	path, err := benchExecutable()
	if err != nil {
		fmt.Fprintf(stderr, "decodeplane bench: %v\n", err)
		return exitFailure
	}
	cmd := exec.Command(path, args...)
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// The terminal sends SIGINT (Ctrl-C) and SIGQUIT to the whole
	// foreground process group, the bench included, which stops on the
	// first SIGINT and prints its summary: this process only waits for it.
	// SIGTERM and SIGHUP sent to this process are passed on.
	ignored := make(chan os.Signal, 1)
	signal.Notify(ignored, os.Interrupt, syscall.SIGQUIT)
	defer signal.Stop(ignored)
	passed := make(chan os.Signal, 1)
	signal.Notify(passed, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(passed)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "decodeplane bench: start %s: %v\n", path, err)
		return exitFailure
	}
	done := make(chan struct{})
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for {
			select {
			case s := <-passed:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	<-forwarded
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	fmt.Fprintf(stderr, "decodeplane bench: %s: %v\n", path, err)
	return exitFailure
}

// benchExecutable returns the path of decodeplane-bench in benchDir, or
// next to this executable (symbolic links resolved).
func benchExecutable() (string, error) {
	dir := benchDir
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("cannot find %s: the path of this executable: %w", benchCommand, err)
		}
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dir = filepath.Dir(exe)
	}
	return findBench(dir)
}

// findBench returns the path of decodeplane-bench in dir, or an error that
// names it and how to build it.
func findBench(dir string) (string, error) {
	name := benchCommand
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	path := filepath.Join(dir, name)
	if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		return "", fmt.Errorf("the benchmark is its own binary, %s, and it is not next to decodeplane (%s is missing): build both with `make build` (or go build -o DIR/ ./cmd/...) and run this decodeplane from DIR", name, path)
	}
	return path, nil
}
