package helix

import (
	"io"
	"net/http"
	"time"
)

// DrainClose finishes with a response body so that its connection can be
// reused: it reads what is left, at most maxBody+1 bytes, then closes it.
// Defer it after every successful Do, whatever the status (2xx, 4xx, 429,
// 5xx): an HTTP/1.1 connection returns to the pool only once its body was
// read to EOF.
//
// complete reports that EOF came within maxBody bytes, so the connection may
// be reused. Otherwise (an oversized or endless body, or a read error) the
// body is closed after at most maxBody+1 bytes and the transport discards the
// connection: draining without a bound could hold a worker forever.
func DrainClose(body io.ReadCloser, maxBody int64) (n int64, complete bool) {
	n, err := io.CopyN(io.Discard, body, maxBody+1)
	body.Close()
	return n, err == io.EOF
}

// NewTransport returns the Helix client's own transport: a clone of
// http.DefaultTransport, so proxy, dialer, TLS and HTTP/2 defaults stay, with
// room to keep one idle connection per concurrent worker. The default keeps
// two idle connections per host, so beyond two workers every burst would
// close connections and dial new ones. MaxConnsPerHost stays unlimited: a low
// cap only moves the queueing into the transport. Close its idle connections
// on shutdown (Helix.Close does).
func NewTransport(concurrency int) *http.Transport {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	} else { // DefaultTransport was replaced: rebuild its documented defaults
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			ForceAttemptHTTP2:     true,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	idle := max(concurrency, 2)
	t.MaxIdleConnsPerHost = idle
	if t.MaxIdleConns != 0 { // 0 is unlimited
		t.MaxIdleConns = max(t.MaxIdleConns, idle)
	}
	t.MaxConnsPerHost = 0
	return t
}
