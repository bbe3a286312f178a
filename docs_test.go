//go:build linux || darwin

package decodeplane_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The command blocks of README.md, docs/*.md, TESTING.md and BENCHMARKS.md
// run as typed. The convention,
// for whoever writes a page:
//
//   - A ```sh block is run, from the repository root, in a fresh bash (`bash -e`:
//     a failing command fails the block), and must exit 0 within five minutes.
//   - An HTML comment on the line just before it, `<!-- doc-test: ... -->`,
//     says how, with directives key=value or key="quoted value":
//     skip="why"     not run (a cluster, Docker, files the reader brings);
//     terminal=NAME  the block is a terminal of its own that keeps running (a
//     daemon, the demo, a watch): started in the background, stopped with
//     Ctrl-C (SIGINT to its process group) when the page is done;
//     in=NAME        the block is typed into terminal NAME (its jobs, %1…);
//     port=N,M       then wait until 127.0.0.1:N (and M…) accepts connections,
//     as a person waits for a daemon to be up;
//     wait="TEXT"    then wait until TEXT appears in that terminal's output, as
//     a person watches for it;
//     expect="TEXT"  the block's output must contain TEXT;
//     exit=N         the block must exit N instead of 0.
//   - Any other fence (```text, ```go, ```yaml, …) is not run, and a fence
//     without a language is an error: say what it is.
//
// The waits are the person's: real time, bounded by a deadline, ended by a
// condition (a port, a line of output), never a fixed sleep. Pages run one
// after the other, each from nothing (every terminal of the previous page
// stopped), on the fixed ports the pages name, which must be free.

// docPorts are the loopback ports the pages' commands use.
var docPorts = []int{2379, 7600, 7601, 7610, 7611, 7620, 7621, 8998}

type docBlock struct {
	page string
	line int // of the opening fence
	lang string
	body string
	dir  map[string]string
}

var (
	docTestRE = regexp.MustCompile(`^<!--\s*doc-test:(.*)-->\s*$`)
	docDirRE  = regexp.MustCompile(`([a-z]+)=("([^"]*)"|[^\s"]+)`)
)

// docPages returns README.md, docs/*.md, TESTING.md and BENCHMARKS.md, in
// that order.
func docPages(t *testing.T) []string {
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pages)
	return append(append([]string{"README.md"}, pages...), "TESTING.md", "BENCHMARKS.md")
}

// docBlocks parses a page's fenced blocks and their doc-test directives.
func docBlocks(t *testing.T, page string) []docBlock {
	t.Helper()
	raw, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var blocks []docBlock
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "```") {
			continue
		}
		b := docBlock{page: page, line: i + 1, lang: strings.TrimSpace(strings.TrimPrefix(lines[i], "```"))}
		if b.lang == "" {
			t.Errorf("%s:%d: a fence without a language: mark it ```sh (run by this test), ```text (output) or another language", page, b.line)
		}
		// The directive: the last non-blank line before the fence.
		for j := i - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) == "" {
				continue
			}
			if m := docTestRE.FindStringSubmatch(lines[j]); m != nil {
				b.dir = map[string]string{}
				for _, d := range docDirRE.FindAllStringSubmatch(m[1], -1) {
					v := d[2]
					if strings.HasPrefix(v, `"`) {
						v = d[3]
					}
					b.dir[d[1]] = v
				}
			}
			break
		}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		b.body = strings.Join(body, "\n") + "\n"
		if b.dir != nil && b.lang != "sh" {
			t.Errorf("%s:%d: a doc-test directive on a ```%s block: only ```sh blocks are run", page, b.line, b.lang)
		}
		for k := range b.dir {
			if !slices.Contains([]string{"skip", "terminal", "in", "port", "wait", "expect", "exit"}, k) {
				t.Errorf("%s:%d: unknown doc-test directive %q", page, b.line, k)
			}
		}
		if _, ok := b.dir["skip"]; ok && b.dir["skip"] == "" {
			t.Errorf("%s:%d: skip needs a reason", page, b.line)
		}
		blocks = append(blocks, b)
	}
	return blocks
}

// TestDocsBlocksMarked: every fence says what it is (runs without -short).
func TestDocsBlocksMarked(t *testing.T) {
	for _, page := range docPages(t) {
		docBlocks(t, page)
	}
}

// docEnviron is the environment of the pages' commands: the test's, without
// anything that would configure the daemon, its tracing or make.
func docEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "DECODEPLANE_"), strings.HasPrefix(name, "SGLANG_"), strings.HasPrefix(name, "OTEL_"),
			name == "DISAGGREGATION_TEST_FAILURE_PROB", name == "MAKEFLAGS", name == "MAKELEVEL", name == "MFLAGS", name == "TERM":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "TERM=dumb")
}

// syncBuffer is a terminal's output, read while it is written.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// docTerminal is a shell a page's blocks are typed into.
type docTerminal struct {
	name  string
	cmd   *exec.Cmd
	stdin *os.File // the write end: what is typed
	out   *syncBuffer
	done  chan struct{}
}

func startTerminal(t *testing.T, name string) *docTerminal {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd := exec.Command("bash", "--noprofile", "--norc", "-s")
	cmd.Env = docEnviron()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	term := &docTerminal{name: name, cmd: cmd, stdin: w, out: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(term.done) }()
	return term
}

// stop is Ctrl-C: SIGINT to the terminal's process group (the foreground
// command, the shell, its jobs), then the shell's end of input; whatever is
// left of the group after a while is killed.
func (term *docTerminal) stop(t *testing.T) {
	pgid := term.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGINT)
	term.stdin.Close()
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			<-term.done
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("terminal %s: still running 40 s after Ctrl-C; killed. Its output:\n%s", term.name, tail(term.out.String()))
	syscall.Kill(-pgid, syscall.SIGKILL)
	<-term.done
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

// waitUntil polls cond every 100 ms until it holds or the deadline passes.
func waitUntil(deadline time.Duration, cond func() bool) bool {
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

func portOpen(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestDocsCommands runs the command blocks of the pages as a person types
// them (see the convention above).
func TestDocsCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the pages' commands, with real waits; skipped with -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: the pages' commands use it", tool)
		}
	}
	// What the pages take as done: `make build` (README, before the tour).
	build := exec.Command("make", "-s", "build")
	build.Env = docEnviron()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, page := range docPages(t) {
		blocks := docBlocks(t, page)
		run := false
		for _, b := range blocks {
			if _, skip := b.dir["skip"]; b.lang == "sh" && !skip {
				run = true
			}
		}
		if !run {
			continue
		}
		t.Run(page, func(t *testing.T) { runPage(t, blocks) })
	}
}

func runPage(t *testing.T, blocks []docBlock) {
	for _, p := range docPorts {
		if portOpen(p) {
			t.Fatalf("127.0.0.1:%d is in use (a daemon of yours, `make run`?): the pages' commands need it; stop it and run the test again", p)
		}
	}
	terms := map[string]*docTerminal{}
	var order []*docTerminal
	defer func() {
		for i := len(order) - 1; i >= 0; i-- {
			order[i].stop(t)
		}
		if t.Failed() {
			for _, term := range order {
				t.Logf("terminal %s:\n%s", term.name, tail(term.out.String()))
			}
		}
	}()
	for _, b := range blocks {
		if _, skip := b.dir["skip"]; b.lang != "sh" || skip {
			continue
		}
		where := fmt.Sprintf("%s:%d", b.page, b.line)
		var term *docTerminal
		switch {
		case b.dir["terminal"] != "":
			if terms[b.dir["terminal"]] != nil {
				t.Fatalf("%s: terminal %s already started", where, b.dir["terminal"])
			}
			term = startTerminal(t, b.dir["terminal"])
			terms[term.name] = term
			order = append(order, term)
		case b.dir["in"] != "":
			if term = terms[b.dir["in"]]; term == nil {
				t.Fatalf("%s: no terminal %s", where, b.dir["in"])
			}
		}
		if term == nil {
			runForeground(t, where, b)
			continue
		}
		from := len(term.out.String())
		if _, err := term.stdin.WriteString(b.body); err != nil {
			t.Fatalf("%s: typing into terminal %s: %v", where, term.name, err)
		}
		if ports := b.dir["port"]; ports != "" {
			for _, ps := range strings.Split(ports, ",") {
				p, err := strconv.Atoi(ps)
				if err != nil {
					t.Fatalf("%s: port=%s", where, ports)
				}
				// A make target builds first: minutes on a cold cache.
				if !waitUntil(5*time.Minute, func() bool { return portOpen(p) }) {
					t.Fatalf("%s: nothing listens on 127.0.0.1:%d after 5 minutes; terminal %s:\n%s", where, p, term.name, tail(term.out.String()))
				}
			}
		}
		if text := b.dir["wait"]; text != "" {
			if !waitUntil(2*time.Minute, func() bool { return strings.Contains(term.out.String()[from:], text) }) {
				t.Fatalf("%s: %q did not appear in terminal %s within 2 minutes:\n%s", where, text, term.name, tail(term.out.String()))
			}
		}
		select {
		case <-term.done:
			t.Fatalf("%s: terminal %s ended:\n%s", where, term.name, tail(term.out.String()))
		default:
		}
	}
}

// runForeground runs a block in a fresh bash and checks its exit and output.
func runForeground(t *testing.T, where string, b docBlock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-e", "-s")
	cmd.Env = docEnviron()
	cmd.Stdin = strings.NewReader(b.body)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", where, err)
	}
	want := 0
	if e := b.dir["exit"]; e != "" {
		want, _ = strconv.Atoi(e)
	}
	if code != want || ctx.Err() != nil {
		t.Fatalf("%s: exit %d (want %d; %v):\n%s\n--- output\n%s", where, code, want, ctx.Err(), b.body, tail(string(out)))
	}
	if text := b.dir["expect"]; text != "" && !strings.Contains(string(out), text) {
		t.Fatalf("%s: the output lacks %q:\n%s\n--- output\n%s", where, text, b.body, tail(string(out)))
	}
	t.Logf("%s: ok (%d bytes of output)", where, len(out))
}

var (
	docLinkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	docHeadingRE = regexp.MustCompile("(?m)^#{1,6} (.+)$")
)

// docAnchor is GitHub's anchor of a heading: lower case, punctuation but
// hyphens dropped, spaces as hyphens.
func docAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127 && r != '…' && r != '—' && r != '–':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsLinks: every relative link of the pages names a file of the
// repository, and every #anchor a heading of its page.
func TestDocsLinks(t *testing.T) {
	anchors := func(page string) map[string]bool {
		raw, err := os.ReadFile(page)
		if err != nil {
			return nil
		}
		out := map[string]bool{}
		for _, m := range docHeadingRE.FindAllStringSubmatch(string(raw), -1) {
			out[docAnchor(strings.TrimSpace(m[1]))] = true
		}
		return out
	}
	for _, page := range append(docPages(t), "CHANGELOG.md") {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		// Links inside code blocks are code.
		var text []string
		fence := false
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(l, "```") {
				fence = !fence
				continue
			}
			if !fence {
				text = append(text, l)
			}
		}
		for _, m := range docLinkRE.FindAllStringSubmatch(strings.Join(text, "\n"), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(link, "#")
			target := page
			if path != "" {
				target = filepath.Join(filepath.Dir(page), path)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: link %s: no such file %s", page, link, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchors(target)[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", page, link, target, anchor)
			}
		}
	}
}
