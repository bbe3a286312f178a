package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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
	if n := len(Flatten(err)); n != 3 {
		t.Fatalf("%d problems, want 3: %v", n, err)
	}
}
