package main

import (
	"strings"
	"testing"
)

// The README's tour: pick a room without copying an 18-digit ID.

func TestRoomLatest(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	// Room 5 opened last; room 3 is the only failed one.
	for _, tt := range []struct {
		args []string
		id   string
	}{
		{[]string{"room", "--latest"}, "5"},
		{[]string{"room", "--latest", "--pages"}, "5"},
		{[]string{"room", "--latest-failed"}, "3"},
	} {
		out := d.mustCtl(t, tt.args...)
		if got := rowOf(out, "Room:"); len(got) != 2 || got[1] != tt.id {
			t.Errorf("decodectl %v: shows room %v, want %s:\n%s", tt.args, got, tt.id, out)
		}
		// The same as naming the room.
		byID := d.mustCtl(t, append([]string{"room", tt.id}, tt.args[2:]...)...)
		if a, b := stripTimes(out), stripTimes(byID); a != b {
			t.Errorf("decodectl %v:\n%s\nwant what room %s prints:\n%s", tt.args, a, tt.id, b)
		}
	}
	if out := d.mustCtl(t, "room", "--latest-failed"); !strings.Contains(out, "aborted: Aborted by AbortReq.") {
		t.Errorf("room --latest-failed is not the aborted room:\n%s", out)
	}
}

func TestRoomLatestNone(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	r := d.ctl("room", "--latest")
	if r.code != exitFailure || r.stdout != "" || r.stderr != "decodectl: --latest: no room at "+d.addr+" yet (make demo opens some)\n" {
		t.Errorf("room --latest on an empty daemon: %v", r)
	}
	d.register(t, prefillRank(prefillA, 1, 0))
	d.open(t, prefillA, 7, 100)
	r = d.ctl("room", "--latest-failed")
	if r.code != exitFailure || r.stdout != "" || !strings.HasPrefix(r.stderr, "decodectl: --latest-failed: no failed room at "+d.addr) {
		t.Errorf("room --latest-failed without a failed room: %v", r)
	}
}

func TestRoomLatestUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"room", "--latest", "12"}, `decodectl: --latest picks the room: give no room ID (got "12")`},
		{[]string{"room", "--latest-failed", "12"}, `decodectl: --latest-failed picks the room: give no room ID (got "12")`},
		{[]string{"room", "--latest", "--latest-failed"}, "decodectl: --latest and --latest-failed exclude each other"},
		{[]string{"room"}, "decodectl: missing room ID (decodectl rooms lists them; decodectl room --latest shows the newest)"},
	} {
		r := decodectl(nil, append(tt.args, "--addr", "127.0.0.1:1")...)
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("decodectl %q: %v\nwant exit 2 and %q on stderr", tt.args, r, tt.want)
		}
	}
}
