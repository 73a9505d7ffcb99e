package admittest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// faultProxy is a TCP proxy between one client and one server node. It
// relays one command at a time, so it knows which reply answers which
// command; it records every command the client sent; and it can lose the
// reply of a script command after the server has executed it, which is the
// ambiguity the library must not paper over with a retry.
type faultProxy struct {
	ln     net.Listener
	target string
	tls    *tls.Config // dials target with TLS when set
	mode   atomic.Int32
	// executed receives once per script command whose reply the proxy
	// withheld, after the server answered it: the script has run.
	executed chan struct{}
	release  chan struct{} // closed: withheld replies are dropped
	relOnce  sync.Once
	done     chan struct{} // closed by close
	doneOnce sync.Once

	mu     sync.Mutex
	conns  map[net.Conn]bool
	sent   [][]string
	closed bool
	wg     sync.WaitGroup
}

// Proxy modes.
const (
	relayReplies    = iota
	dropScriptReply // execute the script, then cut the connection without its reply
	holdScriptReply // execute the script, signal executed, keep the reply until release, then cut
	noscriptOnce    // answer the next EVALSHA with NOSCRIPT without sending it, then relay
)

// startFaultProxy listens on 127.0.0.1 and relays to target, over TLS when
// tlsConfig is not nil, so that it sees the commands in the clear.
func startFaultProxy(target string, tlsConfig *tls.Config) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{
		ln: ln, target: target, tls: tlsConfig, conns: map[net.Conn]bool{},
		executed: make(chan struct{}, 16), release: make(chan struct{}), done: make(chan struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

// track registers a connection, or closes it when the proxy is down.
func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *faultProxy) relay(client net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	var server net.Conn
	var err error
	if p.tls != nil {
		server, err = tls.DialWithDialer(dialer, "tcp", p.target, p.tls)
	} else {
		server, err = dialer.Dial("tcp", p.target)
	}
	if err != nil || !p.track(server) {
		return
	}
	defer server.Close()
	cr, sr := bufio.NewReader(client), bufio.NewReader(server)
	for {
		raw, args, err := readRESP(cr)
		if err != nil {
			return
		}
		p.mu.Lock()
		p.sent = append(p.sent, args)
		p.mu.Unlock()
		if len(args) > 0 && strings.EqualFold(args[0], "EVALSHA") && p.mode.CompareAndSwap(noscriptOnce, relayReplies) {
			if _, err := client.Write([]byte("-NOSCRIPT No matching script. Please use EVAL.\r\n")); err != nil {
				return
			}
			continue
		}
		if _, err := server.Write(raw); err != nil {
			return
		}
		reply, _, err := readRESP(sr)
		if err != nil {
			return
		}
		if isScriptCommand(args) {
			switch p.mode.Load() {
			case dropScriptReply:
				return
			case holdScriptReply:
				p.executed <- struct{}{}
				select {
				case <-p.release:
				case <-p.done:
				}
				return
			}
		}
		if _, err := client.Write(reply); err != nil {
			return
		}
	}
}

func isScriptCommand(args []string) bool {
	return len(args) > 0 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL"))
}

// dropHeld drops the replies the proxy holds, cutting their connections.
func (p *faultProxy) dropHeld() { p.relOnce.Do(func() { close(p.release) }) }

// commands returns every command the client sent so far.
func (p *faultProxy) commands() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]string(nil), p.sent...)
}

// since returns the commands sent after the first n, without PING:
// valkey-go pings a connection that has been idle for a second
// (Dialer.KeepAlive), which is no part of any decision.
func (p *faultProxy) since(n int) [][]string {
	var cmds [][]string
	for _, c := range p.commands()[n:] {
		if len(c) > 0 && !strings.EqualFold(c[0], "PING") {
			cmds = append(cmds, c)
		}
	}
	return cmds
}

// scripts returns the names of the script commands sent so far, in order.
func (p *faultProxy) scripts() []string {
	var names []string
	for _, c := range p.commands() {
		if isScriptCommand(c) {
			names = append(names, strings.ToUpper(c[0]))
		}
	}
	return names
}

// down closes the listener and every connection: from now on a dial to the
// proxy is refused and no byte reaches the server.
func (p *faultProxy) down() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	p.ln.Close()
	for c := range conns {
		c.Close()
	}
}

// close brings the proxy down and waits for its goroutines.
func (p *faultProxy) close() {
	p.doneOnce.Do(func() { close(p.done) })
	p.down()
	p.wg.Wait()
}

// readRESP reads one RESP2 or RESP3 value. It returns the value's raw
// bytes and, for an array (a command), the array's bulk strings.
func readRESP(r *bufio.Reader) (raw []byte, args []string, err error) {
	var buf bytes.Buffer
	args, err = readValue(r, &buf)
	return buf.Bytes(), args, err
}

// readValue copies one value into buf and returns the bulk strings it is
// made of (itself, for a bulk string; its top-level elements, for an
// aggregate).
func readValue(r *bufio.Reader, buf *bytes.Buffer) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	buf.WriteString(line)
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("malformed RESP line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', '-', ':', ',', '#', '(', '_':
		return nil, nil
	case '$', '!', '=':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		data := make([]byte, n+2)
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, err
		}
		buf.Write(data)
		return []string{string(data[:n])}, nil
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		if line[0] == '%' || line[0] == '|' {
			n *= 2
		}
		var elems []string
		for range n {
			sub, err := readValue(r, buf)
			if err != nil {
				return nil, err
			}
			if len(sub) == 1 {
				elems = append(elems, sub[0])
			}
		}
		if line[0] == '|' { // an attribute comes before the value it annotates
			return readValue(r, buf)
		}
		return elems, nil
	}
	return nil, fmt.Errorf("unknown RESP type in %q", line)
}
