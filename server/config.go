package server

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Config is the gRPC layer's configuration (server).
type Config struct {
	// Listen is the gRPC address (127.0.0.1:7600).
	Listen string `yaml:"listen"`
	// MetricsListen is the Prometheus /metrics address (127.0.0.1:7601);
	// empty disables the metrics listener.
	MetricsListen string `yaml:"metrics_listen"`
	// HTTPListen serves SGLang's bootstrap routes (PUT/GET /route,
	// /register_dp_rank, /query_dp_ranks, /health) and JSON over HTTP for
	// every decodeplane.v1 RPC; empty (the default) disables it. SGLang's
	// bootstrap port is 8998.
	HTTPListen string `yaml:"http_listen"`
	// SGLangMetrics serves, on /metrics next to decodeplane_*, SGLang's
	// decode-side metrics under SGLang's names and labels
	// (sglang:num_decode_prealloc_queue_reqs and its family; package
	// metrics, sglang.go), for routers that read them. On by default.
	SGLangMetrics bool `yaml:"sglang_metrics"`
	// Reflection registers gRPC server reflection (on by default).
	Reflection bool `yaml:"reflection"`
	// ShutdownTimeout bounds the graceful stop on SIGINT/SIGTERM: the rooms
	// get it less a flush reserve (a fifth, at most 2 s) to finish, the rest
	// fail with FAILURE_CODE_SHUTDOWN on every stream; after it in-flight
	// RPCs are cancelled.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// AuthToken, when set, is required as "authorization: Bearer <token>" on
	// every mutating RPC (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN).
	AuthToken string `yaml:"auth_token" secret:"true"`
	// TLS is the listener's TLS and mutual TLS (server.tls); off by default.
	TLS TLSConfig `yaml:"tls"`
}

// ListenAddr splits a listen address into the network and address for
// net.Listen: "host:port" (port 0..65535; 0 picks a free one) is TCP, and,
// when unix is allowed, "unix:///absolute/path" is a Unix socket.
func ListenAddr(addr string, unix bool) (network, address string, err error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !unix {
			return "", "", fmt.Errorf("a Unix socket is not supported here")
		}
		if !filepath.IsAbs(path) {
			return "", "", fmt.Errorf("unix://PATH needs an absolute path (unix:///run/decodeplane.sock)")
		}
		return "unix", path, nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("not a host:port address")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", "", fmt.Errorf("port %q is not a number in 0..65535", port)
	}
	return "tcp", addr, nil
}

// DefaultConfig returns the defaults: loopback listeners, the sglang:*
// metrics and reflection on, 15s shutdown, no token, no TLS.
func DefaultConfig() Config {
	return Config{Listen: "127.0.0.1:7600", MetricsListen: "127.0.0.1:7601", SGLangMetrics: true, Reflection: true, ShutdownTimeout: 15 * time.Second, TLS: DefaultTLSConfig()}
}

// Validate returns every problem at once (the TLS files are read and
// checked).
func (c Config) Validate() error {
	var errs []error
	if _, _, err := ListenAddr(c.Listen, true); err != nil {
		errs = append(errs, &kvlayout.ConfigError{Key: "server.listen", Value: c.Listen, Problem: err.Error() + ".", Fix: "set it like 127.0.0.1:7600 (:7600 for every interface), or unix:///run/decodeplane.sock."})
	}
	if c.MetricsListen != "" {
		if _, _, err := ListenAddr(c.MetricsListen, false); err != nil {
			errs = append(errs, &kvlayout.ConfigError{Key: "server.metrics_listen", Value: c.MetricsListen, Problem: err.Error() + ".", Fix: "set it like 127.0.0.1:7601, or to \"\" to disable /metrics."})
		} else if _, port, _ := net.SplitHostPort(c.MetricsListen); c.MetricsListen == c.Listen && port != "0" {
			errs = append(errs, &kvlayout.ConfigError{Key: "server.metrics_listen", Value: c.MetricsListen, Problem: "is the same address as server.listen.", Fix: "give /metrics its own port (default 127.0.0.1:7601)."})
		}
	}
	if c.HTTPListen != "" {
		if _, _, err := ListenAddr(c.HTTPListen, false); err != nil {
			errs = append(errs, &kvlayout.ConfigError{Key: "server.http_listen", Value: c.HTTPListen, Problem: err.Error() + ".", Fix: "set it like 127.0.0.1:8998 (SGLang's bootstrap port), or to \"\" to disable the HTTP surface."})
		} else if _, port, _ := net.SplitHostPort(c.HTTPListen); port != "0" && (c.HTTPListen == c.Listen || c.HTTPListen == c.MetricsListen) {
			errs = append(errs, &kvlayout.ConfigError{Key: "server.http_listen", Value: c.HTTPListen, Problem: "is the same address as server.listen or server.metrics_listen.", Fix: "give the HTTP surface its own port, e.g. 127.0.0.1:8998."})
		}
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, &kvlayout.ConfigError{Key: "server.shutdown_timeout", Value: c.ShutdownTimeout, Problem: "must be > 0.", Fix: "set a duration such as 15s."})
	}
	errs = append(errs, c.TLS.validate()...)
	return errors.Join(errs...)
}
