package helix

import (
	"context"
	"errors"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// connServer is an HTTP/1.1 test server that counts the connections it
// accepts and closes.
type connServer struct {
	*httptest.Server
	opened, closed atomic.Int64
}

func newConnServer(t *testing.T, h http.HandlerFunc) *connServer {
	t.Helper()
	s := &connServer{Server: httptest.NewUnstartedServer(h)}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.Start() // plain httptest: HTTP/1.1 only
	t.Cleanup(s.Close)
	return s
}

// statusHandler answers with the status and body size in the query:
// /?status=429&size=20.
func statusHandler(w http.ResponseWriter, r *http.Request) {
	status, _ := strconv.Atoi(r.URL.Query().Get("status"))
	size, _ := strconv.Atoi(r.URL.Query().Get("size"))
	w.Header().Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(status)
	w.Write([]byte(strings.Repeat("x", size)))
}

// get sends one request and finishes it with finish; it reports whether
// the connection was reused.
func get(t *testing.T, c *http.Client, url string, finish func(*http.Response)) bool {
	t.Helper()
	var reused bool
	ctx := httptrace.WithClientTrace(testenv.Ctx(t), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	finish(resp)
	return reused
}

var testStatuses = []int{200, 204, 400, 404, 429, 500, 503}

// TestDrainCloseReusesSequential: with DrainClose after every response,
// success and error alike, sequential requests share one connection.
// Without the drain (Close alone), every request opens its own: the
// helper is what makes reuse happen.
func TestDrainCloseReusesSequential(t *testing.T) {
	for _, c := range []struct {
		name   string
		finish func(*http.Response)
		conns  int64
	}{
		{"drained", func(r *http.Response) { DrainClose(r.Body, 1024) }, 1},
		// Only the three 204s, which have no body, leave their connection reusable.
		{"closed-unread", func(r *http.Response) { r.Body.Close() }, 18},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newConnServer(t, statusHandler)
			client := &http.Client{Transport: NewTransport(4)}
			defer client.CloseIdleConnections()
			var reused int64
			for i := range 21 {
				status := testStatuses[i%len(testStatuses)]
				size := 100
				if status == 204 {
					size = 0
				}
				if get(t, client, srv.URL+"/?status="+strconv.Itoa(status)+"&size="+strconv.Itoa(size), c.finish) {
					reused++
				}
			}
			if n := srv.opened.Load(); n != c.conns || reused != 21-c.conns {
				t.Errorf("%d connections, %d requests reused one; want %d and %d", n, reused, c.conns, 21-c.conns)
			}
		})
	}
}

// TestDrainCloseReusesConcurrent sends five rounds of eight concurrent
// requests; the handler holds each round until all eight arrived, so every
// round needs eight connections at once. The dedicated transport keeps all
// eight idle between rounds; one with the default two idle connections per
// host dials six new ones every round.
func TestDrainCloseReusesConcurrent(t *testing.T) {
	const workers, rounds = 8, 5
	for _, c := range []struct {
		name  string
		tr    func() *http.Transport
		conns int64
	}{
		{"dedicated", func() *http.Transport { return NewTransport(workers) }, workers},
		{"default-idle-limit", func() *http.Transport {
			tr := NewTransport(workers)
			tr.MaxIdleConnsPerHost = 0 // http.DefaultMaxIdleConnsPerHost: 2
			return tr
		}, workers + (rounds-1)*(workers-2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var timeouts atomic.Int64
			arrived := 0
			all := make(chan struct{})
			srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				wait := all // this round's gate, opened by its last arrival
				if arrived++; arrived%workers == 0 {
					close(all)
					all = make(chan struct{})
				}
				mu.Unlock()
				select {
				case <-wait:
				case <-time.After(10 * time.Second):
					timeouts.Add(1)
				}
				statusHandler(w, r)
			})
			client := &http.Client{Transport: c.tr()}
			defer client.CloseIdleConnections()
			for round := range rounds {
				var wg sync.WaitGroup
				for i := range workers {
					wg.Go(func() {
						status := testStatuses[(round*workers+i)%len(testStatuses)]
						get(t, client, srv.URL+"/?size=64&status="+strconv.Itoa(status), func(r *http.Response) { DrainClose(r.Body, 1024) })
					})
				}
				wg.Wait()
			}
			if n := srv.opened.Load(); n != c.conns || timeouts.Load() != 0 {
				t.Errorf("%d connections for %d rounds of %d, want %d (%d requests timed out waiting for their round)", n, rounds, workers, c.conns, timeouts.Load())
			}
		})
	}
}

// TestDrainCloseOversized: a body over maxBody, or one that never ends, is
// read only to maxBody+1 bytes and its connection is not reused.
func TestDrainCloseOversized(t *testing.T) {
	const maxBody = 1024
	var endlessDone atomic.Int64
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			statusHandler(w, r)
		case "/endless":
			defer endlessDone.Add(1)
			chunk := []byte(strings.Repeat("y", 4096))
			for range 100000 { // about 400 MB: far more than any drain reads
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		default:
			statusHandler(w, r)
		}
	})
	client := &http.Client{Transport: NewTransport(4)}
	defer client.CloseIdleConnections()
	for i, c := range []struct {
		path      string
		wantN     int64
		wantWhole bool
		conns     int64
	}{
		{"/small?status=200&size=1024", 0, true, 1}, // exactly maxBody: reusable
		{"/small?status=200&size=10", 0, true, 1},
		{"/big?status=500&size=65536", maxBody + 1, false, 1},
		{"/small?status=200&size=10", 0, true, 2}, // the big one's connection was discarded
		{"/endless", maxBody + 1, false, 2},
		{"/small?status=200&size=10", 0, true, 3}, // and so was the endless one's
	} {
		var n int64
		var whole bool
		get(t, client, srv.URL+c.path, func(r *http.Response) {
			// Read the first part as a caller would, then finish.
			if strings.HasPrefix(c.path, "/small") {
				buf := make([]byte, 10)
				r.Body.Read(buf)
			}
			n, whole = DrainClose(r.Body, maxBody)
		})
		if whole != c.wantWhole || (c.wantN != 0 && n != c.wantN) || srv.opened.Load() != c.conns {
			t.Errorf("step %d (%s): read %d, complete %v, %d connections; want %d, %v, %d",
				i, c.path, n, whole, srv.opened.Load(), c.wantN, c.wantWhole, c.conns)
		}
	}
	if !testenv.WaitFor(func() bool { return endlessDone.Load() == 1 }) {
		t.Error("the endless handler still writes: its connection was not closed")
	}
}

// TestHelixSendCancellation cancels a request the server is holding: Send
// returns the context's error, and the server sees the request cancelled.
func TestHelixSendCancellation(t *testing.T) {
	arrived := make(chan struct{})
	var cancelled atomic.Int64
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-r.Context().Done():
			cancelled.Add(1)
		case <-time.After(10 * time.Second):
		}
	})
	m := &recorder{}
	h, err := New(Config{BaseURL: srv.URL, ClientID: "c", Token: "t"}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithCancel(testenv.Ctx(t))
	req, err := h.NewRequest(ctx, &command.Command{Kind: command.KindAPI, Method: "GET", Path: "/helix/users"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-arrived; cancel() }()
	err = h.Send(req, time.Now().Add(time.Minute))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Send: %v, want context.Canceled", err)
	}
	if !testenv.WaitFor(func() bool { return cancelled.Load() == 1 }) {
		t.Error("the server never saw the request cancelled")
	}
	if n := m.Status(StatusError); n != 1 {
		t.Errorf("%d responses counted as no response, want 1", n)
	}
}

// TestHelixSendOutcomes maps each status onto the bus contract, on one
// reused connection (every body drained), and closes it on Close.
func TestHelixSendOutcomes(t *testing.T) {
	reset := time.Now().Add(3 * time.Second).Unix()
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("reset") != "" {
			w.Header().Set("Ratelimit-Reset", r.URL.Query().Get("reset"))
		}
		statusHandler(w, r)
	})
	m := &recorder{}
	h, err := New(Config{BaseURL: srv.URL, ClientID: "c", Token: "t", TraceEvery: 1}, m)
	if err != nil {
		t.Fatal(err)
	}
	long, short := time.Now().Add(time.Minute), time.Now().Add(time.Second)
	for i, c := range []struct {
		query    string
		deadline time.Time
		check    func(error) bool
	}{
		{"status=200&size=50", long, func(err error) bool { return err == nil }},
		{"status=204", long, func(err error) bool { return err == nil }},
		{"status=429&size=50&reset=" + strconv.FormatInt(reset, 10), long, func(err error) bool {
			var n *bus.ExpectedNack
			return errors.As(err, &n) && n.Reason == bus.NackThrottled && n.RetryAfter > time.Second && n.RetryAfter <= 3*time.Second
		}},
		{"status=429&size=50&reset=" + strconv.FormatInt(reset, 10), short, func(err error) bool {
			var d *bus.Dropped
			return errors.As(err, &d) && d.Reason == bus.DropNoTimeThrottled
		}},
		{"status=400&size=50", long, func(err error) bool {
			var d *bus.Dropped
			return errors.As(err, &d) && d.Reason == bus.DropRejected
		}},
		{"status=503&size=50", long, func(err error) bool {
			var n *bus.ExpectedNack
			var d *bus.Dropped
			return err != nil && !errors.As(err, &n) && !errors.As(err, &d)
		}},
	} {
		req, err := h.NewRequest(testenv.Ctx(t), &command.Command{Kind: command.KindAPI, Method: "GET", Path: "/helix/x?" + c.query}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Send(req, c.deadline); !c.check(err) {
			t.Errorf("step %d (%s): %v", i, c.query, err)
		}
	}
	reused, fresh := m.Conns()
	if srv.opened.Load() != 1 || reused != 5 || fresh != 1 {
		t.Errorf("%d connections; traced %d reused, %d new; want 1, 5, 1", srv.opened.Load(), reused, fresh)
	}
	for class, want := range map[StatusClass]int64{Status2xx: 2, Status429: 2, Status4xx: 1, Status5xx: 1} {
		if got := m.Status(class); got != want {
			t.Errorf("status %v: %d, want %d", class, got, want)
		}
	}
	h.Close()
	if !testenv.WaitFor(func() bool { return srv.closed.Load() == 1 }) {
		t.Errorf("after Close, %d connections closed, want 1", srv.closed.Load())
	}
}

// TestNewTransport: a clone of the default, sized for the workers, with
// no per-host connection cap; the default itself is untouched.
func TestNewTransport(t *testing.T) {
	def := http.DefaultTransport.(*http.Transport)
	before := def.MaxIdleConnsPerHost
	tr := NewTransport(32)
	if tr == def || tr.Proxy == nil || !tr.ForceAttemptHTTP2 || tr.DialContext == nil || tr.TLSHandshakeTimeout != def.TLSHandshakeTimeout {
		t.Error("not a clone of http.DefaultTransport")
	}
	if tr.MaxIdleConnsPerHost != 32 || tr.MaxIdleConns < 32 || tr.MaxConnsPerHost != 0 {
		t.Errorf("idle per host %d, idle %d, conns per host %d; want 32, >= 32, 0", tr.MaxIdleConnsPerHost, tr.MaxIdleConns, tr.MaxConnsPerHost)
	}
	if def.MaxIdleConnsPerHost != before {
		t.Error("http.DefaultTransport was modified")
	}
}

// recorder is a Recorder that counts.
type recorder struct {
	status         [NumStatus]atomic.Int64
	reused, dialed atomic.Int64
	protos         [NumProtos]atomic.Int64
}

func (r *recorder) SampledProto(p Proto) { r.protos[p%NumProtos].Add(1) }

func (r *recorder) Response(c StatusClass, _ time.Duration) { r.status[c%NumStatus].Add(1) }

func (r *recorder) SampledConn(reused bool) {
	if reused {
		r.reused.Add(1)
	} else {
		r.dialed.Add(1)
	}
}

func (r *recorder) Status(c StatusClass) int64 { return r.status[c%NumStatus].Load() }

func (r *recorder) Conns() (reused, dialed int64) { return r.reused.Load(), r.dialed.Load() }
