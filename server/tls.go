package server

import (
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/internal/tlsreload"
	"github.com/decodeplane/decodeplane/kvlayout"
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

func (c TLSConfig) validate() []error {
	var errs []error
	add := func(key string, v any, problem, fix string) {
		errs = append(errs, &kvlayout.ConfigError{Key: key, Value: v, Problem: problem, Fix: fix})
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
	return append(errs, tlsreload.ConfigErrors(tlsreload.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.ClientCAFile}, time.Now(),
		map[string]string{"cert": "server.tls.cert_file", "key": "server.tls.key_file", "ca": "server.tls.client_ca_file"},
		map[string]string{"cert": "the server's PEM certificate (chain), e.g. tls.crt", "key": "the PEM private key of server.tls.cert_file, e.g. tls.key",
			"ca": "a PEM bundle of the CAs that sign client certificates, e.g. ca.crt"})...)
}

// TLSOptions are what NewServerTLS needs besides the configuration.
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
