package config

import (
	"strings"
	"testing"
)

// TestTLSKeys: the TLS keys are set like every key, from the file (nested
// in their sections), the environment and flags, with their sources.
func TestTLSKeys(t *testing.T) {
	path := writeConfig(t, `server:
  tls:
    cert_file: /etc/decodeplane/tls.crt
    require_client_cert: false
transfer:
  delegate:
    tls:
      enabled: true
      ca_file: /etc/agent/ca.crt
`)
	env := []string{"DECODEPLANE_TRANSFER_DELEGATE_TLS_SERVER_NAME=agent.internal", "DECODEPLANE_SERVER_TLS_RELOAD_INTERVAL=1m"}
	l := mustLoadArgs(t, []string{"--config", path, "--tls-key", "/k.pem", "--tls-client-ca", "/ca.pem", "--set", "transfer.delegate.tls.reload_interval=5s"}, env)
	for _, tt := range []struct{ key, value, source string }{
		{"server.tls.cert_file", `"/etc/decodeplane/tls.crt"`, "file " + path + ":3"},
		{"server.tls.require_client_cert", "false", "file " + path + ":4"},
		{"server.tls.key_file", `"/k.pem"`, "flag --tls-key"},
		{"server.tls.client_ca_file", `"/ca.pem"`, "flag --tls-client-ca"},
		{"server.tls.reload_interval", "1m0s", "env DECODEPLANE_SERVER_TLS_RELOAD_INTERVAL"},
		{"transfer.delegate.tls.enabled", "true", "file " + path + ":8"},
		{"transfer.delegate.tls.ca_file", `"/etc/agent/ca.crt"`, "file " + path + ":9"},
		{"transfer.delegate.tls.server_name", `"agent.internal"`, "env DECODEPLANE_TRANSFER_DELEGATE_TLS_SERVER_NAME"},
		{"transfer.delegate.tls.reload_interval", "5s", "flag --set transfer.delegate.tls.reload_interval"},
	} {
		if got := l.Value(tt.key); got != tt.value {
			t.Errorf("%s = %s, want %s", tt.key, got, tt.value)
		}
		if got := l.Sources[tt.key]; got != tt.source {
			t.Errorf("source of %s = %q, want %q", tt.key, got, tt.source)
		}
	}
	// An unknown key inside the spliced section names what is allowed.
	_, err := Load(writeConfig(t, "transfer:\n  delegate:\n    tls:\n      ca: x\n"), nil, Overrides{})
	if err == nil || !strings.Contains(err.Error(), `unknown key "ca" in transfer.delegate.tls (allowed: enabled, ca_file, cert_file, key_file, server_name, reload_interval)`) {
		t.Errorf("unknown key: %v", err)
	}
}
