// Package agenttls is the TLS of the daemon's link to the transfer agent
// (transfer/agentclient): its configuration section, transfer.delegate.tls
// (AgentTLSConfig, with the checks of 'decodeplane validate'), and the
// client credentials built from it (NewAgentTLS), whose files a
// tlsreload.Reloader keeps current. It is its own package so that the
// configuration loader (internal/config) can describe the section without
// linking the agent client itself (deps_test.go).
package agenttls

import (
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/decodeplane/decodeplane/internal/tlsreload"
	"github.com/decodeplane/decodeplane/kvlayout"
)

// AgentTLSConfig is the client side of the transfer-agent link
// (transfer.delegate.tls): TLS when Enabled, verifying the agent against
// CAFile (the system roots when empty) and the name ServerName (default:
// the host of transfer.delegate.target), presenting CertFile/KeyFile as the
// client certificate when set (mutual TLS). The files are re-read every
// ReloadInterval; a reconnection after a change uses the new ones.
type AgentTLSConfig struct {
	// Enabled turns TLS on for the agent link.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs that sign the agent's certificate.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the daemon's client certificate and key.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the agent's certificate must carry.
	ServerName string `yaml:"server_name"`
	// ReloadInterval is how often the files are read for changes.
	ReloadInterval time.Duration `yaml:"reload_interval"`
}

// DefaultAgentTLSConfig is TLS off, files re-read every 10s once on.
func DefaultAgentTLSConfig() AgentTLSConfig {
	return AgentTLSConfig{ReloadInterval: tlsreload.DefaultInterval}
}

// Validate returns every problem at once, the files' included.
func (c AgentTLSConfig) Validate() error {
	var errs []error
	add := func(key string, v any, problem, fix string) {
		errs = append(errs, &kvlayout.ConfigError{Key: key, Value: v, Problem: problem, Fix: fix})
	}
	if c.ReloadInterval <= 0 {
		add("transfer.delegate.tls.reload_interval", c.ReloadInterval, "must be > 0.", "set a duration such as 10s.")
	}
	if !c.Enabled {
		for _, f := range []struct{ key, v string }{
			{"transfer.delegate.tls.ca_file", c.CAFile}, {"transfer.delegate.tls.cert_file", c.CertFile},
			{"transfer.delegate.tls.key_file", c.KeyFile}, {"transfer.delegate.tls.server_name", c.ServerName},
		} {
			if f.v != "" {
				add(f.key, f.v, "is set but the agent link's TLS is off, so it would be ignored and the link would stay plaintext.",
					"set transfer.delegate.tls.enabled: true, or clear "+f.key+".")
			}
		}
		return errors.Join(errs...)
	}
	switch {
	case c.CertFile == "" && c.KeyFile != "":
		add("transfer.delegate.tls.cert_file", c.CertFile, "transfer.delegate.tls.key_file is set but its certificate is not.", "set the client certificate of that key, or clear transfer.delegate.tls.key_file.")
	case c.CertFile != "" && c.KeyFile == "":
		add("transfer.delegate.tls.key_file", c.KeyFile, "transfer.delegate.tls.cert_file is set but its private key is not.", "set the client certificate's PEM private key.")
	}
	if c.CertFile == "" && c.KeyFile == "" && c.CAFile == "" {
		return errors.Join(errs...)
	}
	errs = append(errs, tlsreload.ConfigErrors(tlsreload.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.CAFile}, time.Now(),
		map[string]string{"cert": "transfer.delegate.tls.cert_file", "key": "transfer.delegate.tls.key_file", "ca": "transfer.delegate.tls.ca_file"},
		map[string]string{"cert": "the daemon's PEM client certificate for the agent", "key": "the PEM private key of transfer.delegate.tls.cert_file",
			"ca": "a PEM bundle of the CAs that sign the agent's certificate, e.g. ca.crt"})...)
	return errors.Join(errs...)
}

// Options are what NewAgentTLS needs besides the configuration.
type Options struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnReload is called after each reload of changed files (nil error: in
	// use; else refused, the previous files kept).
	OnReload func(err error)
}

// AgentTLS is the agent link's TLS: credentials for
// agentclient.Options.Credentials and the reloader (nil without files) whose
// Run keeps them current.
type AgentTLS struct {
	Credentials credentials.TransportCredentials
	Reloader    *tlsreload.Reloader
}

// NewAgentTLS loads the agent link's CA and client certificate; nil when
// TLS is off.
func NewAgentTLS(c AgentTLSConfig, o Options) (*AgentTLS, error) {
	if !c.Enabled {
		return nil, nil
	}
	if c.CAFile == "" && c.CertFile == "" {
		var r *tlsreload.Reloader // system roots, no client certificate
		return &AgentTLS{Credentials: r.ClientCredentials(c.ServerName)}, nil
	}
	r, err := tlsreload.New(tlsreload.Options{Name: "transfer.delegate.tls", Interval: c.ReloadInterval, Logger: o.Logger, OnReload: o.OnReload,
		Files: tlsreload.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.CAFile}})
	if err != nil {
		return nil, err
	}
	return &AgentTLS{Credentials: r.ClientCredentials(c.ServerName), Reloader: r}, nil
}
