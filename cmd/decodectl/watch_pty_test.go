//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/decodeplane/decodeplane/internal/testing/ptytest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// setWinsize sets the size of the terminal whose master is f (TIOCSWINSZ):
// the kernel then sends SIGWINCH to the terminal's foreground process group,
// as a terminal emulator does when its window is resized.
func setWinsize(t *testing.T, f *os.File, rows, cols uint16) {
	t.Helper()
	ws := struct{ row, col, x, y uint16 }{rows, cols, 0, 0}
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); errno != 0 {
		t.Fatalf("TIOCSWINSZ: %v", errno)
	}
}

// screenLog splits what a terminal received into screens (each starts with
// the watch's clear sequence) and stamps each with when it began to arrive.
type screenLog struct {
	mu      sync.Mutex
	raw     []byte
	arrived []time.Time
	changed chan struct{}
}

const clearScreen = "\x1b[H\x1b[2J"

func (l *screenLog) add(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	before := bytes.Count(l.raw, []byte(clearScreen))
	l.raw = append(l.raw, p...)
	for range bytes.Count(l.raw, []byte(clearScreen)) - before {
		l.arrived = append(l.arrived, time.Now())
	}
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// complete returns the screens received whole (a later one began), with
// the terminal's \r\n turned back into \n, and their arrival times.
func (l *screenLog) complete() ([]string, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	parts := strings.Split(strings.ReplaceAll(string(l.raw), "\r\n", "\n"), clearScreen)
	if len(parts) < 2 {
		return nil, nil
	}
	n := len(parts) - 2 // parts[0] precedes the first screen; the last may be partial
	return parts[1 : 1+n], l.arrived[:n]
}

// waitFor waits until ok holds for the complete screens, or fails after
// the deadline (the watch is broken or the machine far too slow).
func (l *screenLog) waitFor(t *testing.T, what string, ok func([]string) bool) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if s, _ := l.complete(); ok(s) {
			return s
		}
		select {
		case <-l.changed:
		case <-deadline:
			s, _ := l.complete()
			t.Fatalf("waiting for %s: %d screens, last:\n%s", what, len(s), last(s))
		}
	}
}

func last(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return s[len(s)-1]
}

// checkFits fails unless screen fits rows x cols the way a terminal needs:
// at most rows-1 lines (a newline on the bottom row would scroll the header
// away), none wider than cols, the header first, the table's header, the
// newest room first, and a last line counting the rooms that did not fit.
func checkFits(t *testing.T, screen string, rows, cols int, every, addr string, newest uint64, total int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(screen, "\n"), "\n")
	if len(lines) > rows-1 || !strings.HasSuffix(screen, "\n") {
		t.Errorf("%dx%d terminal: screen of %d lines (at most %d, each ending its line):\n%s", rows, cols, len(lines), rows-1, screen)
	}
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > cols {
			t.Errorf("%dx%d terminal: a line of %d columns wraps: %q", rows, cols, n, l)
		}
	}
	if len(lines) < 5 {
		t.Fatalf("%dx%d terminal: screen too short:\n%s", rows, cols, screen)
	}
	if want := "Every " + every + ": decodectl rooms at " + addr; !strings.HasPrefix(lines[0], want[:min(len(want), cols-1)]) {
		t.Errorf("first line %q: want the header, %q", lines[0], want)
	}
	if f := strings.Fields(lines[2]); len(f) < 2 || f[0] != "ROOM" || f[1] != "RID" {
		t.Errorf("third line %q: want the table's header", lines[2])
	}
	if f := strings.Fields(lines[3]); len(f) == 0 || f[0] != fmt.Sprint(newest) {
		t.Errorf("first row %q: want the newest room, %d", lines[3], newest)
	}
	shown := len(lines) - 4 // header, blank, table header, last line
	if want := rows - 5; shown != want {
		t.Errorf("%dx%d terminal: %d rooms shown, want %d (all the rows that fit)", rows, cols, shown, want)
	}
	if want := fmt.Sprintf("… %d more rooms (showing %d of %d", total-shown, shown, total); !strings.HasPrefix(lines[len(lines)-1], want) {
		t.Errorf("last line %q: want it to start with %q", lines[len(lines)-1], want)
	}
}

// watchOnTerminal runs `decodectl rooms -w --interval interval` as an
// operator does: on a terminal of rows x cols (a pseudo-terminal that is its
// controlling terminal, so that a resize sends it SIGWINCH). It returns the
// screens log, the terminal's master (to resize it) and stop, which presses
// Ctrl-C and checks that the watch ended cleanly.
func watchOnTerminal(t *testing.T, bin, addr string, interval string, rows, cols uint16) (*screenLog, *os.File, func()) {
	t.Helper()
	master, tty, err := ptytest.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	setWinsize(t, master, rows, cols)
	cmd := exec.Command(bin, "rooms", "-w", "--interval", interval, "--addr", addr)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TERM=xterm"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		tty.Close()
		t.Fatal(err)
	}
	tty.Close() // the child holds the terminal now
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	log := &screenLog{changed: make(chan struct{}, 1)}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 8192)
		for {
			n, err := master.Read(buf)
			log.add(buf[:n])
			if err != nil { // EIO once the child closed the terminal
				return
			}
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGINT)
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("decodectl rooms -w after Ctrl-C: %v, want exit 0", err)
				}
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Errorf("decodectl rooms -w did not end on Ctrl-C")
			}
			<-readDone
		})
	}
	t.Cleanup(stop)
	return log, master, stop
}

// TestWatchFitsTerminal: `decodectl rooms -w` (the binary) on an 80x24
// terminal, with more rooms than fit and rows wider than the terminal:
// every screen keeps its header, shows the newest rooms first, cuts rows to
// the width and counts the rooms left out; --interval 10ms still redraws at
// most four times a second; and a resize to 60x12 is redrawn at once, at
// the new size.
func TestWatchFitsTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the decodectl binary; skipped with -short")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "decodectl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	d := startDaemon(t, daemonConfig{})
	d.register(t, prefillRank(prefillA, 1, 0))
	const rooms = 40
	for room := uint64(1); room <= rooms; room++ {
		// A long rid makes every row wider than 80 columns.
		if _, err := d.c.Engine().OpenRoom(testCtx(t), &pb.OpenRoomRequest{
			Rid: fmt.Sprintf("chat-completion-request-%04d-of-a-long-running-session", room), BootstrapAddr: prefillA, Room: room,
			PromptLen: 100, MaxNewTokens: 16,
		}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("80x24, --interval 10ms", func(t *testing.T) {
		start := time.Now()
		log, _, stop := watchOnTerminal(t, bin, d.addr, "10ms", 24, 80)
		screens := log.waitFor(t, "six screens", func(s []string) bool { return len(s) >= 6 })
		stop()
		elapsed := time.Since(start)
		for _, s := range screens[:6] {
			checkFits(t, s, 24, 80, "250ms", d.addr, rooms, rooms)
		}
		// At most four redraws a second, though --interval asks for 100:
		// every screen the watch drew, from its start to its end, counted
		// against the time it ran (an upper bound: a loaded machine only
		// makes it run longer, never draw more).
		log.mu.Lock()
		drawn := strings.Count(string(log.raw), clearScreen)
		log.mu.Unlock()
		if most := int(elapsed/minTermRedraw) + 2; drawn > most {
			t.Errorf("%d screens in %s: want at most 4 a second, %d (--interval 10ms clamped to %s)", drawn, elapsed, most, minTermRedraw)
		}
	})

	t.Run("resized to 60x12", func(t *testing.T) {
		// With a one-hour interval, only the resize can draw a second screen.
		log, master, stop := watchOnTerminal(t, bin, d.addr, "1h", 24, 80)
		// drawn waits for the n-th screen to have arrived whole (its last
		// line), and returns it.
		drawn := func(n int) string {
			var part string
			log.waitFor(t, fmt.Sprintf("screen %d", n), func([]string) bool {
				log.mu.Lock()
				parts := strings.Split(strings.ReplaceAll(string(log.raw), "\r\n", "\n"), clearScreen)
				log.mu.Unlock()
				if len(parts) <= n {
					return false
				}
				part = parts[n]
				return strings.Contains(part, " more rooms (showing ") && strings.HasSuffix(part, "\n")
			})
			return part
		}
		checkFits(t, drawn(1), 24, 80, "1h0m0s", d.addr, rooms, rooms)
		setWinsize(t, master, 12, 60)
		second := drawn(2)
		stop()
		checkFits(t, second, 12, 60, "1h0m0s", d.addr, rooms, rooms)
	})
}
