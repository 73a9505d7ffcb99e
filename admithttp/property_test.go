package admithttp_test

// The middleware against internal/model: random requests over both lanes,
// with hostile user ids and classify outputs, the server's clock moved,
// store outages (nothing sent; the reply lost after the script ran) and
// clients that go away (before sending; with the command in flight). For
// every request the answer is predicted from the model alone: status,
// every field, Retry-After, the violated policy, whether the handler ran,
// the Outcome event, and the state the server is left in.
//
// It runs on miniredis here, and on a real server whose clock the test
// steps in integration_test.go (TestIntegrationProperty).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/model"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

var (
	propStd    = admit.MustSpec(admit.Every(3*time.Second), 4)
	propShared = admit.MustSpec(admit.Every(time.Second), 6)
)

// propUsers are the X-User values: a few well-behaved ones, and what a
// hostile client sends.
var propUsers = []string{"alice", "bob", "", "}", "}x", "{", "{}", "a{b}c", "\xff\xfe", "caf\xc3\xa9",
	strings.Repeat("u", admit.MaxKeyLen), strings.Repeat("}", 1<<20)}

// propRule is the classify of the property test: the lanes, with the
// user's key part built by admit.KeyPart; a per-tenant pair under the
// user's own hash tag; and a hostile classify that puts the raw header in
// the key (an empty one is an invalid Rule, a huge one a key admit
// refuses), one that forgets the Spec, and no limit.
func propRule(r *http.Request) admithttp.Rule {
	cost, _ := strconv.Atoi(r.Header.Get("X-Cost"))
	user := r.Header.Get("X-User")
	shared := admithttp.Bucket{Policy: "shared", Key: "p:{api}:shared", Spec: propShared, Cost: cost}
	switch r.Header.Get("X-Plan") {
	case "premium":
		return admithttp.Rule{First: shared}
	case "standard":
		return admithttp.Rule{First: admithttp.Bucket{Policy: "standard", Key: "p:{api}:std:" + admit.KeyPart(user), Spec: propStd, Cost: cost}, Second: &shared}
	case "tenant":
		tag := admit.KeyPart(user)
		return admithttp.Rule{First: admithttp.Bucket{Policy: "own", Key: "p:{" + tag + "}:own", Spec: propStd, Cost: cost},
			Second: &admithttp.Bucket{Policy: "pool", Key: "p:{" + tag + "}:pool", Spec: propShared}}
	case "raw":
		return admithttp.Rule{First: admithttp.Bucket{Policy: "raw", Key: user, Spec: propStd, Cost: cost}}
	case "no-spec":
		return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "p:nospec:" + admit.KeyPart(user)}}
	}
	return admithttp.Rule{}
}

var propPlans = []string{"premium", "standard", "standard", "tenant", "raw", "no-spec", ""}

// A fault is what the test does to one request's decision.
type fault uint8

const (
	noFault      fault = iota
	storeDown          // the command is not sent: not executed
	replyLost          // the script runs, its reply is lost: outcome unknown
	goneBefore         // the client is gone before the decision: nothing sent
	goneInFlight       // the client goes while the command is in flight: it ran
)

// faultClient passes commands to its client, or does the current fault.
// A NOSCRIPT reply always passes (the EVAL that follows is the script).
type faultClient struct {
	valkey.Client
	mu     sync.Mutex
	f      fault
	cancel context.CancelFunc
}

func (c *faultClient) set(f fault, cancel context.CancelFunc) {
	c.mu.Lock()
	c.f, c.cancel = f, cancel
	c.mu.Unlock()
}

func (c *faultClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	c.mu.Lock()
	f, cancel := c.f, c.cancel
	c.mu.Unlock()
	switch f {
	case storeDown:
		return valkey.NewErrorResult(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")})
	case replyLost, goneInFlight:
		res := c.Client.Do(context.Background(), cmd)
		if ve, ok := valkey.IsValkeyErr(res.Error()); ok && ve.IsNoScript() {
			return res
		}
		if f == replyLost {
			return valkey.NewErrorResult(io.ErrUnexpectedEOF)
		}
		cancel()
		return valkey.NewErrorResult(context.Canceled)
	}
	return c.Client.Do(ctx, cmd)
}

// A propBackend is the server the property runs on.
type propBackend interface {
	client() valkey.Client
	// clock returns the server's clock, in µs since the epoch.
	clock() int64
	// advance moves the server's clock forward by d.
	advance(d time.Duration)
	expiry() model.Expiry
	// exact reports whether the clock stands still between advances.
	exact() bool
}

type miniProp struct {
	srv *miniredis.Miniredis
	c   valkey.Client
	now time.Time
}

func newMiniProp(t *testing.T) *miniProp {
	srv := miniredis.RunT(t)
	srv.ClockTTL(true)
	b := &miniProp{srv: srv, now: time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)}
	srv.SetTime(b.now)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b.c = c
	return b
}

func (b *miniProp) client() valkey.Client { return b.c }
func (b *miniProp) clock() int64          { return b.now.UnixMicro() }
func (b *miniProp) advance(d time.Duration) {
	b.now = b.now.Add(d)
	b.srv.SetTime(b.now)
	b.srv.Keys() // count the TTLs down now (see the root property test)
}
func (b *miniProp) expiry() model.Expiry { return model.Countdown }
func (b *miniProp) exact() bool          { return true }

// propSteps is the number of requests of one run; PROP_STEPS overrides it.
func propSteps(def int) int {
	if n, err := strconv.Atoi(os.Getenv("PROP_STEPS")); err == nil && n > 0 {
		return n
	}
	if testing.Short() {
		return def / 10
	}
	return def
}

// TestPropertyAgainstModel runs the property on miniredis.
func TestPropertyAgainstModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("PROP_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("PROP_SEED=%d", seed)
	runProperty(t, newMiniProp(t), propSteps(1500), 10*time.Second, seed)
}

// propState is one run: the middleware, the model, and what the last
// request did.
type propState struct {
	t       *testing.T
	b       propBackend
	fc      *faultClient
	h       http.Handler
	m       *model.Server
	events  []admithttp.Event
	outages int
	handled int
}

func runProperty(t *testing.T, b propBackend, steps int, budget time.Duration, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &propState{t: t, b: b, fc: &faultClient{Client: b.client()}, m: model.NewServer(b.clock(), b.expiry())}
	outage := func(w http.ResponseWriter, _ *http.Request, _ http.Handler, _ error) {
		s.outages++
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	h, err := admithttp.New(admit.New(s.fc), propRule, admithttp.Outage{NotExecuted: outage, OutcomeUnknown: outage},
		admithttp.WithHeaders(), admithttp.WithOutcome(func(e admithttp.Event) { s.events = append(s.events, e) }))
	if err != nil {
		t.Fatal(err)
	}
	s.h = h(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { s.handled++; io.WriteString(w, "ok") }))
	deadline := time.Now().Add(budget)
	counts := map[string]int{}
	for i := 0; i < steps && time.Now().Before(deadline); i++ {
		if rng.IntN(4) == 0 {
			b.advance(time.Duration(rng.Int64N(int64(2 * time.Second))))
		}
		f := noFault
		if rng.IntN(5) == 0 {
			f = fault(1 + rng.IntN(4))
		}
		plan := propPlans[rng.IntN(len(propPlans))]
		user := propUsers[rng.IntN(len(propUsers))]
		cost := rng.IntN(3) // 0 means 1
		outcome := s.step(i, plan, user, cost, f)
		counts[outcome]++
		if t.Failed() {
			t.Fatalf("step %d (plan %q, user %.12q, cost %d, fault %d) failed; replay with PROP_SEED=%d", i, plan, user, cost, f, seed)
		}
	}
	t.Logf("outcomes: %v", counts)
	for _, o := range []string{"admitted", "refused", "outage-refused", "client-gone", "rule-error", "unlimited"} {
		if counts[o] == 0 && steps >= 500 {
			t.Errorf("no %s in %d steps: the generator misses a path", o, steps)
		}
	}
}

// step sends one request and checks it against the model.
func (s *propState) step(i int, plan, user string, cost int, f fault) string {
	t := s.t
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	req.Header.Set("X-Plan", plan)
	req.Header.Set("X-User", user)
	req.Header.Set("X-Cost", strconv.Itoa(cost))
	if f == goneBefore {
		cancel()
	}
	s.fc.set(f, cancel)
	rule := propRule(req)
	first, second := rule.Requests()

	s.events, s.outages, s.handled = nil, 0, 0
	before := s.b.clock()
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	after := s.b.clock()
	s.fc.set(noFault, nil)

	// The candidates: the model at each clock the script may have read.
	// On a server whose clock runs on, a bucket the script stored as
	// full or fresh holds the script's own clock as its ts: that is the
	// first candidate.
	nows := []int64{before}
	if after != before {
		nows = append(nows, after)
	}
	if !s.b.exact() {
		for _, k := range []string{first.Key, secondKey(rule)} {
			if k == "" || len(k) > admit.MaxKeyLen {
				continue
			}
			c := s.b.client()
			ts, err := c.Do(context.Background(), c.B().Hget().Key(k).Field("ts").Build()).AsInt64()
			if err == nil && ts > before && ts < after {
				nows = append([]int64{ts}, nows...)
			}
		}
	}
	var errs []string
	for _, now := range nows {
		m := s.m.Clone()
		m.SetNow(now)
		err := s.expect(m, rule, first, second, f, rec)
		if err == nil {
			s.m = m
			if len(s.events) != 1 {
				return "?"
			}
			return s.events[0].Outcome.String()
		}
		errs = append(errs, err.Error())
	}
	t.Errorf("step %d: %s", i, strings.Join(errs, "\n  or at the later clock: "))
	return ""
}

// expect decides the request on m and returns nil when rec, the events,
// the handler and the outage handler are what the model says, and the
// server holds the model's state for the request's keys.
func (s *propState) expect(m *model.Server, rule admithttp.Rule, first admit.Request, second *admit.Request, f fault, rec *httptest.ResponseRecorder) error {
	wantOutcome := ""
	var out model.Outcome
	switch {
	case rule.First == (admithttp.Bucket{}) && rule.Second == nil: // the test's own zero check, not the package's
		wantOutcome = "unlimited"
	case first.Spec.IsZero() || first.Key == "" || (second != nil && (second.Key == "" || second.Spec.IsZero())):
		wantOutcome = "rule-error"
	case model.Validate(first, second) != nil:
		wantOutcome = "rule-error"
	default:
		switch f {
		case storeDown:
			wantOutcome = "outage-refused"
		case goneBefore:
			wantOutcome = "client-gone"
		default:
			o, err := m.AllowAll(first, second) // the script runs
			if err != nil {
				return fmt.Errorf("model: %v", err)
			}
			out = o
			switch {
			case f == replyLost:
				wantOutcome = "outage-refused"
			case f == goneInFlight:
				wantOutcome = "client-gone"
			case o.Allowed:
				wantOutcome = "admitted"
			default:
				wantOutcome = "refused"
			}
		}
	}
	if len(s.events) != 1 || s.events[0].Outcome.String() != wantOutcome {
		names := make([]string, len(s.events))
		for i, e := range s.events {
			names[i] = e.Outcome.String()
		}
		return fmt.Errorf("events %v, want [%s]", names, wantOutcome)
	}
	wantStatus := map[string]int{"unlimited": 200, "admitted": 200, "refused": 429, "rule-error": 500, "outage-refused": 503,
		"client-gone": admithttp.StatusClientClosedRequest}[wantOutcome]
	status := rec.Code
	if wantOutcome == "client-gone" && (rec.Code != admithttp.StatusClientClosedRequest || rec.Body.Len() != 0 || len(rec.Header()) != 0) {
		return fmt.Errorf("client gone, yet the middleware wrote %d %v %q; want 499 alone", rec.Code, rec.Header(), rec.Body.String())
	}
	if wantStatus != 0 && status != wantStatus {
		return fmt.Errorf("status %d, want %d (%s)", status, wantStatus, wantOutcome)
	}
	if ran := wantOutcome == "admitted" || wantOutcome == "unlimited"; (s.handled == 1) != ran || s.handled > 1 {
		return fmt.Errorf("handler ran %d times for %s", s.handled, wantOutcome)
	}
	if (s.outages == 1) != (wantOutcome == "outage-refused") {
		return fmt.Errorf("outage handler ran %d times for %s", s.outages, wantOutcome)
	}
	if wantOutcome == "admitted" || wantOutcome == "refused" {
		if err := s.checkFields(m, rule, out, rec); err != nil {
			return err
		}
	} else if rec.Header().Get(admithttp.LimitField)+rec.Header().Get(admithttp.PolicyField) != "" {
		return fmt.Errorf("%s with fields %v", wantOutcome, rec.Header())
	}
	return s.checkState(m, first, second)
}

// checkFields checks the fields and body of an admission or a refusal
// against the model's Outcome out, decided on m.
func (s *propState) checkFields(m *model.Server, rule admithttp.Rule, out model.Outcome, rec *httptest.ResponseRecorder) error {
	var policy, limit []string
	violated := ""
	for i, b := range []*admithttp.Bucket{&rule.First, rule.Second} {
		if b == nil {
			continue
		}
		burst, iv := b.Spec.Burst(), b.Spec.Interval()
		policy = append(policy, fmtPolicy(b.Policy, burst, int(max((time.Duration(burst)*iv+time.Second-1)/time.Second, 1))))
		r := out.Remaining[i]
		if r < 0 {
			continue
		}
		tWant := -1
		switch {
		case int(out.Denied) == i+1:
			tWant = int((out.RetryAfter + time.Second - 1) / time.Second)
			violated = b.Policy
		case r < burst:
			tWant = int((iv + time.Second - 1) / time.Second)
			// never shorter than the real wait for the next token
			st, ok := m.Buckets[b.Key]
			tk, ts := model.Refill(m.Now, b.Spec, model.State{Tokens: st.Tokens, TS: st.TS}, ok)
			if int(tk) != r {
				return fmt.Errorf("model: bucket %q holds %d, Remaining %d", b.Key, tk, r)
			}
			if next := time.Duration(ts+iv.Microseconds()-m.Now) * time.Microsecond; time.Duration(tWant)*time.Second < next {
				return fmt.Errorf("%q: t=%d is shorter than the next token's %v", b.Policy, tWant, next)
			}
		}
		limit = append(limit, fmtLimit(b.Policy, r, tWant))
	}
	h := rec.Header()
	if got, want := h.Get(admithttp.PolicyField), strings.Join(policy, ", "); got != want {
		return fmt.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := h.Get(admithttp.LimitField), strings.Join(limit, ", "); got != want {
		return fmt.Errorf("RateLimit %q, want %q (model: %v)", got, want, out)
	}
	if err := checkFields(h, violated); err != nil {
		return err
	}
	if out.Allowed {
		if h.Get("Retry-After") != "" || rec.Body.String() != "ok" {
			return fmt.Errorf("admitted with Retry-After %q, body %q", h.Get("Retry-After"), rec.Body.String())
		}
		return nil
	}
	ra, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
	if err != nil || time.Duration(ra)*time.Second < out.RetryAfter || time.Duration(ra-1)*time.Second >= out.RetryAfter {
		return fmt.Errorf("Retry-After %q for the model's wait %v: want it rounded up", h.Get("Retry-After"), out.RetryAfter)
	}
	var p struct {
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || len(p.Violated) != 1 || p.Violated[0] != violated {
		return fmt.Errorf("body %q: want violated-policies [%q]", rec.Body.String(), violated)
	}
	return nil
}

// checkState compares what the server holds for the request's keys with
// the model.
func (s *propState) checkState(m *model.Server, first admit.Request, second *admit.Request) error {
	keys := []string{first.Key}
	if second != nil {
		keys = append(keys, second.Key)
	}
	c := s.b.client()
	for _, k := range keys {
		if k == "" || len(k) > admit.MaxKeyLen {
			continue
		}
		v, err := c.Do(context.Background(), c.B().Hmget().Key(k).Field("tokens", "ts").Build()).ToArray()
		if err != nil {
			return fmt.Errorf("HMGET %q: %v", k, err)
		}
		tokens, terr := v[0].ToString()
		ts, serr := v[1].ToString()
		b, ok := m.Buckets[k]
		switch {
		case !ok && (terr == nil || serr == nil):
			return fmt.Errorf("%.40q holds tokens %q ts %q; the model has no such key", k, tokens, ts)
		case ok && (tokens != strconv.FormatInt(b.Tokens, 10) || ts != strconv.FormatInt(b.TS, 10)):
			return fmt.Errorf("%.40q holds tokens %q ts %q; the model %d %d", k, tokens, ts, b.Tokens, b.TS)
		}
	}
	return nil
}
