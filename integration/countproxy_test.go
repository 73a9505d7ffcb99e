package integration

import (
	"bytes"
	"io"
	"net"
	"sync"
)

// countProxy relays every connection accepted on its loopback address to
// a server, and keeps what each client sent, split by where it went: to a
// live server connection, or after that connection had ended (the server
// closed it, or died). It mirrors a dead peer as the kernel does: once the
// server side ends, the client gets a FIN (CloseWrite), and what the
// client still writes is read, kept as sent to a dead server, and never
// forwarded; the connection is then reset. So it shows on the wire where a
// failed call's command went.
type countProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []*countConn
	closed bool
	wg     sync.WaitGroup
}

// countConn is one relayed connection: the client's bytes that reached
// the server (live) and those written after the server side had ended
// (dead).
type countConn struct {
	client, server net.Conn
	mu             sync.Mutex
	serverGone     bool
	live, dead     bytes.Buffer
}

func startCountProxy(target string) (*countProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *countProxy) addr() string { return p.ln.Addr().String() }

func (p *countProxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			// No server: refuse as a closed port would, with a reset.
			client.(*net.TCPConn).SetLinger(0)
			client.Close()
			continue
		}
		c := &countConn{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.conns = append(p.conns, c)
		p.wg.Add(2)
		p.mu.Unlock()
		go func() { defer p.wg.Done(); c.toClient() }()
		go func() { defer p.wg.Done(); c.toServer() }()
	}
}

// toClient relays the server's bytes; when the server side ends, the
// client gets a FIN, as from a server that closed or died.
func (c *countConn) toClient() {
	io.Copy(c.client, c.server)
	c.mu.Lock()
	c.serverGone = true
	c.mu.Unlock()
	c.client.(*net.TCPConn).CloseWrite()
}

// toServer relays the client's bytes while the server side lives, and
// keeps each chunk as live or dead; after a dead chunk it resets the
// client connection, as the dead server's kernel would.
func (c *countConn) toServer() {
	defer c.server.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			c.mu.Lock()
			gone := c.serverGone
			if gone {
				c.dead.Write(buf[:n])
			} else {
				c.live.Write(buf[:n])
			}
			c.mu.Unlock()
			if gone {
				c.client.(*net.TCPConn).SetLinger(0)
				c.client.Close()
				return
			}
			if _, werr := c.server.Write(buf[:n]); werr != nil {
				c.mu.Lock()
				c.serverGone = true
				c.mu.Unlock()
			}
		}
		if err != nil {
			c.client.Close()
			return
		}
	}
}

// scriptCommands counts the script commands (EVALSHA and EVAL, as
// valkey-go encodes them) the clients sent: those that reached a live
// server connection, and those written after their connection's server
// side had ended.
func (p *countProxy) scriptCommands() (live, dead int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.mu.Lock()
		live += countScripts(c.live.Bytes())
		dead += countScripts(c.dead.Bytes())
		c.mu.Unlock()
	}
	return live, dead
}

func countScripts(b []byte) int {
	return bytes.Count(b, []byte("$7\r\nEVALSHA\r\n")) + bytes.Count(b, []byte("$4\r\nEVAL\r\n"))
}

func (p *countProxy) close() {
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.client.Close()
		c.server.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
