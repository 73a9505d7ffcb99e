// Package helix is the outgress worker's client of the third-party API
// (Twitch Helix): it builds the request for an admitted command, sends it
// over a transport of its own that keeps an idle connection per worker,
// drains every response body within a bound so connections are reused,
// and maps the answer onto the bus's contract (429 is an expected nack
// until Ratelimit-Reset, another 4xx a drop, 5xx an error). Fake is an
// in-process stand-in for the demo and the tests.
package helix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/internal/label"
)

// Config configures a Helix client. Zero fields take the defaults named.
type Config struct {
	// BaseURL is the API root, for example "https://api.example" (the
	// demo's is the fake server's URL). Required.
	BaseURL string
	// ClientID and Token authenticate as the application and the bot.
	ClientID, Token string
	// BotID is the bot's user id: the chat sender and the moderator acting.
	BotID string
	// Concurrency is the number of workers sending at once: the transport
	// keeps that many idle connections. Default 16.
	Concurrency int
	// MaxBody bounds how much of a response body is read. Default 64 KiB.
	MaxBody int64
	// TraceEvery samples connection reuse on one request in TraceEvery.
	// Default 16; 1 traces every request.
	TraceEvery uint64
	// Now is the clock, used to read a 429's Ratelimit-Reset. Default time.Now.
	Now func() time.Time
	// LegacyTransport is rollout step 2 switched off (worker.StepTransport):
	// http.DefaultTransport's own settings (two idle connections per host)
	// instead of NewTransport's one per worker. Send the requests with
	// SendUndrained to switch off the step's other half.
	LegacyTransport bool
}

// Helix sends requests to the third-party API over its own transport and
// reads no more of any response than it needs. It is safe for concurrent use.
type Helix struct {
	base     string
	clientID string
	auth     string
	botID    string
	maxBody  int64
	every    uint64
	now      func() time.Time
	tr       *http.Transport
	hc       *http.Client
	rec      Recorder
	n        atomic.Uint64
	trace    *httptrace.ClientTrace
}

// New returns a client recording into rec (which may be shared).
func New(cfg Config, rec Recorder) (*Helix, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("outgress: Helix base URL %q is not an http(s) URL", cfg.BaseURL)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 64 << 10
	}
	if cfg.TraceEvery == 0 {
		cfg.TraceEvery = 16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	tr := NewTransport(cfg.Concurrency)
	if cfg.LegacyTransport {
		tr = NewTransport(2) // the DefaultTransport's idle connections per host
	}
	h := &Helix{
		base: cfg.BaseURL, clientID: cfg.ClientID, auth: "Bearer " + cfg.Token, botID: cfg.BotID,
		maxBody: cfg.MaxBody, every: cfg.TraceEvery, now: cfg.Now,
		tr: tr, hc: &http.Client{Transport: tr}, rec: rec,
	}
	// One trace shared by all sampled requests: GotConn only counts.
	h.trace = &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		rec.SampledConn(info.Reused)
	}}
	return h, nil
}

// NewRequest builds the request for an admitted command. ch is nil for the
// API kind, which acts in no channel.
func (h *Helix) NewRequest(ctx context.Context, cmd *command.Command, ch *channels.Channel) (*http.Request, error) {
	var method, path string
	var body any
	switch cmd.Kind {
	case command.KindChat:
		method, path = http.MethodPost, "/helix/chat/messages"
		body = struct {
			Broadcaster string `json:"broadcaster_id"`
			Sender      string `json:"sender_id"`
			Message     string `json:"message"`
		}{ch.ID, h.botID, cmd.Text}
	case command.KindAnnounce:
		method, path = http.MethodPost, "/helix/chat/announcements?broadcaster_id="+ch.ID+"&moderator_id="+h.botID
		body = struct {
			Message string `json:"message"`
			Color   string `json:"color,omitempty"`
		}{cmd.Text, cmd.Color}
	case command.KindShoutout:
		method, path = http.MethodPost, "/helix/chat/shoutouts?from_broadcaster_id="+ch.ID+"&to_broadcaster_id="+cmd.To+"&moderator_id="+h.botID
	case command.KindAPI:
		method, path = cmd.Method, cmd.Path
	default:
		return nil, fmt.Errorf("outgress: no Helix request for kind %v", cmd.Kind)
	}
	var buf *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		buf = bytes.NewReader(b)
	}
	var req *http.Request
	var err error
	if buf != nil {
		req, err = http.NewRequestWithContext(ctx, method, h.base+path, buf)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, h.base+path, http.NoBody)
	}
	if err != nil {
		return nil, err
	}
	req.Header.Set("Client-Id", h.clientID)
	req.Header.Set("Authorization", h.auth)
	if buf != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// Send performs req and maps the response onto the bus contract, with
// deadline the message's end of life:
//
//	2xx                 nil
//	429                 an ExpectedNack until Ratelimit-Reset, or a Dropped
//	                    when that is past the deadline
//	other 4xx           Dropped (DropRejected): a retry gets the same answer
//	5xx, 3xx, no reply  an error: a dependency failure, reported and retried
//
// The body is drained and closed on every path that got a response.
func (h *Helix) Send(req *http.Request, deadline time.Time) error {
	return h.send(req, deadline, true)
}

// SendUndrained is Send as it was before rollout step 2: the body is closed
// without being read, so the transport discards the connection of any
// response with a body left (every one the fake, and Helix, sends).
func (h *Helix) SendUndrained(req *http.Request, deadline time.Time) error {
	return h.send(req, deadline, false)
}

func (h *Helix) send(req *http.Request, deadline time.Time, drain bool) error {
	sampled := h.n.Add(1)%h.every == 0
	if sampled {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), h.trace))
	}
	start := h.now()
	resp, err := h.hc.Do(req)
	if err != nil {
		h.rec.Response(StatusError, h.now().Sub(start))
		return fmt.Errorf("outgress: Helix %s: %w", req.Method, err)
	}
	if sampled {
		h.rec.SampledProto(ProtoOf(resp.ProtoMajor))
	}
	// Deferred so that no return path can skip it: the connection goes back
	// to the pool only once the body is read to EOF.
	class := ClassOf(resp.StatusCode)
	defer func() {
		if drain {
			DrainClose(resp.Body, h.maxBody)
		} else {
			resp.Body.Close()
		}
		h.rec.Response(class, h.now().Sub(start))
	}()
	now := h.now()
	switch class {
	case Status2xx:
		return nil
	case Status429:
		return bus.RetryOrDrop(bus.NackThrottled, resetDelay(resp.Header.Get("Ratelimit-Reset"), now), deadline.Sub(now))
	case Status4xx, StatusAuth:
		return &bus.Dropped{Reason: bus.DropRejected, Err: fmt.Errorf("Helix answered %d", resp.StatusCode)}
	default:
		return fmt.Errorf("outgress: Helix answered %d", resp.StatusCode)
	}
}

// resetDelay reads Ratelimit-Reset (Unix seconds when the bucket refills);
// a missing or unreadable header means one second.
func resetDelay(header string, now time.Time) time.Duration {
	sec, err := strconv.ParseInt(header, 10, 64)
	if err != nil {
		return time.Second
	}
	return max(time.Unix(sec, 0).Sub(now), 0)
}

// Close closes the transport's idle connections.
func (h *Helix) Close() { h.tr.CloseIdleConnections() }

// Recorder receives the client's measurements; metrics.Metrics is one. Its
// methods must be safe for concurrent use.
type Recorder interface {
	// Response records one request's outcome and how long it took,
	// through draining the body.
	Response(c StatusClass, took time.Duration)
	// SampledConn records whether a sampled request reused a connection.
	SampledConn(reused bool)
	// SampledProto records the HTTP protocol a sampled request's response
	// came over.
	SampledProto(p Proto)
}

// Proto is the fixed label of an HTTP protocol version.
type Proto uint8

// The protocols.
const (
	ProtoHTTP1 Proto = iota // HTTP/1.x
	ProtoHTTP2
	ProtoOther
	NumProtos
)

var protoNames = [NumProtos]string{"HTTP/1", "HTTP/2", "other"}

// String is the protocol's metric label.
func (p Proto) String() string { return label.Of(protoNames[:], p) }

// ProtoOf is the protocol of a response with that major version.
func ProtoOf(major int) Proto {
	switch major {
	case 1:
		return ProtoHTTP1
	case 2:
		return ProtoHTTP2
	}
	return ProtoOther
}

// StatusClass is the fixed label for an HTTP outcome.
type StatusClass uint8

// The status classes.
const (
	Status2xx StatusClass = iota
	Status3xx
	Status4xx
	Status429
	Status5xx
	StatusError // no response: transport error or cancellation
	StatusAuth  // 401 or 403: an authorization failure
	NumStatus
)

var statusNames = [NumStatus]string{"2xx", "3xx", "4xx", "429", "5xx", "error", "auth"}

// String is the class's metric label.
func (s StatusClass) String() string { return label.Of(statusNames[:], s) }

// ClassOf is the class of an HTTP status code.
func ClassOf(code int) StatusClass {
	switch {
	case code == http.StatusTooManyRequests:
		return Status429
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return StatusAuth
	case code >= 200 && code < 300:
		return Status2xx
	case code >= 300 && code < 400:
		return Status3xx
	case code >= 400 && code < 500:
		return Status4xx
	default:
		return Status5xx
	}
}
