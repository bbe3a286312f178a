package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// frameWriter collects a watch's output and calls onFrame after each write
// (the watch writes each frame at once); it stands for the operator, who
// interrupts the watch from onFrame.
type frameWriter struct {
	buf     bytes.Buffer
	frames  int
	onFrame func(n int)
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	w.frames++
	w.onFrame(w.frames)
	return len(p), nil
}

func TestWatch(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// After the first frame a room opens; the second frame shows it; the
	// operator interrupts after the third.
	w := &frameWriter{onFrame: func(n int) {
		switch n {
		case 1:
			d.open(t, prefillA, 9, 100)
		case 3:
			cancel()
		}
	}}
	var stderr bytes.Buffer
	code := runContext(ctx, []string{"rooms", "-w", "--interval", "10ms", "--addr", d.addr, "--live"}, nil, w, &stderr)
	if code != exitOK || stderr.Len() != 0 {
		t.Fatalf("rooms -w: exit %d, stderr %q", code, stderr.String())
	}
	out := w.buf.String()
	if strings.Contains(out, "\x1b[") {
		t.Errorf("the watch cleared a screen that is not a terminal:\n%q", out)
	}
	frames := strings.Split(out, "Every 10ms: decodectl rooms at "+d.addr)
	if len(frames) != 4 || frames[0] != "" {
		t.Fatalf("want 3 frames, got:\n%s", out)
	}
	if diff := cmp.Diff([]string{"5", "4", "1"}, roomRows(frames[1])); diff != "" {
		t.Errorf("first frame (-want +got):\n%s\n%s", diff, frames[1])
	}
	if diff := cmp.Diff([]string{"9", "5", "4", "1"}, roomRows(frames[2])); diff != "" {
		t.Errorf("second frame (-want +got):\n%s\n%s", diff, frames[2])
	}
	if !strings.Contains(frames[2], "ROOM  RID    STATE") || !strings.HasSuffix(frames[2], "showing 4 of 4 rooms\n\n") {
		t.Errorf("second frame:\n%s", frames[2])
	}
}

func TestWatchJSON(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &frameWriter{onFrame: func(n int) {
		if n == 2 {
			cancel()
		}
	}}
	var stderr bytes.Buffer
	if code := runContext(ctx, []string{"--addr", d.addr, "-o", "json", "rooms", "--watch", "--interval", "10ms"}, nil, w, &stderr); code != exitOK {
		t.Fatalf("rooms --watch -o json: exit %d, stderr %q", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines (one document per frame), got:\n%s", w.buf.String())
	}
	for _, l := range lines {
		var resp pb.ListRoomsResponse
		if err := protojson.Unmarshal([]byte(l), &resp); err != nil || resp.GetTotal() != 5 {
			t.Errorf("frame %q: %v, total %d", l, err, resp.GetTotal())
		}
	}
}

func TestWatchFirstFailure(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	var stdout, stderr bytes.Buffer
	// The first refresh failing ends the watch: there is nothing to show.
	code := runContext(t.Context(), []string{"rooms", "-w", "--addr", d.addr, "--phase", "failed", "--prefill", "not an address"}, nil, &stdout, &stderr)
	if code != exitFailure || stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "decodectl: rooms: InvalidArgument: ") {
		t.Errorf("rooms -w with a bad filter: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}
