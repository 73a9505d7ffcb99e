package testenv

import (
	"io"
	"net"
	"runtime"
	"sync"
	"time"
)

// A DelayProxy forwards each connection accepted on a loopback port to a
// target, writing every chunk read from one side to the other oneWay after
// it was read, in order: a network link between a worker and its Valkey,
// so that round trips show in a benchmark. It sleeps until a millisecond
// before a chunk is due and yields in a loop for the rest (a timer may
// round a shorter sleep up to a millisecond), and copies through a fixed
// set of buffers, so it adds no allocation per chunk to a benchmark in the
// same process.
type DelayProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// StartDelayProxy starts a proxy to target with the one-way delay oneWay.
func StartDelayProxy(target string, oneWay time.Duration) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &DelayProxy{ln: ln}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go delayCopy(out, in, oneWay)
			go delayCopy(in, out, oneWay)
		}
	}()
	return p, nil
}

// delayCopy copies from src to dst, each chunk oneWay after it was read.
func delayCopy(dst io.WriteCloser, src io.ReadCloser, oneWay time.Duration) {
	type chunk struct {
		due  time.Time
		data []byte
	}
	const buffers = 32
	queue, free := make(chan chunk, buffers), make(chan []byte, buffers)
	for range buffers {
		free <- make([]byte, 16<<10)
	}
	go func() {
		defer close(queue)
		for buf := range free {
			n, err := src.Read(buf)
			if n > 0 {
				queue <- chunk{time.Now().Add(oneWay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		if d := time.Until(c.due); d > time.Millisecond {
			time.Sleep(d - time.Millisecond)
		}
		for time.Now().Before(c.due) {
			runtime.Gosched()
		}
		_, err := dst.Write(c.data)
		free <- c.data[:cap(c.data)]
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

// Addr is the proxy's address.
func (p *DelayProxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting and closes every proxied connection.
func (p *DelayProxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}
