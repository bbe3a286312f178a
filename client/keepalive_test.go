package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// silencer wraps the connections it dials so that they can all go silent
// at once without closing: reads block until the connection is closed,
// writes vanish (a partition, a frozen host).
type silencer struct {
	silent atomic.Bool
	mu     sync.Mutex
	dials  int
}

func (s *silencer) dial(d *daemon) func(ctx context.Context, _ string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		c, err := d.DialContext(ctx)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.dials++
		s.mu.Unlock()
		return &silentConn{Conn: c, s: s, closed: make(chan struct{})}, nil
	}
}

type silentConn struct {
	net.Conn
	s         *silencer
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *silentConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.s.silent.Load() {
		<-c.closed // nothing more arrives
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *silentConn) Write(b []byte) (int, error) {
	if c.s.silent.Load() {
		return len(b), nil // lost
	}
	return c.Conn.Write(b)
}

func (c *silentConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestKeepaliveDropsADeadConnection: a connection that goes silent without
// closing fails the calls waiting on it with ErrUnavailable once a
// keepalive ping goes unanswered (here 10 s + 1 s: grpc-go's floor), and
// the next call reconnects; without keepalive they would wait until TCP
// gave up. (The Client's default is KeepaliveTime + KeepaliveTimeout.)
func TestKeepaliveDropsADeadConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a keepalive ping (~11 s)")
	}
	t.Parallel()
	d := newDaemon(t, daemonConfig{})
	var s silencer
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(grpc.WithContextDialer(s.dial(d)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: time.Second})))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The watchdog: the ping must end the wait well before it.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	es, err := client.OpenEngineSession(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	if _, err := es.Abort(ctx, &pb.AbortRoomRequest{Room: 1}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Abort of an unknown room = %v, want ErrNotFound (the session works)", err)
	}
	s.silent.Store(true)
	start := time.Now()
	_, err = es.Abort(ctx, &pb.AbortRoomRequest{Room: 2})
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("an op on a silent connection = %v after %v, want ErrUnavailable (keepalive)", err, time.Since(start))
	}
	s.silent.Store(false)
	if _, err := c.Admin().Status(ctx); err != nil {
		t.Fatalf("the next call after the dead connection: %v, want a new connection", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dials < 2 {
		t.Errorf("%d connections dialled, want a new one after the dead one", s.dials)
	}
}
