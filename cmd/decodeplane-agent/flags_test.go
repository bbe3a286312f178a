package main

import (
	"io"
	"slices"
	"strings"
	"testing"
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
