// Command decodeplane-dev-etcd runs a single-member etcd for trying a
// decodeplane fleet (several daemons sharing registry.backend: etcd) on one
// machine. It is for development only, not for production: one member (no
// quorum, no failover), plaintext client traffic with no authentication,
// and, by default, its data in a temporary directory that is removed when
// it exits. Production runs a real etcd cluster (three or five members,
// TLS, auth, its own disks).
//
//	decodeplane-dev-etcd [--listen 127.0.0.1:2379] [--data-dir DIR] [--log-level error]
//
// It is the real etcd server (go.etcd.io/etcd/server/v3/embed, through
// internal/testing/etcdtest) with fsync on. When it serves it prints one line to
// stdout, "etcd: <endpoint> data-dir: <dir>", and serves until SIGINT or
// SIGTERM, then stops (exit 0). With --data-dir the data is kept (created
// if missing) for the next run; without it a temporary directory is used
// and removed on exit. Exit codes: 0 stopped by a signal, 1 etcd failed to
// start or failed while serving, 2 usage. `make dev-etcd` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	listen, dataDir, logLevel string
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("decodeplane-dev-etcd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:2379", "etcd client listen address (host:port); the peer port is a free loopback port")
	fs.StringVar(&o.dataDir, "data-dir", "", "etcd data directory, kept on exit (default: a temporary directory, removed on exit)")
	fs.StringVar(&o.logLevel, "log-level", "error", "etcd's log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return o, fmt.Errorf("--listen %q is not host:port", o.listen)
	}
	switch o.logLevel {
	case "debug", "info", "warn", "error":
	default:
		return o, fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane-dev-etcd: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	dir := o.dataDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "decodeplane-dev-etcd-")
		if err != nil {
			fmt.Fprintf(stderr, "decodeplane-dev-etcd: %v\n", err)
			return exitFailure
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Fprintf(stderr, "decodeplane-dev-etcd: --data-dir: %v\n", err)
		return exitFailure
	}
	srv, err := etcdtest.New(etcdtest.Options{Dir: dir, ClientAddr: o.listen, LogLevel: o.logLevel})
	if err != nil {
		fmt.Fprintf(stderr, "decodeplane-dev-etcd: %v\n", err)
		return exitFailure
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintf(stderr, "decodeplane-dev-etcd: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(stdout, "etcd: %s data-dir: %s\n", srv.Endpoint(), dir)
	fmt.Fprintln(stderr, "decodeplane-dev-etcd: development only (one member, no TLS, no auth); SIGINT or SIGTERM stops it")
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintf(stderr, "decodeplane-dev-etcd: %v\n", err)
		return exitFailure
	}
	return exitOK
}
