package pipenet

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDialAcceptClose(t *testing.T) {
	var n Network
	l := n.Listen("a:1")
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c) // echo
		c.Close()
	}()
	c, err := n.DialContext(t.Context(), "tcp", "a:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
	c.Close()
	if _, err := n.DialContext(t.Context(), "tcp", "b:1"); err == nil {
		t.Error("dialing an unknown address succeeded")
	}
	// Nobody accepts: Dial gives up with its context.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l2 := Listen("c:1")
	if _, err := l2.Dial(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial without Accept = %v, want the context's error", err)
	}
	l.Close()
	l.Close() // idempotent
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
	}
	if _, err := l.Dial(t.Context()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Dial after Close = %v, want net.ErrClosed", err)
	}
	if l.Addr().String() != "a:1" || l.Addr().Network() != "pipe" {
		t.Errorf("Addr = %s/%s", l.Addr().Network(), l.Addr())
	}
}
