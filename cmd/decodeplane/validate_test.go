package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/kvlayout"
)

func runCmd(args, environ []string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, environ, &out, &errb)
	return code, out.String(), errb.String()
}

func TestExamplesAreValid(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples found")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			l, err := config.Load(f, nil, config.Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Config.Validate(); err != nil {
				t.Errorf("invalid as shipped:\n%v", err)
			}
			if code, _, stderr := runCmd([]string{"validate", "--config", f}, nil); code != exitOK {
				t.Errorf("validate exited %d:\n%s", code, stderr)
			}
		})
	}
}

func TestValidateCommandReportsEveryProblem(t *testing.T) {
	mla := "kv_pool:\n  kind: mla\n  kv_lora_rank: 512\n  qk_rope_head_dim: 64\nadmission:\n  priority: lifo\n"
	t.Run("three rule violations from three layers", func(t *testing.T) {
		path := writeConfig(t, mla)
		code, _, stderr := runCmd([]string{"validate", "--config", path, "--set", "transfer.backend=x"}, []string{"SGLANG_DISAGG_STAGING_BUFFER=1"})
		if code != exitUsage {
			t.Errorf("exit code %d, want %d", code, exitUsage)
		}
		for _, w := range []string{
			"the configuration has 3 problems:",
			"1. ", "2. ", "3. ",
			`staging.enabled = true   (from env SGLANG_DISAGG_STAGING_BUFFER="1")`,
			kvlayout.MsgStagingMLA,
			`transfer.backend = "x"   (from flag --set transfer.backend)`,
			"Unsupported transfer backend: x",
			fmt.Sprintf(`admission.priority = "lifo"   (from file %s:6)`, path),
		} {
			if !strings.Contains(stderr, w) {
				t.Errorf("stderr does not contain %q:\n%s", w, stderr)
			}
		}
		if strings.Contains(stderr, "4. ") {
			t.Errorf("more than three problems:\n%s", stderr)
		}
	})
	t.Run("load and rule problems together", func(t *testing.T) {
		path := writeConfig(t, mla+"bogus: 1\n")
		code, _, stderr := runCmd([]string{"validate", "--config", path}, []string{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT=soon"})
		if code != exitUsage {
			t.Errorf("exit code %d, want %d", code, exitUsage)
		}
		for _, w := range []string{
			"the configuration has 3 problems:",
			path + `:7: unknown key "bogus"`,
			`env SGLANG_DISAGGREGATION_WAITING_TIMEOUT="soon"`,
			"admission.priority",
		} {
			if !strings.Contains(stderr, w) {
				t.Errorf("stderr does not contain %q:\n%s", w, stderr)
			}
		}
	})
}

// TestProblemSourceUsesTheGivenEnvironment: the value shown for an env
// source is the one run was given, not the process environment's.
func TestProblemSourceUsesTheGivenEnvironment(t *testing.T) {
	t.Setenv("SGLANG_DISAGG_STAGING_BUFFER", "0")
	path := filepath.Join(repoRoot, "deploy", "examples", "deepseek-v3-mla.yaml")
	code, _, stderr := runCmd([]string{"validate", "--config", path}, []string{"SGLANG_DISAGG_STAGING_BUFFER=yes"})
	if code != exitUsage {
		t.Fatalf("exit code %d, want %d:\n%s", code, exitUsage, stderr)
	}
	if want := `(from env SGLANG_DISAGG_STAGING_BUFFER="yes")`; !strings.Contains(stderr, want) {
		t.Errorf("stderr does not contain %q:\n%s", want, stderr)
	}
}

// --- the acceptance ------------------------------------------------

func TestAcceptanceStagingOnMLA(t *testing.T) {
	mla := filepath.Join(repoRoot, "deploy", "examples", "deepseek-v3-mla.yaml")
	gqa := filepath.Join(repoRoot, "deploy", "examples", "llama3-70b-gqa.yaml")
	const msg = "SGLANG_DISAGG_STAGING_BUFFER is designed for non-MLA models (e.g. GQA, MHA). MLA models should not set this flag."
	if msg != kvlayout.MsgStagingMLA {
		t.Fatalf("kvlayout.MsgStagingMLA = %q, want SGLang's %q", kvlayout.MsgStagingMLA, msg)
	}
	tests := []struct {
		name     string
		config   string
		env      []string
		wantCode int
	}{
		{"mla with staging=1", mla, []string{"SGLANG_DISAGG_STAGING_BUFFER=1"}, exitUsage},
		{"mla with staging=true", mla, []string{"SGLANG_DISAGG_STAGING_BUFFER=true"}, exitUsage},
		{"mla with staging=0", mla, []string{"SGLANG_DISAGG_STAGING_BUFFER=0"}, exitOK},
		{"mla without staging", mla, nil, exitOK},
		{"gqa with staging=1", gqa, []string{"SGLANG_DISAGG_STAGING_BUFFER=1"}, exitOK},
		{"gqa with staging=0", gqa, []string{"SGLANG_DISAGG_STAGING_BUFFER=0"}, exitOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd([]string{"validate", "--config", tt.config}, tt.env)
			if code != tt.wantCode {
				t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout, stderr)
			}
			if tt.wantCode == exitUsage {
				if !strings.Contains(stderr, msg) {
					t.Errorf("stderr does not contain SGLang's message:\n%s", stderr)
				}
				if !strings.Contains(stderr, "the configuration has 1 problem:") {
					t.Errorf("want exactly one problem:\n%s", stderr)
				}
				return
			}
			if strings.Contains(stderr, msg) {
				t.Errorf("stderr contains the MLA message:\n%s", stderr)
			}
			if !strings.Contains(stdout, "configuration is valid") {
				t.Errorf("stdout:\n%s", stdout)
			}
		})
	}
}

// --- validate --explain ----------------------------------------------------

func TestExplain(t *testing.T) {
	path := writeConfig(t, "\nkv_pool:\n  page_size: 32\n")
	env := []string{
		"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=hunter2-secret",
		"DECODEPLANE_TIMEOUTS_WAITING=1m",
	}
	code, stdout, stderr := runCmd([]string{"validate", "--explain", "--config", path, "--log-level", "debug"}, env)
	if code != exitOK {
		t.Fatalf("exit code %d:\n%s", code, stderr)
	}
	if strings.Contains(stdout+stderr, "hunter2") {
		t.Errorf("the secret leaked:\n%s\n%s", stdout, stderr)
	}
	lines := map[string][]string{}
	for _, line := range strings.Split(stdout, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 {
			lines[f[0]] = f[1:]
		}
	}
	if got := lines["KEY"]; !slices.Equal(got, []string{"VALUE", "SOURCE"}) {
		t.Errorf("header = %q", got)
	}
	l, err := config.Load("", nil, config.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range l.Keys() {
		got, ok := lines[k]
		if !ok {
			t.Errorf("%s is not listed", k)
			continue
		}
		wantValue, wantSource := l.Value(k), []string{"default"}
		switch k {
		case "kv_pool.page_size":
			wantValue, wantSource = "32", []string{"file", path + ":3"}
		case "server.auth_token":
			wantValue, wantSource = "<redacted>", []string{"env", "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"}
		case "timeouts.waiting":
			wantValue, wantSource = "1m0s", []string{"env", "DECODEPLANE_TIMEOUTS_WAITING"}
		case "log.level":
			wantValue, wantSource = `"debug"`, []string{"flag", "--log-level"}
		}
		if diff := cmp.Diff(append([]string{wantValue}, wantSource...), got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", k, diff)
		}
	}
	if strings.Contains(stdout, "effective heartbeat") {
		t.Errorf("floor note without a floored value:\n%s", stdout)
	}
}

func TestExplainHeartbeatFloor(t *testing.T) {
	tests := []struct {
		env  []string
		want string
	}{
		{[]string{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=0.5"}, "effective heartbeat after SGLang's floors: interval 2s, max failures 2"},
		{[]string{"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=0"}, "effective heartbeat after SGLang's floors: interval 5s, max failures 1"},
		{[]string{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=1", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=0"}, "effective heartbeat after SGLang's floors: interval 2s, max failures 1"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCmd([]string{"validate", "--explain"}, tt.env)
		if code != exitOK {
			t.Errorf("%q: exit code %d:\n%s", tt.env, code, stderr)
		}
		if !strings.Contains(stdout, tt.want) {
			t.Errorf("%q: stdout does not contain %q:\n%s", tt.env, tt.want, stdout)
		}
		if !strings.Contains(stderr, "below SGLang's floor") {
			t.Errorf("%q: no floor warning on stderr:\n%s", tt.env, stderr)
		}
	}
}

func TestExplainWithProblems(t *testing.T) {
	code, stdout, stderr := runCmd([]string{"validate", "--explain", "--set", "kv_pool.kind=mla"}, []string{"DECODEPLANE_SERVER_AUTH_TOKEN=hunter2"})
	if code != exitUsage {
		t.Fatalf("exit code %d", code)
	}
	if !strings.Contains(stdout, "kv_pool.kind") || !strings.Contains(stderr, "kv_pool.kv_lora_rank") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	if strings.Contains(stdout+stderr, "hunter2") {
		t.Errorf("the secret leaked:\n%s\n%s", stdout, stderr)
	}
}

// --- commands --------------------------------------------------------------

func TestCommands(t *testing.T) {
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{[]string{"version"}, exitOK, "decodeplane " + version + " (commit " + commit + ", " + runtime.Version() + ")\n", ""},
		{[]string{"--version"}, exitOK, "decodeplane " + version + " (commit " + commit + ", " + runtime.Version() + ")\n", ""},
		{[]string{"-h"}, exitOK, "Usage:", ""},
		{[]string{"help"}, exitOK, "Usage:", ""},
		{nil, exitUsage, "", "Usage:"},
		{[]string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{[]string{"validate", "-h"}, exitOK, "", "-explain"},
		{[]string{"serve", "-h"}, exitOK, "", "-listen"},
		{[]string{"validate", "--bogus"}, exitUsage, "", "flag provided but not defined: -bogus"},
		{[]string{"validate", "extra"}, exitUsage, "", "unexpected arguments: extra"},
		{[]string{"serve", "--set", "nokey"}, exitUsage, "", "want key=value"},
		{[]string{"validate"}, exitOK, "configuration is valid (the embedded defaults)", ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(tt.args, nil)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout, stderr)
			}
			if tt.wantStdout == "" && stdout != "" {
				t.Errorf("unexpected stdout:\n%s", stdout)
			}
			if !strings.Contains(stdout, tt.wantStdout) {
				t.Errorf("stdout does not contain %q:\n%s", tt.wantStdout, stdout)
			}
			if !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("stderr does not contain %q:\n%s", tt.wantStderr, stderr)
			}
		})
	}
}

// TestServeRefusesInvalidConfig covers serve's config path in-process (the
// e2e tests cover it through the binary).
func TestServeRefusesInvalidConfig(t *testing.T) {
	code, _, stderr := runCmd([]string{"serve", "--set", "kv_pool.page_size=3", "--listen", "127.0.0.1:1"}, []string{"DECODEPLANE_FOO=1"})
	if code != exitUsage {
		t.Fatalf("exit code %d, want %d:\n%s", code, exitUsage, stderr)
	}
	for _, w := range []string{"the configuration has 2 problems", "DECODEPLANE_FOO", "kv_pool.page_size", "refusing to start"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr does not contain %q:\n%s", w, stderr)
		}
	}
}
