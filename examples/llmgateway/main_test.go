package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/examples/internal/demostore"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// The story the workload tells, request by request: HTTP status, and what
// was refunded.
var wantOutcomes = []string{
	"p1: 200, used 5500 (prompt 1500 + answer 4000)",
	"s1: 200, used 2000 (prompt 500 + answer 1500), 500 unused refunded",
	"s2: 200, used 2800",
	"s3: 429, refused by the standard bucket",
	"p2: 200, used 1200 (prompt 300 + answer 900), 100 unused refunded",
	"s4: 429, refused by the shared bucket",
	"s5: 200, used 300",
	"p3: 429, refused by the shared bucket",
}

// The candidate lane (4,500 tokens) would have refused s2, s4 and s5, two
// of which the enforced lane admitted.
var wantSummary = summary{admitted: 5, refusedByLane: 1, refusedByShared: 2, refunded: 500*2 + 100,
	candidateRefused: 3, candidateAdmitted: 2}

// TestIntegrationRun runs the gateway against a real server and checks every
// decision, the refunds, and what the buckets hold at the end: exactly the
// tokens the story leaves (lane 900: the shared bucket's refusal of s4
// charged the lane nothing; shared 200), plus at most what they refilled
// while the run took, by the server's clock.
func TestIntegrationRun(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	prefix := testserver.Prefix(t, c)
	t0 := serverMicros(t, c)
	g, err := newGateway(c, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testserver.DeleteWithPrefix(c, admithttp.ShadowPrefix+"lane-4500:"+prefix) })
	var out strings.Builder
	sum, err := run(ctx, &out, c, g)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	elapsed := serverMicros(t, c) - t0
	checkStory(t, out.String(), sum)
	checkFieldsAfterRefund(t, out.String())

	for _, b := range []struct {
		key          string
		want         int64
		intervalUsec int64
	}{
		{g.laneKey, 900, laneSpec.Interval().Microseconds()},
		{g.sharedKey, 200, sharedSpec.Interval().Microseconds()},
	} {
		s, err := c.Do(ctx, c.B().Hget().Key(b.key).Field("tokens").Build()).ToString()
		if err != nil {
			t.Fatalf("HGET %s tokens: %v", b.key, err)
		}
		got, _ := strconv.ParseInt(s, 10, 64)
		if refilled := elapsed/b.intervalUsec + 1; got < b.want || got > b.want+refilled {
			t.Errorf("%s holds %d tokens, want %d plus at most the %d refilled in the run's %dµs", b.key, got, b.want, refilled, elapsed)
		}
	}
}

// TestRunInProcess is what go run does with no VALKEY_ADDR: the same story
// on an in-process miniredis.
func TestRunInProcess(t *testing.T) {
	c, g := inProcess(t)
	var out strings.Builder
	sum, err := run(context.Background(), &out, c, g)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	checkStory(t, out.String(), sum)
}

func checkStory(t *testing.T, out string, sum summary) {
	t.Helper()
	if sum != wantSummary {
		t.Errorf("summary %+v, want %+v", sum, wantSummary)
	}
	var got []string
	for _, line := range strings.Split(out, "\n") {
		id, rest, ok := strings.Cut(line, " ")
		if _, outcome, found := strings.Cut(rest, " tokens: "); ok && found && len(id) == 2 {
			got = append(got, id+": "+outcome)
		}
	}
	if len(got) != len(wantOutcomes) {
		t.Fatalf("%d request lines, want %d:\n%s", len(got), len(wantOutcomes), out)
	}
	for i, want := range wantOutcomes {
		if !strings.HasPrefix(got[i], want) {
			t.Errorf("request %d: %q, want it to start with %q", i, got[i], want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

func serverMicros(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Time().Build()).AsIntSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("TIME: %v %v", v, err)
	}
	return v[0]*1_000_000 + v[1]
}

// TestRefusedBeforeTheLimiter: what the gateway refuses itself never
// reaches the buckets.
func TestRefusedBeforeTheLimiter(t *testing.T) {
	c, g := inProcess(t)
	for _, tc := range []struct {
		key, body string
		want      int
	}{
		{"key-nobody", `{"prompt_tokens":1,"max_tokens":1}`, http.StatusUnauthorized},
		{"key-standard", `{"prompt_tokens":"many"}`, http.StatusBadRequest},
		{"key-standard", `{"prompt_tokens":-5,"max_tokens":1}`, http.StatusBadRequest},
		{"key-standard", `{"prompt_tokens":1000,"max_tokens":5001}`, http.StatusRequestEntityTooLarge}, // above the lane's 6000
		{"key-premium", `{"prompt_tokens":1000,"max_tokens":11001}`, http.StatusRequestEntityTooLarge}, // above the shared 12000
		{"key-premium", `{"prompt_tokens":1,"max_tokens":9223372036854775807}`, http.StatusRequestEntityTooLarge},
	} {
		if rec := post(g, tc.key, tc.body); rec.Code != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.key, tc.body, rec.Code, tc.want)
		}
	}
	if n, err := c.Do(context.Background(), c.B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("%d keys written (%v); want none", n, err)
	}
}

// testClock is the in-process server's clock in these tests: it stands
// still, so no bucket refills while a slow machine runs the story.
var testClock = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// inProcess is what go run does with no VALKEY_ADDR, on a server whose
// clock stands at testClock: the client and the gateway, closed when the
// test ends.
func inProcess(t *testing.T) (valkey.Client, *gateway) {
	t.Helper()
	t.Setenv("VALKEY_ADDR", "")
	c, _, stop, err := demostore.Connect(testClock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	g, err := newGateway(c, "llmgateway:")
	if err != nil {
		t.Fatal(err)
	}
	return c, g
}

// post sends g a chat request with the API key and body, and returns its
// answer.
func post(g *gateway, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, req)
	return rec
}

// TestFieldsCountTokens: every token policy of every response that carries
// the fields says its quota counts model tokens, never the draft's default
// of requests; the organisation's concurrency limit says it counts
// requests in flight.
func TestFieldsCountTokens(t *testing.T) {
	_, g := inProcess(t)
	seen := map[int]bool{}
	for _, key := range []string{"key-standard", "key-standard", "key-standard", "key-premium"} {
		rec := post(g, key, `{"prompt_tokens":1000,"max_tokens":2000}`)
		seen[rec.Code] = true
		policy := rec.Header().Get("RateLimit-Policy")
		items := strings.Split(policy, ", ")
		if policy == "" || len(items) < 2 {
			t.Fatalf("%s: %d with RateLimit-Policy %q; want the concurrency limit and the buckets", key, rec.Code, policy)
		}
		if want := `"inflight";q=4;qu="concurrent-requests"`; items[0] != want {
			t.Errorf("%s: %d: first policy %q, want %q", key, rec.Code, items[0], want)
		}
		for _, it := range items[1:] {
			if !strings.Contains(it, `;qu="llm-tokens"`) {
				t.Errorf("%s: %d: policy %q does not say it counts tokens", key, rec.Code, it)
			}
		}
	}
	if !seen[200] || !seen[429] {
		t.Errorf("statuses %v; want both an admission and a refusal", seen)
	}
}

// TestConcurrentPerOrganisation: an organisation has at most 4 requests
// with the model at once, whatever its token budget: 7 requests of one
// organisation at once put exactly 4 in the model and get 3 429s naming
// the "inflight" policy, which take no tokens; another organisation is
// admitted meanwhile; once the answers are done, every lease is released.
func TestConcurrentPerOrganisation(t *testing.T) {
	c, g := inProcess(t)
	var now, most atomic.Int64
	entered := make(chan string, 16)
	gate := make(chan struct{})
	g.model = func(r chatRequest) answer {
		n := now.Add(1)
		defer now.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		entered <- r.Org
		if r.Org == "globex" {
			select {
			case <-gate:
			case <-time.After(10 * time.Second): // bound: the test fails below
			}
		}
		return complete(r)
	}
	const body = `{"prompt_tokens":100,"max_tokens":100}`
	lane := func() int64 { // the standard lane's tokens, by a Peek
		d, err := g.lim.Peek(context.Background(), admit.Request{Key: g.laneKey, Spec: laneSpec}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return int64(d.Remaining[0]) + 1
	}
	const limit, sent = 4, 7
	done := make(chan *httptest.ResponseRecorder, sent)
	for range limit {
		go func() { done <- post(g, "key-standard", body) }()
	}
	for range limit {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the organisation's 4 requests never all reached the model")
		}
	}
	before := lane()
	for range sent - limit {
		rec := post(g, "key-standard", body)
		if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"violated-policies":["inflight"]`) {
			t.Errorf("a fifth request of the organisation: %d %s; want 429 by the inflight policy", rec.Code, rec.Body.String())
		}
		if got := rec.Header().Get("RateLimit"); !strings.HasPrefix(got, `"inflight";r=0;t=`) {
			t.Errorf("RateLimit %q", got)
		}
	}
	if after := lane(); after != before {
		t.Errorf("the lane holds %d after the refusals, %d before: a refusal by the concurrency limit took tokens", after, before)
	}
	if rec := post(g, "key-standard-2", body); rec.Code != http.StatusOK {
		t.Errorf("another organisation, while the first is at its limit: %d %s", rec.Code, rec.Body.String())
	}
	<-entered
	close(gate)
	for range limit {
		if rec := <-done; rec.Code != http.StatusOK {
			t.Errorf("an admitted request: %d %s", rec.Code, rec.Body.String())
		}
	}
	if most.Load() != limit+1 { // the 4 of one organisation, and the other's
		t.Errorf("%d requests with the model at once; want the 4 of one organisation and 1 of another", most.Load())
	}
	for _, org := range []string{"globex", "initech"} {
		if n, err := c.Do(context.Background(), c.B().Zcard().Key(g.inflightKey+admit.KeyPart(org)).Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("%s: %d slots taken after every answer (%v)", org, n, err)
		}
	}
}

// checkFieldsAfterRefund: s1 reserved 2,500 tokens of the standard lane's
// 6,000 and refunded 500, so its 200's RateLimit says the lane holds at
// least 4,000 (3,500 plus the refund, plus what refilled meanwhile), not
// the 3,500 the reservation left.
func checkFieldsAfterRefund(t *testing.T, out string) {
	t.Helper()
	_, after, ok := strings.Cut(out, "s1 ")
	if !ok {
		t.Fatalf("no s1 in the run's output:\n%s", out)
	}
	_, limit, ok := strings.Cut(after, "RateLimit: ")
	if !ok {
		t.Fatalf("s1 has no RateLimit field:\n%s", after)
	}
	limit, _, _ = strings.Cut(limit, "\n")
	_, r, _ := strings.Cut(limit, `"standard";r=`)
	r, _, _ = strings.Cut(r, ";")
	if n, err := strconv.Atoi(r); err != nil || n < 4000 || n > laneSpec.Burst() {
		t.Errorf("s1's RateLimit %q: the standard lane's r is %q; want at least 4000, after the refund of 500", limit, r)
	}
}
