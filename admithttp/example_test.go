package admithttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// exampleClient starts an in-process server whose clock stands still, so
// that the Output below is the same on every run; in production, pass your
// own valkey.Client to admit.New.
func exampleClient() (valkey.Client, func()) {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	srv.SetTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		log.Fatal(err)
	}
	return client, func() { client.Close(); srv.Close() }
}

// A premium lane in front of a handler: standard requests pass their own
// bucket, then the shared one; premium requests the shared one alone, so
// they still get through when standard traffic is refused.
func ExampleNew() {
	client, stop := exampleClient()
	defer stop()

	shared := admit.MustSpec(admit.Every(time.Second), 3)     // 3 at once, then 1 a second
	standard := admit.MustSpec(admit.Every(2*time.Second), 2) // standard may use 2 of them
	limit, err := admithttp.New(admit.New(client), func(r *http.Request) admithttp.Rule {
		s := admithttp.Bucket{Policy: "shared", Key: "rl:{api}:shared", Spec: shared}
		if r.Header.Get("X-Plan") == "premium" {
			return admithttp.Rule{First: s}
		}
		return admithttp.Rule{First: admithttp.Bucket{Policy: "standard", Key: "rl:{api}:standard", Spec: standard}, Second: &s}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse}, admithttp.WithHeaders())
	if err != nil {
		log.Fatal(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") }))

	for _, plan := range []string{"standard", "standard", "standard", "premium", "premium"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Plan", plan)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%-8s %d RateLimit: %s", plan, rec.Code, rec.Header().Get("RateLimit"))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Printf(" Retry-After: %s", ra)
		}
		fmt.Println()
	}
	// Output:
	// standard 200 RateLimit: "standard";r=1;t=2, "shared";r=2;t=1
	// standard 200 RateLimit: "standard";r=0;t=2, "shared";r=1;t=1
	// standard 429 RateLimit: "standard";r=0;t=2 Retry-After: 2
	// premium  200 RateLimit: "shared";r=0;t=1
	// premium  429 RateLimit: "shared";r=0;t=1 Retry-After: 1
}

// Trying a tighter Spec on production traffic before enforcing it: the
// current Spec is enforced, the candidate decided in shadow on keys of its
// own, and the report counts what the candidate would have refused.
func ExampleWithShadow() {
	client, stop := exampleClient()
	defer stop()

	current := admit.MustSpec(admit.Every(time.Second), 5)
	candidate := admit.MustSpec(admit.Every(time.Second), 2)
	wouldRefuse := 0
	limit, err := admithttp.New(admit.New(client), func(r *http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "api", Key: "rl:{api}:all", Spec: current}}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithShadow(admithttp.Shadow{
			Name: "tighter",
			Rule: func(_ *http.Request, enforced admithttp.Rule) admithttp.Rule {
				enforced.First.Spec = candidate
				return enforced
			},
			Report: func(r admithttp.ShadowReport) {
				if r.Err == nil && !r.Decision.Allowed() {
					wouldRefuse++
				}
			},
		}))
	if err != nil {
		log.Fatal(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	served := 0
	for range 4 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code == http.StatusOK {
			served++
		}
	}
	fmt.Printf("served %d of 4; the candidate would have refused %d\n", served, wouldRefuse)
	// Output: served 4 of 4; the candidate would have refused 2
}

// A per-client limit by address, behind a load balancer at 10.0.0.0/8:
// X-Forwarded-For is believed only when the balancer sent the request, and
// only up to the first address that is not the balancer's.
func ExampleNewClientIP() {
	ip, err := admithttp.NewClientIP("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range []struct{ peer, xff string }{
		{"10.1.2.3:5555", "203.0.113.9"},                 // through the balancer
		{"10.1.2.3:5555", "198.51.100.1, 203.0.113.9"},   // the client forged the first element
		{"203.0.113.9:4444", "198.51.100.1"},             // straight to the service: the header is ignored
		{"[2001:db8:aa:bb:1:2:3:4]:443", ""},             // IPv6: one key per /64
		{"[2001:db8:aa:bb:ffff::9]:443", "198.51.100.1"}, // the same /64
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.peer
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		fmt.Println("rl:ip:" + ip.Key(r))
	}
	// Output:
	// rl:ip:203.0.113.9
	// rl:ip:203.0.113.9
	// rl:ip:203.0.113.9
	// rl:ip:2001:db8:aa:bb::/64
	// rl:ip:2001:db8:aa:bb::/64
}

// Counting what the middleware did, per Outcome, and logging the outages:
// the hook sees every request once.
func ExampleWithOutcome() {
	client, stop := exampleClient()
	defer stop()

	counts := map[admithttp.Outcome]int{}
	limit, err := admithttp.New(admit.New(client), func(r *http.Request) admithttp.Rule {
		if r.URL.Path == "/health" {
			return admithttp.Rule{} // no limit
		}
		user := admit.KeyPart(r.Header.Get("X-User"))
		return admithttp.Rule{First: admithttp.Bucket{Policy: "per-user", Key: "rl:user:" + user, Spec: admit.MustSpec(admit.Every(time.Second), 2)}}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithOutcome(func(e admithttp.Event) {
			counts[e.Outcome]++
			if e.Outcome == admithttp.OutageServed || e.Outcome == admithttp.OutageRefused {
				log.Printf("limiter store: %s: %v", e.Outcome, e.Err)
			}
		}))
	if err != nil {
		log.Fatal(err)
	}
	h := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, path := range []string{"/a", "/a", "/a", "/health"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil)) // no X-User: one shared bucket
	}
	fmt.Println(counts[admithttp.Admitted], "admitted,", counts[admithttp.Refused], "refused,", counts[admithttp.Unlimited], "unlimited")
	// Output: 2 admitted, 1 refused, 1 unlimited
}

// A refusal in the service's own error format: the RateLimit fields and
// Retry-After are already set when the function runs.
func ExampleWithRefusal() {
	client, stop := exampleClient()
	defer stop()

	limit, err := admithttp.New(admit.New(client), func(r *http.Request) admithttp.Rule {
		return admithttp.Rule{First: admithttp.Bucket{Policy: "api", Key: "rl:api", Spec: admit.MustSpec(admit.Every(time.Second), 1)}}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithRefusal(func(w http.ResponseWriter, _ *http.Request, ref admithttp.Refusal) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, `{"error":"rate_limited","policy":%q,"retry_after":%d}`+"\n", ref.Violated.Policy, ref.RetryAfter())
		}))
	if err != nil {
		log.Fatal(err)
	}
	h := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Print(rec.Code, " ", rec.Header().Get("RateLimit"), " Retry-After: ", rec.Header().Get("Retry-After"), "\n", rec.Body.String())
	// Output:
	// 429 "api";r=0;t=1 Retry-After: 1
	// {"error":"rate_limited","policy":"api","retry_after":1}
}

// At most 2 requests of an organisation in flight, beside its requests a
// minute, in one decision: a request holds a slot while its handler runs,
// and the third at once is refused by the concurrency policy, taking no
// token.
func ExampleConcurrent() {
	client, stop := exampleClient()
	defer stop()

	perMinute := admit.MustSpec(admit.Every(time.Second), 60)
	inflight := admit.MustConcurrency(2, 30*time.Second) // a lease longer than the slowest handler
	limit, err := admithttp.New(admit.New(client), func(r *http.Request) admithttp.Rule {
		org := admit.KeyPart(r.Header.Get("X-Org"))
		return admithttp.Rule{
			// RetryAfter: about how long a handler holds its place, what
			// a refusal tells the client to wait (at most until the
			// oldest lease expires).
			Concurrent: &admithttp.Concurrent{Policy: "inflight", Key: "conc:{org:" + org + "}", Spec: inflight, RetryAfter: 2 * time.Second},
			First:      admithttp.Bucket{Policy: "per-minute", Key: "rpm:{org:" + org + "}", Spec: perMinute},
		}
	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse})
	if err != nil {
		log.Fatal(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-finish // a slow upstream
	}))
	send := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Org", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	done := make(chan int)
	for range 2 {
		go func() { done <- send().Code }()
		<-started
	}
	rec := send() // both slots are taken
	fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"))
	fmt.Println("RateLimit:", rec.Header().Get("RateLimit"), "Retry-After:", rec.Header().Get("Retry-After"))
	close(finish)
	fmt.Println(<-done, <-done)
	go func() { <-started }()
	fmt.Println(send().Code) // a slot is free again
	// Output:
	// 429 "inflight";q=2;qu="concurrent-requests", "per-minute";q=60;w=60
	// RateLimit: "inflight";r=0;t=2 Retry-After: 2
	// 200 200
	// 200
}
