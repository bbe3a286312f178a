package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

// build builds the binary into t.TempDir().
func build(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "decodeplane-dev-etcd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

var readyLine = regexp.MustCompile(`(?m)^etcd: (http://\S+) data-dir: (\S+)$`)

// startDev starts the binary with args and waits for its ready line; it
// returns the process, the endpoint and the data directory it printed.
func startDev(t *testing.T, bin string, args ...string) (*e2e.Proc, string, string) {
	t.Helper()
	p := e2e.Start(t, "decodeplane-dev-etcd", bin, nil, args...)
	deadline := time.After(60 * time.Second)
	for {
		out, changed := p.Out.Snapshot()
		if m := readyLine.FindStringSubmatch(out); m != nil {
			return p, m[1], m[2]
		}
		select {
		case <-changed:
		case <-p.Exited():
			t.Fatalf("exited before serving: %v\n%s", p.Err(), p.Out.String())
		case <-deadline:
			t.Fatalf("no ready line within 60s:\n%s", out)
		}
	}
}

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func get(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 {
		t.Fatalf("get %s: %d keys", key, len(r.Kvs))
	}
	return string(r.Kvs[0].Value)
}

func put(t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, value); err != nil {
		t.Fatal(err)
	}
}

func terminate(t *testing.T, p *e2e.Proc) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, p.Out.String())
	}
}

// TestServesAndStops: the binary serves etcd on --listen (a key written
// is read back), exits 0 on SIGTERM and removes its temporary data
// directory.
func TestServesAndStops(t *testing.T) {
	bin := build(t)
	addr := e2e.FreeAddr(t)
	p, endpoint, dir := startDev(t, bin, "--listen", addr)
	if endpoint != "http://"+addr {
		t.Fatalf("endpoint %s, want http://%s", endpoint, addr)
	}
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil {
		t.Fatalf("the data directory it printed holds no etcd member: %v", err)
	}
	cli := client(t, endpoint)
	put(t, cli, "/decodeplane/dev", "value")
	if got := get(t, cli, "/decodeplane/dev"); got != "value" {
		t.Fatalf("read %q, want %q", got, "value")
	}
	terminate(t, p)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the temporary data directory %s is still there after exit (stat: %v)", dir, err)
	}
}

// TestDataDirKept: with --data-dir the data survives a stop (SIGINT) and
// is served again by the next run.
func TestDataDirKept(t *testing.T) {
	bin := build(t)
	dir := filepath.Join(t.TempDir(), "data")
	addr := e2e.FreeAddr(t)
	p, endpoint, printed := startDev(t, bin, "--listen", addr, "--data-dir", dir)
	if printed != dir {
		t.Fatalf("data-dir %s printed, want %s", printed, dir)
	}
	put(t, client(t, endpoint), "/decodeplane/kept", "v1")
	if err := p.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGINT, want 0:\n%s", code, p.Out.String())
	}
	p, endpoint, _ = startDev(t, bin, "--listen", addr, "--data-dir", dir)
	if got := get(t, client(t, endpoint), "/decodeplane/kept"); got != "v1" {
		t.Fatalf("after restart read %q, want v1", got)
	}
	terminate(t, p)
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil {
		t.Fatalf("--data-dir was not kept: %v", err)
	}
}

// TestUsage: bad flags exit 2 before anything starts.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "2379"},
		{"--log-level", "loud"},
		{"extra"},
		{"--no-such-flag"},
	} {
		if code := run(args, io.Discard, io.Discard); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d", args, code, exitUsage)
		}
	}
}
