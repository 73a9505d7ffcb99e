package admithttp_test

// The middleware against a real server (VALKEY_SERVER, VALKEY_ADDR or
// valkey-server on PATH; see internal/testserver): the premium story over
// real HTTP, shadow rules by the server's own bucket state, and the outage
// policy for each error class through a fault proxy. Without a server these
// tests skip, or fail under ADMIT_REQUIRE_SERVER=1.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/model"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationPremiumLane runs the premium story on a real server, the
// fields checked exactly and against the draft's grammar, then sends one
// refused request over real HTTP to see the fields on the wire.
func TestIntegrationPremiumLane(t *testing.T) {
	c := testserver.NewClient(t, testserver.Shared(t))
	prefix := testserver.Prefix(t, c)
	next := &recordingHandler{}
	h := mustNew(t, admit.New(c), lanes(prefix), refuseAll, admithttp.WithHeaders())(next)
	// One token a minute: no bucket refills while the story runs (well
	// under a second), and RetryAfter, just under a minute, rounds up to 60.
	runSteps(t, h, next, premiumStory(), true)

	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("X-Plan", "premium")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("RateLimit") != `"shared";r=0;t=60` || resp.Header.Get("Retry-After") != "60" ||
		resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), admithttp.QuotaExceeded) {
		t.Errorf("over HTTP: %s %v %s", resp.Status, resp.Header, body)
	}
	if err := checkFields(resp.Header, "shared"); err != nil {
		t.Error(err)
	}
}

// TestIntegrationShadowKeys: after the premium story with the "tight"
// candidate in shadow, every response is as without it (runSteps), and the
// server holds exactly the enforced buckets the story leaves and the
// candidate's own, each with the tokens its decisions leave.
func TestIntegrationShadowKeys(t *testing.T) {
	c := testserver.NewClient(t, testserver.Shared(t))
	prefix := testserver.Prefix(t, c)
	shadowPrefix := admithttp.ShadowPrefix + "tight:" + prefix
	t.Cleanup(func() { testserver.DeleteWithPrefix(c, shadowPrefix) })
	var tally shadowTally
	next := &recordingHandler{}
	wide := admit.MustSpec(admit.Every(time.Minute), 100)
	h := mustNew(t, admit.New(c), lanes(prefix), refuseAll, admithttp.WithHeaders(),
		admithttp.WithShadow(admithttp.Shadow{Name: "tight", Report: tally.report,
			Rule: func(_ *http.Request, enforced admithttp.Rule) admithttp.Rule {
				if enforced.Second == nil {
					return admithttp.Rule{}
				}
				enforced.First.Spec, enforced.Second.Spec = tightStandard, wide
				return enforced
			}}))(next)
	runSteps(t, h, next, premiumStory(), true)
	if tally.admitted != 3 || tally.refused != 5 || tally.failed != 0 || tally.refusedWhatEnforcedAdmits != 4 {
		t.Errorf("tight: %d admitted, %d refused (%d admitted by the enforced rule), %d failed; want 3, 5 (4), 0",
			tally.admitted, tally.refused, tally.refusedWhatEnforcedAdmits, tally.failed)
	}
	want := map[string]string{
		prefix + "{api}:standard:u1": "0",
		// no {api}:standard:u2: all or nothing, the shared bucket's refusal
		// left u2's fresh bucket unwritten
		prefix + "{api}:shared":            "0",
		shadowPrefix + "{api}:standard:u1": "0",
		shadowPrefix + "{api}:standard:u2": "1",
		shadowPrefix + "{api}:shared":      "97",
	}
	got := map[string]string{}
	for _, p := range []string{prefix, shadowPrefix} {
		keys, err := c.Do(context.Background(), c.B().Keys().Pattern(p+"*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			got[k], err = c.Do(context.Background(), c.B().Hget().Key(k).Field("tokens").Build()).ToString()
			if err != nil {
				t.Fatalf("HGET %s tokens: %v", k, err)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("keys %v; want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s holds %q tokens; want %s", k, got[k], w)
		}
	}
}

// TestIntegrationOutageThroughFaultProxy: a client reaches the server
// through a proxy that delays each direction by 50 ms. The proxy is closed
// while a decision is in flight: the connection is lost with the command
// sent, so the call is outcome unknown, and the OutcomeUnknown handler
// (Refuse) answers 503. The next call cannot connect at all: not executed,
// and the NotExecuted handler (Serve) runs the handler.
func TestIntegrationOutageThroughFaultProxy(t *testing.T) {
	srv := testserver.Shared(t)
	admin := testserver.NewClient(t, srv)
	prefix := testserver.Prefix(t, admin)
	proxy, err := delayproxy.Start(srv.Addr, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	sent := make(chan struct{}, 1) // a script command left the client
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{proxy.Addr()}, DisableCache: true, ForceSingleClient: true,
		DialCtxFn: func(ctx context.Context, dst string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "tcp", dst)
			if err != nil {
				return nil, err
			}
			return &signalConn{Conn: conn, sent: sent}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	var (
		mu       sync.Mutex
		reported []error
	)
	next := &recordingHandler{}
	h := mustNew(t, admit.New(c), lanes(prefix),
		admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }))(next)

	done := make(chan int)
	go func() { done <- send(h, "premium", "").Code }()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("no script command left the client in 10 s")
	}
	proxy.Close()
	var code int
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the request in flight did not end within 10 s of the proxy's close")
	}
	// The client may hand the next calls to the dying connection, which
	// fails them the same way (outcome unknown, 503) until it notices;
	// then it dials the closed proxy and cannot connect.
	var second *httptest.ResponseRecorder
	for range 20 {
		if second = send(h, "premium", ""); second.Code != 503 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(reported) < 2 {
		t.Fatalf("errors reported: %v; want one for the call in flight and at least one after", reported)
	}
	t.Logf("%d errors reported; first: %v", len(reported), reported[0])
	t.Logf("last: %v", reported[len(reported)-1])
	if classOf(reported[0]) != "outcome-unknown" || code != 503 {
		t.Errorf("in flight: %d, %v; want 503 from an outcome-unknown error", code, reported[0])
	}
	for i, err := range reported[1 : len(reported)-1] {
		if classOf(err) != "outcome-unknown" {
			t.Errorf("call %d on the dying connection: %v; want outcome unknown", i+2, err)
		}
	}
	last := reported[len(reported)-1]
	if classOf(last) != "not-executed" || second.Code != 200 || next.calls != 1 || next.admitted {
		t.Errorf("after: %d, handler ran %d (admission %v), %v; want 200 served without an Admission, from a not-executed error",
			second.Code, next.calls, next.admitted, last)
	}
	n, err := admin.Do(context.Background(), admin.B().Exists().Key(prefix+"{api}:shared").Build()).AsInt64()
	t.Logf("the shared bucket exists on the server: %v (%v): the in-flight command %s", n == 1, err,
		map[bool]string{true: "ran", false: "never arrived"}[n == 1])
}

// signalConn signals sent when a script command (EVALSHA or EVAL) is
// written.
type signalConn struct {
	net.Conn
	sent chan<- struct{}
}

func (c *signalConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if strings.Contains(strings.ToUpper(string(b)), "EVAL") {
		select {
		case c.sent <- struct{}{}:
		default:
		}
	}
	return n, err
}

// TestIntegrationProperty runs the property test (property_test.go) on a
// real server whose clock the test steps forward
// (testserver.StartClockShifted). The server's clock runs on between the
// test's readings of it, so each request is checked against the model at
// the clock read before it and at the one read after it: one must match
// in every respect, state included.
func TestIntegrationProperty(t *testing.T) {
	srv, clock := testserver.StartClockShifted(t)
	c := testserver.NewClient(t, srv)
	if err := c.Do(context.Background(), c.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("server %s; seed %d", srv.Version, seed)
	runProperty(t, &realProp{t: t, c: c, clk: clock}, propSteps(600), 20*time.Second, seed)
}

// realProp is a real server whose clock the test steps.
type realProp struct {
	t      *testing.T
	c      valkey.Client
	clk    *testserver.Clock
	offset time.Duration
}

func (b *realProp) client() valkey.Client { return b.c }
func (b *realProp) clock() int64 {
	v, err := b.c.Do(context.Background(), b.c.B().Time().Build()).AsIntSlice()
	if err != nil || len(v) != 2 {
		b.t.Fatalf("TIME: %v %v", v, err)
	}
	return v[0]*1_000_000 + v[1]
}
func (b *realProp) advance(d time.Duration) {
	b.offset += d
	b.clk.Set(b.t, b.offset)
}
func (b *realProp) expiry() model.Expiry { return model.Absolute }
func (b *realProp) exact() bool          { return false }

// TestIntegrationClusterHostileIDs: on a real 3-primary Valkey Cluster, a
// per-tenant pair of buckets under the tenant's hash tag, the tag built
// with admit.KeyPart from the X-User header: no header value gives a
// cross-slot error or any 5xx; each tenant gets its own limit (2 admitted,
// then refused by its own bucket). The same classify with the raw header
// as the tag is the one that broke: "}" and "}x" put the pair in two slots.
func TestIntegrationClusterHostileIDs(t *testing.T) {
	bin := testserver.Binary()
	if bin == "" {
		testserver.SkipOrFail(t, testserver.Help)
	}
	cl, err := testserver.StartCluster(bin, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if c.Mode() != valkey.ClientModeCluster {
		t.Fatalf("client mode %v, want cluster", c.Mode())
	}
	own := admit.MustSpec(admit.Every(time.Hour), 2)
	pool := admit.MustSpec(admit.Every(time.Hour), 100)
	tenant := func(tag func(string) string) func(*http.Request) admithttp.Rule {
		return func(r *http.Request) admithttp.Rule {
			t := tag(r.Header.Get("X-User"))
			return admithttp.Rule{First: admithttp.Bucket{Policy: "own", Key: "rl:{" + t + "}:own", Spec: own},
				Second: &admithttp.Bucket{Policy: "pool", Key: "rl:{" + t + "}:pool", Spec: pool}}
		}
	}
	ids := []string{"", "}", "}x", "{", "{}", strings.Repeat("x", 1<<20), "\xff\xfe\xfd", "\xc3", "bob"}
	var reported []error
	next := &recordingHandler{}
	h := mustNew(t, admit.New(c), tenant(admit.KeyPart), refuseAll,
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(next)
	for _, id := range ids {
		var codes []int
		for range 3 {
			codes = append(codes, send(h, "", id).Code)
		}
		if fmt.Sprint(codes) != "[200 200 429]" {
			t.Errorf("X-User %.12q: statuses %v; want [200 200 429]", id, codes)
		}
	}
	if len(reported) != 0 || next.calls != 2*len(ids) {
		t.Errorf("errors %v; handler ran %d times, want %d", reported, next.calls, 2*len(ids))
	}
	// The raw header as the tag: a cross-slot pair, refused before sending.
	raw := mustNew(t, admit.New(c), tenant(func(s string) string { return s }), refuseAll,
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(next)
	if rec := send(raw, "", "}x"); rec.Code != 500 || len(reported) != 1 || !errors.Is(reported[0], admit.ErrCrossSlot) {
		t.Errorf("raw \"}x\": %d, %v; want 500 with ErrCrossSlot (else this test cannot tell)", rec.Code, reported)
	}
}

// TestIntegrationDecisionTimeoutPausedStore: with the store paused (CLIENT
// PAUSE), WithDecisionTimeout answers within its bound, from the Outage
// handler of the error's class (the command was sent: outcome unknown),
// and Refuse's 503 carries Retry-After.
func TestIntegrationDecisionTimeoutPausedStore(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	admin := testserver.NewClient(t, srv)
	var log eventLog
	h := mustNew(t, admit.New(c), lanes("t:"), admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithDecisionTimeout(200*time.Millisecond), admithttp.WithOutcome(log.record))(&recordingHandler{})
	if rec := send(h, "premium", ""); rec.Code != 200 { // the script is loaded, the connection up
		t.Fatalf("before the pause: %d", rec.Code)
	}
	log.take()
	if err := admin.Do(context.Background(), admin.B().ClientPause().Timeout(5000).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), admin.B().ClientUnpause().Build()) })
	start := time.Now()
	rec := send(h, "premium", "")
	took := time.Since(start)
	admin.Do(context.Background(), admin.B().ClientUnpause().Build())
	t.Logf("answered %d after %v", rec.Code, took)
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "5" || took > 2*time.Second {
		t.Errorf("paused store: %d, Retry-After %q, after %v; want 503, 5, within the bound", rec.Code, rec.Header().Get("Retry-After"), took)
	}
	events := log.events[len(log.events)-1:]
	if len(events) != 1 || events[0].Outcome != admithttp.OutageRefused || !errors.Is(events[0].Err, context.DeadlineExceeded) ||
		classOf(events[0].Err) != "outcome-unknown" {
		t.Errorf("events %+v; want outage-refused with an outcome-unknown deadline error", events)
	}
}

// TestIntegrationConcurrent: a limit of 3 in flight on a real server, over
// real HTTP. 50 clients at once: exactly 3 handlers run (held until the 47
// others are refused, by 429s naming the concurrency policy, whose fields
// pass the draft's checks); then 50 clients of 10 requests each, never more
// than 3 inside at once; a panicking handler frees its slot. At the end no
// slot is taken and the bucket paid for the admitted requests only.
func TestIntegrationConcurrent(t *testing.T) {
	c := testserver.NewClient(t, testserver.Shared(t))
	prefix := testserver.Prefix(t, c)
	const clients, n = 50, 3
	bucket := admit.MustSpec(admit.Every(time.Hour), 1000) // no refill while the test runs
	rule := concRule(prefix, admit.MustConcurrency(n, 10*time.Second), bucket)
	var (
		flight   inFlight
		full     = make(chan struct{})
		gate     = make(chan struct{})
		fullOnce sync.Once
		gated    atomic.Bool
		panicked atomic.Int64
	)
	gated.Store(true)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Panic") != "" {
			panicked.Add(1)             // the client may send it again: count here
			panic(http.ErrAbortHandler) // the server recovers it silently
		}
		defer flight.leave()
		if flight.enter() == n {
			fullOnce.Do(func() { close(full) })
		}
		if gated.Load() {
			select {
			case <-gate:
			case <-time.After(10 * time.Second): // bound: the test fails below
			}
		}
		io.WriteString(w, "ok")
	})
	var reported atomic.Int64
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll, admithttp.WithHeaders(),
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported.Add(1); t.Errorf("error hook: %v", err) }))(next)
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	get := func(panics bool) (int, http.Header, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if panics {
			req.Header.Set("X-Panic", "1")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header, nil
	}

	codes := make(chan int, clients)
	for range clients {
		go func() {
			code, hdr, err := get(false)
			if err != nil {
				t.Error(err)
			} else if code == http.StatusTooManyRequests {
				if err := checkFields(hdr, "conc"); err != nil {
					t.Error(err)
				}
			}
			codes <- code
		}()
	}
	select {
	case <-full:
	case <-time.After(10 * time.Second):
		t.Fatal("the limit's 3 handlers never ran at once")
	}
	refused := 0
	for range clients - n {
		select {
		case code := <-codes:
			if code == http.StatusTooManyRequests {
				refused++
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d refusals so far; want %d while the 3 slots are held", refused, clients-n)
		}
	}
	if refused != clients-n {
		t.Errorf("%d refused while 3 handlers held their slots; want %d", refused, clients-n)
	}
	close(gate)
	for range n {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("an admitted request answered %d", code)
		}
	}
	if most := flight.most.Load(); most != n {
		t.Errorf("at most %d handlers inside at once, want exactly %d", most, n)
	}

	gated.Store(false)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				code, _, err := get(false)
				switch {
				case err != nil:
					t.Error(err)
				case code == http.StatusOK:
					admitted.Add(1)
				case code != http.StatusTooManyRequests:
					t.Errorf("status %d", code)
				}
			}
		}()
	}
	wg.Wait()
	if most := flight.most.Load(); most > n {
		t.Errorf("%d handlers inside at once; the limit is %d", most, n)
	}
	for range n + 1 { // more panics than slots: each must free its own
		if _, _, err := get(true); err == nil {
			t.Error("a panicking handler's response arrived")
		}
	}
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots still taken after every handler returned or panicked", got)
	}
	if code, _, err := get(false); err != nil || code != http.StatusOK {
		t.Errorf("after the panics: %d %v; want 200", code, err)
	}
	d, err := admit.New(c).Peek(context.Background(), rule.First.Request(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Admitted: the 3 gated, the free-running ones, those that panicked
	// (the bucket charged them; they ran), and the last one.
	if panicked.Load() < n+1 {
		t.Errorf("%d handlers panicked, want at least %d", panicked.Load(), n+1)
	}
	if want := int64(bucket.Burst()) - n - admitted.Load() - panicked.Load() - 1; int64(d.Remaining[0])+1 != want {
		t.Errorf("bucket holds %d, want %d: a refused request took a token", d.Remaining[0]+1, want)
	}
	t.Logf("limit %d, %d clients: at most %d in flight; free-running %d of %d admitted", n, clients, flight.most.Load(), admitted.Load(), clients*10)
}
