package decodeplane_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/decodeplane/decodeplane/internal/testing/ptytest"
)

// makeHelp runs `make help` with stdout on a pipe, or on a terminal when
// tty is set, in an environment without NO_COLOR plus extra.
func makeHelp(t *testing.T, tty bool, extra ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", "-s", "--no-print-directory", "help")
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "NO_COLOR" && name != "MAKEFLAGS" && name != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, extra...)
	if !tty {
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make help: %v", err)
		}
		return string(out)
	}
	master, term, err := ptytest.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer master.Close()
	cmd.Stdout, cmd.Stderr = term, term
	if err := cmd.Start(); err != nil {
		term.Close()
		t.Fatal(err)
	}
	term.Close() // the child holds the terminal now
	var out bytes.Buffer
	// The master reads EIO once the child closed the terminal.
	if _, err := io.Copy(&out, master); err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading the terminal: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("make help: %v\n%s", err, out.String())
	}
	return strings.ReplaceAll(out.String(), "\r\n", "\n")
}

// TestMakeHelpColour: colour codes only on a terminal, never with NO_COLOR.
func TestMakeHelpColour(t *testing.T) {
	const plain = "  help         Show this help.\n"
	if out := makeHelp(t, false); strings.Contains(out, "\x1b") || !strings.Contains(out, plain) {
		t.Errorf("make help into a pipe printed escape codes or lost the list:\n%q", out)
	}
	if out := makeHelp(t, true); !strings.Contains(out, "  \x1b[36mhelp        \x1b[0m Show this help.\n") {
		t.Errorf("make help on a terminal is not coloured:\n%q", out)
	}
	if out := makeHelp(t, true, "NO_COLOR=1"); strings.Contains(out, "\x1b") || !strings.Contains(out, plain) {
		t.Errorf("make help on a terminal with NO_COLOR=1 printed escape codes:\n%q", out)
	}
}

// TestProtoCheckFailsWithoutProtoc: a proto-check that could not generate
// fails (it once printed "current" when protoc was missing).
func TestProtoCheckFailsWithoutProtoc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the protoc plugins")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", "-s", "--no-print-directory", "proto-check", "PROTOC="+t.TempDir()+"/no-protoc")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make proto-check without protoc succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "proto-check: generating failed") || strings.Contains(string(out), "is current") {
		t.Errorf("make proto-check without protoc printed:\n%s", out)
	}
}
