package faults

import (
	"io"
	"net"
	"sync"
)

// proxy is a TCP proxy in front of one address that can be cut (every
// connection closed, new ones closed as soon as accepted) and healed: a
// network partition between what connects through it and its target.
type proxy struct {
	lis    net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

// newProxy listens on a free loopback port and forwards to target.
func (s *Stage) newProxy(target string) (*proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	s.mu.Lock()
	s.closers = append(s.closers, p.close)
	s.mu.Unlock()
	return p, nil
}

// Addr is where to connect.
func (p *proxy) Addr() string { return p.lis.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *proxy) forward(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Cut closes every connection and refuses new ones until Heal.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal lets connections through again.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *proxy) close() {
	p.lis.Close()
	p.Cut()
}
