package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/internal/config"
)

// FuzzConfigLoad fuzzes configuration loading as serve and validate do it
// (loadConfig: the YAML file, the environment, then Validate and the OTEL_*
// checks): a fuzzed YAML document written to a file, one fuzzed value for a
// variable the loader reads (every DECODEPLANE_*, SGLANG_* and OTEL_* name it
// knows), and one fuzzed NAME=value. Loading must not panic, and every
// problem must name what is wrong: a configuration key, the variable, or
// (for a document that is not YAML) the file.
func FuzzConfigLoad(f *testing.F) {
	seeds := []string{"", "kv_pool:\n  kind: gqa\n", "server:\n  listen: 127.0.0.1:7600\n  metrics_listen:\n",
		"transfer:\n  path: delegate\nkv_pool:\n  kind: hybrid-swa\n", "parallel:\n  attn_tp: 0\n  dcp: 4\n", "a: [1, 2\n", "---\n---\nx: 1\n",
		"timeouts:\n  waiting: -1s\n  bootstrap: 1e400s\n", "kv_pool: 7\n", "staging:\n  enabled: yes\n  pool_size_mb: 99999999999999999999\n"}
	for _, dir := range []string{"../../deploy/local", "../../deploy/examples"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				seeds = append(seeds, string(b))
			}
		}
	}
	for i, s := range seeds {
		f.Add([]byte(s), uint8(i), "1", "DECODEPLANE_LOG_LEVEL=debug")
	}
	f.Add([]byte(""), uint8(3), "-5", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=abc")
	f.Add([]byte("log:\n  level: loud\n"), uint8(200), "\x00", "OTEL_EXPORTER_OTLP_ENDPOINT=::::")

	names := config.EnvNames()
	known := map[string]bool{}
	for _, k := range config.Keys() {
		known[k] = true
	}
	names = append(names, "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED", "DECODEPLANE_NOT_A_KEY")
	path := filepath.Join(f.TempDir(), "decodeplane.yaml")

	f.Fuzz(func(t *testing.T, doc []byte, which uint8, value, extra string) {
		if err := os.WriteFile(path, doc, 0o600); err != nil {
			t.Fatal(err)
		}
		name := names[int(which)%len(names)]
		environ := []string{name + "=" + value, extra}
		cf := config.NewFlags("fuzz", io.Discard)
		cf.Path = path
		l, problems := loadConfig(cf, environ) // must not panic
		_ = l.Config.Warnings()
		extraName, _, _ := strings.Cut(extra, "=")
		for _, p := range problems {
			msg := p.Error()
			if strings.Contains(msg, path) || strings.Contains(msg, name) || (extraName != "" && strings.Contains(msg, extraName)) {
				continue
			}
			named := false
			for k := range known {
				if strings.Contains(msg, k) {
					named = true
					break
				}
			}
			if !named {
				t.Fatalf("problem %q names no key, variable or file (doc %q, env %q)", msg, doc, environ)
			}
		}
	})
}
