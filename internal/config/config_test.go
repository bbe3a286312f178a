package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
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
	cf := NewFlags("test", io.Discard)
	if err := cf.Parse(args, environ); err != nil {
		return nil, err
	}
	return Load(cf.Path, environ, cf.Overrides)
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

// configErrors returns the *kvlayout.ConfigError problems of err, failing the
// test on any other kind of error.
func configErrors(t *testing.T, err error) []*kvlayout.ConfigError {
	t.Helper()
	if err == nil {
		return nil
	}
	var out []*kvlayout.ConfigError
	for _, e := range Flatten(err) {
		var ce *kvlayout.ConfigError
		if !errors.As(e, &ce) {
			t.Fatalf("problem %v (%T) is not a *kvlayout.ConfigError", e, e)
		}
		out = append(out, ce)
	}
	return out
}

func errorKeys(errs []*kvlayout.ConfigError) []string {
	var keys []string
	for _, e := range errs {
		keys = append(keys, e.Key)
	}
	slices.Sort(keys)
	return keys
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
			[]string{`unknown key "bogus" at the top level`, "allowed: server, log, transfer, kv_pool, parallel, staging, admission, model, timeouts, dp_rank, rooms"}},
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
			if n := len(Flatten(err)); n != 1 {
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
	for _, e := range Flatten(err) {
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
	if l.Config.KVPool.Kind != kvlayout.KindMLA || l.Sources["kv_pool.kind"] != "file "+path+":4" {
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
	if l.Config.KVPool.Kind != kvlayout.KindMLA {
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
