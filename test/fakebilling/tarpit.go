package fakebilling

import (
	"io"
	"net"
	"sync"
)

// Tarpit is a billing provider that accepts every connection, reads what it is sent
// and never answers: the worst a provider can do to the operator, since every call to
// it lasts its whole requestTimeout. It holds the connections until it is closed.
type Tarpit struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// StartTarpit listens on a free loopback port.
func StartTarpit() (*Tarpit, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &Tarpit{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed
			}
			t.mu.Lock()
			t.conns = append(t.conns, c)
			t.mu.Unlock()
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads the request, never answers
		}
	}()
	return t, nil
}

// URL is the tarpit's base URL.
func (t *Tarpit) URL() string { return "http://" + t.ln.Addr().String() }

// Close stops accepting and closes every connection it holds.
func (t *Tarpit) Close() {
	_ = t.ln.Close()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		_ = c.Close()
	}
}
