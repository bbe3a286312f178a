package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/prealloc"
)

// repoRoot is the module root as seen from this package's directory (where
// go test runs the tests).
const repoRoot = "../.."

// writeConfig writes content to a fresh file and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "decodeplane.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadArgs parses command-line flags as serve/validate do and loads the
// configuration from them and environ.
func loadArgs(t *testing.T, args, environ []string) (*Loaded, error) {
	t.Helper()
	cf := newConfigFlags("test", io.Discard)
	if err := cf.parse(args, environ); err != nil {
		return nil, err
	}
	return Load(cf.path, environ, cf.overrides)
}

// mustLoadArgs is loadArgs that fails the test on any error.
func mustLoadArgs(t *testing.T, args, environ []string) *Loaded {
	t.Helper()
	l, err := loadArgs(t, args, environ)
	if err != nil {
		t.Fatalf("load %q with env %q: %v", args, environ, err)
	}
	return l
}

// configErrors returns the *prealloc.ConfigError problems of err, failing the
// test on any other kind of error.
func configErrors(t *testing.T, err error) []*prealloc.ConfigError {
	t.Helper()
	if err == nil {
		return nil
	}
	var out []*prealloc.ConfigError
	for _, e := range flatten(err) {
		var ce *prealloc.ConfigError
		if !errors.As(e, &ce) {
			t.Fatalf("problem %v (%T) is not a *prealloc.ConfigError", e, e)
		}
		out = append(out, ce)
	}
	return out
}

func errorKeys(errs []*prealloc.ConfigError) []string {
	var keys []string
	for _, e := range errs {
		keys = append(keys, e.Key)
	}
	slices.Sort(keys)
	return keys
}

func runCmd(args, environ []string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, environ, &out, &errb)
	return code, out.String(), errb.String()
}

// --- precedence and provenance ------------------------------------------

func TestPrecedence(t *testing.T) {
	file := writeConfig(t, "kv_pool:\n  page_size: 32\ntimeouts:\n  waiting: 100s\n")
	other := writeConfig(t, "\n\nkv_pool:\n  page_size: 8\n")
	fileSrc := func(p string, line int) string { return fmt.Sprintf("file %s:%d", p, line) }
	tests := []struct {
		name           string
		args, env      []string
		wantPage       int
		wantPageSrc    string
		wantWaiting    time.Duration
		wantWaitingSrc string
	}{
		{
			name:     "defaults",
			wantPage: 64, wantPageSrc: "default",
			wantWaiting: 300 * time.Second, wantWaitingSrc: "default",
		},
		{
			name:     "file over defaults",
			args:     []string{"--config", file},
			wantPage: 32, wantPageSrc: fileSrc(file, 2),
			wantWaiting: 100 * time.Second, wantWaitingSrc: fileSrc(file, 4),
		},
		{
			name:     "DECODEPLANE_CONFIG names the file",
			env:      []string{"DECODEPLANE_CONFIG=" + file},
			wantPage: 32, wantPageSrc: fileSrc(file, 2),
			wantWaiting: 100 * time.Second, wantWaitingSrc: fileSrc(file, 4),
		},
		{
			name:     "--config beats DECODEPLANE_CONFIG",
			args:     []string{"--config", other},
			env:      []string{"DECODEPLANE_CONFIG=" + file},
			wantPage: 8, wantPageSrc: fileSrc(other, 4),
			wantWaiting: 300 * time.Second, wantWaitingSrc: "default",
		},
		{
			name:     "SGLang env over file",
			args:     []string{"--config", file},
			env:      []string{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT=200"},
			wantPage: 32, wantPageSrc: fileSrc(file, 2),
			wantWaiting: 200 * time.Second, wantWaitingSrc: "env SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
		},
		{
			name: "DECODEPLANE env over SGLang env and file",
			args: []string{"--config", file},
			// DECODEPLANE_* first in environ: it must still win.
			env:      []string{"DECODEPLANE_TIMEOUTS_WAITING=250s", "DECODEPLANE_KV_POOL_PAGE_SIZE=16", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=200"},
			wantPage: 16, wantPageSrc: "env DECODEPLANE_KV_POOL_PAGE_SIZE",
			wantWaiting: 250 * time.Second, wantWaitingSrc: "env DECODEPLANE_TIMEOUTS_WAITING",
		},
		{
			name:     "flags over everything",
			args:     []string{"--config", file, "--set", "kv_pool.page_size=128", "--set", "timeouts.waiting=7s"},
			env:      []string{"DECODEPLANE_TIMEOUTS_WAITING=250s", "DECODEPLANE_KV_POOL_PAGE_SIZE=16", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=200"},
			wantPage: 128, wantPageSrc: "flag --set kv_pool.page_size",
			wantWaiting: 7 * time.Second, wantWaitingSrc: "flag --set timeouts.waiting",
		},
		{
			name:     "the last flag wins",
			args:     []string{"--set", "kv_pool.page_size=8", "--set", "kv_pool.page_size=256"},
			wantPage: 256, wantPageSrc: "flag --set kv_pool.page_size",
			wantWaiting: 300 * time.Second, wantWaitingSrc: "default",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustLoadArgs(t, tt.args, tt.env)
			if got := l.Config.KVPool.PageSize; got != tt.wantPage {
				t.Errorf("kv_pool.page_size = %d, want %d", got, tt.wantPage)
			}
			if got := l.Sources["kv_pool.page_size"]; got != tt.wantPageSrc {
				t.Errorf("source of kv_pool.page_size = %q, want %q", got, tt.wantPageSrc)
			}
			if got := l.Config.Timeouts.Waiting; got != tt.wantWaiting {
				t.Errorf("timeouts.waiting = %s, want %s", got, tt.wantWaiting)
			}
			if got := l.Sources["timeouts.waiting"]; got != tt.wantWaitingSrc {
				t.Errorf("source of timeouts.waiting = %q, want %q", got, tt.wantWaitingSrc)
			}
			// Every other key keeps its default and says so.
			for _, k := range l.Keys() {
				if k == "kv_pool.page_size" || k == "timeouts.waiting" {
					continue
				}
				if l.Sources[k] != "default" {
					t.Errorf("source of %s = %q, want default", k, l.Sources[k])
				}
			}
		})
	}
}

func TestDedicatedFlags(t *testing.T) {
	tests := []struct {
		args      []string
		key, want string
		src       string
	}{
		{[]string{"--listen", "127.0.0.1:9000"}, "server.listen", `"127.0.0.1:9000"`, "flag --listen"},
		{[]string{"--metrics-listen", ""}, "server.metrics_listen", `""`, "flag --metrics-listen"},
		{[]string{"--transfer-path", "delegate", "--agent", "10.0.0.1:7700"}, "transfer.path", `"delegate"`, "flag --transfer-path"},
		{[]string{"--transfer-path", "delegate", "--agent", "10.0.0.1:7700"}, "transfer.delegate.target", `"10.0.0.1:7700"`, "flag --agent"},
		{[]string{"--log-level", "debug"}, "log.level", `"debug"`, "flag --log-level"},
		{[]string{"--log-format", "json"}, "log.format", `"json"`, "flag --log-format"},
		{[]string{"--reflection=false"}, "server.reflection", "false", "flag --reflection"},
		{[]string{"--reflection"}, "server.reflection", "true", "flag --reflection"},
		{[]string{"--set", "server.reflection=false", "--reflection=true"}, "server.reflection", "true", "flag --reflection"},
		{[]string{"--set", "kv_pool.kind=MLA"}, "kv_pool.kind", "mla", "flag --set kv_pool.kind"},
		{[]string{"--set", "kv_pool.kind=hybrid_linear"}, "kv_pool.kind", "hybrid-linear", "flag --set kv_pool.kind"},
		{[]string{"--set", "server.listen=a:1=b"}, "server.listen", `"a:1=b"`, "flag --set server.listen"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			l := mustLoadArgs(t, tt.args, nil)
			if got := l.Value(tt.key); got != tt.want {
				t.Errorf("%s = %s, want %s", tt.key, got, tt.want)
			}
			if got := l.Sources[tt.key]; got != tt.src {
				t.Errorf("source of %s = %q, want %q", tt.key, got, tt.src)
			}
		})
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want []string // substrings of the error
	}{
		{[]string{"--set", "kv_pool.heads=8"}, []string{"--set kv_pool.heads", `unknown configuration key "kv_pool.heads"`}},
		{[]string{"--set", "kv_pool.page_size=big"}, []string{"--set kv_pool.page_size", "kv_pool.page_size", `"big" is not an integer`}},
		{[]string{"--set", "timeouts.waiting=300"}, []string{"--set timeouts.waiting", "not a duration"}},
		{[]string{"--set", "kv_pool.kind=mqa"}, []string{"--set kv_pool.kind", `unknown kv pool kind "mqa"`}},
		{[]string{"--set", "staging.enabled=maybe"}, []string{"--set staging.enabled", "not a boolean"}},
		{[]string{"--set", "transfer.sim.failure_probability=NaN"}, []string{"--set transfer.sim.failure_probability", "not a finite number"}},
		{[]string{"--set", "kv_pool"}, []string{"want key=value"}},
		{[]string{"--set", "=1"}, []string{"want key=value"}},
		{[]string{"stray"}, []string{"unexpected arguments: stray"}},
		{[]string{"--no-such-flag"}, []string{"no-such-flag"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := loadArgs(t, tt.args, nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// --- strict YAML ----------------------------------------------------------

func TestStrictYAML(t *testing.T) {
	tests := []struct {
		name    string
		content string
		line    int
		want    []string
	}{
		{"unknown top-level key", "server:\n  listen: 127.0.0.1:1\nbogus: 1\n", 3,
			[]string{`unknown key "bogus" at the top level`, "allowed: server, log, transfer, kv_pool, parallel, staging, admission, timeouts, dp_rank, rooms"}},
		{"unknown nested key", "kv_pool:\n  kind: gqa\n  heads: 8\n", 3,
			[]string{`unknown key "heads" in kv_pool`, "allowed: kind, num_layers, kv_heads"}},
		{"unknown key two levels down", "transfer:\n  sim:\n    latencyy: 1s\n", 3,
			[]string{`unknown key "latencyy" in transfer.sim`, "allowed: bandwidth_gbytes_per_s, latency, failure_probability, seed"}},
		{"scalar where a section is expected", "kv_pool: 5\n", 1,
			[]string{"kv_pool is a section (keys: kind, num_layers"}},
		{"list where a section is expected", "server:\n  - a\n", 2,
			[]string{"server is a section"}},
		{"nested scalar where a section is expected", "kv_pool:\n  swa: 128\n", 2,
			[]string{"kv_pool.swa is a section (keys: window, total_tokens)"}},
		{"mapping where a value is expected", "kv_pool:\n  page_size:\n    a: 1\n", 3,
			[]string{"kv_pool.page_size takes a single value, not a mapping"}},
		{"list where a value is expected", "kv_pool:\n  page_size: [1, 2]\n", 2,
			[]string{"kv_pool.page_size takes a single value, not a list"}},
		{"duplicate key", "kv_pool:\n  page_size: 32\n  page_size: 64\n", 3,
			[]string{`key "kv_pool.page_size" is set twice`}},
		{"duplicate section", "log:\n  level: info\nlog:\n  level: debug\n", 3,
			[]string{`key "log" is set twice`}},
		{"unparsable integer", "kv_pool:\n  page_size: big\n", 2,
			[]string{"kv_pool.page_size", `"big" is not an integer`}},
		{"duration without a unit", "timeouts:\n  waiting: 300\n", 2,
			[]string{"timeouts.waiting", "not a duration"}},
		{"unknown kind", "kv_pool:\n  kind: mqa\n", 2,
			[]string{"kv_pool.kind", `unknown kv pool kind "mqa"`}},
		{"root is not a mapping", "- a\n- b\n", 1,
			[]string{"must be a mapping of sections"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.content)
			_, err := Load(path, nil, Overrides{})
			if err == nil {
				t.Fatal("no error")
			}
			if n := len(flatten(err)); n != 1 {
				t.Errorf("%d problems, want 1: %v", n, err)
			}
			want := append([]string{fmt.Sprintf("%s:%d:", path, tt.line)}, tt.want...)
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestMalformedYAMLNamesTheLine: syntax errors carry the file and the line.
// (For some parser errors, e.g. an unclosed flow sequence, yaml.v3 reports
// the line where the enclosing construct's context starts, 0-based; those are
// not listed here.)
func TestMalformedYAMLNamesTheLine(t *testing.T) {
	tests := []struct {
		content string
		line    int
	}{
		{"kv_pool:\n  kind: \"gqa\n", 2},
		{"kv_pool:\n  kind: gqa: mla\n", 2},
		{"kv_pool:\n  kind: gqa\n  page_size 64\n  total_pages: 1\n", 3},
		{"server:\n  listen: 127.0.0.1:7600\n  metrics_listen: @x\n", 3},
	}
	for _, tt := range tests {
		path := writeConfig(t, tt.content)
		_, err := Load(path, nil, Overrides{})
		if err == nil {
			t.Errorf("%q: no error", tt.content)
			continue
		}
		for _, w := range []string{path, fmt.Sprintf("line %d", tt.line)} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not contain %q", tt.content, err, w)
			}
		}
	}
}

func TestYAMLReportsEveryProblem(t *testing.T) {
	path := writeConfig(t, "kv_pool:\n  heads: 8\n  page_size: big\n  kind: mla\n  kind: gqa\nbogus: {}\n")
	l, err := Load(path, nil, Overrides{})
	var got []string
	for _, e := range flatten(err) {
		got = append(got, e.Error())
	}
	want := []string{
		path + `:2: unknown key "heads" in kv_pool`,
		path + `:3: kv_pool.page_size`,
		path + `:5: key "kv_pool.kind" is set twice`,
		path + `:6: unknown key "bogus" at the top level`,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
	// What could be parsed was applied.
	if l.Config.KVPool.Kind != prealloc.KindMLA || l.Sources["kv_pool.kind"] != "file "+path+":4" {
		t.Errorf("kv_pool.kind = %s from %q, want mla from line 4", l.Config.KVPool.Kind, l.Sources["kv_pool.kind"])
	}
}

func TestOneYAMLDocument(t *testing.T) {
	path := writeConfig(t, "kv_pool:\n  kind: gqa\n---\nkv_pool:\n  kind: mla\n")
	_, err := Load(path, nil, Overrides{})
	if err == nil || !strings.Contains(err.Error(), path+":4: a second YAML document") {
		t.Fatalf("Load = %v, want an error naming the second document", err)
	}
	// Explicit document markers around one document are fine.
	path = writeConfig(t, "---\nkv_pool:\n  kind: mla\n...\n---\n")
	l, err := Load(path, nil, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Config.KVPool.Kind != prealloc.KindMLA {
		t.Errorf("kind = %s, want mla", l.Config.KVPool.Kind)
	}
}

func TestEmptyFileIsDefaults(t *testing.T) {
	for _, content := range []string{"", "\n", "# only a comment\n", "---\n", "--- ~\n", "server:\n", "kv_pool: ~\n"} {
		path := writeConfig(t, content)
		l, err := Load(path, nil, Overrides{})
		if err != nil {
			t.Errorf("%q: %v", content, err)
			continue
		}
		if diff := cmp.Diff(DefaultConfig(), l.Config); diff != "" {
			t.Errorf("%q: config differs from the defaults (-want +got):\n%s", content, diff)
		}
		for _, k := range l.Keys() {
			if l.Sources[k] != "default" {
				t.Errorf("%q: source of %s = %q, want default", content, k, l.Sources[k])
			}
		}
	}
}

func TestMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(path, nil, Overrides{})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load(%s) = %v, want an error naming the file", path, err)
	}
}

// --- environment -----------------------------------------------------------

func TestSGLangEnv(t *testing.T) {
	tests := []struct {
		env, raw, key, want string
	}{
		{"SGLANG_DISAGG_STAGING_BUFFER", "1", "staging.enabled", "true"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "true", "staging.enabled", "true"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "TRUE", "staging.enabled", "true"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "Yes", "staging.enabled", "true"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "y", "staging.enabled", "true"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "0", "staging.enabled", "false"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "False", "staging.enabled", "false"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "NO", "staging.enabled", "false"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "n", "staging.enabled", "false"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "8192", "staging.pool_size_mb", "8192"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", " 300 ", "staging.pool_size_mb", "300"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "+5", "staging.pool_size_mb", "5"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "1_000", "staging.pool_size_mb", "1000"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "007", "staging.pool_size_mb", "7"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "-1", "staging.pool_size_mb", "-1"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "600", "timeouts.waiting", "10m0s"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", " 300 ", "timeouts.waiting", "5m0s"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "+5", "timeouts.waiting", "5s"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1_000", "timeouts.waiting", "16m40s"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "120", "timeouts.bootstrap", "2m0s"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "\t30\n", "timeouts.bootstrap", "30s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2.5", "timeouts.heartbeat_interval", "2.5s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1e1", "timeouts.heartbeat_interval", "10s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "5", "timeouts.heartbeat_interval", "5s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", " 3.0 ", "timeouts.heartbeat_interval", "3s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", ".5", "timeouts.heartbeat_interval", "500ms"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "4.", "timeouts.heartbeat_interval", "4s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "+2E0", "timeouts.heartbeat_interval", "2s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1_0.5", "timeouts.heartbeat_interval", "10.5s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "3", "timeouts.heartbeat_max_failures", "3"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", " 0", "timeouts.heartbeat_max_failures", "0"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "s3cret", "server.auth_token", "<redacted>"},
		{"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "2048", "admission.clip_max_new_tokens", "2048"},
		{"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "8_192", "admission.clip_max_new_tokens", "8192"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL", "60", "dp_rank.binding_ttl", "1m0s"},
		{"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "yes", "dp_rank.force_query", "true"},
		{"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "0", "dp_rank.force_query", "false"},
		{"DISAGGREGATION_TEST_FAILURE_PROB", "0.25", "transfer.sim.failure_probability", "0.25"},
		{"SGLANG_TEST_DISAGG_FAILURE_PROB", "1e-1", "transfer.sim.failure_probability", "0.1"},
		{"SGLANG_TEST_DISAGG_FAILURE_PROB", "0", "transfer.sim.failure_probability", "0"},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		covered[tt.env] = true
		t.Run(tt.env+"="+tt.raw, func(t *testing.T) {
			l, err := Load("", []string{tt.env + "=" + tt.raw}, Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Value(tt.key); got != tt.want {
				t.Errorf("%s = %s, want %s", tt.key, got, tt.want)
			}
			if got, want := l.Sources[tt.key], "env "+tt.env; got != want {
				t.Errorf("source of %s = %q, want %q", tt.key, got, want)
			}
		})
	}
	for _, e := range sglangEnv {
		if !covered[e.name] {
			t.Errorf("%s has no test case", e.name)
		}
	}
}

func TestSGLangEnvSecretIsKeptVerbatim(t *testing.T) {
	l, err := Load("", []string{"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN= tok en=1 "}, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Config.Server.AuthToken; got != " tok en=1 " {
		t.Errorf("auth token = %q, want the variable verbatim", got)
	}
}

func TestSGLangEnvCurrentNameBeatsLegacy(t *testing.T) {
	for _, env := range [][]string{
		{"DISAGGREGATION_TEST_FAILURE_PROB=0.5", "SGLANG_TEST_DISAGG_FAILURE_PROB=0.25"},
		{"SGLANG_TEST_DISAGG_FAILURE_PROB=0.25", "DISAGGREGATION_TEST_FAILURE_PROB=0.5"},
	} {
		l, err := Load("", env, Overrides{})
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Config.Transfer.Sim.FailureProbability; got != 0.25 {
			t.Errorf("%q: failure probability = %v, want 0.25", env, got)
		}
		if got := l.Sources["transfer.sim.failure_probability"]; got != "env SGLANG_TEST_DISAGG_FAILURE_PROB" {
			t.Errorf("%q: source = %q", env, got)
		}
	}
}

func TestSGLangEnvMalformed(t *testing.T) {
	tests := []struct{ env, raw string }{
		{"SGLANG_DISAGG_STAGING_BUFFER", "2"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "on"},
		{"SGLANG_DISAGG_STAGING_BUFFER", ""},
		{"SGLANG_DISAGG_STAGING_BUFFER", " 1"},
		{"SGLANG_DISAGG_STAGING_BUFFER", "truee"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "abc"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "1.5"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", ""},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "  "},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "1__000"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "_1"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "1_"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "+_1"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "++5"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "+-5"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "0x10"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "5 0"},
		{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "99999999999"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300s"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1.5"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1e3"},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", ""},
		{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "99999999999999999999"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "5m"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "-"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "abc"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", ""},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "5s"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1,5"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "nan"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "inf"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "-Infinity"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1e400"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1__0"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "_1"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1_"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1_.5"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1._5"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1_e1"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1e"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "."},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0x1p3"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0x10"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2.0"},
		{"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "two"},
		{"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "4k"},
		{"SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL", "2m"},
		{"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "maybe"},
		{"DISAGGREGATION_TEST_FAILURE_PROB", "x"},
		{"SGLANG_TEST_DISAGG_FAILURE_PROB", "NaN"},
		{"SGLANG_TEST_DISAGG_FAILURE_PROB", "1__0"},
	}
	// Any string is a valid token.
	covered := map[string]bool{"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN": true}
	for _, tt := range tests {
		covered[tt.env] = true
		t.Run(tt.env+"="+tt.raw, func(t *testing.T) {
			l, err := Load("", []string{tt.env + "=" + tt.raw}, Overrides{})
			if err == nil {
				t.Fatalf("no error; %s", describeAll(l))
			}
			if !strings.Contains(err.Error(), tt.env) {
				t.Errorf("error %q does not name %s", err, tt.env)
			}
		})
	}
	for _, e := range sglangEnv {
		if !covered[e.name] {
			t.Errorf("%s has no malformed test case", e.name)
		}
	}
}

// describeAll renders the non-default values, for failure messages.
func describeAll(l *Loaded) string {
	var parts []string
	for _, k := range l.Keys() {
		if l.Sources[k] != "default" {
			parts = append(parts, fmt.Sprintf("%s=%s (%s)", k, l.Value(k), l.Sources[k]))
		}
	}
	return "loaded " + strings.Join(parts, ", ")
}

func TestDecodeplaneEnvMirrorsEveryKey(t *testing.T) {
	l0, err := Load("", nil, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, s := range settings() {
		if !strings.HasPrefix(s.env, "DECODEPLANE_") || s.env != strings.ToUpper(s.env) || strings.Contains(s.env, ".") {
			t.Errorf("%s: bad variable name %q", s.key, s.env)
		}
		if prev, dup := seen[s.env]; dup {
			t.Errorf("%s and %s share the variable %s", prev, s.key, s.env)
		}
		seen[s.env] = s.key
		if got := l0.EnvName(s.key); got != s.env {
			t.Errorf("EnvName(%s) = %q, want %q", s.key, got, s.env)
		}
		// Round-trip the default through the variable.
		v := l0.field(s)
		raw := renderValue(v)
		if v.Kind() == reflect.String {
			raw = v.String()
		}
		l, err := Load("", []string{s.env + "=" + raw}, Overrides{})
		if err != nil {
			t.Errorf("%s=%s: %v", s.env, raw, err)
			continue
		}
		if got := l.Sources[s.key]; got != "env "+s.env {
			t.Errorf("%s=%s: source of %s = %q", s.env, raw, s.key, got)
		}
		if diff := cmp.Diff(DefaultConfig(), l.Config); diff != "" {
			t.Errorf("%s=%s did not round-trip (-want +got):\n%s", s.env, raw, diff)
		}
	}
}

func TestDecodeplaneEnv(t *testing.T) {
	tests := []struct{ env, key, want string }{
		{"DECODEPLANE_KV_POOL_KIND=MLA", "kv_pool.kind", "mla"},
		{"DECODEPLANE_TIMEOUTS_WAITING=90s", "timeouts.waiting", "1m30s"},
		{"DECODEPLANE_STAGING_ENABLED=true", "staging.enabled", "true"},
		{"DECODEPLANE_STAGING_POOL_SIZE_MB= 1024 ", "staging.pool_size_mb", "1024"},
		{"DECODEPLANE_TRANSFER_SIM_FAILURE_PROBABILITY=0.5", "transfer.sim.failure_probability", "0.5"},
		{"DECODEPLANE_SERVER_METRICS_LISTEN=", "server.metrics_listen", `""`},
		{"DECODEPLANE_SERVER_AUTH_TOKEN=tok", "server.auth_token", "<redacted>"},
		{"DECODEPLANE_KV_POOL_SWA_WINDOW=128", "kv_pool.swa.window", "128"},
		{"DECODEPLANE_KV_POOL_TOTAL_TOKENS=4294967296", "kv_pool.total_tokens", "4294967296"},
		{"DECODEPLANE_TRANSFER_SIM_LATENCY=1ms", "transfer.sim.latency", "1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			l, err := Load("", []string{tt.env}, Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Value(tt.key); got != tt.want {
				t.Errorf("%s = %s, want %s", tt.key, got, tt.want)
			}
			name, _, _ := strings.Cut(tt.env, "=")
			if got := l.Sources[tt.key]; got != "env "+name {
				t.Errorf("source of %s = %q, want env %s", tt.key, got, name)
			}
		})
	}
}

func TestDecodeplaneEnvErrors(t *testing.T) {
	tests := []struct {
		env  string
		want string
	}{
		{"DECODEPLANE_KV_POOL_PAGE_SIZE=abc", "not an integer"},
		{"DECODEPLANE_TIMEOUTS_WAITING=300", "not a duration"},
		{"DECODEPLANE_KV_POOL_KIND=mqa", "unknown kv pool kind"},
		{"DECODEPLANE_STAGING_ENABLED=maybe", "not a boolean"},
		{"DECODEPLANE_TRANSFER_SIM_FAILURE_PROBABILITY=NaN", "not a finite number"},
		{"DECODEPLANE_FOO=1", "not a configuration variable"},
		{"DECODEPLANE_KV_POOL=gqa", "not a configuration variable"},
		{"DECODEPLANE_KV_POOL_KIND_=gqa", "not a configuration variable"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			_, err := Load("", []string{tt.env}, Overrides{})
			if err == nil {
				t.Fatal("no error")
			}
			name, _, _ := strings.Cut(tt.env, "=")
			for _, w := range []string{"env " + name, tt.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNonConfigEnvIsIgnored(t *testing.T) {
	environ := []string{
		"DECODEPLANE_ADDR=127.0.0.1:7600", "DECODEPLANE_CONFIG=/nonexistent.yaml", "DECODEPLANE_TOKEN=x",
		"DECODEPLANE_TLS_CA=a", "DECODEPLANE_TLS_CERT=b", "DECODEPLANE_TLS_KEY=c", "DECODEPLANE_TLS_SERVER_NAME=d",
		"SGLANG_SOMETHING_ELSE=1", "PATH=/usr/bin", "HOME=/root", "NOEQUALS",
	}
	l, err := Load("", environ, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DefaultConfig(), l.Config); diff != "" {
		t.Errorf("config changed (-want +got):\n%s", diff)
	}
}

func TestEnvReportsEveryProblem(t *testing.T) {
	_, err := Load("", []string{"DECODEPLANE_FOO=1", "SGLANG_DISAGG_STAGING_BUFFER=on", "DECODEPLANE_KV_POOL_PAGE_SIZE=x"}, Overrides{})
	if n := len(flatten(err)); n != 3 {
		t.Fatalf("%d problems, want 3: %v", n, err)
	}
}

// --- shipped files ---------------------------------------------------------

// TestLocalConfigIsTheDefaults is the "embedded default" guarantee: the file
// make run passes is exactly DefaultConfig(), and it spells out every key.
func TestLocalConfigIsTheDefaults(t *testing.T) {
	path := filepath.Join(repoRoot, "deploy", "local", "decodeplane.yaml")
	l, err := Load(path, nil, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DefaultConfig(), l.Config); diff != "" {
		t.Errorf("%s differs from DefaultConfig() (-default +file):\n%s", path, diff)
	}
	for _, k := range l.Keys() {
		if !strings.HasPrefix(l.Sources[k], "file "+path+":") {
			t.Errorf("%s does not set %s (source %q)", path, k, l.Sources[k])
		}
	}
	if err := l.Config.Validate(); err != nil {
		t.Errorf("the defaults are invalid: %v", err)
	}
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
			l, err := Load(f, nil, Overrides{})
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

// --- validation rules ------------------------------------------------------

func gqaBase() Config { return DefaultConfig() }

func mhaBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = prealloc.KindMHA
	c.KVPool.KVHeads = 32
	return c
}

func mlaBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = prealloc.KindMLA
	c.KVPool.KVHeads, c.KVPool.HeadDim = 0, 0
	c.KVPool.KVLoraRank, c.KVPool.QKRopeHeadDim = 512, 64
	return c
}

func hybridMLABase() Config {
	c := mlaBase()
	c.KVPool.Kind = prealloc.KindHybridMLA
	return c
}

func swaBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = prealloc.KindHybridSWA
	c.KVPool.SWA = prealloc.SWAConfig{Window: 128, TotalTokens: 200000}
	return c
}

func linearBase() Config {
	c := DefaultConfig()
	c.KVPool.Kind = prealloc.KindHybridLinear
	c.KVPool.RequestSlots = 128
	c.KVPool.Mamba.StateSlots = 128
	return c
}

var bases = map[string]func() Config{
	"gqa": gqaBase, "mha": mhaBase, "mla": mlaBase, "hybrid-mla": hybridMLABase, "hybrid-swa": swaBase, "hybrid-linear": linearBase,
}

type ruleCase struct {
	name string
	base func() Config // nil: gqaBase
	mod  func(c *Config)
	// want are the keys of the expected problems; nil means valid.
	want []string
	// problem, if set, is the exact problem of one of the errors for want[0];
	// contains, if set, is a substring of one of them.
	problem, contains string
}

func checkRules(t *testing.T, tests []ruleCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := tt.base
			if base == nil {
				base = gqaBase
			}
			c := base()
			if tt.mod != nil {
				tt.mod(&c)
			}
			errs := configErrors(t, c.Validate())
			want := slices.Clone(tt.want)
			slices.Sort(want)
			if diff := cmp.Diff(want, errorKeys(errs)); diff != "" {
				t.Fatalf("problem keys (-want +got):\n%s\nproblems: %v", diff, errs)
			}
			if tt.problem == "" && tt.contains == "" {
				return
			}
			var problems []string
			for _, e := range errs {
				if e.Key == tt.want[0] {
					problems = append(problems, e.Problem)
				}
			}
			if tt.problem != "" && !slices.Contains(problems, tt.problem) {
				t.Errorf("problems for %s = %q, want exactly %q", tt.want[0], problems, tt.problem)
			}
			if tt.contains != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tt.contains) }) {
				t.Errorf("problems for %s = %q, want one containing %q", tt.want[0], problems, tt.contains)
			}
		})
	}
}

func TestRuleBasesAreValid(t *testing.T) {
	var tests []ruleCase
	for name, b := range bases {
		tests = append(tests, ruleCase{name: name, base: b})
	}
	checkRules(t, tests)
}

func TestRuleKindRequired(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "unspecified", mod: func(c *Config) { c.KVPool.Kind = prealloc.KindUnspecified }, want: []string{"kv_pool.kind"}},
		{name: "out of range", mod: func(c *Config) { c.KVPool.Kind = prealloc.Kind(99) }, want: []string{"kv_pool.kind"}},
	})
}

func TestRuleStagingNeedsNonMLA(t *testing.T) {
	on := func(c *Config) { c.Staging.Enabled = true }
	checkRules(t, []ruleCase{
		{name: "mla", base: mlaBase, mod: on, want: []string{"staging.enabled"}, problem: prealloc.MsgStagingMLA},
		{name: "hybrid-mla", base: hybridMLABase, mod: on, want: []string{"staging.enabled"}, problem: prealloc.MsgStagingMLA},
		{name: "mla with staging off", base: mlaBase},
		{name: "gqa", base: gqaBase, mod: on},
		{name: "mha", base: mhaBase, mod: on},
		{name: "hybrid-swa", base: swaBase, mod: on},
		{name: "hybrid-linear", base: linearBase, mod: on},
	})
}

func TestRuleStagingNeedsStagingBackend(t *testing.T) {
	var tests []ruleCase
	for _, b := range []string{"ascend", "mori", "fake"} {
		tests = append(tests, ruleCase{
			name: b, mod: func(c *Config) { c.Staging.Enabled, c.Transfer.Backend = true, b },
			want: []string{"staging.enabled"}, contains: "the " + b + " transfer backend has no staging allocator",
		}, ruleCase{
			name: b + " without staging", mod: func(c *Config) { c.Transfer.Backend = b },
		})
	}
	for _, b := range []string{"mooncake", "nixl"} {
		tests = append(tests, ruleCase{name: b, mod: func(c *Config) { c.Staging.Enabled, c.Transfer.Backend = true, b }})
	}
	checkRules(t, tests)
}

func TestRuleStagingPoolSize(t *testing.T) {
	// The default GQA pool: 2 × 8 heads × 128 × 2 B × 32 layers = 128 KiB per
	// token, 8 MiB per 64-token page at attn_tp 1; 1 MiB per page at attn_tp 8.
	staging := func(mb, tp int) func(c *Config) {
		return func(c *Config) { c.Staging.Enabled, c.Staging.PoolSizeMB, c.Parallel.AttnTP = true, mb, tp }
	}
	checkRules(t, []ruleCase{
		{name: "zero", mod: staging(0, 1), want: []string{"staging.pool_size_mb"}, contains: "the ring has size 0"},
		{name: "below one page", mod: staging(7, 1), want: []string{"staging.pool_size_mb"}, contains: "smaller than one page of one chunk (8388608 bytes)"},
		{name: "exactly one page", mod: staging(8, 1)},
		{name: "one page at tp 8", mod: staging(1, 8)},
		{name: "negative", mod: func(c *Config) { c.Staging.PoolSizeMB = -1 }, want: []string{"staging.pool_size_mb"}},
		{name: "zero with staging off", mod: func(c *Config) { c.Staging.PoolSizeMB = 0 }},
	})
}

func TestRuleDCPNeedsMLA(t *testing.T) {
	dcp2 := func(c *Config) { c.Parallel.DCP = 2 }
	checkRules(t, []ruleCase{
		{name: "gqa", base: gqaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNeedsMLA},
		{name: "mha", base: mhaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNeedsMLA},
		{name: "hybrid-swa", base: swaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNeedsMLA},
		{name: "hybrid-linear", base: linearBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNeedsMLA},
		{name: "mla", base: mlaBase, mod: dcp2, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNotModelled},
		{name: "hybrid-mla", base: hybridMLABase, mod: func(c *Config) { c.Parallel.DCP = 8 }, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNotModelled},
		{name: "gqa at dcp 1", base: gqaBase},
	})
}

func TestRuleDCPNeedsDCPBackend(t *testing.T) {
	var tests []ruleCase
	for _, b := range []string{"ascend", "mori", "fake"} {
		name := strings.ToUpper(b[:1]) + b[1:]
		tests = append(tests, ruleCase{
			name: b, base: mlaBase, mod: func(c *Config) { c.Parallel.DCP, c.Transfer.Backend = 2, b },
			want:     []string{"parallel.dcp", "parallel.dcp"},
			contains: name + " does not yet implement DCP-aware KV transfer, but engine is configured with dcp_size=2. PD disaggregation under DCP requires the transfer layer to remap logical token loc -> per-rank physical offset",
		}, ruleCase{name: b + " at dcp 1", base: mlaBase, mod: func(c *Config) { c.Transfer.Backend = b }})
	}
	for _, b := range []string{"mooncake", "nixl"} {
		tests = append(tests, ruleCase{name: b, base: mlaBase, mod: func(c *Config) { c.Parallel.DCP, c.Transfer.Backend = 4, b },
			want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNotModelled})
	}
	// Both DCP rules at once on a GQA pool with a non-DCP backend.
	tests = append(tests, ruleCase{
		name: "gqa on ascend", mod: func(c *Config) { c.Parallel.DCP, c.Transfer.Backend = 2, "ascend" },
		want: []string{"parallel.dcp", "parallel.dcp"}, problem: prealloc.MsgDCPNeedsMLA,
	})
	checkRules(t, tests)
}

// TestRuleDelegateNeedsStateless: the delegated path moves no SWA or Mamba
// state, so pools that need it are refused there (gpt-oss, Qwen3-Next would
// decode on missing state).
func TestRuleDelegateNeedsStateless(t *testing.T) {
	delegate := func(c *Config) {
		c.Transfer.Path, c.Transfer.Delegate.Target = "delegate", "127.0.0.1:7700"
	}
	checkRules(t, []ruleCase{
		{name: "hybrid-swa", base: swaBase, mod: delegate, want: []string{"transfer.path"}, contains: "not the SWA state a hybrid-swa pool needs"},
		{name: "hybrid-linear", base: linearBase, mod: delegate, want: []string{"transfer.path"}, contains: "not the MAMBA state a hybrid-linear pool needs"},
		{name: "gqa", base: gqaBase, mod: delegate},
		{name: "mla", base: mlaBase, mod: delegate},
		{name: "hybrid-mla", base: hybridMLABase, mod: delegate},
		{name: "hybrid-swa on sim", base: swaBase},
	})
}

func TestRuleDCPNoDecodeRadixCache(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "dcp with radix cache", base: mlaBase, mod: func(c *Config) { c.Parallel.DCP, c.Admission.DecodeRadixCache = 2, true },
			want: []string{"admission.decode_radix_cache", "parallel.dcp"}, contains: "a decode radix cache is not supported with DCP"},
		{name: "dcp without radix cache", base: mlaBase, mod: func(c *Config) { c.Parallel.DCP = 2 }, want: []string{"parallel.dcp"}, problem: prealloc.MsgDCPNotModelled},
		{name: "radix cache without dcp", base: mlaBase, mod: func(c *Config) { c.Admission.DecodeRadixCache = true },
			want: []string{"admission.decode_radix_cache"}, contains: "does not model a decode radix cache"},
	})
}

func TestRuleAttnCPIsOne(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "1"},
		{name: "2", mod: func(c *Config) { c.Parallel.AttnCP = 2 }, want: []string{"parallel.attn_cp"}, contains: "must be 1"},
		{name: "0", mod: func(c *Config) { c.Parallel.AttnCP = 0 }, want: []string{"parallel.attn_cp"}},
		{name: "mla 2", base: mlaBase, mod: func(c *Config) { c.Parallel.AttnCP = 2 }, want: []string{"parallel.attn_cp"}},
	})
}

func TestRuleSizesPositive(t *testing.T) {
	type field struct {
		key  string
		base func() Config
		set  func(c *Config, v int)
		bad  []int
		good []int
	}
	fields := []field{
		{"kv_pool.num_layers", gqaBase, func(c *Config, v int) { c.KVPool.NumLayers = v }, []int{0, -1}, []int{1}},
		{"kv_pool.num_layers", mlaBase, func(c *Config, v int) { c.KVPool.NumLayers = v }, []int{0}, []int{1}},
		{"kv_pool.kv_heads", gqaBase, func(c *Config, v int) { c.KVPool.KVHeads = v }, []int{0, -8}, []int{1}},
		{"kv_pool.head_dim", gqaBase, func(c *Config, v int) { c.KVPool.HeadDim = v }, []int{0, -1}, []int{1}},
		{"kv_pool.kv_heads", swaBase, func(c *Config, v int) { c.KVPool.KVHeads = v }, []int{0}, []int{1}},
		{"kv_pool.head_dim", linearBase, func(c *Config, v int) { c.KVPool.HeadDim = v }, []int{0}, []int{1}},
		{"kv_pool.kv_lora_rank", mlaBase, func(c *Config, v int) { c.KVPool.KVLoraRank = v }, []int{0, -1}, []int{1}},
		{"kv_pool.qk_rope_head_dim", hybridMLABase, func(c *Config, v int) { c.KVPool.QKRopeHeadDim = v }, []int{0, -1}, []int{1}},
		{"kv_pool.request_slots", gqaBase, func(c *Config, v int) { c.KVPool.RequestSlots = v }, []int{0, -1}, []int{1}},
		{"kv_pool.pre_alloc_slots", gqaBase, func(c *Config, v int) { c.KVPool.PreAllocSlots = v }, []int{-2}, []int{-1, 0, 4}},
		{"parallel.attn_tp", gqaBase, func(c *Config, v int) { c.Parallel.AttnTP = v }, []int{0, -1}, []int{1}},
		{"parallel.dp", gqaBase, func(c *Config, v int) { c.Parallel.DP = v }, []int{0, -1}, []int{1, 8}},
		{"parallel.pp", gqaBase, func(c *Config, v int) { c.Parallel.PP = v }, []int{0, -1}, []int{1, 2}},
		{"parallel.dcp", gqaBase, func(c *Config, v int) { c.Parallel.DCP = v }, []int{0, -1}, []int{1}},
		{"admission.clip_max_new_tokens", gqaBase, func(c *Config, v int) { c.Admission.ClipMaxNewTokens = v }, []int{0, -1}, []int{1}},
		{"admission.reserved_decode_tokens", gqaBase, func(c *Config, v int) { c.Admission.ReservedDecodeTokens = v }, []int{-1}, []int{0}},
		{"admission.max_queued", gqaBase, func(c *Config, v int) { c.Admission.MaxQueued = v }, []int{-1}, []int{0, 1}},
		{"admission.max_bypass", gqaBase, func(c *Config, v int) { c.Admission.MaxBypass = v }, []int{-1, prealloc.MaxBypassLimit + 1}, []int{0, 1, prealloc.DefaultMaxBypass, prealloc.MaxBypassLimit}},
		{"admission.claim_timeout", gqaBase, func(c *Config, v int) { c.Admission.ClaimTimeout = time.Duration(v) * time.Second }, []int{-1}, []int{0, 1}},
		{"kv_pool.mamba.state_bytes", linearBase, func(c *Config, v int) { c.KVPool.Mamba.StateBytes = int64(v) }, []int{-1}, []int{0, 1}},
		{"rooms.max_retained", gqaBase, func(c *Config, v int) { c.Rooms.MaxRetained = v }, []int{-1}, []int{0}},
		{"rooms.retention", gqaBase, func(c *Config, v int) { c.Rooms.Retention = time.Duration(v) * time.Second }, []int{-1}, []int{0}},
		{"transfer.sim.bandwidth_gbytes_per_s", gqaBase, func(c *Config, v int) { c.Transfer.Sim.BandwidthGBytesPerS = float64(v) }, []int{-1}, []int{0}},
		{"transfer.sim.latency", gqaBase, func(c *Config, v int) { c.Transfer.Sim.Latency = time.Duration(v) }, []int{-1}, []int{0}},
	}
	var tests []ruleCase
	for _, f := range fields {
		for _, v := range f.bad {
			tests = append(tests, ruleCase{name: fmt.Sprintf("%s=%d", f.key, v), base: f.base, mod: func(c *Config) { f.set(c, v) }, want: []string{f.key}})
		}
		for _, v := range f.good {
			tests = append(tests, ruleCase{name: fmt.Sprintf("%s=%d", f.key, v), base: f.base, mod: func(c *Config) { f.set(c, v) }})
		}
	}
	checkRules(t, tests)
}

func TestRuleKVHeadsDivideTP(t *testing.T) {
	heads := func(base func() Config, h, tp int, bad bool) ruleCase {
		rc := ruleCase{
			name: fmt.Sprintf("%s %d heads tp %d", base().KVPool.Kind, h, tp), base: base,
			mod: func(c *Config) { c.KVPool.KVHeads, c.Parallel.AttnTP = h, tp },
		}
		if bad {
			rc.want = []string{"kv_pool.kv_heads"}
			rc.contains = fmt.Sprintf("%d KV heads cannot be split over parallel.attn_tp = %d", h, tp)
		}
		return rc
	}
	checkRules(t, []ruleCase{
		heads(gqaBase, 8, 1, false),
		heads(gqaBase, 8, 2, false),
		heads(gqaBase, 8, 8, false),
		heads(gqaBase, 8, 16, false), // replication: TP a multiple of the heads
		heads(gqaBase, 2, 8, false),
		heads(gqaBase, 1, 4, false),
		heads(gqaBase, 8, 3, true),
		heads(gqaBase, 8, 12, true), // more ranks than heads, but not a multiple
		heads(gqaBase, 3, 2, true),
		heads(mhaBase, 32, 8, false),
		heads(mhaBase, 32, 6, true),
		heads(swaBase, 8, 3, true),
		heads(linearBase, 2, 3, true),
		{name: "mla has no heads", base: mlaBase, mod: func(c *Config) { c.Parallel.AttnTP = 3 }},
	})
}

func TestRulePageSizePowerOfTwo(t *testing.T) {
	var tests []ruleCase
	for _, p := range []int{1, 2, 16, 64, 128, 1024} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.KVPool.PageSize = p }})
	}
	for _, p := range []int{0, -64, 3, 48, 100} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.KVPool.PageSize = p }, want: []string{"kv_pool.page_size"}, contains: "power of two"})
	}
	checkRules(t, tests)
}

func TestRulePoolSizeExactlyOne(t *testing.T) {
	pool := func(tokens, pages int64) func(c *Config) {
		return func(c *Config) { c.KVPool.TotalTokens, c.KVPool.TotalPages = tokens, pages }
	}
	checkRules(t, []ruleCase{
		{name: "tokens only", mod: pool(1<<20, 0)},
		{name: "pages only", mod: pool(0, 1000)},
		{name: "exactly one page of tokens", mod: pool(64, 0)},
		{name: "both", mod: pool(1<<20, 1000), want: []string{"kv_pool.total_pages"}, contains: "both kv_pool.total_tokens (1048576) and kv_pool.total_pages are set"},
		{name: "neither", mod: pool(0, 0), want: []string{"kv_pool.total_tokens"}, contains: "the pool size is required"},
		{name: "less than a page", mod: pool(63, 0), want: []string{"kv_pool.total_tokens"}, contains: "smaller than one page (64 tokens)"},
		{name: "negative tokens", mod: pool(-1, 0), want: []string{"kv_pool.total_tokens"}},
		{name: "negative pages", mod: pool(0, -1), want: []string{"kv_pool.total_pages"}},
	})
}

func TestRuleMetadataSlots(t *testing.T) {
	meta := func(slots, prealloc, metadata int) func(c *Config) {
		return func(c *Config) {
			c.KVPool.RequestSlots, c.KVPool.PreAllocSlots, c.KVPool.MetadataSlots = slots, prealloc, metadata
		}
	}
	checkRules(t, []ruleCase{
		{name: "default", mod: meta(256, -1, 0)},
		{name: "equal", mod: meta(256, -1, 256)},
		{name: "more", mod: meta(256, -1, 1024)},
		{name: "one short", mod: meta(256, -1, 255), want: []string{"kv_pool.metadata_slots"}, contains: "must be >= the request slots (request_slots + pre_alloc_slots = 256)"},
		// SGLang's rule: 16 slots <= 32 get 2 × 16 pre-allocation rows, 48 in all.
		{name: "with SGLang's pre-alloc rows, equal", mod: meta(16, -1, 48)},
		{name: "with SGLang's pre-alloc rows, one short", mod: meta(16, -1, 47), want: []string{"kv_pool.metadata_slots"}, contains: "= 48"},
		{name: "explicit pre-alloc rows", mod: meta(16, 4, 20)},
		{name: "explicit pre-alloc rows, one short", mod: meta(16, 4, 19), want: []string{"kv_pool.metadata_slots"}},
		{name: "negative", mod: meta(256, -1, -1), want: []string{"kv_pool.metadata_slots"}},
	})
}

func TestRuleSWANeedsWindowAndPool(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "complete", base: swaBase},
		{name: "no window", base: swaBase, mod: func(c *Config) { c.KVPool.SWA.Window = 0 }, want: []string{"kv_pool.swa.window"}},
		{name: "no pool", base: swaBase, mod: func(c *Config) { c.KVPool.SWA.TotalTokens = 0 }, want: []string{"kv_pool.swa.total_tokens"}},
		{name: "neither", base: swaBase, mod: func(c *Config) { c.KVPool.SWA = prealloc.SWAConfig{Window: -1} }, want: []string{"kv_pool.swa.total_tokens", "kv_pool.swa.window"}},
		{name: "not needed for gqa", base: gqaBase},
	})
}

func TestRuleHybridLinearStateSlots(t *testing.T) {
	mamba := func(slots, state int, extra bool, pp int) func(c *Config) {
		return func(c *Config) {
			c.KVPool.RequestSlots = slots
			c.KVPool.Mamba.StateSlots, c.KVPool.Mamba.ExtraBuffer, c.KVPool.Mamba.PingPong = state, extra, pp
		}
	}
	checkRules(t, []ruleCase{
		{name: "none", base: linearBase, mod: mamba(128, 0, false, 0), want: []string{"kv_pool.mamba.state_slots"}, contains: "needs its Mamba/linear state slots"},
		{name: "one per request", base: linearBase, mod: mamba(128, 128, false, 0)},
		{name: "one short", base: linearBase, mod: mamba(128, 127, false, 0), want: []string{"kv_pool.mamba.state_slots"}, contains: "128 × 1 = 128"},
		{name: "extra buffer ping-pong 1", base: linearBase, mod: mamba(128, 256, true, 1)},
		{name: "extra buffer ping-pong 1, one short", base: linearBase, mod: mamba(128, 255, true, 1), want: []string{"kv_pool.mamba.state_slots"}, contains: "128 × 2 = 256"},
		{name: "extra buffer ping-pong 2", base: linearBase, mod: mamba(128, 384, true, 2)},
		{name: "extra buffer ping-pong 2, one short", base: linearBase, mod: mamba(128, 383, true, 2), want: []string{"kv_pool.mamba.state_slots"}, contains: "128 × 3 = 384"},
		// 16 request slots get SGLang's 32 pre-allocation rows: 48 requests.
		{name: "with pre-alloc rows", base: linearBase, mod: mamba(16, 48, false, 0)},
		{name: "with pre-alloc rows, one short", base: linearBase, mod: mamba(16, 47, false, 0), want: []string{"kv_pool.mamba.state_slots"}, contains: "48 × 1 = 48"},
		{name: "bad ping-pong", base: linearBase, mod: mamba(128, 1024, true, 3), want: []string{"kv_pool.mamba.ping_pong"}},
		{name: "ping-pong ignored without the extra buffer", base: linearBase, mod: mamba(128, 128, false, 3)},
		{name: "not needed for gqa", base: gqaBase, mod: func(c *Config) { c.KVPool.Mamba.StateSlots = 0 }},
	})
}

func TestRuleTransferBackend(t *testing.T) {
	var tests []ruleCase
	for _, b := range prealloc.TransferBackends {
		tests = append(tests, ruleCase{name: b, mod: func(c *Config) { c.Transfer.Backend = b }})
	}
	for _, b := range []string{"x", "", "Mooncake", "tcp"} {
		tests = append(tests, ruleCase{name: "unknown " + b, mod: func(c *Config) { c.Transfer.Backend = b },
			want: []string{"transfer.backend"}, problem: "Unsupported transfer backend: " + b})
	}
	// An unknown backend is reported once, not again by the staging rule.
	tests = append(tests, ruleCase{name: "unknown with staging", mod: func(c *Config) { c.Transfer.Backend, c.Staging.Enabled = "x", true },
		want: []string{"transfer.backend"}, problem: "Unsupported transfer backend: x"})
	checkRules(t, tests)
}

func TestRuleDType(t *testing.T) {
	var tests []ruleCase
	for d := range prealloc.DTypes {
		tests = append(tests, ruleCase{name: d, mod: func(c *Config) { c.KVPool.DType = d }})
	}
	tests = append(tests,
		ruleCase{name: "BF16", mod: func(c *Config) { c.KVPool.DType = "BF16" }},
		ruleCase{name: "int4", mod: func(c *Config) { c.KVPool.DType = "int4" }, want: []string{"kv_pool.dtype"}, problem: "unknown KV cache dtype."},
		ruleCase{name: "empty", mod: func(c *Config) { c.KVPool.DType = "" }, want: []string{"kv_pool.dtype"}},
		ruleCase{name: "auto", mod: func(c *Config) { c.KVPool.DType = "auto" }, want: []string{"kv_pool.dtype"}, problem: "unknown KV cache dtype."},
	)
	checkRules(t, tests)

	// "auto" gets its own advice.
	c := DefaultConfig()
	c.KVPool.DType = "auto"
	errs := configErrors(t, c.Validate())
	if len(errs) != 1 || !strings.Contains(errs[0].Fix, `"auto" depends on the model`) {
		t.Errorf("auto: %v", errs)
	}
}

func TestRulePriority(t *testing.T) {
	var tests []ruleCase
	for _, p := range []string{"fifo", "low-first", "high-first"} {
		tests = append(tests, ruleCase{name: p, mod: func(c *Config) { c.Admission.Priority = p }})
	}
	for _, p := range []string{"", "lifo", "FIFO"} {
		tests = append(tests, ruleCase{name: "bad " + p, mod: func(c *Config) { c.Admission.Priority = p }, want: []string{"admission.priority"}})
	}
	checkRules(t, tests)
}

func TestRuleTimeoutsPositive(t *testing.T) {
	durations := []struct {
		key string
		set func(c *Config, d time.Duration)
	}{
		{"timeouts.waiting", func(c *Config, d time.Duration) { c.Timeouts.Waiting = d }},
		{"timeouts.bootstrap", func(c *Config, d time.Duration) { c.Timeouts.Bootstrap = d }},
		{"timeouts.heartbeat_interval", func(c *Config, d time.Duration) { c.Timeouts.HeartbeatInterval = d }},
		{"timeouts.prefill_info_backoff", func(c *Config, d time.Duration) { c.Timeouts.PrefillInfoBackoff = d }},
		{"timeouts.dp_rank_resolution", func(c *Config, d time.Duration) { c.Timeouts.DPRankResolution = d }},
		{"dp_rank.binding_ttl", func(c *Config, d time.Duration) { c.DPRank.BindingTTL = d }},
		{"server.shutdown_timeout", func(c *Config, d time.Duration) { c.Server.ShutdownTimeout = d }},
	}
	var tests []ruleCase
	for _, d := range durations {
		for _, v := range []time.Duration{0, -time.Second} {
			tests = append(tests, ruleCase{name: fmt.Sprintf("%s=%s", d.key, v), mod: func(c *Config) { d.set(c, v) }, want: []string{d.key}})
		}
		tests = append(tests, ruleCase{name: d.key + "=1ns", mod: func(c *Config) { d.set(c, 1) }})
	}
	tests = append(tests,
		ruleCase{name: "backoff max 0", mod: func(c *Config) { c.Timeouts.PrefillInfoBackoffMax = 0 }, want: []string{"timeouts.prefill_info_backoff_max"}},
		ruleCase{name: "backoff max below backoff", mod: func(c *Config) { c.Timeouts.PrefillInfoBackoffMax = 500 * time.Millisecond },
			want: []string{"timeouts.prefill_info_backoff_max"}, contains: "is below timeouts.prefill_info_backoff (1s)"},
		ruleCase{name: "backoff max equal", mod: func(c *Config) { c.Timeouts.PrefillInfoBackoffMax = time.Second }},
		ruleCase{name: "heartbeat failures 0 is floored, not refused", mod: func(c *Config) { c.Timeouts.HeartbeatMaxFailures = 0 }},
		ruleCase{name: "heartbeat failures negative", mod: func(c *Config) { c.Timeouts.HeartbeatMaxFailures = -1 }, want: []string{"timeouts.heartbeat_max_failures"}},
		ruleCase{name: "heartbeat interval below the floor is floored", mod: func(c *Config) { c.Timeouts.HeartbeatInterval = time.Second }},
		ruleCase{name: "prefill info attempts 0", mod: func(c *Config) { c.Timeouts.PrefillInfoAttempts = 0 }, want: []string{"timeouts.prefill_info_attempts"}},
	)
	checkRules(t, tests)
}

func TestHeartbeatFloors(t *testing.T) {
	tests := []struct {
		iv       time.Duration
		mf       int
		wantIV   time.Duration
		wantMF   int
		warnings []string
	}{
		{5 * time.Second, 2, 5 * time.Second, 2, nil},
		{2 * time.Second, 1, 2 * time.Second, 1, nil},
		{time.Second, 2, 2 * time.Second, 2, []string{"timeouts.heartbeat_interval"}},
		{5 * time.Second, 0, 5 * time.Second, 1, []string{"timeouts.heartbeat_max_failures"}},
		{500 * time.Millisecond, 0, 2 * time.Second, 1, []string{"timeouts.heartbeat_interval", "timeouts.heartbeat_max_failures"}},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.Timeouts.HeartbeatInterval, c.Timeouts.HeartbeatMaxFailures = tt.iv, tt.mf
		iv, mf := c.Timeouts.EffectiveHeartbeat()
		if iv != tt.wantIV || mf != tt.wantMF {
			t.Errorf("EffectiveHeartbeat(%s, %d) = %s, %d; want %s, %d", tt.iv, tt.mf, iv, mf, tt.wantIV, tt.wantMF)
		}
		var got []string
		for _, w := range c.Manager().Warnings() {
			got = append(got, w.Key)
		}
		if diff := cmp.Diff(tt.warnings, got); diff != "" {
			t.Errorf("(%s, %d) warnings (-want +got):\n%s", tt.iv, tt.mf, diff)
		}
	}
}

func TestRuleDelegateNeedsTarget(t *testing.T) {
	delegate := func(target string) func(c *Config) {
		return func(c *Config) { c.Transfer.Path, c.Transfer.Delegate.Target = "delegate", target }
	}
	checkRules(t, []ruleCase{
		{name: "no target", mod: delegate(""), want: []string{"transfer.delegate.target"}, contains: "needs the transfer agent's address"},
		{name: "no port", mod: delegate("localhost"), want: []string{"transfer.delegate.target"}},
		{name: "host:port", mod: delegate("127.0.0.1:7700")},
		{name: "name:port", mod: delegate("agent.local:7700")},
		{name: "sim needs no target", mod: func(c *Config) { c.Transfer.Path, c.Transfer.Delegate.Target = "sim", "" }},
		{name: "batch timeout", mod: func(c *Config) { delegate("a:1")(c); c.Transfer.Delegate.BatchTimeout = 0 }, want: []string{"transfer.delegate.batch_timeout"}},
		{name: "health interval", mod: func(c *Config) { delegate("a:1")(c); c.Transfer.Delegate.HealthInterval = -1 }, want: []string{"transfer.delegate.health_interval"}},
		{name: "unknown path", mod: func(c *Config) { c.Transfer.Path = "grpc" }, want: []string{"transfer.path"}},
		{name: "empty path", mod: func(c *Config) { c.Transfer.Path = "" }, want: []string{"transfer.path"}},
	})
}

func TestRuleSimFailureProbability(t *testing.T) {
	var tests []ruleCase
	for _, p := range []float64{0, 0.5, 1} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.Transfer.Sim.FailureProbability = p }})
	}
	for _, p := range []float64{-0.01, 1.01, math.NaN(), math.Inf(1)} {
		tests = append(tests, ruleCase{name: fmt.Sprint(p), mod: func(c *Config) { c.Transfer.Sim.FailureProbability = p },
			want: []string{"transfer.sim.failure_probability"}, contains: "between 0 and 1"})
	}
	checkRules(t, tests)
}

func TestRuleServer(t *testing.T) {
	checkRules(t, []ruleCase{
		{name: "listen", mod: func(c *Config) { c.Server.Listen = "7600" }, want: []string{"server.listen"}},
		{name: "listen on every interface", mod: func(c *Config) { c.Server.Listen = ":7600" }},
		{name: "metrics disabled", mod: func(c *Config) { c.Server.MetricsListen = "" }},
		{name: "metrics bad", mod: func(c *Config) { c.Server.MetricsListen = "metrics" }, want: []string{"server.metrics_listen"}},
		{name: "metrics on the gRPC port", mod: func(c *Config) { c.Server.MetricsListen = c.Server.Listen }, want: []string{"server.metrics_listen"}},
	})
}

func TestRuleLog(t *testing.T) {
	var tests []ruleCase
	for _, l := range []string{"debug", "info", "warn", "error"} {
		tests = append(tests, ruleCase{name: l, mod: func(c *Config) { c.Log.Level = l }})
	}
	tests = append(tests,
		ruleCase{name: "json", mod: func(c *Config) { c.Log.Format = "json" }},
		ruleCase{name: "trace", mod: func(c *Config) { c.Log.Level = "trace" }, want: []string{"log.level"}},
		ruleCase{name: "xml", mod: func(c *Config) { c.Log.Format = "xml" }, want: []string{"log.format"}},
	)
	checkRules(t, tests)
}

// --- every problem at once -------------------------------------------------

func TestValidateReportsEveryProblem(t *testing.T) {
	c := mlaBase()
	c.Staging.Enabled = true
	c.Transfer.Backend = "x"
	c.Admission.Priority = "lifo"
	errs := configErrors(t, c.Validate())
	want := []string{"admission.priority", "staging.enabled", "transfer.backend"}
	if diff := cmp.Diff(want, errorKeys(errs)); diff != "" {
		t.Errorf("problem keys (-want +got):\n%s", diff)
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
			prealloc.MsgStagingMLA,
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
	if msg != prealloc.MsgStagingMLA {
		t.Fatalf("prealloc.MsgStagingMLA = %q, want SGLang's %q", prealloc.MsgStagingMLA, msg)
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
	l, err := Load("", nil, Overrides{})
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
		{[]string{"version"}, exitOK, "decodeplane " + version + "\n", ""},
		{[]string{"--version"}, exitOK, "decodeplane " + version + "\n", ""},
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
