package faults

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

func TestMain(m *testing.M) {
	code := m.Run()
	e2e.Cleanup()
	os.Exit(code)
}

// TestScenariosShort runs every scenario's short variant against the real
// binaries (built once): what `make test` runs of the suite. Each must
// pass: every room terminal within its bound, no page held twice, the
// reuse counter 0, the log lines within their bound and the scenario's own
// checks. They run one after the other: each starts its own processes.
func TestScenariosShort(t *testing.T) {
	bins := Binaries{
		Daemon: e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane"),
		Agent:  e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-agent"),
		Etcd:   e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodeplane-dev-etcd"),
	}
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			res := RunOne(context.Background(), sc, Options{Bins: bins}, t.TempDir())
			t.Log(strings.TrimSpace(res.Report()))
			if !res.Passed() {
				t.Errorf("%s failed", sc.Name)
			}
			if res.Violations != 0 || res.Rooms == 0 || res.LogLines > res.LogLimit {
				t.Errorf("%s: %g reuse violations, %d rooms, %d of %d log lines", sc.Name, res.Violations, res.Rooms, res.LogLines, res.LogLimit)
			}
		})
	}
}

// TestLookupAndList: the scenarios are found by name, an unknown name is
// refused naming the known ones, and the list says what each injects and
// proves with both variants.
func TestLookupAndList(t *testing.T) {
	all := Scenarios()
	seen := map[string]bool{}
	for _, sc := range all {
		if seen[sc.Name] {
			t.Errorf("scenario %s is listed twice", sc.Name)
		}
		seen[sc.Name] = true
		if sc.Fault == "" || sc.Proves == "" || sc.run == nil {
			t.Errorf("scenario %s lacks its fault, what it proves or its function", sc.Name)
		}
		if sc.Short.Rooms <= 0 || sc.Full.Rooms < sc.Short.Rooms || sc.Short.Bound <= 0 || sc.Full.Bound < time.Second || sc.Short.Logs.Fixed <= 0 || sc.Full.Logs.Fixed <= 0 {
			t.Errorf("scenario %s: variants %+v, %+v", sc.Name, sc.Short, sc.Full)
		}
	}
	got, err := Lookup([]string{"abort-storm", "lost-ack"})
	if err != nil || len(got) != 2 || got[0].Name != "abort-storm" || got[1].Name != "lost-ack" {
		t.Fatalf("Lookup(abort-storm, lost-ack) = %v, %v", got, err)
	}
	if _, err := Lookup([]string{"lost-ack", "no-such"}); err == nil || !strings.Contains(err.Error(), "no-such") || !strings.Contains(err.Error(), "daemon-paused") {
		t.Fatalf("Lookup(no-such) = %v, want an error naming it and the known scenarios", err)
	}
	var b bytes.Buffer
	List(&b)
	for _, sc := range all {
		if !strings.Contains(b.String(), sc.Name+"\n  fault:  "+sc.Fault) {
			t.Errorf("List lacks %s and its fault", sc.Name)
		}
	}
}
