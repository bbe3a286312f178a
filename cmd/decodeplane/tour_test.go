package main

import (
	"strings"
	"testing"
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
