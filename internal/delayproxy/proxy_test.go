package delayproxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// startEcho starts a loopback TCP echo server, stopped at the end of the test.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func startProxy(t *testing.T, target string, oneWay time.Duration) *Proxy {
	t.Helper()
	p, err := Start(target, oneWay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Generous: a hang fails the test instead of stalling it.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// roundTrips sends one byte and waits for its echo, n times, and returns
// the round-trip times.
func roundTrips(t *testing.T, c net.Conn, n int) []time.Duration {
	t.Helper()
	rtts := make([]time.Duration, n)
	var b [1]byte
	for i := range rtts {
		start := time.Now()
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatal(err)
		}
		rtts[i] = time.Since(start)
		if b[0] != byte(i) {
			t.Fatalf("round trip %d: echoed byte %d, want %d", i, b[0], byte(i))
		}
	}
	return rtts
}

// TestAddedRoundTrip checks that the proxy adds about 2×oneWay to a round
// trip. A chunk is never released early, so no round trip through the proxy
// may be shorter than 2×oneWay. The upper bound is loose and count-based: at
// least half of the round trips must fall under 2×oneWay plus a tolerance
// that a proxy sleeping on Go timers (which round 250µs up to about 1ms each
// way) would exceed. A loaded machine gets up to three attempts.
func TestAddedRoundTrip(t *testing.T) {
	const (
		oneWay    = 250 * time.Microsecond
		samples   = 200
		tolerance = 750 * time.Microsecond
		attempts  = 3
	)
	p := startProxy(t, startEcho(t), oneWay)
	c := dial(t, p.Addr())
	var within int
	for attempt := 1; attempt <= attempts; attempt++ {
		rtts := roundTrips(t, c, samples)
		within = 0
		for i, rtt := range rtts {
			if rtt < 2*oneWay {
				t.Fatalf("round trip %d took %v, less than 2×oneWay = %v: a chunk was released early", i, rtt, 2*oneWay)
			}
			if rtt <= 2*oneWay+tolerance {
				within++
			}
		}
		slices.Sort(rtts)
		t.Logf("attempt %d: round trips through a %v proxy: min %v, median %v, p90 %v; %d of %d within %v",
			attempt, oneWay, rtts[0], rtts[samples/2], rtts[samples*9/10], within, samples, 2*oneWay+tolerance)
		if within >= samples/2 {
			return
		}
	}
	t.Errorf("only %d of %d round trips within 2×oneWay+%v = %v", within, samples, tolerance, 2*oneWay+tolerance)
}

// TestBytesAndOrderPreserved streams random bytes in random-sized writes
// through the proxy to an echo server, reading concurrently, and compares
// the echoed stream with what was sent.
func TestBytesAndOrderPreserved(t *testing.T) {
	p := startProxy(t, startEcho(t), 200*time.Microsecond)
	c := dial(t, p.Addr())
	rng := rand.New(rand.NewPCG(1, 2))
	sent := make([]byte, 3<<20) // larger than all the proxy's buffers together
	for i := range sent {
		sent[i] = byte(rng.Uint32())
	}
	errc := make(chan error, 1)
	go func() {
		for rest := sent; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(40<<10))
			if _, err := c.Write(rest[:n]); err != nil {
				errc <- err
				return
			}
			rest = rest[n:]
		}
		errc <- c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, sent) {
		i := 0
		for i < len(got) && i < len(sent) && got[i] == sent[i] {
			i++
		}
		t.Fatalf("echoed %d bytes, sent %d; first difference at byte %d", len(got), len(sent), i)
	}
}

// TestPipelinedChunksAreNotSerialized sends messages 1ms apart without
// waiting for replies. Each is due oneWay after it was read, whatever is
// queued before it, so all replies are back after about the send time plus
// 2×oneWay. A proxy that delayed each chunk after the previous one was
// written would take about messages×oneWay; the bound sits far from both.
func TestPipelinedChunksAreNotSerialized(t *testing.T) {
	const (
		oneWay   = 20 * time.Millisecond
		messages = 20
	)
	p := startProxy(t, startEcho(t), oneWay)
	c := dial(t, p.Addr())
	for i := range messages {
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	// Measured from the last write, so that a loaded machine's slow sleeps
	// above do not count: unserialized, the rest arrives about two one-way
	// delays later; serialized, the chunks still queued take one delay
	// each (about 20 of them).
	lastWrite := time.Now()
	got := make([]byte, messages)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(lastWrite)
	for i, b := range got {
		if b != byte(i) {
			t.Fatalf("reply %d is %d: order not preserved", i, b)
		}
	}
	if bound := messages * oneWay / 2; elapsed > bound {
		t.Errorf("the last of %d pipelined messages came back %v after it was sent through a %v proxy, over %v: chunks are delayed one after another", messages, elapsed, oneWay, bound)
	}
}

// TestCloseEndsConnections checks that Close closes proxied connections and
// the listener, and that a second Close is harmless.
func TestCloseEndsConnections(t *testing.T) {
	p := startProxy(t, startEcho(t), 100*time.Microsecond)
	c := dial(t, p.Addr())
	roundTrips(t, c, 3)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("read after Close succeeded, want end of stream or reset")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("connection still open after Close")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("dial after Close succeeded")
	}
}

// TestStartRefusesNegativeDelay checks the one argument check Start makes.
func TestStartRefusesNegativeDelay(t *testing.T) {
	if p, err := Start("127.0.0.1:1", -time.Millisecond); err == nil {
		p.Close()
		t.Fatal("Start with a negative delay succeeded")
	}
}

// TestUnreachableTarget checks that a connection to a proxy whose target
// refuses connections is closed rather than left hanging.
func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there now
	p := startProxy(t, target, 0)
	c := dial(t, p.Addr())
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("read through a proxy to a closed port succeeded")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("connection through a proxy to a closed port was left open")
	}
}

// TestThreadsOutliveConnections checks that the writers hand their threads
// back when a connection ends instead of letting them exit: the test
// helpers start valkey-server with Pdeathsig, which kills the server when
// the thread that forked it exits, and that thread may be any of the
// runtime's. The Go runtime ends no thread of its own accord, so no thread
// alive before the connections may be gone after them.
func TestThreadsOutliveConnections(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("needs /proc/self/task")
	}
	p := startProxy(t, startEcho(t), 50*time.Microsecond)
	connect := func() {
		c := dial(t, p.Addr())
		roundTrips(t, c, 2)
		c.Close()
		waitIdle(t, p)
	}
	connect() // the runtime starts the threads it needs
	before := liveThreads(t)
	for range 20 {
		connect()
	}
	after := liveThreads(t)
	var gone []string
	for tid := range before {
		if !after[tid] {
			gone = append(gone, tid)
		}
	}
	if len(gone) > 0 {
		t.Errorf("threads %v ended during 20 proxied connections: a writer let its thread die", gone)
	}
}

// liveThreads returns the ids of the process's threads.
func liveThreads(t *testing.T) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, e := range entries {
		m[e.Name()] = true
	}
	return m
}

// waitIdle waits (at most 10s) until p has no connection left.
func waitIdle(t *testing.T, p *Proxy) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			return
		}
	}
	t.Fatal("proxied connections still open 10s after the client closed")
}

// TestLoseReply: after LoseReply, the command that holds the marker reaches
// the server (the echo server answers it), its reply is dropped and the
// connection cut; commands before it and on a new connection after it are
// answered as usual.
func TestLoseReply(t *testing.T) {
	p := startProxy(t, startEcho(t), 0)
	c := dial(t, p.Addr())
	p.LoseReply([]byte("MARK"))
	if _, err := c.Write([]byte("plain")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := io.ReadFull(c, buf[:5]); err != nil || string(buf[:n]) != "plain" {
		t.Fatalf("a command without the marker: %q, %v; want its echo", buf[:n], err)
	}
	if _, err := c.Write([]byte("x MARK y")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("the marked command's reply came through: %q", buf[:n])
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the connection stayed open after its reply was lost")
	}
	if got := p.Lost(); got != 1 {
		t.Errorf("Lost() = %d, want 1", got)
	}
	c2 := dial(t, p.Addr())
	if _, err := c2.Write([]byte("MARK again")); err != nil {
		t.Fatal(err)
	}
	if n, err := io.ReadFull(c2, buf[:10]); err != nil || string(buf[:n]) != "MARK again" {
		t.Errorf("after the loss: %q, %v; want the echo (one reply is lost per LoseReply)", buf[:n], err)
	}
}
