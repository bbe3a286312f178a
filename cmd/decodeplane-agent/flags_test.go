package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/internal/stormlog"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// TestAgentSharedMemoryDirsFlag: --shared-memory-dirs defaults to /dev/shm,
// takes a comma-separated list of absolute directories, is empty to admit
// none, and refuses a relative directory.
func TestAgentSharedMemoryDirsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		err  string
	}{
		{nil, []string{"/dev/shm"}, ""},
		{[]string{"--shared-memory-dirs", "/dev/shm/engine, /run/kv/"}, []string{"/dev/shm/engine", "/run/kv"}, ""},
		{[]string{"--shared-memory-dirs", ""}, nil, ""},
		{[]string{"--shared-memory-dirs", "/dev/shm,kv"}, nil, `--shared-memory-dirs: "kv" is not an absolute directory`},
	} {
		o, err := parse(tc.args, io.Discard)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parse(%q) = %v, want an error saying %q", tc.args, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("parse(%q): %v", tc.args, err)
		case tc.err == "" && !slices.Equal(o.sharedDirs, tc.want):
			t.Errorf("parse(%q) shared dirs = %q, want %q", tc.args, o.sharedDirs, tc.want)
		}
	}
	if code := run([]string{"--shared-memory-dirs", "relative"}, io.Discard); code != exitUsage {
		t.Errorf("run with a relative --shared-memory-dirs = %d, want %d", code, exitUsage)
	}
}

// TestHoldLogsBounded: a storm of held batches, one per room, writes one
// line at Info at once and one summary with the count when flushed,
// however many rooms; at debug level each held batch also has its own
// line naming its room. A batch of a room not listed is not held.
func TestHoldLogsBounded(t *testing.T) {
	const n = 100_000
	rooms := make([]uint64, n)
	for i := range rooms {
		rooms[i] = uint64(i + 1)
	}
	o := options{holdRooms: rooms}
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		storm := stormlog.New(log, stormlog.Options{})
		hold := holdFunc(o, log, storm)
		if hold(kvcopy.Batch{ID: "b0", Room: n + 1}) {
			t.Fatalf("a batch of room %d (not listed) was held", n+1)
		}
		for _, r := range rooms {
			if !hold(kvcopy.Batch{ID: fmt.Sprintf("b%d", r), Room: r}) {
				t.Fatalf("the batch of room %d was not held", r)
			}
		}
		storm.Close()
		var info, debug int
		for line := range strings.Lines(buf.String()) {
			switch {
			case strings.Contains(line, "level=DEBUG") && strings.Contains(line, "batch held"):
				debug++
			case strings.Contains(line, "level=INFO"):
				info++
			}
		}
		wantDebug := 0
		if level == slog.LevelDebug {
			wantDebug = n
		}
		if info != 2 || debug != wantDebug || !strings.Contains(buf.String(), fmt.Sprintf("count=%d ", n-1)) {
			t.Errorf("level %v: %d lines at INFO (want 2: the first and a summary with count=%d), %d at DEBUG (want %d)", level, info, n-1, debug, wantDebug)
		}
	}
}
