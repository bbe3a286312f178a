package server

import (
	"errors"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/decodeplane/decodeplane/internal/tlsreload"
	"github.com/decodeplane/decodeplane/prealloc"
)

// TLSConfig is the gRPC listener's TLS (server.tls). The listener uses TLS
// when CertFile is set; with ClientCAFile too it verifies client
// certificates against that bundle (mutual TLS). The files are re-read every
// ReloadInterval and a changed, valid pair or bundle is used for the
// connections made from then on (certificate rotation without a restart).
type TLSConfig struct {
	// CertFile is the server's PEM certificate (chain), e.g. cert-manager's tls.crt.
	CertFile string `yaml:"cert_file"`
	// KeyFile is CertFile's PEM private key (tls.key).
	KeyFile string `yaml:"key_file"`
	// ClientCAFile is a PEM bundle of the CAs that sign client certificates
	// (ca.crt); set, it turns on mutual TLS.
	ClientCAFile string `yaml:"client_ca_file"`
	// RequireClientCert, with ClientCAFile, refuses clients without a
	// certificate (true, the default); false admits them, still verifying
	// the certificates clients do present. Without ClientCAFile it has no
	// effect.
	RequireClientCert bool `yaml:"require_client_cert"`
	// ReloadInterval is how often the files are read for changes.
	ReloadInterval time.Duration `yaml:"reload_interval"`
}

// Enabled reports whether the listener uses TLS.
func (c TLSConfig) Enabled() bool { return c.CertFile != "" }

// DefaultTLSConfig is TLS off, client certificates required once a client
// CA is set, files re-read every 10s.
func DefaultTLSConfig() TLSConfig {
	return TLSConfig{RequireClientCert: true, ReloadInterval: tlsreload.DefaultInterval}
}

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

// fileFix is the fix for a problem with one kind of file.
func fileFix(p tlsreload.Problem, what string) string {
	switch {
	case strings.Contains(p.Message, "expired") || strings.Contains(p.Message, "not valid before"):
		return "renew the certificate (or check this machine's clock)."
	case strings.Contains(p.Message, "does not match"):
		return "give the key that was generated with the certificate (the pair of one cert-manager secret: tls.crt and tls.key)."
	}
	return "point it at " + what + "."
}

// checkFiles turns tlsreload's findings into configuration errors.
func checkFiles(keys map[string]string, files tlsreload.Files, what map[string]string) []error {
	var errs []error
	for _, p := range tlsreload.Check(files, time.Now()) {
		errs = append(errs, &prealloc.ConfigError{Key: keys[p.File], Value: p.Path, Problem: p.Message, Fix: fileFix(p, what[p.File])})
	}
	return errs
}

func (c TLSConfig) validate() []error {
	var errs []error
	add := func(key string, v any, problem, fix string) {
		errs = append(errs, &prealloc.ConfigError{Key: key, Value: v, Problem: problem, Fix: fix})
	}
	if c.ReloadInterval <= 0 {
		add("server.tls.reload_interval", c.ReloadInterval, "must be > 0.", "set a duration such as 10s.")
	}
	switch {
	case c.CertFile == "" && c.KeyFile != "":
		add("server.tls.cert_file", c.CertFile, "server.tls.key_file is set but its certificate is not.", "set server.tls.cert_file to the PEM certificate of that key, or clear server.tls.key_file.")
	case c.CertFile != "" && c.KeyFile == "":
		add("server.tls.key_file", c.KeyFile, "server.tls.cert_file is set but its private key is not.", "set server.tls.key_file to the certificate's PEM private key.")
	case c.CertFile == "" && c.ClientCAFile != "":
		add("server.tls.client_ca_file", c.ClientCAFile, "mutual TLS needs the server's own certificate.", "set server.tls.cert_file and server.tls.key_file, or clear server.tls.client_ca_file.")
	}
	if c.CertFile == "" && c.KeyFile == "" && c.ClientCAFile == "" {
		return errs
	}
	return append(errs, checkFiles(
		map[string]string{"cert": "server.tls.cert_file", "key": "server.tls.key_file", "ca": "server.tls.client_ca_file"},
		tlsreload.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.ClientCAFile},
		map[string]string{"cert": "the server's PEM certificate (chain), e.g. tls.crt", "key": "the PEM private key of server.tls.cert_file, e.g. tls.key",
			"ca": "a PEM bundle of the CAs that sign client certificates, e.g. ca.crt"})...)
}

// Validate returns every problem at once, the files' included.
func (c AgentTLSConfig) Validate() error {
	var errs []error
	add := func(key string, v any, problem, fix string) {
		errs = append(errs, &prealloc.ConfigError{Key: key, Value: v, Problem: problem, Fix: fix})
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
	errs = append(errs, checkFiles(
		map[string]string{"cert": "transfer.delegate.tls.cert_file", "key": "transfer.delegate.tls.key_file", "ca": "transfer.delegate.tls.ca_file"},
		tlsreload.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.CAFile},
		map[string]string{"cert": "the daemon's PEM client certificate for the agent", "key": "the PEM private key of transfer.delegate.tls.cert_file",
			"ca": "a PEM bundle of the CAs that sign the agent's certificate, e.g. ca.crt"})...)
	return errors.Join(errs...)
}

// TLSOptions are what NewServerTLS and NewAgentTLS need besides the
// configuration.
type TLSOptions struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnReload is called after each reload of changed files (nil error: in
	// use; else refused, the previous files kept).
	OnReload func(err error)
}

// ServerTLS is the listener's TLS: the server option to pass in
// Deps.ExtraServerOptions and the reloader whose Run keeps it current.
type ServerTLS struct {
	Option   grpc.ServerOption
	Reloader *tlsreload.Reloader
}

// NewServerTLS loads the listener's certificate (and client CAs); nil when
// TLS is off.
func NewServerTLS(c TLSConfig, o TLSOptions) (*ServerTLS, error) {
	if !c.Enabled() {
		return nil, nil
	}
	r, err := tlsreload.New(tlsreload.Options{Name: "server.tls", Interval: c.ReloadInterval, Logger: o.Logger, OnReload: o.OnReload,
		Files: tlsreload.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.ClientCAFile}})
	if err != nil {
		return nil, err
	}
	return &ServerTLS{Option: grpc.Creds(r.ServerCredentials(c.RequireClientCert)), Reloader: r}, nil
}

// AgentTLS is the agent link's TLS: credentials for
// AgentClientOptions.Credentials and the reloader (nil without files) whose
// Run keeps them current.
type AgentTLS struct {
	Credentials credentials.TransportCredentials
	Reloader    *tlsreload.Reloader
}

// NewAgentTLS loads the agent link's CA and client certificate; nil when
// TLS is off.
func NewAgentTLS(c AgentTLSConfig, o TLSOptions) (*AgentTLS, error) {
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
