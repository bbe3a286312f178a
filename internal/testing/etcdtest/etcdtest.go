// Package etcdtest runs a real etcd (go.etcd.io/etcd/server/v3/embed, one
// member) inside the calling process, for the tests and benchmarks that
// claim something about a fleet sharing etcd, and for
// cmd/decodeplane-dev-etcd. It is not a mock: clients reach it over TCP
// with the real etcd client and it keeps its data on disk, so Stop and
// Start model an etcd outage and its recovery (same ports, same data, the
// leases' remaining TTL renewed by the new leader, as etcd does).
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Options configure a Server.
type Options struct {
	// Dir is the data directory (required).
	Dir string
	// ClientAddr is the client listener's host:port; "" picks a free
	// loopback port (kept across Stop and Start).
	ClientAddr string
	// LogLevel is etcd's zap level; "" is "error" (etcd is noisy).
	LogLevel string
	// NoFsync trades durability for speed (tests only).
	NoFsync bool
}

// Server is one embedded etcd member.
type Server struct {
	opts    Options
	client  url.URL
	peer    url.URL
	mu      sync.Mutex
	etcd    *embed.Etcd
	stopped chan struct{}
}

// New reserves the ports of a server; Start starts it.
func New(opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("etcdtest: Options.Dir is required")
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "error"
	}
	caddr := opts.ClientAddr
	if caddr == "" {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		caddr = a
	}
	paddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return &Server{opts: opts, client: url.URL{Scheme: "http", Host: caddr}, peer: url.URL{Scheme: "http", Host: paddr}}, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("etcdtest: reserve a port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Endpoint is the client URL ("http://127.0.0.1:PORT").
func (s *Server) Endpoint() string { return s.client.String() }

// Start starts the member (again, after Stop, on the same ports and data)
// and waits until it serves, at most 30 s.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		return errors.New("etcdtest: already running")
	}
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.opts.Dir
	cfg.ListenClientUrls = []url.URL{s.client}
	cfg.AdvertiseClientUrls = []url.URL{s.client}
	cfg.ListenPeerUrls = []url.URL{s.peer}
	cfg.AdvertisePeerUrls = []url.URL{s.peer}
	cfg.InitialCluster = cfg.Name + "=" + s.peer.String()
	cfg.LogLevel = s.opts.LogLevel
	cfg.UnsafeNoFsync = s.opts.NoFsync
	var lastErr error
	// A port released by Stop may take a moment to be bindable again.
	for range 50 {
		e, err := embed.StartEtcd(cfg)
		if err == nil {
			select {
			case <-e.Server.ReadyNotify():
				s.etcd = e
				s.stopped = make(chan struct{})
				return nil
			case <-time.After(30 * time.Second):
				e.Close()
				return errors.New("etcdtest: etcd did not become ready within 30s")
			}
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("etcdtest: start etcd: %w", lastErr)
}

// Stop stops the member; its data stays for the next Start. Stopping a
// stopped server does nothing.
//
// The member stops applying at once: embed's Close alone drains the open
// client streams (watches) for up to etcd's request timeout (5 s + two
// election timeouts) while the server runs on, refusing new requests but
// expiring leases and sending the deletions down the open watches, so a
// lease shorter than that window would end during Stop. The server is
// stopped first (HardStop: no more applies, the lessor stopped), then
// Close drains and closes the listeners, so Stop still takes that window
// when a watch is open.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd == nil {
		return
	}
	s.etcd.Server.HardStop()
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
	s.etcd = nil
	close(s.stopped)
}

// Run starts the member and serves until ctx ends: Start, then Serve.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Serve waits until ctx ends or the started member fails, then stops it
// (the dev binary: Start, print the endpoint, Serve). It returns nil when
// ctx ended, etcd's error when the member failed first.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	e := s.etcd
	s.mu.Unlock()
	if e == nil {
		return errors.New("etcdtest: not running")
	}
	select {
	case <-ctx.Done():
		s.Stop()
		return nil
	case err := <-e.Err():
		s.Stop()
		return fmt.Errorf("etcd: %w", err)
	}
}
