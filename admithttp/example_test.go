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
