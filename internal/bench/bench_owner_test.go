package bench

import (
	"strings"
	"testing"
)

// TestBenchEngineOwner: with --page-owner engine the bench's decode engine
// declares every room's destination from its own free lists, on both apis:
// every room succeeds, the unary path makes one DeclareDestination call per
// room, the stream path none (the declaration rides the engine session);
// with failures injected, failed rooms' pages come back only once they
// are reusable and the run still ends with every room accounted for. A
// daemon whose owner is not the one asked for is refused, naming the fix.
func TestBenchEngineOwner(t *testing.T) {
	args := []string{"--page-owner", "engine", "--rooms", "300", "--concurrency", "32", "--warmup", "20", "--bare-duration", "0", "--json"}
	for _, api := range []string{"unary", "stream"} {
		code, out, errOut := benchTestRun(t, append([]string{"--api", api}, args...)...)
		if code != exitOK {
			t.Fatalf("--api %s: exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", api, code, out, errOut)
		}
		j := benchTestJSON(t, out)
		if j.PageOwner != "engine" || j.RoomsOK != 300 || j.RoomsFailed != 0 {
			t.Errorf("--api %s: page owner %q, rooms ok %d, failed %d; want engine, 300, 0 (failures %v)", api, j.PageOwner, j.RoomsOK, j.RoomsFailed, j.Failures)
		}
		declares := j.Messages.ByMethod["DeclareDestination"].Calls
		if want := map[string]float64{"unary": 1, "stream": 0}[api]; declares != want {
			t.Errorf("--api %s: %v DeclareDestination calls per room, want %v", api, declares, want)
		}
		if !strings.Contains(strings.Join(j.Setup, "\n"), "page owner  engine") {
			t.Errorf("--api %s: the setup does not name the page owner: %q", api, j.Setup)
		}
	}
	code, out, errOut := benchTestRun(t, "--page-owner", "engine", "--rooms", "200", "--concurrency", "16", "--warmup", "0", "--bare-duration", "0",
		"--set", "transfer.sim.failure_probability=0.3", "--room-timeout", "30s", "--json")
	if code != exitOK {
		t.Fatalf("with failures: exit code %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if j := benchTestJSON(t, out); j.RoomsOK+j.RoomsFailed != 200 || j.RoomsFailed == 0 {
		t.Fatalf("with failures: rooms ok %d, failed %d; want 200 in all, some failed", j.RoomsOK, j.RoomsFailed)
	}
	code, _, errOut = benchTestRun(t, "--set", "kv_pool.owner=engine", "--rooms", "10", "--bare-duration", "0")
	if code != exitFailure || !strings.Contains(errOut, "has kv_pool.owner engine: run the bench with --page-owner engine") {
		t.Errorf("a daemon owned by its engine, the bench's default owner: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = benchTestRun(t, "--page-owner", "vllm")
	if code != exitUsage || !strings.Contains(errOut, `--page-owner "vllm": must be daemon or engine`) {
		t.Errorf("--page-owner vllm: exit %d, stderr %q", code, errOut)
	}
}
