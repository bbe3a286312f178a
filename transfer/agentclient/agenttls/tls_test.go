package agenttls_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/internal/testing/tlstest"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer/agentclient/agenttls"
)

// TestAgentTLSConfigValidate is the agent half of server's
// TestTLSConfigValidate, moved here with AgentTLSConfig.
func TestAgentTLSConfigValidate(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "CA")
	f := tlstest.WriteFiles(t, dir, "x", ca.Server(t, "x"), ca)
	garbage := tlstest.Write(t, dir, "garbage", []byte("garbage"))
	keys := func(err error) []string {
		var out []string
		for _, e := range flattenErr(err) {
			var ce *kvlayout.ConfigError
			if !errors.As(e, &ce) {
				t.Fatalf("%v is not a ConfigError", e)
			}
			if ce.Problem == "" || ce.Fix == "" {
				t.Errorf("%s: problem %q fix %q", ce.Key, ce.Problem, ce.Fix)
			}
			out = append(out, ce.Key)
		}
		return out
	}
	agent := []struct {
		name string
		c    agenttls.AgentTLSConfig
		want []string
	}{
		{"off", agenttls.DefaultAgentTLSConfig(), nil},
		{"system roots", agenttls.AgentTLSConfig{Enabled: true, ReloadInterval: 1}, nil},
		{"mtls", agenttls.AgentTLSConfig{Enabled: true, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key, ServerName: "x", ReloadInterval: 1}, nil},
		{"set while off", agenttls.AgentTLSConfig{CAFile: f.CA, ServerName: "x", ReloadInterval: 1}, []string{"transfer.delegate.tls.ca_file", "transfer.delegate.tls.server_name"}},
		{"cert without key, bad CA", agenttls.AgentTLSConfig{Enabled: true, CAFile: garbage, CertFile: f.Cert, ReloadInterval: 1},
			[]string{"transfer.delegate.tls.key_file", "transfer.delegate.tls.ca_file"}},
		{"reload interval", agenttls.AgentTLSConfig{Enabled: true}, []string{"transfer.delegate.tls.reload_interval"}},
	}
	for _, tt := range agent {
		t.Run("agent "+tt.name, func(t *testing.T) {
			if got := keys(tt.c.Validate()); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("problems %q, want %q", got, tt.want)
			}
		})
	}
}

func flattenErr(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenErr(e)...)
		}
		return out
	}
	return []error{err}
}
