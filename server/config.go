package server

import (
	"errors"
	"net"
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// Config is the gRPC layer's configuration (server).
type Config struct {
	// Listen is the gRPC address (127.0.0.1:7600).
	Listen string `yaml:"listen"`
	// MetricsListen is the Prometheus /metrics address (127.0.0.1:7601);
	// empty disables the metrics listener.
	MetricsListen string `yaml:"metrics_listen"`
	// Reflection registers gRPC server reflection (on by default).
	Reflection bool `yaml:"reflection"`
	// ShutdownTimeout bounds the graceful stop on SIGINT/SIGTERM; after it
	// in-flight RPCs are cancelled.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// AuthToken, when set, is required as "authorization: Bearer <token>" on
	// every mutating RPC (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN).
	AuthToken string `yaml:"auth_token" secret:"true"`
}

// DefaultConfig returns the defaults: loopback listeners, reflection on, 15s
// shutdown, no token.
func DefaultConfig() Config {
	return Config{Listen: "127.0.0.1:7600", MetricsListen: "127.0.0.1:7601", Reflection: true, ShutdownTimeout: 15 * time.Second}
}

// Validate returns every problem at once.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, &prealloc.ConfigError{Key: "server.listen", Value: c.Listen, Problem: "not a host:port address.", Fix: "set it like 127.0.0.1:7600 (or :7600 for every interface)."})
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			errs = append(errs, &prealloc.ConfigError{Key: "server.metrics_listen", Value: c.MetricsListen, Problem: "not a host:port address.", Fix: "set it like 127.0.0.1:7601, or to \"\" to disable /metrics."})
		} else if _, port, _ := net.SplitHostPort(c.MetricsListen); c.MetricsListen == c.Listen && port != "0" {
			errs = append(errs, &prealloc.ConfigError{Key: "server.metrics_listen", Value: c.MetricsListen, Problem: "is the same address as server.listen.", Fix: "give /metrics its own port (default 127.0.0.1:7601)."})
		}
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, &prealloc.ConfigError{Key: "server.shutdown_timeout", Value: c.ShutdownTimeout, Problem: "must be > 0.", Fix: "set a duration such as 15s."})
	}
	return errors.Join(errs...)
}
