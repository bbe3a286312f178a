package faults

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one process a scenario runs: its output goes to a file in the
// scenario's directory and its lines are counted (and the recent ones
// kept, for a failure's report and for waiting on a line).
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    *lines
	exited chan struct{}
	err    error // cmd.Wait's, valid once exited is closed
	file   *os.File
}

// lines counts the lines written to it, apart from those at DEBUG, and
// keeps the last tailBytes. A process run at debug level (the agent whose
// held batches a scenario waits on) writes lines per batch by design; the
// bound is on what it writes at its default level.
type lines struct {
	mu      sync.Mutex
	n       int
	debug   int
	head    []byte // the start of the current line (up to headBytes)
	partial bool
	tail    []byte
	changed chan struct{}
	file    *os.File
}

// headBytes is how much of a line is kept to read its level: slog's text
// handler writes "time=<RFC 3339> level=DEBUG " first.
const headBytes = 80

// debugLevel marks a line at DEBUG (slog's text handler).
var debugLevel = []byte(" level=DEBUG ")

const tailBytes = 64 << 10

func newLines(f *os.File) *lines { return &lines{changed: make(chan struct{}), file: f} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_, _ = l.file.Write(p)
	}
	for _, b := range p {
		if b != '\n' {
			l.partial = true
			if len(l.head) < headBytes {
				l.head = append(l.head, b)
			}
			continue
		}
		l.endLine()
	}
	l.tail = append(l.tail, p...)
	if len(l.tail) > 2*tailBytes {
		l.tail = append([]byte(nil), l.tail[len(l.tail)-tailBytes:]...)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

// endLine counts the line just ended (l.mu held).
func (l *lines) endLine() {
	if bytes.Contains(l.head, debugLevel) {
		l.debug++
	} else {
		l.n++
	}
	l.head, l.partial = l.head[:0], false
}

// count is the number of lines written so far at INFO and above (a line
// not ended yet included), and the number at DEBUG.
func (l *lines) count() (n, debug int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n = l.n
	if l.partial && !bytes.Contains(l.head, debugLevel) {
		n++
	}
	return n, l.debug
}

// snapshot is the recent output and a channel closed at the next write.
func (l *lines) snapshot() (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.tail), l.changed
}

// start runs bin with args; the process is killed when the scenario ends.
func (s *Stage) start(name, bin string, args ...string) (*proc, error) {
	f, err := os.Create(fmt.Sprintf("%s/%s.log", s.dir, strings.NewReplacer(" ", "-", "/", "-").Replace(name)))
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, out: newLines(f), exited: make(chan struct{}), file: f}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = environ()
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

// environ is this process's environment without what configures
// decodeplane or its tracing, so that every process runs with the settings
// its scenario gives it.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SGLANG_") || strings.HasPrefix(name, "DECODEPLANE_") || strings.HasPrefix(name, "OTEL_") || name == "DISAGGREGATION_TEST_FAILURE_PROB" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig and, for a signal that ends it, waits up to 30 s for
// the exit.
func (p *proc) signal(sig syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("%s is not running: %v", p.name, p.err)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, p.name, err)
	}
	if sig == syscall.SIGSTOP || sig == syscall.SIGCONT {
		return nil
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("%s did not exit within 30s of %v", p.name, sig)
	}
}

// waitLine waits until the process wrote a line containing every word, or
// returns why not.
func (p *proc) waitLine(ctx context.Context, words ...string) error {
	for {
		out, changed := p.out.snapshot()
		for _, line := range strings.Split(out, "\n") {
			if containsAll(line, words) {
				return nil
			}
		}
		select {
		case <-changed:
		case <-p.exited:
			return fmt.Errorf("%s exited (%v) before writing %q", p.name, p.err, strings.Join(words, " … "))
		case <-ctx.Done():
			return fmt.Errorf("%s did not write %q: %w", p.name, strings.Join(words, " … "), ctx.Err())
		}
	}
}

// waitOutput waits until done holds for everything the process wrote so
// far: its whole output file, not only the recent lines.
func (p *proc) waitOutput(ctx context.Context, what string, done func(out []byte) bool) error {
	for {
		_, changed := p.out.snapshot()
		out, err := os.ReadFile(p.file.Name())
		if err != nil {
			return err
		}
		if done(out) {
			return nil
		}
		select {
		case <-changed:
		case <-p.exited:
			return fmt.Errorf("%s exited (%v) before %s", p.name, p.err, what)
		case <-ctx.Done():
			return fmt.Errorf("%s: %s: %w", p.name, what, ctx.Err())
		}
	}
}

func containsAll(s string, words []string) bool {
	for _, w := range words {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// tail is the end of the process's output, for a failure's report.
func (p *proc) tail(n int) string {
	out, _ := p.out.snapshot()
	ls := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// freeAddr is a loopback address nothing listens on (at the time).
func freeAddr() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer lis.Close()
	return lis.Addr().String(), nil
}
