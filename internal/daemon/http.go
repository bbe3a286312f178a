package daemon

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/decodeplane/decodeplane/server"
)

// addHTTP opens server.http_listen (when set) and serves there SGLang's
// bootstrap routes, from the same registry as the gRPC API (and keeps the
// prefills registered through them alive by polling their /health), and
// JSON over HTTP for every decodeplane.v1 RPC.
func (d *Daemon) addHTTP(srv *server.Server) error {
	addr := d.cfg.Server.HTTPListen
	if addr == "" {
		return nil
	}
	bh, err := srv.NewBootstrapHTTP(server.BootstrapHTTPOptions{})
	if err != nil {
		return err
	}
	hlis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (server.http_listen): %w", addr, err)
	}
	d.hlis = hlis
	mux := http.NewServeMux()
	bh.Register(mux)
	if d.cfg.Server.TLS.Enabled() {
		d.log.Warn("server.http_listen serves the SGLang bootstrap routes only: the JSON gateway is not available with server.tls on", "http_listen", addr)
	} else {
		gw, err := srv.NewJSONGateway()
		if err != nil {
			return err
		}
		gw.Register(mux)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	d.loops = append(d.loops, bh.Run)
	d.serveHTTP("HTTP server (server.http_listen)", hs, hlis)
	return nil
}
