package admithttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/google/go-cmp/cmp"
	"github.com/valkey-io/valkey-go"
)

// eventLog records the Outcome hook's events as "outcome" or
// "outcome/shadow".
type eventLog struct {
	mu     sync.Mutex
	names  []string
	events []admithttp.Event
}

func (l *eventLog) record(e admithttp.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := e.Outcome.String()
	if e.Shadow != "" {
		name += "/" + e.Shadow
	}
	l.names = append(l.names, name)
	l.events = append(l.events, e)
}

func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.names
	l.names = nil
	return n
}

// switchClient passes commands to its client, or fails them with err when
// err is set.
type switchClient struct {
	valkey.Client
	mu  sync.Mutex
	err error
}

func (c *switchClient) fail(err error) { c.mu.Lock(); c.err = err; c.mu.Unlock() }

func (c *switchClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return valkey.NewErrorResult(err)
	}
	return c.Client.Do(ctx, cmd)
}

// TestOutcomeEvents: every request gives the hook exactly one Event with
// its Outcome (and one more per shadow that would refuse), whatever path
// it takes; the Outage handler's choice decides served or refused.
func TestOutcomeEvents(t *testing.T) {
	_, mini := minitest.Start(t)
	client := &switchClient{Client: mini}
	var log eventLog
	tight := admit.MustSpec(admit.Every(time.Minute), 1)
	own := func(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
		if r.URL.Path == "/serve" {
			next.ServeHTTP(w, r)
			return
		}
		w.WriteHeader(http.StatusTeapot)
	}
	h := mustNew(t, admit.New(client), func(r *http.Request) admithttp.Rule {
		if r.Header.Get("X-Bad") != "" {
			return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Spec: sharedSpec}}
		}
		return lanes("t:")(r)
	}, admithttp.Outage{NotExecuted: own, OutcomeUnknown: admithttp.Serve},
		admithttp.WithOutcome(log.record),
		admithttp.WithShadow(admithttp.Shadow{Name: "tight", Report: func(admithttp.ShadowReport) {},
			Rule: func(_ *http.Request, enforced admithttp.Rule) admithttp.Rule {
				if enforced.IsZero() {
					return enforced
				}
				enforced.First.Spec = tight
				return enforced
			}}))(&recordingHandler{})
	get := func(path, plan string, header ...string) int {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("X-Plan", plan)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	steps := []struct {
		do   func() int
		code int
		want []string
	}{
		{func() int { return get("/", "") }, 200, []string{"unlimited"}},
		{func() int { return get("/", "premium") }, 200, []string{"admitted"}},
		{func() int { return get("/", "premium") }, 200, []string{"shadow-would-refuse/tight", "admitted"}},
		{func() int { return get("/", "premium", "X-Bad", "1") }, 500, []string{"rule-error"}},
		{func() int { client.fail(dialRefused); return get("/serve", "premium") }, 200, []string{"outage-served"}},
		{func() int { return get("/refuse", "premium") }, 418, []string{"outage-refused"}},
		{func() int { client.fail(io.EOF); return get("/", "premium") }, 200, []string{"outage-served"}},
		// The candidate's shared bucket, on the shadow's keys, was spent
		// by the premium requests above at a burst of 1.
		{func() int { client.fail(nil); return get("/", "standard") }, 200, []string{"shadow-would-refuse/tight", "admitted"}},
	}
	for i, st := range steps {
		if code := st.do(); code != st.code {
			t.Errorf("step %d: status %d, want %d", i, code, st.code)
		}
		if diff := cmp.Diff(st.want, log.take()); diff != "" {
			t.Errorf("step %d: events (-want +got):\n%s", i, diff)
		}
	}
	// Eight more premium requests spend the shared bucket (10): the 9th
	// is refused.
	for range 7 {
		get("/", "premium")
	}
	log.take()
	if code := get("/", "premium"); code != 429 {
		t.Errorf("status %d, want 429", code)
	}
	if diff := cmp.Diff([]string{"shadow-would-refuse/tight", "refused"}, log.take()); diff != "" {
		t.Errorf("refusal: events (-want +got):\n%s", diff)
	}
	if e := log.events[len(log.events)-1]; e.Decision.Denied != 1 || e.Rule.First.Policy != "shared" || e.Request == nil || e.Err != nil {
		t.Errorf("refusal event %+v", e)
	}
}

// dialRefused is a dial failure: nothing was sent.
var dialRefused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

// writeLog is a ResponseWriter that records the status and whether a
// body was written.
type writeLog struct {
	h      http.Header
	status int
	body   bool
}

func (w *writeLog) Header() http.Header         { return w.h }
func (w *writeLog) WriteHeader(code int)        { w.status = code }
func (w *writeLog) Write(b []byte) (int, error) { w.body = true; return len(b), nil }

// inFlightCancel runs each command on its client, then cancels the
// request's context and reports the cancellation, as valkey-go does when
// a context ends while the command is in flight: the command ran.
type inFlightCancel struct {
	valkey.Client
	cancel context.CancelFunc
}

func (c *inFlightCancel) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	res := c.Client.Do(context.Background(), cmd)
	if ve, ok := valkey.IsValkeyErr(res.Error()); ok && ve.IsNoScript() {
		return res // EVALSHA before the script is cached: the EVAL that follows is the one in flight
	}
	c.cancel()
	return valkey.NewErrorResult(context.Canceled)
}

// TestClientGoneIsNotAnOutage: a request whose context was canceled before
// the decision (refused before sending) or during it (the command ran)
// runs no Outage handler, writes the status 499 and nothing else, reports
// no error, and gives the hook ClientGone with the decision's error.
func TestClientGoneIsNotAnOutage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		class string
		setup func(mini valkey.Client) (valkey.Client, context.Context)
	}{
		{"before-sending", "not-executed", func(mini valkey.Client) (valkey.Client, context.Context) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return mini, ctx
		}},
		{"in-flight", "outcome-unknown", func(mini valkey.Client) (valkey.Client, context.Context) {
			ctx, cancel := context.WithCancel(context.Background())
			return &inFlightCancel{Client: mini, cancel: cancel}, ctx
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, mini := minitest.Start(t)
			client, ctx := tc.setup(mini)
			var outages outageLog
			var log eventLog
			var reported []error
			next := &recordingHandler{}
			h := mustNew(t, admit.New(client), lanes("t:"), outages.outage(), admithttp.WithOutcome(log.record),
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(next)
			w := &writeLog{h: http.Header{}}
			r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
			r.Header.Set("X-Plan", "premium")
			h.ServeHTTP(w, r)
			if w.status != admithttp.StatusClientClosedRequest || w.body || len(w.h) != 0 || next.calls != 0 || len(outages.ran) != 0 || len(reported) != 0 {
				t.Errorf("status %d, body %v, header %v, handler ran %d, outage handlers %v, reported %v; want 499 alone",
					w.status, w.body, w.h, next.calls, outages.ran, reported)
			}
			if diff := cmp.Diff([]string{"client-gone"}, log.take()); diff != "" {
				t.Fatalf("events (-want +got):\n%s", diff)
			}
			if err := log.events[0].Err; classOf(err) != tc.class || !errors.Is(err, context.Canceled) {
				t.Errorf("event error %v; want %s with context.Canceled", err, tc.class)
			}
			if wantKeys := map[string]int{"not-executed": 0, "outcome-unknown": 1}[tc.class]; len(srv.Keys()) != wantKeys {
				t.Errorf("keys after: %q; want %d (the command ran only when in flight)", srv.Keys(), wantKeys)
			}
		})
	}
}

// TestParentDeadlineIsClientGone: a deadline that a server above set on
// the request's context ends the request as a client that went away does
// (edge.IsGone: one rule at both edges): 499, no Outage handler.
func TestParentDeadlineIsClientGone(t *testing.T) {
	_, mini := minitest.Start(t)
	var log eventLog
	h := mustNew(t, admit.New(stallingClient{mini}), lanes("t:"), refuseAll, admithttp.WithOutcome(log.record))(&recordingHandler{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	rec := sendCtx(ctx, h, "premium", "")
	if rec.Code != admithttp.StatusClientClosedRequest || rec.Header().Get("Retry-After") != "" {
		t.Errorf("status %d, Retry-After %q; want 499 and no Outage handler", rec.Code, rec.Header().Get("Retry-After"))
	}
	if diff := cmp.Diff([]string{"client-gone"}, log.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// stallingClient answers no command: each waits for its context.
type stallingClient struct{ valkey.Client }

func (stallingClient) Do(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
	<-ctx.Done()
	return valkey.NewErrorResult(ctx.Err())
}

// TestDecisionTimeout: with WithDecisionTimeout, a store that does not
// answer holds a request for the bound, then its class's Outage handler
// answers (the command was in flight: outcome unknown), with the deadline
// in the error; Refuse's 503 carries Retry-After.
func TestDecisionTimeout(t *testing.T) {
	_, mini := minitest.Start(t)
	var log eventLog
	var reported []error
	h := mustNew(t, admit.New(stallingClient{mini}), func(*http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: sharedSpec}}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithDecisionTimeout(50*time.Millisecond), admithttp.WithOutcome(log.record),
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(&recordingHandler{})
	start := time.Now()
	rec := send(h, "", "")
	took := time.Since(start)
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "5" {
		t.Errorf("status %d, Retry-After %q; want 503, 5", rec.Code, rec.Header().Get("Retry-After"))
	}
	if took < 50*time.Millisecond {
		t.Errorf("answered after %v, before the bound", took)
	}
	if len(reported) != 1 || !errors.Is(reported[0], context.DeadlineExceeded) || classOf(reported[0]) != "outcome-unknown" {
		t.Errorf("reported %v; want one outcome-unknown error with the deadline", reported)
	}
	if diff := cmp.Diff([]string{"outage-refused"}, log.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if _, err := admithttp.New(admit.New(mini), lanes("t:"), refuseAll, admithttp.WithDecisionTimeout(0)); err == nil {
		t.Error("WithDecisionTimeout(0) accepted")
	}
}

// TestRefuseAfter: RefuseAfter's 503 carries its Retry-After, rounded up.
func TestRefuseAfter(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Second: "1", 1500 * time.Millisecond: "2", time.Minute: "60"} {
		rec := httptest.NewRecorder()
		admithttp.RefuseAfter(d)(rec, httptest.NewRequest(http.MethodGet, "/", nil), nil, io.EOF)
		if rec.Code != 503 || rec.Header().Get("Retry-After") != want {
			t.Errorf("RefuseAfter(%v): %d, Retry-After %q; want 503, %q", d, rec.Code, rec.Header().Get("Retry-After"), want)
		}
	}
}

// TestWithRefusal: a custom refusal keeps the fields the middleware set
// (the same as the default refusal's), writes its own body, and falls back
// to the default when it writes nothing.
func TestWithRefusal(t *testing.T) {
	rule := func(*http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: admit.MustSpec(admit.Every(time.Minute), 1)}}
	}
	run := func(opts ...admithttp.Option) *httptest.ResponseRecorder {
		_, c := minitest.Start(t)
		h := mustNew(t, admit.New(c), rule, refuseAll, opts...)(&recordingHandler{})
		send(h, "", "")
		return send(h, "", "")
	}
	def := run()
	var got admithttp.Refusal
	custom := run(admithttp.WithRefusal(func(w http.ResponseWriter, _ *http.Request, ref admithttp.Refusal) {
		got = ref
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "slow down\n")
	}))
	for _, f := range []string{admithttp.PolicyField, admithttp.LimitField, "Retry-After"} {
		if custom.Header().Get(f) == "" || custom.Header().Get(f) != def.Header().Get(f) {
			t.Errorf("%s: custom %q, default %q", f, custom.Header().Get(f), def.Header().Get(f))
		}
	}
	if custom.Code != 429 || custom.Body.String() != "slow down\n" {
		t.Errorf("custom: %d %q", custom.Code, custom.Body.String())
	}
	if got.Violated.Policy != "p" || got.Decision.Denied != 1 || got.RetryAfter() != 60 {
		t.Errorf("Refusal %+v", got)
	}
	silent := run(admithttp.WithRefusal(func(http.ResponseWriter, *http.Request, admithttp.Refusal) {}))
	if silent.Code != 429 || silent.Body.String() != def.Body.String() {
		t.Errorf("a refusal that writes nothing: %d %q; want the default %q", silent.Code, silent.Body.String(), def.Body.String())
	}
}

// nopWriter is a ResponseWriter that keeps one header map and writes
// nowhere, so that a request's allocations are the middleware's own.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) WriteHeader(int)             {}
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }

// TestOutcomeHookAllocatesNothingUnset: without WithOutcome, a request
// with no limit allocates nothing in the middleware at all, so neither
// does the hook; on the decided paths, the unset hook costs no allocation
// that a set one does not (the Event is built only when there is a hook).
func TestOutcomeHookAllocatesNothingUnset(t *testing.T) {
	_, c := minitest.Start(t)
	lim := admit.New(c)
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	unlimited := mustNew(t, lim, func(*http.Request) admithttp.Rule { return admithttp.Rule{} }, refuseAll)(noop)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &nopWriter{h: http.Header{}}
	if n := testing.AllocsPerRun(200, func() { unlimited.ServeHTTP(w, r) }); n != 0 {
		t.Errorf("zero Rule, no hook: %v allocations per request; want 0", n)
	}
	var events int
	hooked := mustNew(t, lim, func(*http.Request) admithttp.Rule { return admithttp.Rule{} }, refuseAll,
		admithttp.WithOutcome(func(admithttp.Event) { events++ }))(noop)
	if n := testing.AllocsPerRun(200, func() { hooked.ServeHTTP(w, r) }); n != 0 {
		t.Errorf("zero Rule, a hook that keeps nothing: %v allocations per request; want 0", n)
	}
	if events == 0 {
		t.Fatal("the hook never ran")
	}
	// A decision that fails (the store refuses the connection): the hook
	// unset allocates no more than a hook set, which needs its Event and
	// a wrapper telling whether the Outage handler served. (A refusal's
	// allocations cannot be told from an in-process server's own here;
	// BenchmarkMiddleware reports them against a real one.)
	failing := &failingClient{Client: c, err: dialRefused}
	limited := func(*http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: sharedSpec}}
	}
	plain := mustNew(t, admit.New(failing), limited, refuseAll)(noop)
	withHook := mustNew(t, admit.New(failing), limited, refuseAll, admithttp.WithOutcome(func(admithttp.Event) { events++ }))(noop)
	unset := testing.AllocsPerRun(200, func() { clear(w.h); plain.ServeHTTP(w, r) })
	set := testing.AllocsPerRun(200, func() { clear(w.h); withHook.ServeHTTP(w, r) })
	t.Logf("a failed decision: %v allocations without the hook, %v with one", unset, set)
	if unset >= set {
		t.Errorf("a failed decision allocates %v without the hook and %v with it; the unset hook should cost nothing", unset, set)
	}
}

// TestGoneVersusOutageStorePaused: with the store paused (SIGSTOP) and
// clients that give up after 300 ms, every one of 100 requests that
// reached the middleware is ClientGone, with and without a decision
// timeout (one longer than the clients' patience), and no handler runs:
// a request whose client went away is never an outage (edge.Judge, as at
// the gRPC edge). A decision timeout well before it is an outage.
func TestGoneVersusOutageStorePaused(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	spec := admit.MustSpec(admit.Every(time.Millisecond), 1000)
	for _, tc := range []struct {
		name     string
		opts     []admithttp.Option
		patience time.Duration
		outcome  admithttp.Outcome
	}{
		{"no timeout", nil, 300 * time.Millisecond, admithttp.ClientGone},
		{"timeout 1s", []admithttp.Option{admithttp.WithDecisionTimeout(time.Second)}, 300 * time.Millisecond, admithttp.ClientGone},
		{"timeout 50ms", []admithttp.Option{admithttp.WithDecisionTimeout(50 * time.Millisecond)}, 10 * time.Second, admithttp.OutageServed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			counts := map[admithttp.Outcome]int{}
			var ran, classified atomic.Int64
			mw := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule {
				classified.Add(1)
				return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "gone:{o}", Spec: spec}}
			}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Serve}, append(tc.opts,
				admithttp.WithOutcome(func(e admithttp.Event) { mu.Lock(); counts[e.Outcome]++; mu.Unlock() }))...)
			hs := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) })))
			defer hs.Close()
			client := &http.Client{Timeout: tc.patience, Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
			if resp, err := client.Get(hs.URL); err != nil || resp.StatusCode != 200 { // the store's connection is up
				t.Fatal(resp, err)
			}
			mu.Lock()
			clear(counts)
			mu.Unlock()
			ran.Store(0)
			classified.Store(0)
			resume := testserver.Pause(t, srv)
			const calls = 100
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					if resp, err := client.Get(hs.URL); err == nil {
						resp.Body.Close()
					}
				})
			}
			wg.Wait()
			total := func() (n int) {
				mu.Lock()
				defer mu.Unlock()
				for _, v := range counts {
					n += v
				}
				return n
			}
			// Every request that reached the middleware is decided (its
			// context ended) before the store resumes.
			for deadline := time.Now().Add(5 * time.Second); int64(total()) < classified.Load() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			resume()
			mu.Lock()
			defer mu.Unlock()
			n, wrong := int(classified.Load()), 0
			for o, v := range counts {
				if o != tc.outcome {
					wrong += v
				}
			}
			t.Logf("%d requests, %d reached the middleware, store paused: outcomes %v, handlers run %d, not %v: %d", calls, n, counts, ran.Load(), tc.outcome, wrong)
			if wrong != 0 || counts[tc.outcome] != n || n < calls/2 {
				t.Errorf("%d of %d requests decided not %v (%v); want 0, and at least %d decided", wrong, n, tc.outcome, counts, calls/2)
			}
			if tc.outcome == admithttp.ClientGone && ran.Load() != 0 {
				t.Errorf("%d handlers ran for clients that had gone; want 0", ran.Load())
			}
		})
	}
}
