package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/tlsreload"
	"github.com/decodeplane/decodeplane/server"
	"github.com/decodeplane/decodeplane/transfer/agentclient/agenttls"
)

// daemonServerTLS is the listener's TLS (nil: plaintext).
type daemonServerTLS struct{ *server.ServerTLS }

// daemonAgentTLS is the agent link's TLS (nil: plaintext).
type daemonAgentTLS struct{ *agenttls.AgentTLS }

// buildTLS loads the listener's and the agent link's certificates and
// counts their reloads in decodeplane_tls_reloads_total.
func buildTLS(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (daemonServerTLS, daemonAgentTLS, error) {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "decodeplane_tls_reloads_total",
		Help: "Reloads of changed TLS files, by section (server.tls, transfer.delegate.tls) and result (ok: in use; error: refused, the previous files kept).",
	}, []string{"section", "result"})
	if err := reg.Register(reloads); err != nil {
		return daemonServerTLS{}, daemonAgentTLS{}, err
	}
	notAfter := func(section string, r *tlsreload.Reloader) error {
		return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "decodeplane_tls_certificate_not_after_seconds",
			Help:        "End of validity (Unix time) of the certificate in use, by section; alert well before it.",
			ConstLabels: prometheus.Labels{"section": section},
		}, func() float64 {
			if c := r.Certificate(); c != nil && c.Leaf != nil {
				return float64(c.Leaf.NotAfter.Unix())
			}
			return 0
		}))
	}
	counted := func(section string) server.TLSOptions {
		ok, failed := reloads.WithLabelValues(section, "ok"), reloads.WithLabelValues(section, "error")
		return server.TLSOptions{Logger: log, OnReload: func(err error) {
			if err != nil {
				failed.Inc()
				return
			}
			ok.Inc()
		}}
	}
	st, err := server.NewServerTLS(cfg.Server.TLS, counted("server.tls"))
	if err != nil {
		return daemonServerTLS{}, daemonAgentTLS{}, fmt.Errorf("server.tls: %w", err)
	}
	var at *agenttls.AgentTLS
	if cfg.Transfer.Path == config.PathDelegate {
		o := counted("transfer.delegate.tls")
		if at, err = agenttls.NewAgentTLS(cfg.AgentTLS, agenttls.Options{Logger: o.Logger, OnReload: o.OnReload}); err != nil {
			return daemonServerTLS{}, daemonAgentTLS{}, fmt.Errorf("transfer.delegate.tls: %w", err)
		}
	}
	if st != nil {
		if err := notAfter("server.tls", st.Reloader); err != nil {
			return daemonServerTLS{}, daemonAgentTLS{}, err
		}
	}
	if at != nil && at.Reloader != nil && cfg.AgentTLS.CertFile != "" {
		if err := notAfter("transfer.delegate.tls", at.Reloader); err != nil {
			return daemonServerTLS{}, daemonAgentTLS{}, err
		}
	}
	switch {
	case st == nil:
		log.Info("gRPC listener without TLS (plaintext)", "listen", cfg.Server.Listen)
	case cfg.Server.TLS.ClientCAFile == "":
		log.Info("gRPC listener with TLS", "cert_file", cfg.Server.TLS.CertFile, "reload_interval", cfg.Server.TLS.ReloadInterval)
	default:
		log.Info("gRPC listener with mutual TLS", "cert_file", cfg.Server.TLS.CertFile, "client_ca_file", cfg.Server.TLS.ClientCAFile,
			"require_client_cert", cfg.Server.TLS.RequireClientCert, "reload_interval", cfg.Server.TLS.ReloadInterval)
	}
	if at != nil {
		log.Info("transfer agent link with TLS", "ca_file", cfg.AgentTLS.CAFile, "client_cert", cfg.AgentTLS.CertFile != "", "server_name", cfg.AgentTLS.ServerName)
	}
	return daemonServerTLS{st}, daemonAgentTLS{at}, nil
}

func (t daemonServerTLS) options() []grpc.ServerOption {
	if t.ServerTLS == nil {
		return nil
	}
	return []grpc.ServerOption{t.Option}
}

func (t daemonServerTLS) loops() []func(context.Context) error {
	if t.ServerTLS == nil {
		return nil
	}
	return []func(context.Context) error{t.Reloader.Run}
}

func (t daemonAgentTLS) credentials() credentials.TransportCredentials {
	if t.AgentTLS == nil {
		return nil
	}
	return t.Credentials
}

func (t daemonAgentTLS) loops() []func(context.Context) error {
	if t.AgentTLS == nil || t.Reloader == nil {
		return nil
	}
	return []func(context.Context) error{t.Reloader.Run}
}
