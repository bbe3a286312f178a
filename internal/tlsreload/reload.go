// Package tlsreload keeps a TLS certificate pair and a CA bundle, read from
// PEM files, current without a restart: a Reloader polls the files every
// interval and, when their content changed, parses and swaps them in for the
// connections made from then on. Rotation tools (cert-manager, Vault agent)
// replace the files, often by swapping a symlink to a new directory; polling
// the content follows that whatever the file system or the swap, and costs
// three small reads per interval.
//
// A reload that fails (a half-written pair, a key that does not match its
// certificate, an expired certificate, a CA file without certificates) keeps
// the last good pair and CA, logs the reason once per distinct content and is
// counted (Failures, Options.OnReload). Connections already established are
// not touched: TLS authenticates at the handshake.
//
// It is used by the daemon's listener (server.tls), the daemon's client of
// the transfer agent (transfer.delegate.tls) and the reference agent's
// listener (--tls-*). Check validates files the same way for
// 'decodeplane validate'.
package tlsreload

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// DefaultInterval is how often the files are read when Options.Interval is 0.
const DefaultInterval = 10 * time.Second

// Files names the PEM files. Cert and Key go together (both or neither); CA
// is a bundle of one or more CA certificates (optional).
type Files struct {
	Cert, Key, CA string
}

// Options configure New.
type Options struct {
	Files
	// Name says which link the files serve in logs ("server.tls").
	Name string
	// Interval is how often Run reads the files (0: DefaultInterval).
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnReload, when set, is called after every reload of changed files: nil
	// when the new files are in use, else why they were refused.
	OnReload func(err error)
	// Now is the clock for the expiry checks (nil: time.Now).
	Now func() time.Time
}

// Problem is one thing wrong with one file.
type Problem struct {
	// File is which file: "cert", "key" or "ca".
	File string
	// Path is the file's path.
	Path string
	// Message says what is wrong.
	Message string
}

func (p Problem) Error() string { return fmt.Sprintf("%s file %s: %s", p.File, p.Path, p.Message) }

// state is one loaded generation of the files.
type state struct {
	cert *tls.Certificate // nil without Cert/Key
	pool *x509.CertPool   // nil without CA
	sum  [sha256.Size]byte
}

// Reloader holds the current pair and CA pool.
type Reloader struct {
	o   Options
	log *slog.Logger

	cur      atomic.Pointer[state]
	mu       sync.Mutex // serialises Reload
	badSum   [sha256.Size]byte
	failures atomic.Uint64
	reloads  atomic.Uint64
}

// New loads the files once; it fails, with every problem found, if they are
// not usable.
func New(o Options) (*Reloader, error) {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if (o.Cert == "") != (o.Key == "") {
		return nil, errors.New("tlsreload: the certificate and key files go together")
	}
	if o.Cert == "" && o.CA == "" {
		return nil, errors.New("tlsreload: no file to load")
	}
	r := &Reloader{o: o, log: o.Logger.With("tls", o.Name)}
	st, problems := load(o.Files, o.Now())
	if len(problems) > 0 {
		return nil, joinProblems(problems)
	}
	r.cur.Store(st)
	return r, nil
}

func joinProblems(ps []Problem) error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// Check validates the files as New and Reload would load them, at time now:
// each readable, PEM, the certificate parsing, the key matching it, the
// certificate valid at now, the CA bundle holding parsable certificates of
// which at least one is valid at now. It returns every problem found.
func Check(f Files, now time.Time) []Problem {
	_, problems := load(f, now)
	return problems
}

// ConfigErrors is Check's findings as configuration problems: keys names the
// configuration key of each file ("cert", "key", "ca") and what describes
// what the file must be, for the fix.
func ConfigErrors(f Files, now time.Time, keys, what map[string]string) []error {
	var errs []error
	for _, p := range Check(f, now) {
		errs = append(errs, &kvlayout.ConfigError{Key: keys[p.File], Value: p.Path, Problem: p.Message, Fix: p.fix(what[p.File])})
	}
	return errs
}

// fix is the fix for a problem with one kind of file.
func (p Problem) fix(what string) string {
	switch {
	case strings.Contains(p.Message, "expired") || strings.Contains(p.Message, "not valid before"):
		return "renew the certificate (or check this machine's clock)."
	case strings.Contains(p.Message, "does not match"):
		return "give the key that was generated with the certificate (the pair of one cert-manager secret: tls.crt and tls.key)."
	}
	return "point it at " + what + "."
}

// read returns a file's content, or a problem.
func read(which, path string) ([]byte, *Problem) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		msg := err.Error()
		if errors.As(err, &pe) {
			msg = pe.Err.Error()
		}
		return nil, &Problem{File: which, Path: path, Message: "cannot read it: " + msg + "."}
	}
	return b, nil
}

// certificates parses every CERTIFICATE block of a PEM file.
func certificates(which, path string, data []byte) ([]*x509.Certificate, *Problem) {
	var out []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			if strings.Contains(block.Type, "PRIVATE KEY") {
				return nil, &Problem{File: which, Path: path, Message: "holds a private key (" + block.Type + "), not a certificate."}
			}
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, &Problem{File: which, Path: path, Message: fmt.Sprintf("certificate %d does not parse: %v.", len(out)+1, err)}
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, &Problem{File: which, Path: path, Message: "no PEM certificate in it (want -----BEGIN CERTIFICATE-----)."}
	}
	return out, nil
}

func validity(which, path string, c *x509.Certificate, now time.Time) *Problem {
	name := c.Subject.CommonName
	if name == "" {
		name = c.Subject.String()
	}
	switch {
	case now.After(c.NotAfter):
		return &Problem{File: which, Path: path, Message: fmt.Sprintf("certificate %q expired at %s.", name, c.NotAfter.UTC().Format(time.RFC3339))}
	case now.Before(c.NotBefore):
		return &Problem{File: which, Path: path, Message: fmt.Sprintf("certificate %q is not valid before %s.", name, c.NotBefore.UTC().Format(time.RFC3339))}
	}
	return nil
}

// load reads and parses the files; it reports every problem.
func load(f Files, now time.Time) (*state, []Problem) {
	var problems []Problem
	h := sha256.New()
	add := func(p *Problem) {
		if p != nil {
			problems = append(problems, *p)
		}
	}
	st := &state{}
	if f.Cert != "" || f.Key != "" {
		// Check reports on a lone certificate or key too (New refuses them).
		var certPEM, keyPEM []byte
		var p1, p2 *Problem
		if f.Cert != "" {
			certPEM, p1 = read("cert", f.Cert)
			add(p1)
		}
		if f.Key != "" {
			keyPEM, p2 = read("key", f.Key)
			add(p2)
		}
		var leaf *x509.Certificate
		if f.Cert != "" && p1 == nil {
			certs, p := certificates("cert", f.Cert, certPEM)
			add(p)
			if p == nil {
				leaf = certs[0]
				add(validity("cert", f.Cert, leaf, now))
			}
		}
		if f.Key != "" && p2 == nil {
			if blk, _ := pem.Decode(keyPEM); blk == nil || !strings.Contains(blk.Type, "PRIVATE KEY") {
				add(&Problem{File: "key", Path: f.Key, Message: "no PEM private key in it (want -----BEGIN ... PRIVATE KEY-----)."})
			} else if leaf != nil && len(problems) == 0 {
				pair, err := tls.X509KeyPair(certPEM, keyPEM)
				if err != nil {
					msg := strings.TrimPrefix(err.Error(), "tls: ")
					if strings.Contains(msg, "does not match") {
						msg = "the private key does not match the certificate in " + f.Cert
					}
					add(&Problem{File: "key", Path: f.Key, Message: msg + "."})
				} else {
					st.cert = &pair
				}
			}
		}
		h.Write(certPEM)
		h.Write([]byte{0})
		h.Write(keyPEM)
	}
	h.Write([]byte{1})
	if f.CA != "" {
		caPEM, p := read("ca", f.CA)
		add(p)
		if p == nil {
			certs, p := certificates("ca", f.CA, caPEM)
			add(p)
			if p == nil {
				// A bundle may carry an outgoing CA past its end during a
				// rotation: only a bundle with no valid certificate is refused.
				pool := x509.NewCertPool()
				var invalid *Problem
				valid := 0
				for _, c := range certs {
					if p := validity("ca", f.CA, c, now); p != nil {
						invalid = p
						continue
					}
					pool.AddCert(c)
					valid++
				}
				if valid == 0 {
					add(invalid)
				}
				st.pool = pool
			}
		}
		h.Write(caPEM)
	}
	copy(st.sum[:], h.Sum(nil))
	if len(problems) > 0 {
		return &state{sum: st.sum}, problems
	}
	return st, nil
}

// Reload reads the files now; when their content changed it swaps the new
// pair and CA in, or keeps the current ones if the new files are not usable
// (logged once per distinct content, counted, and returned). It reports
// whether new files were taken.
func (r *Reloader) Reload() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, problems := load(r.o.Files, r.o.Now())
	if st.sum == r.cur.Load().sum {
		r.badSum = [sha256.Size]byte{} // back to the files in use
		return false, nil
	}
	if len(problems) > 0 {
		err := joinProblems(problems)
		if st.sum != r.badSum {
			r.badSum = st.sum
			r.failures.Add(1)
			r.log.Warn("TLS files changed but cannot be used; keeping the previous certificate", "err", err)
			if r.o.OnReload != nil {
				r.o.OnReload(err)
			}
		}
		return false, err
	}
	r.cur.Store(st)
	r.badSum = [sha256.Size]byte{}
	r.reloads.Add(1)
	attrs := []any{}
	if st.cert != nil && st.cert.Leaf != nil {
		attrs = append(attrs, "subject", st.cert.Leaf.Subject.String(), "not_after", st.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	r.log.Info("TLS files reloaded", attrs...)
	if r.o.OnReload != nil {
		r.o.OnReload(nil)
	}
	return true, nil
}

// Run reloads every interval until ctx is done; it returns ctx's error.
func (r *Reloader) Run(ctx context.Context) error {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			_, _ = r.Reload()
		}
	}
}

// Failures counts reloads refused since New (one per distinct bad content).
func (r *Reloader) Failures() uint64 { return r.failures.Load() }

// Reloads counts the reloads that took new files since New.
func (r *Reloader) Reloads() uint64 { return r.reloads.Load() }

// Certificate returns the current certificate pair (nil without one).
func (r *Reloader) Certificate() *tls.Certificate { return r.cur.Load().cert }

// CAs returns the current CA pool (nil without a CA file).
func (r *Reloader) CAs() *x509.CertPool { return r.cur.Load().pool }

// ServerConfig is a server-side tls.Config that picks the current
// certificate and client CAs at every handshake. With a CA file, clients are
// verified against it: required when requireClientCert, else only when they
// present a certificate.
func (r *Reloader) ServerConfig(requireClientCert bool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			st := r.cur.Load()
			if st.cert == nil {
				return nil, errors.New("no server certificate loaded")
			}
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*st.cert}}
			if st.pool != nil {
				c.ClientCAs = st.pool
				c.ClientAuth = tls.VerifyClientCertIfGiven
				if requireClientCert {
					c.ClientAuth = tls.RequireAndVerifyClientCert
				}
			}
			return c, nil
		},
	}
}

// ServerCredentials are gRPC server credentials over ServerConfig.
func (r *Reloader) ServerCredentials(requireClientCert bool) credentials.TransportCredentials {
	return credentials.NewTLS(r.ServerConfig(requireClientCert))
}

// ClientConfig is a client-side tls.Config built from the current files:
// the CA pool as roots (the system roots without a CA file), the certificate
// as the client certificate (mutual TLS), serverName as the name to verify
// ("" = the host of the target).
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	st := r.cur.Load()
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: st.pool}
	if st.cert != nil {
		c.Certificates = []tls.Certificate{*st.cert}
	}
	return c
}

// ClientCredentials are gRPC client credentials that build ClientConfig
// afresh at every handshake, so a reconnection after a rotation uses the new
// CA and client certificate. A nil Reloader uses the system roots and no
// client certificate.
func (r *Reloader) ClientCredentials(serverName string) credentials.TransportCredentials {
	return &clientCreds{r: r, serverName: serverName}
}

type clientCreds struct {
	r          *Reloader
	serverName string
}

func (c *clientCreds) current() credentials.TransportCredentials {
	if c.r == nil {
		return credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName})
	}
	return credentials.NewTLS(c.r.ClientConfig(c.serverName))
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsreload: client credentials used on a server")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2", ServerName: c.serverName}
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{r: c.r, serverName: c.serverName}
}

func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
