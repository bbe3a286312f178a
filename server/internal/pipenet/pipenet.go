// Package pipenet is an in-memory network for tests: a Listener whose
// connections are net.Pipe pairs, to run HTTP servers inside a
// testing/synctest bubble, where blocking on a pipe is durable and a real
// socket is not. No server code uses it (the JSON gateway calls the
// operation table in process: deps_test.go).
package pipenet

import (
	"context"
	"net"
	"sync"
)

// Listener is an in-memory net.Listener; Dial connects to it.
type Listener struct {
	addr  pipeAddr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

// Listen returns a listener named addr.
func Listen(addr string) *Listener {
	return &Listener{addr: pipeAddr(addr), conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for the next Dial; after Close it returns net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and Dial; connections already made stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the name given to Listen.
func (l *Listener) Addr() net.Addr { return l.addr }

// Dial connects to the listener; it waits for Accept, ctx or Close.
func (l *Listener) Dial(ctx context.Context) (net.Conn, error) {
	client, srv := net.Pipe()
	select {
	case l.conns <- srv:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	srv.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, net.ErrClosed
}

// Network maps addresses to listeners: its DialContext has net.Dialer's
// signature, for an http.Transport.
type Network struct {
	mu sync.Mutex
	ls map[string]*Listener
}

// Listen adds a listener at addr ("host:port").
func (n *Network) Listen(addr string) *Listener {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls == nil {
		n.ls = map[string]*Listener{}
	}
	l := Listen(addr)
	n.ls[addr] = l
	return l
}

// DialContext dials the listener at addr; an unknown address is refused.
func (n *Network) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.ls[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: errRefused}
	}
	return l.Dial(ctx)
}

var errRefused = refused{}

type refused struct{}

func (refused) Error() string { return "connection refused" }
