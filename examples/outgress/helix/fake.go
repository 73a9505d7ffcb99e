package helix

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Fake is an in-process stand-in for the third-party API, served over
// HTTP/1.1 on 127.0.0.1. It answers like Helix in shape only: 200 with a
// small JSON body for chat and API calls, 204 for announcements and
// shoutouts, 400 for a shoutout of a channel to itself, 401 without the
// headers, 404 elsewhere. It counts the TCP connections it accepts.
type Fake struct {
	*httptest.Server
	conns    atomic.Int64
	requests atomic.Int64
	// ThrottleEvery, when n > 0, answers every n-th request with 429 (Ratelimit-Reset
	// one second ahead): a Helix limit reached, for the canary's tests and demo.
	ThrottleEvery atomic.Int64
}

// StartFake starts the server; Close stops it.
func StartFake() *Fake {
	f := &Fake{}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}
	f.Start()
	return f
}

// Conns is the number of TCP connections accepted so far.
func (f *Fake) Conns() int64 { return f.conns.Load() }

// Requests is the number of requests served so far.
func (f *Fake) Requests() int64 { return f.requests.Load() }

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	n := f.requests.Add(1)
	if every := f.ThrottleEvery.Load(); every > 0 && n%every == 0 {
		w.Header().Set("Ratelimit-Reset", strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10))
		http.Error(w, `{"error":"Too Many Requests","status":429}`, http.StatusTooManyRequests)
		return
	}
	if r.Header.Get("Client-Id") == "" || !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		http.Error(w, `{"error":"Unauthorized","status":401}`, http.StatusUnauthorized)
		return
	}
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/helix/chat/messages":
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"data":[{"message_id":"m","is_sent":true}]}`))
	case r.Method == http.MethodPost && r.URL.Path == "/helix/chat/announcements":
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && r.URL.Path == "/helix/chat/shoutouts":
		if q.Get("from_broadcaster_id") == q.Get("to_broadcaster_id") {
			http.Error(w, `{"error":"Bad Request","status":400,"message":"cannot shout out yourself"}`, http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(r.URL.Path, "/helix/"):
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"data":[]}`))
	default:
		http.NotFound(w, r)
	}
}
