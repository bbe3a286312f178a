package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/decodeplane/decodeplane/client"
)

// The daemon --queued measures: the real daemon started as a child
// process, or the one at --target.

// benchQueuedDaemon is the daemon being measured.
type benchQueuedDaemon struct {
	addr       string
	metricsURL string
	pid        int
	token      string
	child      bool
	stopFn     func() error
	// exited is closed when the child exits; exitErr then describes how.
	exited  chan struct{}
	exitErr func() string
}

func (d *benchQueuedDaemon) stop() error {
	if d.stopFn == nil {
		return nil
	}
	err := d.stopFn()
	d.stopFn = nil
	return err
}

// benchDaemon is the daemon binary --queued starts: decodeplane, next to
// decodeplane-bench (make build puts both into bin/).
const benchDaemon = "decodeplane"

// benchDaemonExecutable returns the path of the decodeplane binary in the
// directory of this executable (symbolic links resolved).
func benchDaemonExecutable() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("the daemon executable: the path of this executable: %w", err)
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	name := benchDaemon
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	path := filepath.Join(filepath.Dir(exe), name)
	if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		return "", fmt.Errorf("--queued starts the daemon binary, %s, which is not next to the bench (%s is missing): build both with `make build` (or go build -o DIR/ ./cmd/...)", name, path)
	}
	return path, nil
}

// benchFreePort reserves and releases a loopback port for the child.
func benchFreePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// benchStartChild starts `decodeplane serve` (the daemon binary next to
// this executable) with the queued-room settings, --config and --set.
func benchStartChild(o *benchOptions, environ []string) (*benchQueuedDaemon, error) {
	exe, err := benchDaemonExecutable()
	if err != nil {
		return nil, err
	}
	addr, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	maddr, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--listen", addr, "--metrics-listen", maddr, "--log-level", "error",
		// Every shard may receive every room.
		"--set", "admission.max_queued=" + strconv.Itoa(o.queued+1),
		"--set", "timeouts.bootstrap=" + benchQueuedLongTimeout,
		"--set", "admission.claim_timeout=" + benchQueuedLongTimeout,
		// Its queued rooms never finish: do not wait for them on SIGTERM.
		"--set", "server.shutdown_timeout=1s",
		"--set", "timeouts.heartbeat_max_failures=" + benchQueuedHeartbeatFailures,
	}
	if o.configPath != "" {
		args = append(args, "--config", o.configPath)
	}
	if o.visited["decode-tp"] {
		args = append(args, "--set", "parallel.attn_tp="+strconv.Itoa(o.decodeTP))
	}
	token := ""
	for _, s := range o.sets {
		args = append(args, "--set", s.Key+"="+s.Value)
		if s.Key == "server.auth_token" {
			token = s.Value
		}
	}
	// The child is configured by its flags only: nothing from the
	// environment that configures decodeplane or exports telemetry.
	var env []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SGLANG_") || strings.HasPrefix(name, "DECODEPLANE_") || strings.HasPrefix(name, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	var errBuf benchTail
	cmd.Stdout = io.Discard
	cmd.Stderr = &errBuf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", exe, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	d := &benchQueuedDaemon{addr: addr, metricsURL: "http://" + maddr + "/metrics", pid: cmd.Process.Pid, token: token, child: true}
	d.stopFn = func() error {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(30 * time.Second)
			defer t.Stop()
			select {
			case <-exited:
			case <-t.C:
				_ = cmd.Process.Kill()
				<-exited
				return fmt.Errorf("the child daemon (pid %d) was still failing its queued rooms 30s after SIGTERM and was killed (the measurement was complete)", d.pid)
			}
		}
		return nil
	}
	d.exited = exited
	d.exitErr = func() string {
		return fmt.Sprintf("%v; its stderr ends:\n%s", waitErr, errBuf.String())
	}
	return d, nil
}

// benchTail keeps the last 16 KiB a child wrote.
type benchTail struct {
	mu sync.Mutex
	b  []byte
}

func (t *benchTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if n := len(t.b) - 16<<10; n > 0 {
		t.b = append(t.b[:0], t.b[n:]...)
	}
	return len(p), nil
}

func (t *benchTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// benchWaitReady polls the child with GetStatus until it answers (30 s at
// most) or exits.
func benchWaitReady(ctx context.Context, c *client.Client, d *benchQueuedDaemon) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Admin().Status(sctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-d.exited:
			return fmt.Errorf("the child daemon exited before serving: %s", d.exitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the child daemon at %s did not answer GetStatus within 30s: %w", d.addr, err)
		}
	}
}
