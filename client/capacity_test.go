package client_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/server"
)

// TestWatchCapacityEnds: a bad interval is ErrInvalidArgument naming the
// field; Close ends a stream with ErrCanceled; the daemon's stop ends it
// with io.EOF after an update with ready=false; the token is needed when
// the daemon has one.
func TestWatchCapacityEnds(t *testing.T) {
	d, err := startDaemon(daemonConfig{server: func(c *server.Config) { c.AuthToken = "tok" }})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			d.stop()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	anon, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	s, err := anon.Admin().WatchCapacity(ctx, client.CapacityOptions{})
	if err == nil {
		_, err = s.Next()
	}
	if !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("WatchCapacity without the token: %v, want ErrUnauthenticated", err)
	}

	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()), client.WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err = c.Admin().WatchCapacity(ctx, client.CapacityOptions{MinInterval: 2 * time.Second, Keepalive: time.Second})
	if err == nil {
		_, err = s.Next()
	}
	if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "keepalive_interval: 1s is below min_interval 2s") {
		t.Fatalf("keepalive below min_interval: %v, want ErrInvalidArgument naming keepalive_interval", err)
	}

	s, err = c.Admin().WatchCapacity(ctx, client.CapacityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u, err := s.Next(); err != nil || u.GetSequence() != 1 || !u.GetReady() || len(u.GetShards()) != 1 {
		t.Fatalf("first update %v, %v", u, err)
	}
	s.Close()
	if _, err := s.Next(); !errors.Is(err, client.ErrCanceled) {
		t.Fatalf("Next after Close: %v, want ErrCanceled", err)
	}

	s, err = c.Admin().WatchCapacity(ctx, client.CapacityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	var last string
	for {
		u, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the stream ended with %v after %q, want io.EOF", err, last)
		}
		last = u.GetReadiness()
		if u.GetReady() && last == server.ReadinessShuttingDown {
			t.Fatalf("ready=true with readiness %q", last)
		}
	}
	if last != server.ReadinessShuttingDown {
		t.Fatalf("last readiness %q, want %q", last, server.ReadinessShuttingDown)
	}
	if _, err := s.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the end: %v, want io.EOF again", err)
	}
}
