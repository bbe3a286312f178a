package kvmanager

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/internal/stormlog"
	"github.com/decodeplane/decodeplane/kvlayout"
)

// lineLog collects log lines (a text handler's), safe for the manager's
// goroutines.
type lineLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lineLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSuffix(l.b.String(), "\n"), "\n")
}

var msgOf = regexp.MustCompile(`msg="([^"]*)"|msg=(\S+)`)

// byMessage counts lines by message.
func byMessage(lines []string) map[string]int {
	out := map[string]int{}
	for _, l := range lines {
		if m := msgOf.FindStringSubmatch(l); m != nil {
			out[m[1]+m[2]]++
		}
	}
	return out
}

// stormLines drives n rooms into one failure: a prefill instance whose
// heartbeats stop while n rooms wait on it (the first ones admitted, two
// claimed with their ranks writing by themselves, so that they drain, the
// rest queued behind a full pool), then a shutdown. It returns the log
// lines by message (INFO and above), after the storm logger's interval.
func stormLines(t *testing.T, n int) map[string]int {
	var counts map[string]int
	bubble(t, func(t *testing.T) {
		var logs lineLog
		h := newHarness(t, withRun(),
			withLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
			withDecode(func(c *kvlayout.Config) { c.Admission.MaxQueued = n }),
			withConfig(func(c *Config) { c.Release.DeferredTimeout, c.Rooms.MaxRetained = 30*time.Second, n }))
		in := instance{addr: addrA}
		h.register(in)
		h.m.selfWriters.note(addrA)
		for i := range n {
			h.open(addrA, uint64(i+1))
		}
		h.claimAll(1)
		h.claimAll(2)
		st := h.m.Status()
		if st.RoomsByPhase[PhaseQueued] < n/2 {
			t.Fatalf("%d of %d rooms queued, want most of them (a full pool): %v", st.RoomsByPhase[PhaseQueued], n, st.RoomsByPhase)
		}
		advance(10 * time.Second) // two heartbeat intervals of silence: the instance is lost
		if got := h.m.Status().RoomsByPhase[PhaseFailed]; got != n {
			t.Fatalf("%d of %d rooms failed after the loss", got, n)
		}
		h.wantFailure(uint64(n), FailurePrefillLost, "Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), "+fmt.Sprint(n)+" requests affected")
		advance(stormlog.DefaultInterval) // the summaries
		advance(30 * time.Second)         // the drains expire
		advance(stormlog.DefaultInterval)
		counts = byMessage(logs.lines())
		h.assertClean()
	})
	return counts
}

// TestStormLogLinesBounded: a prefill lost with 100,000 rooms waiting on it
// writes as many log lines as one lost with 1,000: a constant, one line per
// cause per interval (the loss itself, the first room failure and one
// summary counting the others, the drains started and expired), while each
// room's own account stays in its events and GetRoom.
func TestStormLogLinesBounded(t *testing.T) {
	small := stormLines(t, 1000)
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	big := stormLines(t, n)
	if fmt.Sprint(small) != fmt.Sprint(big) {
		t.Errorf("log lines by message with 1,000 rooms %v, with %d rooms %v: want the same", small, n, big)
	}
	total := 0
	for _, c := range big {
		total += c
	}
	want := map[string]int{
		"prefill instance registered":               1,
		"prefill instance lost: heartbeats stopped": 1,
		"room failed": 2, // the first, then the summary of the others
		"room's pages draining until its prefill ranks acknowledge":                                            2,
		"room's pages released without every prefill rank's acknowledgement: release.deferred_timeout expired": 2,
	}
	if fmt.Sprint(big) != fmt.Sprint(want) {
		t.Errorf("log lines by message %v, want %v (%d lines in all)", big, want, total)
	}
}
