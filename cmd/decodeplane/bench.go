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

// benchCommand and faultsCommand are the benchmark's and the fault
// suite's own binaries. `decodeplane bench ARGS` runs `decodeplane-bench
// ARGS` (and `decodeplane faults ARGS`, `decodeplane-faults ARGS`) from the
// directory of this executable, as git runs git-foo, so that the daemon
// binary links neither the client library, the bench nor the fault suite.
const (
	benchCommand  = "decodeplane-bench"
	faultsCommand = "decodeplane-faults"
)

// benchDir is the directory cmdBench and cmdFaults run their binary from;
// empty means the directory of this executable. The tests set it.
var benchDir string

// cmdBench runs decodeplane-bench with args and environ.
func cmdBench(args, environ []string, stdout, stderr io.Writer) int {
	return runSibling("bench", benchCommand, args, environ, stdout, stderr)
}

// cmdFaults runs decodeplane-faults with args and environ.
func cmdFaults(args, environ []string, stdout, stderr io.Writer) int {
	return runSibling("faults", faultsCommand, args, environ, stdout, stderr)
}

// runSibling runs command (the binary of `decodeplane sub`) with args and
// environ, its output going to stdout and stderr, and returns its exit
// code. A command killed by a signal exits 128 + the signal's number, as a
// shell reports it.
func runSibling(sub, command string, args, environ []string, stdout, stderr io.Writer) int {
	path, err := siblingExecutable(command)
	if err != nil {
		fmt.Fprintf(stderr, "decodeplane %s: %v\n", sub, err)
		return exitFailure
	}
	cmd := exec.Command(path, args...)
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// The terminal sends SIGINT (Ctrl-C) and SIGQUIT to the whole
	// foreground process group, the command included, which stops on the
	// first SIGINT and prints its summary: this process only waits for it.
	// SIGTERM and SIGHUP sent to this process are passed on.
	ignored := make(chan os.Signal, 1)
	signal.Notify(ignored, os.Interrupt, syscall.SIGQUIT)
	defer signal.Stop(ignored)
	passed := make(chan os.Signal, 1)
	signal.Notify(passed, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(passed)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "decodeplane %s: start %s: %v\n", sub, path, err)
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
	fmt.Fprintf(stderr, "decodeplane %s: %s: %v\n", sub, path, err)
	return exitFailure
}

// siblingExecutable returns the path of command in benchDir, or next to
// this executable (symbolic links resolved).
func siblingExecutable(command string) (string, error) {
	dir := benchDir
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("cannot find %s: the path of this executable: %w", command, err)
		}
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dir = filepath.Dir(exe)
	}
	return findSibling(dir, command)
}

// findBench returns the path of decodeplane-bench in dir, or an error that
// names it and how to build it.
func findBench(dir string) (string, error) { return findSibling(dir, benchCommand) }

// findSibling returns the path of command in dir, or an error that names
// it and how to build it.
func findSibling(dir, command string) (string, error) {
	name := command
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	path := filepath.Join(dir, name)
	if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		return "", fmt.Errorf("this command is its own binary, %s, and it is not next to decodeplane (%s is missing): build both with `make build` (or go build -o DIR/ ./cmd/...) and run this decodeplane from DIR", name, path)
	}
	return path, nil
}
