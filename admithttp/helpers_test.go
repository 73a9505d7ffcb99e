package admithttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}

// One token a minute: on a server whose clock the test freezes, no bucket
// refills while a test runs, so every count and every header is exact.
var (
	sharedSpec   = admit.MustSpec(admit.Every(time.Minute), 10)
	standardSpec = admit.MustSpec(admit.Every(time.Minute), 6)
)

// t0 is the frozen clock of the miniredis servers.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// newMini returns a client on an in-process miniredis whose clock stands
// still at t0, and the server.
func newMini(t *testing.T) (*miniredis.Miniredis, valkey.Client) {
	t.Helper()
	srv := miniredis.RunT(t)
	srv.SetTime(t0)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return srv, c
}

// lanes is the classifier of the tests: X-Plan premium draws on the shared
// bucket alone, X-Plan standard on the user's own bucket, then the shared
// one; no X-Plan, no limit. Every key is under prefix.
func lanes(prefix string) func(*http.Request) admithttp.Rule {
	return func(r *http.Request) admithttp.Rule {
		shared := admithttp.Bucket{Policy: "shared", Key: prefix + "{api}:shared", Spec: sharedSpec}
		switch r.Header.Get("X-Plan") {
		case "premium":
			return admithttp.Rule{First: shared}
		case "standard":
			own := admithttp.Bucket{Policy: "standard", Key: prefix + "{api}:standard:" + r.Header.Get("X-User"), Spec: standardSpec}
			return admithttp.Rule{First: own, Second: &shared}
		}
		return admithttp.Rule{}
	}
}

// refuseAll is an Outage that refuses on both classes.
var refuseAll = admithttp.Outage{NotExecuted: admithttp.Refuse, OutcomeUnknown: admithttp.Refuse}

// A recordingHandler answers 200 "ok" and counts its calls, keeping the
// Admission it found in the last request's context.
type recordingHandler struct {
	calls     int
	admission admithttp.Admission
	admitted  bool
}

func (h *recordingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls++
	h.admission, h.admitted = admithttp.FromContext(r.Context())
	io.WriteString(w, "ok")
}

func mustNew(t *testing.T, lim *admit.Limiter, classify func(*http.Request) admithttp.Rule, outage admithttp.Outage, opts ...admithttp.Option) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := admithttp.New(lim, classify, outage, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// send serves one GET with the given plan and user.
func send(h http.Handler, plan, user string) *httptest.ResponseRecorder {
	return sendCtx(context.Background(), h, plan, user)
}

func sendCtx(ctx context.Context, h http.Handler, plan, user string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/things", nil)
	if plan != "" {
		req.Header.Set("X-Plan", plan)
	}
	if user != "" {
		req.Header.Set("X-User", user)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// quotaUnits are the draft's registered quota units (section 10.3).
var quotaUnits = map[string]bool{"requests": true, "content-bytes": true, "concurrent-requests": true}

var delaySeconds = regexp.MustCompile(`^[0-9]+$`)

// checkFields checks h's RateLimit-Policy, RateLimit and Retry-After
// against draft-ietf-httpapi-ratelimit-headers-11 and the package's
// promises, and returns nil, or an error naming the rule broken:
//
//   - RateLimit-Policy is a non-empty List of Items whose values are
//     Strings, distinct, each with q (a non-negative Integer), w if any (a
//     positive Integer), qu if any (a registered unit); sections 3, 3.1;
//   - RateLimit is a List of Items whose values are Strings naming a
//     policy of RateLimit-Policy, at most once each, with r (a
//     non-negative Integer) and t if any (a non-negative Integer);
//     sections 4, 4.1;
//   - a policy whose r is below its q has a t (its next token comes some
//     time), and a full one (r = q) has none (nothing more comes);
//   - Retry-After, if any, is delay-seconds (RFC 9110 section 10.2.3) and
//     comes with the violated policy violated, which RateLimit lists
//     with a t that Retry-After is never earlier than (section 6).
//
// A response without RateLimit-Policy must carry no RateLimit either.
func checkFields(h http.Header, violated string) error {
	policyValues, limitValues := h.Values(admithttp.PolicyField), h.Values(admithttp.LimitField)
	if len(policyValues) == 0 {
		if len(limitValues) != 0 {
			return fmt.Errorf("RateLimit %q without RateLimit-Policy", limitValues)
		}
		return nil
	}
	policies, err := parseSFList(joinField(policyValues))
	if err != nil {
		return fmt.Errorf("RateLimit-Policy: %w", err)
	}
	if len(policies) == 0 {
		return fmt.Errorf("RateLimit-Policy: empty List; section 3 wants a non-empty one")
	}
	quota := map[string]int64{}
	for _, p := range policies {
		name, ok := p.Value.(string)
		if !ok {
			return fmt.Errorf("RateLimit-Policy: item %v is a %T; section 3 wants a String", p.Value, p.Value)
		}
		if _, dup := quota[name]; dup {
			return fmt.Errorf("RateLimit-Policy: policy %q twice", name)
		}
		q, ok := p.param(admithttp.QuotaParam)
		n, isInt := q.(int64)
		if !ok || !isInt || n < 0 {
			return fmt.Errorf("RateLimit-Policy %q: q = %v; section 3.1.1 wants a non-negative Integer", name, q)
		}
		quota[name] = n
		if w, ok := p.param(admithttp.WindowParam); ok {
			if n, isInt := w.(int64); !isInt || n <= 0 {
				return fmt.Errorf("RateLimit-Policy %q: w = %v; section 3.1.3 wants a positive Integer", name, w)
			}
		}
		if qu, ok := p.param(admithttp.UnitParam); ok {
			if s, isStr := qu.(string); !isStr || !quotaUnits[s] {
				return fmt.Errorf("RateLimit-Policy %q: qu = %v; section 3.1.2 wants a registered unit's String", name, qu)
			}
		}
	}
	limits, err := parseSFList(joinField(limitValues))
	if err != nil {
		return fmt.Errorf("RateLimit: %w", err)
	}
	windows := map[string]int64{}
	for _, l := range limits {
		name, ok := l.Value.(string)
		if _, known := quota[name]; !ok || !known {
			return fmt.Errorf("RateLimit: item %v names no policy of RateLimit-Policy", l.Value)
		}
		if _, dup := windows[name]; dup {
			return fmt.Errorf("RateLimit: policy %q twice", name)
		}
		windows[name] = -1
		r, ok := l.param(admithttp.RemainingParam)
		rn, isInt := r.(int64)
		if !ok || !isInt || rn < 0 {
			return fmt.Errorf("RateLimit %q: r = %v; section 4.1.1 wants a non-negative Integer", name, r)
		}
		t, hasT := l.param(admithttp.ResetParam)
		if hasT {
			n, isInt := t.(int64)
			if !isInt || n < 0 {
				return fmt.Errorf("RateLimit %q: t = %v; section 4.1.2 wants a non-negative Integer", name, t)
			}
			windows[name] = n
		}
		if full := rn >= quota[name]; full == hasT {
			return fmt.Errorf("RateLimit %q: r=%d of q=%d with t %v; t is the seconds until the bucket holds more than r: "+
				"present below q, absent at q", name, rn, quota[name], t)
		}
	}
	ra := h.Get("Retry-After")
	switch {
	case ra == "" && violated != "":
		return fmt.Errorf("a refusal by %q without Retry-After", violated)
	case ra == "":
		return nil
	case !delaySeconds.MatchString(ra):
		return fmt.Errorf("Retry-After %q is not delay-seconds", ra)
	}
	n, _ := strconv.ParseInt(ra, 10, 64)
	t, listed := windows[violated]
	switch {
	case !listed || t < 0:
		return fmt.Errorf("Retry-After %d, and RateLimit lists no t for the violated policy %q", n, violated)
	case n < t:
		return fmt.Errorf("Retry-After %d points before the end of the violated policy %q's effective window (t=%d)", n, violated, t)
	}
	return nil
}

func joinField(values []string) string {
	s := ""
	for i, v := range values {
		if i > 0 {
			s += ", "
		}
		s += v
	}
	return s
}

// problemOf decodes rec's application/problem+json body.
func problemOf(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %q", ct, rec.Body.String())
	}
	var p map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return p
}
