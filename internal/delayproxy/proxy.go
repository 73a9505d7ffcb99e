// Package delayproxy is a loopback TCP proxy that delays the bytes in each
// direction by a fixed one-way time, the way a network link between an
// application and its Valkey server does. Benchmarks use it to make round
// trips visible: on plain loopback a round trip costs a few microseconds, so
// a design that needs two of them looks no slower than one that needs one.
//
// Every chunk of bytes read from one side at time t is written to the other
// side at t+oneWay, never earlier, whatever is queued before it: order is
// preserved and pipelined traffic stays pipelined, as on a real link.
//
// Go timers round sub-millisecond sleeps up to about a millisecond, which
// would double a 500µs delay. So each direction's writer runs on its own OS
// thread with the Linux timer slack set to 1ns, sleeps in nanosleep until
// shortly before a chunk is due and spins for the rest. Elsewhere it sleeps
// with time.Sleep while more than a few milliseconds remain and yields in a
// loop for the rest, which costs more CPU.
//
// A Proxy can also lose a reply, the fault a retry-safe call must survive:
// after LoseReply, the next command that holds a marker reaches the server,
// and the first bytes the server sends back on that connection are
// dropped and the connection cut, so the client sees its command fail
// after the server ran it.
package delayproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Buffers per direction and their size. Chunks are copied into a fixed set
// of buffers, so the proxy allocates nothing per chunk and does not disturb
// the allocation figures of a benchmark running in the same process. A
// reader with no free buffer waits, which pushes back on the sender.
const (
	buffersPerDirection = 32
	bufferSize          = 16 << 10
)

// dialTimeout bounds the connection to the target made for each accepted
// connection.
const dialTimeout = 5 * time.Second

// A Proxy forwards every connection accepted on its loopback address to a
// target, delaying both directions. Its methods are safe for simultaneous
// use by multiple goroutines.
type Proxy struct {
	ln     net.Listener
	target string
	oneWay time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	lose atomic.Pointer[[]byte] // the marker of the command whose reply to lose; nil: none
	lost atomic.Int64           // replies lost so far
}

// LoseReply arms the proxy to lose one reply: the next chunk a client
// sends that contains marker (for a Valkey client, a command name such as
// "EVALSHA") is forwarded to the server as usual, and the server's next
// bytes on that connection are dropped instead of delivered, and both
// sides of the connection closed. The client must send one command at a
// time on that connection for those bytes to be that command's reply. A
// second call before the first loss replaces the marker.
func (p *Proxy) LoseReply(marker []byte) {
	m := bytes.Clone(marker)
	p.lose.Store(&m)
}

// Lost returns the number of replies lost so far.
func (p *Proxy) Lost() int64 { return p.lost.Load() }

// A link is the state one proxied connection's two directions share.
type link struct {
	cut atomic.Bool // the server's next bytes are lost, and the link cut
}

// Start listens on 127.0.0.1:0 and forwards every connection to target,
// delaying bytes in each direction by oneWay. A zero oneWay forwards without
// delay. The caller should call Close when finished.
func Start(target string, oneWay time.Duration) (*Proxy, error) {
	if oneWay < 0 {
		return nil, fmt.Errorf("delayproxy: negative one-way delay %v", oneWay)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("delayproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, oneWay: oneWay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's listening address, host:port on 127.0.0.1.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops listening, closes every proxied connection, bytes still in
// flight included, and waits for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (out of file descriptors): back off, as
			// net/http does, instead of spinning or giving up.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track registers conns so that Close can close them; it reports false,
// having closed them, when the proxy is already closed.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

// serve proxies one accepted connection until both directions have ended.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	defer p.untrack(client, server)
	done := make(chan struct{}, 2)
	l := &link{}
	go p.forward(server, client, done, l, true)
	go p.forward(client, server, done, l, false)
	<-done
	<-done
}

// A chunk is bytes read from one side, due on the other side at due.
type chunk struct {
	buf []byte // a whole buffer, returned to the free list once written
	n   int
	due time.Time
}

// forward copies src to dst, each chunk delayed by oneWay, and signals done
// when src has ended and everything read from it has been written (or dst
// has failed). On src's end of stream it half-closes dst, so a server sees
// its client's FIN; on any error it closes both sides. toServer is the
// client's direction, where LoseReply's marker is looked for; the other
// direction loses the reply.
func (p *Proxy) forward(dst, src net.Conn, done chan<- struct{}, l *link, toServer bool) {
	free := make(chan []byte, buffersPerDirection)
	for range buffersPerDirection {
		free <- make([]byte, bufferSize)
	}
	queue := make(chan chunk, buffersPerDirection)
	go func() {
		var lose *link
		if !toServer {
			lose = l
		}
		p.release(dst, src, queue, free, lose)
		done <- struct{}{}
	}()
	defer close(queue)
	for {
		buf := <-free
		n, err := src.Read(buf)
		if n > 0 && toServer {
			if m := p.lose.Load(); m != nil && bytes.Contains(buf[:n], *m) && p.lose.CompareAndSwap(m, nil) {
				l.cut.Store(true)
			}
		}
		if n > 0 {
			// Stamped as soon as the read returns: the chunk left the
			// sender at about this time.
			queue <- chunk{buf: buf, n: n, due: time.Now().Add(p.oneWay)}
		} else {
			free <- buf
		}
		if err != nil {
			return
		}
	}
}

// release writes each queued chunk to dst at its due time. It runs on a
// thread of its own (see preciseThread) and returns when queue is closed.
// With lose set (the server's direction), a chunk that comes once lose is
// cut is dropped and the connection closed: a lost reply.
func (p *Proxy) release(dst, src net.Conn, queue <-chan chunk, free chan<- []byte, lose *link) {
	defer preciseThread()()
	var failed bool
	for c := range queue {
		if !failed && lose != nil && lose.cut.Load() {
			p.lost.Add(1)
			failed = true
			dst.Close()
			src.Close()
		}
		if !failed {
			waitUntil(c.due)
			if _, err := dst.Write(c.buf[:c.n]); err != nil {
				// The link is broken: closing src as well ends the reader,
				// which then closes queue.
				failed = true
				dst.Close()
				src.Close()
			}
		}
		free <- c.buf
	}
	if !failed {
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
}
