package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// transfer.sim.bandwidth_gbps was renamed transfer.sim.bandwidth_gbytes_per_s:
// the old name, wherever it is given, is refused by validate (exit 2) with a
// message that names the new one, and every use of it is listed at once.
func TestRenamedBandwidthKey(t *testing.T) {
	const why = "(the value is in gigabytes per second, as it always was; the old name read as gigabits). "
	path := writeConfig(t, "transfer:\n  sim:\n    bandwidth_gbps: 8\n")
	code, stdout, stderr := runCmd([]string{"validate", "--config", path, "--set", "transfer.sim.bandwidth_gbps=9"},
		[]string{"DECODEPLANE_TRANSFER_SIM_BANDWIDTH_GBPS=10"})
	if code != exitUsage || stdout != "" {
		t.Fatalf("validate with the old key: exit %d, stdout %q; want 2 and nothing\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"the configuration has 3 problems",
		path + ":3: transfer.sim.bandwidth_gbps is deprecated and no longer read: it was renamed transfer.sim.bandwidth_gbytes_per_s " + why +
			"Please use transfer.sim.bandwidth_gbytes_per_s instead.",
		"env DECODEPLANE_TRANSFER_SIM_BANDWIDTH_GBPS is deprecated and no longer read: it was renamed DECODEPLANE_TRANSFER_SIM_BANDWIDTH_GBYTES_PER_S " +
			"(the key transfer.sim.bandwidth_gbytes_per_s; the value is in gigabytes per second, as it always was; the old name read as gigabits). " +
			"Please use DECODEPLANE_TRANSFER_SIM_BANDWIDTH_GBYTES_PER_S instead.",
		"flag --set transfer.sim.bandwidth_gbps: transfer.sim.bandwidth_gbps is deprecated and no longer read: it was renamed transfer.sim.bandwidth_gbytes_per_s " + why +
			"Please use transfer.sim.bandwidth_gbytes_per_s instead.",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("validate output lacks %q:\n%s", want, stderr)
		}
	}

	// The new key, from each source, is read as gigabytes per second.
	path = writeConfig(t, "transfer:\n  sim:\n    bandwidth_gbytes_per_s: 8\n")
	for _, tt := range []struct {
		args, env []string
		value     string
	}{
		{[]string{"--config", path}, nil, "8"},
		{[]string{"--config", path}, []string{"DECODEPLANE_TRANSFER_SIM_BANDWIDTH_GBYTES_PER_S=2.5"}, "2.5"},
		{[]string{"--config", path, "--set", "transfer.sim.bandwidth_gbytes_per_s=0"}, nil, "0"},
	} {
		code, stdout, stderr := runCmd(append([]string{"validate", "--explain"}, tt.args...), tt.env)
		if code != exitOK {
			t.Errorf("validate %v (env %v): exit %d\n%s", tt.args, tt.env, code, stderr)
			continue
		}
		if f := rowFields(stdout, "transfer.sim.bandwidth_gbytes_per_s"); len(f) < 2 || f[1] != tt.value {
			t.Errorf("validate --explain %v (env %v): bandwidth row %q, want value %s", tt.args, tt.env, f, tt.value)
		}
	}

	// The bench's flag followed the key.
	code, _, stderr = benchTestRun(t, "--sim-bandwidth-gbps", "1")
	if code != exitUsage || !strings.Contains(stderr, "--sim-bandwidth-gbps is deprecated and no longer read: it was renamed --sim-bandwidth-gbytes-per-s") {
		t.Errorf("bench --sim-bandwidth-gbps: exit %d, stderr %q", code, stderr)
	}
}

// rowFields returns the fields of the first line of out whose first field
// is key.
func rowFields(out, key string) []string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == key {
			return f
		}
	}
	return nil
}

// TestBenchStopsWhenTheDaemonStops: make demo against a daemon that is
// killed mid-run stops by itself, prints the summary and exits 1 saying the
// daemon stopped answering (it used to fail rooms until Ctrl-C).
func TestBenchStopsWhenTheDaemonStops(t *testing.T) {
	addr := freeAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen=", "--log-level", "error"}, e2eEnviron())
	if err := roomsWaitServing(t, p, addr); err != nil {
		t.Fatalf("the daemon did not serve: %v\n%s", err, p.Out.String())
	}
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// make demo's command line, with a 1s bound instead of 5s.
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := run([]string{"bench", "--target", addr, "--rate", "20", "--duration", "0", "--prefill-ranks", "2", "--concurrency", "8",
			"--unreachable-timeout", "1s", "--progress=false"}, []string{}, &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()

	// Rooms flow: wait (bounded) until the daemon released a few.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		list, err := c.Admin().ListRooms(ctx, &pb.ListRoomsRequest{Phases: []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_RELEASED}, Limit: 1})
		cancel()
		if err == nil && list.GetTotal() >= 5 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the bench ended before the daemon stopped: %+v", r)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no room released within 30s (last error %v)\n%s", err, p.Out.String())
		}
	}

	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the bench went on for 30s after the daemon was killed")
	}
	// 1s of silence, a probe interval of 250ms, and slack for a loaded
	// machine.
	if took := time.Since(killed); took > 10*time.Second {
		t.Errorf("the bench stopped %s after the daemon was killed, want about 1s", took)
	}
	if r.code != exitFailure {
		t.Errorf("exit code %d, want %d", r.code, exitFailure)
	}
	msg := regexp.MustCompile(`decodeplane bench: the daemon at ` + regexp.QuoteMeta(addr) +
		` has not answered for [0-9.]+m?s \(--unreachable-timeout 1s; last error: .+\): stopped; is it still running\? the figures cover the rooms that finished\n$`)
	if !msg.MatchString(r.stderr) {
		t.Errorf("stderr does not end with the reason:\n%s", r.stderr)
	}
	// The summary of what ran before.
	m := regexp.MustCompile(`(?m)^rooms ok\s+([0-9]+)$`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no summary:\n%s", r.stdout)
	}
	if n, _ := strconv.Atoi(m[1]); n < 5 {
		t.Errorf("rooms ok %d, want the >= 5 released before the kill:\n%s", n, r.stdout)
	}
}
