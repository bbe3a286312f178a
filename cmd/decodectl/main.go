// Command decodectl is the operator CLI of decodeplane, the decode-side
// control plane for prefill/decode disaggregated LLM serving. It talks to a
// running daemon through the Go client library (package client):
//
//	decodectl status [--config]                      version, readiness, shards, prefills
//	decodectl fleet                                  the registry's daemons and prefill instances
//	decodectl rooms [--phase P,...] [--prefill ADDR] [--live] [--oldest] [--limit N] [-w]
//	decodectl room ID|--latest|--latest-failed [--pages]  a room and its timeline
//	decodectl abort ID [--reason TEXT]               fail a room, return its pages
//	decodectl drain                                  stop admitting; list rooms in flight
//	decodectl lookup --prefill ADDR ROOM...          resolve rooms to prefill DP ranks
//	decodectl help [COMMAND] | version
//
// Every command takes the connection flags (--addr, --token, --tls,
// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --timeout), before or
// after the command name, and -o json for scripts (the protojson of the
// daemon's answer, with the proto field names).
//
// Exit codes: 0 success, 1 the daemon answered with an error (or could not
// be reached), 2 usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/decodeplane/decodeplane/internal/buildinfo"
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (make build: the git tag and commit);
// init completes them from Go's VCS stamp (internal/buildinfo).
var version, commit = "dev", ""

func init() { version, commit = buildinfo.Resolve(version, commit) }

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run is decodectl's entry point: it parses args (without the program
// name) and environ ("KEY=value" entries), runs the command and returns the
// exit code. An interrupt (SIGINT, SIGTERM) ends a --watch cleanly and
// cancels any other call.
func run(args, environ []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, environ, stdout, stderr)
}

// runContext is run with the caller's context: cancelling ctx is an
// interrupt.
func runContext(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	inv, err := parseArgs(args, environ)
	if err != nil {
		return reportError(stderr, inv, err)
	}
	switch {
	case inv.help:
		writeHelp(stdout, inv.cmd)
		return exitOK
	case inv.cmd == nil:
		writeUsage(stderr)
		return exitUsage
	}
	x := &cli{opts: &inv.opts, cmd: inv.cmd, stdout: stdout, stderr: stderr, now: timeNow}
	if inv.cmd.daemon {
		c, err := dial(&inv.opts, stderr)
		if err != nil {
			return reportError(stderr, inv, err)
		}
		defer c.Close()
		x.c = c
	}
	if err := inv.cmd.run(ctx, x, inv.args); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "decodectl: interrupted")
			return exitInterrupted
		}
		return reportError(stderr, inv, err)
	}
	return exitOK
}

// reportError prints err on stderr and returns its exit code: 2 for usage
// errors (with a pointer to the help), 1 for everything else.
func reportError(stderr io.Writer, inv *invocation, err error) int {
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "decodectl: %s\n", ue.msg)
		topic := "decodectl help"
		if inv != nil && inv.cmd != nil {
			topic += " " + inv.cmd.name
		}
		fmt.Fprintf(stderr, "Run '%s' for usage.\n", topic)
		return exitUsage
	}
	fmt.Fprintf(stderr, "decodectl: %s\n", describeError(err))
	if hint := errorHint(err, inv); hint != "" {
		fmt.Fprintf(stderr, "decodectl: %s\n", hint)
	}
	return exitFailure
}
