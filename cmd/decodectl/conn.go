package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
)

// dial builds the client from the connection flags. It does not connect:
// the first call does. A token sent in clear text to a host that is not
// loopback earns a warning on stderr.
func dial(o *options, stderr io.Writer) (*client.Client, error) {
	var opts []client.Option
	if o.token != "" {
		opts = append(opts, client.WithToken(o.token))
	}
	if o.tlsEnabled() {
		cfg, err := tlsConfig(o)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	} else if o.token != "" && !isLoopback(o.addr) {
		fmt.Fprintf(stderr, "decodectl: warning: sending the token in clear text to %s (use --tls)\n", o.addr)
	}
	c, err := client.New(o.addr, opts...)
	if err != nil {
		return nil, usagef("--addr %q: %v", o.addr, err)
	}
	return c, nil
}

// tlsConfig builds the TLS configuration: the system roots unless --tls-ca,
// a client certificate with --tls-cert/--tls-key (mutual TLS), and the server
// name to verify with --tls-server-name (default: the host of --addr).
// Unreadable or malformed files are usage errors.
func tlsConfig(o *options) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.tlsServerName}
	if o.tlsCA != "" {
		pem, err := os.ReadFile(o.tlsCA)
		if err != nil {
			return nil, usagef("--tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--tls-ca %s: no PEM certificate in the file", o.tlsCA)
		}
		cfg.RootCAs = pool
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, usagef("--tls-cert/--tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// isLoopback reports whether a gRPC target is on this machine: a Unix
// socket, localhost or a loopback IP.
func isLoopback(target string) bool {
	if strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return true
	}
	if i := strings.Index(target, ":///"); i >= 0 {
		target = target[i+4:]
	}
	host := target
	if h, _, err := net.SplitHostPort(target); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// callError is an RPC that failed; what says which ("room 42", "status").
type callError struct {
	what string
	err  error
}

// Error renders "what: error".
func (e *callError) Error() string { return e.what + ": " + e.err.Error() }

// Unwrap returns the RPC error.
func (e *callError) Unwrap() error { return e.err }

// describeError renders an error for people: "what: Code: message" for an
// RPC failure (the gRPC code and the daemon's message), else the error.
func describeError(err error) string {
	var what string
	var ce *callError
	if errors.As(err, &ce) {
		what = ce.what + ": "
		err = ce.err
	}
	var ge interface{ GRPCStatus() *status.Status }
	if errors.As(err, &ge) && ge.GRPCStatus() != nil {
		st := ge.GRPCStatus()
		return what + st.Code().String() + ": " + st.Message()
	}
	return what + err.Error()
}

// errorHint suggests a fix for the errors an operator can fix here.
func errorHint(err error, inv *invocation) string {
	addr := defaultAddr
	if inv != nil {
		addr = inv.opts.addr
	}
	switch status.Code(err) {
	case codes.Unavailable:
		return fmt.Sprintf("is the daemon running at %s? (set --addr or DECODEPLANE_ADDR)", addr)
	case codes.Unauthenticated:
		if inv != nil && inv.opts.token != "" {
			return "the daemon rejected the token given with --token or DECODEPLANE_TOKEN"
		}
		return "the daemon has a bootstrap token: pass --token or set DECODEPLANE_TOKEN"
	case codes.Unimplemented:
		return fmt.Sprintf("the daemon at %s does not serve this call (is it older than this decodectl?)", addr)
	}
	return ""
}
