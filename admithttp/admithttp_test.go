package admithttp_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/model"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/valkey-io/valkey-go"
)

// A step is one request and the response it must get, header for header.
type step struct {
	plan, user string
	status     int
	policy     string // RateLimit-Policy
	limit      string // RateLimit
	retryAfter string
	violated   string // the problem body's one violated policy
}

var (
	stdPolicy     = fmtPolicy("standard", 6, 360) + ", " + fmtPolicy("shared", 10, 600)
	premiumPolicy = fmtPolicy("shared", 10, 600)
)

// premiumStory: standard traffic spends its own 6 of the shared 10 and is
// refused by its own bucket; premium still gets the other 4, then the
// shared bucket refuses everyone. A standard request of a fresh user is
// admitted by its own bucket and refused by the shared one: all or
// nothing, its own bucket is not charged (r=6, full: no t). Every bucket
// gains a token a minute and the clock stands still, so the next token of
// every bucket not refusing is exactly a minute away (t=60).
func premiumStory() []step {
	var steps []step
	for k := 1; k <= 6; k++ {
		steps = append(steps, step{plan: "standard", user: "u1", status: 200, policy: stdPolicy,
			limit: fmtLimit("standard", 6-k, 60) + ", " + fmtLimit("shared", 10-k, 60)})
	}
	steps = append(steps, step{plan: "standard", user: "u1", status: 429, policy: stdPolicy,
		limit: fmtLimit("standard", 0, 60), retryAfter: "60", violated: "standard"})
	for k := 1; k <= 4; k++ {
		steps = append(steps, step{plan: "premium", status: 200, policy: premiumPolicy,
			limit: fmtLimit("shared", 4-k, 60)})
	}
	steps = append(steps,
		step{plan: "premium", status: 429, policy: premiumPolicy, limit: fmtLimit("shared", 0, 60), retryAfter: "60", violated: "shared"},
		step{plan: "standard", user: "u2", status: 429, policy: stdPolicy,
			limit: fmtLimit("standard", 6, -1) + ", " + fmtLimit("shared", 0, 60), retryAfter: "60", violated: "shared"},
		step{plan: "", status: 200}, // no limit: no field
	)
	return steps
}

// fmtLimit is one item of RateLimit; t < 0 leaves the t parameter out.
func fmtLimit(name string, r, t int) string {
	s := `"` + name + `";` + admithttp.RemainingParam + "=" + strconv.Itoa(r)
	if t >= 0 {
		s += ";" + admithttp.ResetParam + "=" + strconv.Itoa(t)
	}
	return s
}

// fmtPolicy is one item of RateLimit-Policy.
func fmtPolicy(name string, q, w int) string {
	return `"` + name + `";` + admithttp.QuotaParam + "=" + strconv.Itoa(q) + ";" + admithttp.WindowParam + "=" + strconv.Itoa(w)
}

// runSteps serves each step through h and checks status, fields, body and
// whether the handler ran.
func runSteps(t *testing.T, h http.Handler, next *recordingHandler, steps []step, headersOnAdmit bool) {
	t.Helper()
	for i, st := range steps {
		calls := next.calls
		rec := send(h, st.plan, st.user)
		name := st.plan + "/" + st.user
		if rec.Code != st.status {
			t.Fatalf("step %d (%s): status %d, want %d; body %q", i, name, rec.Code, st.status, rec.Body.String())
		}
		if err := checkFields(rec.Header(), st.violated); err != nil {
			t.Errorf("step %d (%s): %v", i, name, err)
		}
		wantPolicy, wantLimit := st.policy, st.limit
		if st.status == 200 && !headersOnAdmit {
			wantPolicy, wantLimit = "", ""
		}
		got := []string{rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After")}
		if diff := cmp.Diff([]string{wantPolicy, wantLimit, st.retryAfter}, got); diff != "" {
			t.Errorf("step %d (%s): RateLimit-Policy, RateLimit, Retry-After (-want +got):\n%s", i, name, diff)
		}
		ran := next.calls - calls
		if st.status == 200 {
			if ran != 1 || rec.Body.String() != "ok" {
				t.Errorf("step %d (%s): handler ran %d times, body %q; want once, \"ok\"", i, name, ran, rec.Body.String())
			}
			if next.admitted != (st.plan != "") {
				t.Errorf("step %d (%s): FromContext ok = %v", i, name, next.admitted)
			}
			continue
		}
		if ran != 0 {
			t.Errorf("step %d (%s): refused, yet the handler ran", i, name)
		}
		want := map[string]any{
			"type":              admithttp.QuotaExceeded,
			"title":             "Request cannot be satisfied as assigned quota has been exceeded",
			"status":            float64(429),
			"detail":            `policy "` + st.violated + `" holds 0 of the 1 this request needs; retry after ` + st.retryAfter + " s",
			"violated-policies": []any{st.violated},
		}
		if diff := cmp.Diff(want, problemOf(t, rec)); diff != "" {
			t.Errorf("step %d (%s): problem body (-want +got):\n%s", i, name, diff)
		}
	}
}

func TestPremiumAdmittedWhileStandardRefused(t *testing.T) {
	for _, headers := range []bool{true, false} {
		t.Run("headers-on-admit="+map[bool]string{true: "yes", false: "no"}[headers], func(t *testing.T) {
			_, c := minitest.Start(t)
			lim := admit.New(c)
			var opts []admithttp.Option
			if headers {
				opts = append(opts, admithttp.WithHeaders())
			}
			next := &recordingHandler{}
			h := mustNew(t, lim, lanes("t:"), refuseAll, opts...)(next)
			runSteps(t, h, next, premiumStory(), headers)

			// What the buckets hold, by the server: u2's own bucket was
			// not charged (a take leaves 5 of 6), the shared one is empty.
			ctx := context.Background()
			d, err := lim.AllowOrdered(ctx, admit.Request{Key: "t:{api}:standard:u2", Spec: standardSpec}, nil)
			if err != nil || d.Remaining[0] != 5 {
				t.Errorf("u2's bucket after a take: %v %v; want 5 left (the shared refusal charged it nothing)", d.Remaining, err)
			}
			d, err = lim.AllowOrdered(ctx, admit.Request{Key: "t:{api}:shared", Spec: sharedSpec}, nil)
			if err != nil || d.Denied != 1 || d.Remaining[0] != 0 {
				t.Errorf("shared bucket: %v %v %v; want refused with 0 left", d, d.Remaining, err)
			}
		})
	}
}

// TestAdmissionInContext: the handler finds the Rule and Decision of its
// admission, and turns them into admit's arguments for a refund.
func TestAdmissionInContext(t *testing.T) {
	_, c := minitest.Start(t)
	next := &recordingHandler{}
	h := mustNew(t, admit.New(c), lanes("t:"), refuseAll)(next)
	if rec := send(h, "standard", "u1"); rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	a := next.admission
	if !next.admitted || !a.Decision.Allowed() || a.Decision.Remaining != [2]int{5, 9} {
		t.Fatalf("admission %+v (ok %v); want allowed with Remaining [5 9]", a, next.admitted)
	}
	first, second := a.Rule.Requests()
	want := admit.Request{Key: "t:{api}:standard:u1", Spec: standardSpec}
	if first != want || second == nil || second.Key != "t:{api}:shared" || second.Spec != sharedSpec {
		t.Errorf("Requests() = %+v, %+v", first, second)
	}
}

// TestRetryAfterNeverShort: Retry-After is RetryAfter rounded up to a whole
// second, never down, and equal when RetryAfter is whole.
func TestRetryAfterNeverShort(t *testing.T) {
	spec := admit.MustSpec(admit.Every(1500*time.Millisecond), 1)
	for _, c := range []struct {
		after time.Duration // how long after the take the refused request comes
		want  string
	}{
		{0, "2"},                      // 1.5 s
		{500 * time.Millisecond, "1"}, // 1 s exactly
		{501 * time.Millisecond, "1"}, // 0.999 s
		{1499 * time.Millisecond, "1"},
	} {
		srv, cl := minitest.Start(t)
		h := mustNew(t, admit.New(cl), func(*http.Request) admithttp.Rule {
			return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: spec}}
		}, refuseAll)(&recordingHandler{})
		if rec := send(h, "", ""); rec.Code != 200 {
			t.Fatalf("first request: %d", rec.Code)
		}
		srv.SetTime(minitest.Epoch.Add(c.after))
		rec := send(h, "", "")
		if rec.Code != 429 || rec.Header().Get("Retry-After") != c.want {
			t.Errorf("%v after the take: %d, Retry-After %q; want 429, %q", c.after, rec.Code, rec.Header().Get("Retry-After"), c.want)
		}
		if got := rec.Header().Get("RateLimit"); got != `"p";r=0;t=`+c.want {
			t.Errorf("%v after the take: RateLimit %q; want t equal to Retry-After", c.after, got)
		}
		if err := checkFields(rec.Header(), "p"); err != nil {
			t.Error(err)
		}
	}
}

// TestFieldValues: policy names and units are Structured Field Strings,
// escaped and read back as given; Cost above 1 shows in r; w is never 0;
// t of a bucket that admits is its Interval rounded up (a millisecond: 1).
func TestFieldValues(t *testing.T) {
	_, c := minitest.Start(t)
	fast := admit.MustSpec(admit.Every(time.Millisecond), 3) // refills in 3 ms: w rounds up to 1
	bytes := admit.MustSpec(1000, 4000)
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule {
		first := admithttp.Bucket{Policy: `we "quote" \ and slash`, Key: "{x}:a", Spec: fast}
		return admithttp.Rule{First: first, Second: &admithttp.Bucket{Policy: "bytes", Key: "{x}:b", Spec: bytes, Cost: 1500, Unit: "content-bytes"}}
	}, refuseAll, admithttp.WithHeaders())(&recordingHandler{})
	rec := send(h, "", "")
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	if err := checkFields(rec.Header(), ""); err != nil {
		t.Error(err)
	}
	wantPolicy := `"we \"quote\" \\ and slash";q=3;w=1, "bytes";q=4000;qu="content-bytes";w=4`
	wantLimit := `"we \"quote\" \\ and slash";r=2;t=1, "bytes";r=2500;t=1`
	if got := rec.Header().Get("RateLimit-Policy"); got != wantPolicy {
		t.Errorf("RateLimit-Policy\n got %s\nwant %s", got, wantPolicy)
	}
	if got := rec.Header().Get("RateLimit"); got != wantLimit {
		t.Errorf("RateLimit\n got %s\nwant %s", got, wantLimit)
	}
	items, err := parseSFList(rec.Header().Get("RateLimit-Policy"))
	if err != nil || len(items) != 2 || items[0].Value != `we "quote" \ and slash` {
		t.Errorf("parsed back: %+v %v", items, err)
	}
}

// TestInvalidRule: a Rule the fields cannot carry, or that admit refuses,
// is answered 500, whatever the Outage says (even Serve), the handler does
// not run, the error goes to WithErrorFunc, and nothing is written.
func TestInvalidRule(t *testing.T) {
	for _, c := range []struct {
		name string
		rule admithttp.Rule
		says string
	}{
		{"cost-above-burst", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: sharedSpec, Cost: 11}}, "burst"},
		{"no-policy-name", admithttp.Rule{First: admithttp.Bucket{Key: "k", Spec: sharedSpec}}, "empty policy name"},
		{"non-ascii-name", admithttp.Rule{First: admithttp.Bucket{Policy: "café", Key: "k", Spec: sharedSpec}}, "printable ASCII"},
		{"bad-unit", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: sharedSpec, Unit: "tok\x00ens"}}, "unit"},
		{"same-name-twice", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "{x}k", Spec: sharedSpec},
			Second: &admithttp.Bucket{Policy: "p", Key: "{x}j", Spec: sharedSpec}}, "name each bucket differently"},
		{"shadow-namespace", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: admithttp.ShadowPrefix + "k", Spec: sharedSpec}}, "namespace"},
		{"zero-spec", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k"}}, "Spec"},
		{"empty-first-key", admithttp.Rule{First: admithttp.Bucket{Policy: "f", Spec: sharedSpec},
			Second: &admithttp.Bucket{Policy: "p", Key: "k", Spec: sharedSpec}}, "empty Key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, cl := minitest.Start(t)
			var errs []error
			next := &recordingHandler{}
			h := mustNew(t, admit.New(cl), func(*http.Request) admithttp.Rule { return c.rule },
				admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Serve},
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(next)
			rec := send(h, "", "")
			if rec.Code != 500 || next.calls != 0 {
				t.Errorf("status %d, handler ran %d times; want 500 and never", rec.Code, next.calls)
			}
			want := map[string]any{"type": "about:blank", "title": "Internal Server Error", "status": float64(500),
				"detail": "the rate-limit rule for this request is invalid"}
			if diff := cmp.Diff(want, problemOf(t, rec)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			if len(errs) != 1 || !errors.Is(errs[0], admit.ErrInvalidRequest) || !errors.Is(errs[0], admit.ErrNotExecuted) ||
				!strings.Contains(errs[0].Error(), c.says) {
				t.Errorf("errors %v; want one ErrInvalidRequest, ErrNotExecuted saying %q", errs, c.says)
			}
			if keys := srv.Keys(); len(keys) != 0 {
				t.Errorf("keys written: %q", keys)
			}
		})
	}
}

// TestZeroRuleNoLimit: the zero Rule runs the handler with no field, no
// Admission and no key written.
func TestZeroRuleNoLimit(t *testing.T) {
	srv, c := minitest.Start(t)
	next := &recordingHandler{}
	h := mustNew(t, admit.New(c), lanes("t:"), refuseAll, admithttp.WithHeaders())(next)
	for range 3 {
		rec := send(h, "", "")
		if rec.Code != 200 || rec.Header().Get("RateLimit-Policy") != "" || rec.Header().Get("RateLimit") != "" || next.admitted {
			t.Errorf("status %d, fields %q %q, admission %v", rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), next.admitted)
		}
	}
	if next.calls != 3 || len(srv.Keys()) != 0 {
		t.Errorf("handler ran %d times (want 3); keys %q (want none)", next.calls, srv.Keys())
	}
}

// TestNewRefuses: no middleware without a Limiter, a classifier and both
// outage handlers; bad options are errors too.
func TestNewRefuses(t *testing.T) {
	_, c := minitest.Start(t)
	lim := admit.New(c)
	classify := lanes("t:")
	report := func(admithttp.ShadowReport) {}
	rule := func(*http.Request, admithttp.Rule) admithttp.Rule { return admithttp.Rule{} }
	for _, tc := range []struct {
		name     string
		lim      admit.Decider
		classify func(*http.Request) admithttp.Rule
		outage   admithttp.Outage
		opts     []admithttp.Option
		says     string
	}{
		{"no-outage", lim, classify, admithttp.Outage{}, nil, "Outage needs both NotExecuted and OutcomeUnknown"},
		{"no-not-executed", lim, classify, admithttp.Outage{OutcomeUnknown: admithttp.Refuse}, nil, "Outage needs both"},
		{"no-outcome-unknown", lim, classify, admithttp.Outage{NotExecuted: admithttp.Serve}, nil, "Outage needs both"},
		{"no-decider", nil, classify, refuseAll, nil, "nil decider"},
		{"nil-limiter", (*admit.Limiter)(nil), classify, refuseAll, nil, "has no client"},
		{"limiter-without-client", admit.New(nil), classify, refuseAll, nil, "has no client"},
		{"no-classify", lim, nil, refuseAll, nil, "nil classify"},
		{"nil-error-func", lim, classify, refuseAll, []admithttp.Option{admithttp.WithErrorFunc(nil)}, "WithErrorFunc(nil)"},
		{"shadow-no-name", lim, classify, refuseAll, []admithttp.Option{admithttp.WithShadow(admithttp.Shadow{Rule: rule, Report: report})}, "empty Name"},
		{"shadow-brace", lim, classify, refuseAll, []admithttp.Option{admithttp.WithShadow(admithttp.Shadow{Name: "a{b}", Rule: rule, Report: report})}, "brace"},
		{"shadow-non-ascii", lim, classify, refuseAll, []admithttp.Option{admithttp.WithShadow(admithttp.Shadow{Name: "é", Rule: rule, Report: report})}, "printable ASCII"},
		{"shadow-no-rule", lim, classify, refuseAll, []admithttp.Option{admithttp.WithShadow(admithttp.Shadow{Name: "s", Report: report})}, "nil Rule"},
		{"shadow-no-report", lim, classify, refuseAll, []admithttp.Option{admithttp.WithShadow(admithttp.Shadow{Name: "s", Rule: rule})}, "nil Report"},
		{"shadow-twice", lim, classify, refuseAll, []admithttp.Option{
			admithttp.WithShadow(admithttp.Shadow{Name: "s", Rule: rule, Report: report}),
			admithttp.WithShadow(admithttp.Shadow{Name: "s", Rule: rule, Report: report})}, "two shadows named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := admithttp.New(tc.lim, tc.classify, tc.outage, tc.opts...)
			if err == nil || mw != nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("New: %v (middleware %v); want an error saying %q", err, mw != nil, tc.says)
			}
		})
	}
}

// perUserSpec is the per-user bucket of TestMissingHeaderNeverUnlimited:
// 50 at once, a token a minute (the clock stands still).
var perUserSpec = admit.MustSpec(admit.Every(time.Minute), 50)

// TestMissingHeaderNeverUnlimited: a classify that builds the key from a
// header the request lacks returns a Rule with an empty Key. That Rule is
// invalid (500, the error reported, the handler never run), not the zero
// Rule: 300 requests without the header get no 200. With the key part
// built by admit.KeyPart, the requests without the header share one
// bucket: 50 admitted, 250 refused, as with any one user.
func TestMissingHeaderNeverUnlimited(t *testing.T) {
	for _, tc := range []struct {
		name          string
		key           func(*http.Request) string
		status200     int
		status429     int
		status500     int
		errorsWritten int
	}{
		{"raw-header", func(r *http.Request) string { return r.Header.Get("X-User") }, 0, 0, 300, 300},
		{"key-part", func(r *http.Request) string { return "rl:user:" + admit.KeyPart(r.Header.Get("X-User")) }, 50, 250, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c := minitest.Start(t)
			var errs []error
			next := &recordingHandler{}
			h := mustNew(t, admit.New(c), func(r *http.Request) admithttp.Rule {
				return admithttp.Rule{First: admithttp.Bucket{Policy: "per-user", Key: tc.key(r), Spec: perUserSpec}}
			}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Serve},
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(next)
			codes := map[int]int{}
			for range 300 {
				codes[send(h, "", "").Code]++
			}
			if codes[200] != tc.status200 || codes[429] != tc.status429 || codes[500] != tc.status500 || next.calls != tc.status200 {
				t.Errorf("statuses %v, handler ran %d times; want %d 200, %d 429, %d 500", codes, next.calls, tc.status200, tc.status429, tc.status500)
			}
			if len(errs) != tc.errorsWritten {
				t.Fatalf("%d errors reported; want %d", len(errs), tc.errorsWritten)
			}
			if len(errs) > 0 && (!errors.Is(errs[0], admit.ErrInvalidRequest) || !strings.Contains(errs[0].Error(), "empty Key")) {
				t.Errorf("error %v; want ErrInvalidRequest naming the empty Key", errs[0])
			}
		})
	}
}

// TestIncompleteRuleIsInvalid: a Rule with any field set and a field
// missing is answered 500, whatever Outage says, and writes nothing; only
// the zero Rule imposes no limit.
func TestIncompleteRuleIsInvalid(t *testing.T) {
	full := admithttp.Bucket{Policy: "p", Key: "{x}:a", Spec: sharedSpec}
	for _, tc := range []struct {
		name string
		rule admithttp.Rule
		says string
	}{
		{"policy-and-spec-only", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Spec: sharedSpec}}, "empty Key"},
		{"cost-only", admithttp.Rule{First: admithttp.Bucket{Cost: 3}}, "empty Key"},
		{"unit-only", admithttp.Rule{First: admithttp.Bucket{Unit: "requests"}}, "empty Key"},
		{"no-policy", admithttp.Rule{First: admithttp.Bucket{Key: "k", Spec: sharedSpec}}, "empty policy name"},
		{"zero-spec", admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k"}}, "zero Spec"},
		{"zero-second", admithttp.Rule{First: full, Second: &admithttp.Bucket{}}, "bucket 2"},
		{"second-empty-key", admithttp.Rule{First: full, Second: &admithttp.Bucket{Policy: "s", Spec: sharedSpec}}, "empty Key"},
		{"zero-first-with-second", admithttp.Rule{Second: &full}, "bucket 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rule.IsZero() {
				t.Fatal("IsZero")
			}
			srv, c := minitest.Start(t)
			var errs []error
			next := &recordingHandler{}
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return tc.rule },
				admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Serve},
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(next)
			if rec := send(h, "", ""); rec.Code != 500 || next.calls != 0 {
				t.Errorf("status %d, handler ran %d times; want 500, never", rec.Code, next.calls)
			}
			if len(errs) != 1 || !errors.Is(errs[0], admit.ErrInvalidRequest) || !strings.Contains(errs[0].Error(), tc.says) {
				t.Errorf("errors %v; want one ErrInvalidRequest saying %q", errs, tc.says)
			}
			if keys := srv.Keys(); len(keys) != 0 {
				t.Errorf("keys written: %q", keys)
			}
		})
	}
	if !(admithttp.Rule{}).IsZero() {
		t.Error("the zero Rule is not IsZero")
	}
}

// TestNewRefusesLimiterWithoutClient: a Limiter without a client is
// refused at New, not answered 500 on every request.
func TestNewRefusesLimiterWithoutClient(t *testing.T) {
	for name, lim := range map[string]*admit.Limiter{"New(nil)": admit.New(nil), "zero Limiter": {}} {
		mw, err := admithttp.New(lim, lanes("t:"), refuseAll)
		if err == nil || mw != nil || !strings.Contains(err.Error(), "no client") {
			t.Errorf("%s: %v; want an error saying the Limiter has no client", name, err)
		}
	}
	_, c := minitest.Start(t)
	if _, err := admithttp.New(admit.New(c), lanes("t:"), refuseAll); err != nil {
		t.Errorf("a Limiter with a client: %v", err)
	}
}

func TestMain(m *testing.M) { testserver.Main(m) }

// One token a minute: on a server whose clock the test freezes, no bucket
// refills while a test runs, so every count and every header is exact.
var (
	sharedSpec   = admit.MustSpec(admit.Every(time.Minute), 10)
	standardSpec = admit.MustSpec(admit.Every(time.Minute), 6)
)

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

// A Rule's concurrency part, on miniredis, whose clock the tests freeze:
// no lease expires while a test runs unless the test moves the clock.

// concSpec is the concurrency part of these tests: 4 at once, a lease of
// 30 s.
var concSpec = admit.MustConcurrency(4, 30*time.Second)

// wideSpec is a bucket that no test here empties.
var wideSpec = admit.MustSpec(admit.Every(time.Minute), 1000)

// concRule is a Rule of a concurrency part (policy "conc") and one bucket
// (policy "tpm"), both under prefix with the hash tag {org}.
func concRule(prefix string, spec admit.Concurrency, bucket admit.Spec) admithttp.Rule {
	return admithttp.Rule{
		Concurrent: &admithttp.Concurrent{Policy: "conc", Key: prefix + "{org}:conc", Spec: spec},
		First:      admithttp.Bucket{Policy: "tpm", Key: prefix + "{org}:tpm", Spec: bucket},
	}
}

// holders is the number of members of the lease key: the slots taken.
func holders(t *testing.T, c valkey.Client, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("ZCARD %s: %v", key, err)
	}
	return n
}

// inFlight counts the handlers running at once, exactly, and the most it
// has seen.
type inFlight struct {
	now, most atomic.Int64
}

func (f *inFlight) enter() int64 {
	n := f.now.Add(1)
	for {
		m := f.most.Load()
		if n <= m || f.most.CompareAndSwap(m, n) {
			return n
		}
	}
}

func (f *inFlight) leave() { f.now.Add(-1) }

// TestConcurrentAtMostN: atMostN with a limit of 4 on miniredis, whose
// clock stands still.
func TestConcurrentAtMostN(t *testing.T) {
	_, c := minitest.Start(t)
	atMostN(t, c, concRule("atmost:", concSpec, wideSpec), true)
}

// atMostN sends rule (a concurrency limit of n, and a bucket that holds
// enough for every request) 50 clients over real HTTP. First gated: the n
// admitted handlers hold their slots until the others have been refused,
// so exactly n run, n slots are taken, and every other client gets a 429
// naming the concurrency policy, whose fields pass the draft's checks and
// say the slot refused (r=0, t up to the lease; exactly the lease on a
// frozen clock) with no bucket evaluated; the admitted see both parts in
// RateLimit-Policy. Then free-running, 50 clients of 10 requests each,
// never more than n inside at once; then n+1 panicking handlers, each of
// which frees its slot. After each phase every slot is free again, the
// error hook heard nothing, and the bucket paid for the admitted requests
// only.
func atMostN(t *testing.T, c valkey.Client, rule admithttp.Rule, frozenClock bool) {
	const clients = 50
	n := int64(rule.Concurrent.Spec.Limit())
	bucket := rule.First.Spec
	var (
		flight     inFlight
		full       = make(chan struct{})
		gate       = make(chan struct{})
		fullOnce   sync.Once
		gated      atomic.Bool
		panicked   atomic.Int64
		fieldsSeen atomic.Value
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
			fieldsSeen.Store(w.Header().Clone())
			select {
			case <-gate:
			case <-time.After(10 * time.Second): // bound: the test fails below
			}
		}
		io.WriteString(w, "ok")
	})
	// A decision timeout well above the default release bound of a second,
	// which a loaded machine (the race detector, 50 clients) may exceed.
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll, admithttp.WithHeaders(),
		admithttp.WithDecisionTimeout(10*time.Second),
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { t.Errorf("error hook: %v", err) }))(next)
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	get := func(panics bool) (int, http.Header, []byte, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if panics {
			req.Header.Set("X-Panic", "1")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, body, err
	}

	type answer struct {
		code int
		err  error
	}
	answers := make(chan answer, clients)
	for range clients {
		go func() {
			code, hdr, body, err := get(false)
			a := answer{code: code, err: err}
			if err == nil && code == http.StatusTooManyRequests {
				a.err = checkFields(hdr, "conc")
				var p map[string]any
				if err := json.Unmarshal(body, &p); err != nil || fmt.Sprint(p["violated-policies"]) != "[conc]" {
					a.err = errors.Join(a.err, fmt.Errorf("problem %s (%v), want violated-policies [conc]", body, err))
				}
				got, _ := strings.CutPrefix(hdr.Get(admithttp.LimitField), `"conc";r=0;t=`)
				// t and Retry-After: the default hint, 1 s, below every
				// lease's time left here.
				if tt, err := strconv.ParseInt(got, 10, 64); err != nil || tt != 1 || hdr.Get("Retry-After") != "1" {
					a.err = errors.Join(a.err, fmt.Errorf("RateLimit %q, Retry-After %q; want %q and 1: the slot refused, no bucket evaluated",
						hdr.Get(admithttp.LimitField), hdr.Get("Retry-After"), `"conc";r=0;t=1`))
				}
			}
			answers <- a
		}()
	}
	select {
	case <-full:
	case <-time.After(10 * time.Second):
		t.Fatalf("the limit's %d handlers never ran at once", n)
	}
	count := map[int]int{}
	for range clients - n {
		select {
		case a := <-answers:
			count[a.code]++
			if a.err != nil {
				t.Error(a.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("answers so far %v; want %d refusals while the %d slots are held", count, clients-n, n)
		}
	}
	if count[http.StatusTooManyRequests] != int(clients-n) {
		t.Fatalf("while %d handlers held their slots: %v; want %d refusals", n, count, clients-n)
	}
	if got := holders(t, c, rule.Concurrent.Key); got != n {
		t.Errorf("%d slots taken while %d handlers run", got, n)
	}
	h0 := fieldsSeen.Load().(http.Header)
	if err := checkFields(h0, ""); err != nil {
		t.Error(err)
	}
	wantPolicy := fmt.Sprintf(`"conc";q=%d;qu="concurrent-requests", "tpm";q=%d;w=%d`,
		n, bucket.Burst(), int64(bucket.Burst())*int64(bucket.Interval()/time.Second))
	if got := h0.Get(admithttp.PolicyField); got != wantPolicy {
		t.Errorf("RateLimit-Policy %q, want %q", got, wantPolicy)
	}
	close(gate)
	for range n {
		if a := <-answers; a.err != nil || a.code != http.StatusOK {
			t.Errorf("an admitted request answered %d %v", a.code, a.err)
		}
	}
	if most := flight.most.Load(); most != n {
		t.Errorf("at most %d handlers inside at once, want exactly %d", most, n)
	}
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots still taken after every handler returned", got)
	}

	// Free-running: bounded, 50 × 10 requests.
	gated.Store(false)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range 10 {
				code, _, _, err := get(false)
				switch {
				case err != nil:
					t.Error(err)
				case code == http.StatusOK:
					admitted.Add(1)
				case code == http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("status %d", code)
				}
			}
		})
	}
	wg.Wait()
	if most := flight.most.Load(); most > n {
		t.Errorf("%d handlers inside at once; the limit is %d", most, n)
	}
	if admitted.Load()+refused.Load() != clients*10 || admitted.Load() < n {
		t.Errorf("%d admitted, %d refused, of %d", admitted.Load(), refused.Load(), clients*10)
	}
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots still taken after every handler returned", got)
	}
	for range n + 1 { // more panics than slots: each must free its own
		if _, _, _, err := get(true); err == nil {
			t.Error("a panicking handler's response arrived")
		}
	}
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots still taken after every handler returned or panicked", got)
	}
	if code, _, _, err := get(false); err != nil || code != http.StatusOK {
		t.Errorf("after the panics: %d %v; want 200", code, err)
	}
	d, err := admit.New(c).Peek(context.Background(), rule.First.Request(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Admitted: the n gated, the free-running ones, those that panicked
	// (the bucket charged them; they ran), and the last one.
	if panicked.Load() < n+1 {
		t.Errorf("%d handlers panicked, want at least %d", panicked.Load(), n+1)
	}
	if want := int64(bucket.Burst()) - n - admitted.Load() - panicked.Load() - 1; int64(d.Remaining[0])+1 != want {
		t.Errorf("bucket holds %d, want %d: a refused request took a token", d.Remaining[0]+1, want)
	}
	t.Logf("limit %d, %d clients: at most %d in flight; free-running %d admitted, %d refused", n, clients, flight.most.Load(), admitted.Load(), refused.Load())
}

// errBoom is the panic of a handler.
var errBoom = errors.New("boom")

// TestConcurrentPanicFreesSlot: a handler that panics frees its slot, and
// the panic goes on up, unchanged, to the server (which recovers it).
func TestConcurrentPanicFreesSlot(t *testing.T) {
	_, c := minitest.Start(t)
	one := admit.MustConcurrency(1, 30*time.Second)
	rule := concRule("panic:", one, wideSpec)
	var reported []error
	panics := true
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if panics {
				panic(errBoom)
			}
			io.WriteString(w, "ok")
		}))
	for i := range 3 {
		func() {
			defer func() {
				if p := recover(); p != errBoom {
					t.Errorf("panic %d: recovered %v, want the handler's own", i, p)
				}
			}()
			send(h, "", "")
		}()
		if got := holders(t, c, "panic:{org}:conc"); got != 0 {
			t.Fatalf("after panic %d: %d slots taken; a panicking handler must free its slot", i, got)
		}
	}
	panics = false
	if rec := send(h, "", ""); rec.Code != http.StatusOK {
		t.Errorf("after the panics, the one slot: %d, want 200", rec.Code)
	}
	if len(reported) != 0 {
		t.Errorf("errors reported: %v", reported)
	}
}

// TestConcurrentSlotRefusalTakesNothing: while every slot is taken, a
// request is refused by the concurrency part, and both buckets stay as
// they were, byte for byte; the outcome hook sees Refused with the Lease
// naming the slot. A bucket's refusal takes no slot either.
func TestConcurrentSlotRefusalTakesNothing(t *testing.T) {
	_, c := minitest.Start(t)
	ctx := context.Background()
	one := admit.MustConcurrency(1, 30*time.Second)
	second := admithttp.Bucket{Policy: "shared", Key: "refuse:{org}:shared", Spec: sharedSpec}
	rule := concRule("refuse:", one, standardSpec)
	rule.Second = &second
	var events []admithttp.Event
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
		admithttp.WithOutcome(func(e admithttp.Event) { events = append(events, e) }))(&recordingHandler{})
	if rec := send(h, "", ""); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d", rec.Code)
	}
	before := map[string]map[string]string{}
	for _, k := range []string{rule.First.Key, second.Key} {
		before[k] = hashOf(t, c, k)
	}
	// Another holder takes the one slot.
	x, err := admit.New(c).Acquire(ctx, admit.LeaseRequest{Key: rule.Concurrent.Key, Spec: one}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatalf("Acquire: %v %v", x, err)
	}
	events = nil
	rec := send(h, "", "")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("with the slot taken: %d, want 429", rec.Code)
	}
	if err := checkFields(rec.Header(), "conc"); err != nil {
		t.Error(err)
	}
	if p := problemOf(t, rec); fmt.Sprint(p["violated-policies"]) != "[conc]" || !strings.Contains(fmt.Sprint(p["detail"]), "allows 1 requests in flight at once") {
		t.Errorf("problem %v", p)
	}
	if ra, rl := rec.Header().Get("Retry-After"), rec.Header().Get(admithttp.LimitField); ra != "1" || rl != `"conc";r=0;t=1` {
		t.Errorf("Retry-After %q, RateLimit %q; want 1 and t=1: the default hint, although the other lease expires in 30 s", ra, rl)
	}
	// The Rule's hint, capped by the oldest lease's time left (30 s on
	// the frozen clock).
	for _, tc := range []struct {
		hint time.Duration
		want string
	}{{2500 * time.Millisecond, "3"}, {time.Hour, "30"}} {
		rule.Concurrent.RetryAfter = tc.hint
		rec := send(h, "", "")
		if ra, rl := rec.Header().Get("Retry-After"), rec.Header().Get(admithttp.LimitField); rec.Code != http.StatusTooManyRequests || ra != tc.want || rl != `"conc";r=0;t=`+tc.want {
			t.Errorf("hint %v: %d, Retry-After %q, RateLimit %q; want 429, %s and t=%s", tc.hint, rec.Code, ra, rl, tc.want, tc.want)
		}
	}
	rule.Concurrent.RetryAfter = 0
	events = events[:1] // the hints' refusals are checked above
	for _, k := range []string{rule.First.Key, second.Key} {
		if got := hashOf(t, c, k); fmt.Sprint(got) != fmt.Sprint(before[k]) {
			t.Errorf("%s: %v after the slot's refusal, was %v", k, got, before[k])
		}
	}
	if len(events) != 1 || events[0].Outcome != admithttp.Refused || events[0].Lease == nil || events[0].Lease.Denied != admit.PartConcurrency {
		t.Errorf("events %+v; want one Refused whose Lease names the slot", events)
	}
	if _, err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A bucket refuses (the shared one, emptied): no slot stays taken,
	// and the first bucket is not charged either.
	if _, err := admit.New(c).AllowAll(ctx, admit.Request{Key: second.Key, Spec: sharedSpec, Cost: sharedSpec.Burst() - 1}, nil); err != nil {
		t.Fatal(err)
	}
	before[rule.First.Key] = hashOf(t, c, rule.First.Key)
	events = nil
	rec = send(h, "", "")
	if p := problemOf(t, rec); rec.Code != http.StatusTooManyRequests || fmt.Sprint(p["violated-policies"]) != "[shared]" {
		t.Fatalf("shared bucket empty: %d %v", rec.Code, p)
	}
	if err := checkFields(rec.Header(), "shared"); err != nil {
		t.Error(err)
	}
	if got := rec.Header().Get(admithttp.LimitField); !strings.HasPrefix(got, `"conc";r=1, `) {
		t.Errorf("RateLimit %q: the slot was free and is free again (r = q, no t)", got)
	}
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots taken after a bucket's refusal", got)
	}
	if got := hashOf(t, c, rule.First.Key); fmt.Sprint(got) != fmt.Sprint(before[rule.First.Key]) {
		t.Errorf("first bucket %v after the second's refusal, was %v", got, before[rule.First.Key])
	}
	if len(events) != 1 || events[0].Outcome != admithttp.Refused || events[0].Lease.Denied != admit.PartSecond || events[0].Decision.Denied != 2 {
		t.Errorf("events %+v; want one Refused by the second bucket", events)
	}
}

// hashOf is the hash at key, every field.
func hashOf(t *testing.T, c valkey.Client, key string) map[string]string {
	t.Helper()
	m, err := c.Do(context.Background(), c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

// TestConcurrentOnly: a Rule with a concurrency part and no bucket is a
// plain concurrency limit; its fields describe the slots alone.
func TestConcurrentOnly(t *testing.T) {
	_, c := minitest.Start(t)
	rule := admithttp.Rule{Concurrent: &admithttp.Concurrent{Policy: "inflight", Key: "only:{org}:conc", Spec: admit.MustConcurrency(2, 10*time.Second)}}
	var inside http.Header
	var admission admithttp.Admission
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll, admithttp.WithHeaders())(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inside = w.Header().Clone()
			admission, _ = admithttp.FromContext(r.Context())
		}))
	if rec := send(h, "", ""); rec.Code != http.StatusOK {
		t.Fatalf("%d", rec.Code)
	}
	if got, want := inside.Get(admithttp.PolicyField), `"inflight";q=2;qu="concurrent-requests"`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := inside.Get(admithttp.LimitField), `"inflight";r=1;t=10`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if err := checkFields(inside, ""); err != nil {
		t.Error(err)
	}
	if admission.Lease == nil || !admission.Lease.Granted() || admission.Lease.Holders != 1 || !admission.Decision.Allowed() {
		t.Errorf("Admission %+v; want the granted Lease and an Allowed Decision", admission)
	}
	if f, s := rule.Requests(); f != (admit.Request{}) || s != nil {
		t.Errorf("Requests of a Rule without a bucket: %v %v", f, s)
	}
	if got := holders(t, c, "only:{org}:conc"); got != 0 {
		t.Errorf("%d slots taken after the handler returned", got)
	}
}

// TestConcurrentInvalid: a concurrency part without a Key, a Policy or a
// Spec, with a policy name a bucket has, a shadow key, or the key of a
// bucket is an invalid Rule: 500, the handler never runs, nothing is
// written; and it is never the zero Rule's "no limit".
func TestConcurrentInvalid(t *testing.T) {
	srv, c := minitest.Start(t)
	base := concRule("bad:", concSpec, wideSpec)
	for _, tc := range []struct {
		name string
		edit func(r *admithttp.Rule)
	}{
		{"empty key", func(r *admithttp.Rule) { r.Concurrent.Key = "" }},
		{"empty policy", func(r *admithttp.Rule) { r.Concurrent.Policy = "" }},
		{"zero spec", func(r *admithttp.Rule) { r.Concurrent.Spec = admit.Concurrency{} }},
		{"a bucket's policy", func(r *admithttp.Rule) { r.Concurrent.Policy = "tpm" }},
		{"policy not ASCII", func(r *admithttp.Rule) { r.Concurrent.Policy = "c\x00" }},
		{"shadow key", func(r *admithttp.Rule) { r.Concurrent.Key = admithttp.ShadowPrefix + "x" }},
		{"a bucket's key", func(r *admithttp.Rule) { r.Concurrent.Key = r.First.Key }},
		{"empty and alone", func(r *admithttp.Rule) { r.First = admithttp.Bucket{}; r.Concurrent.Key = "" }},
		{"second without first", func(r *admithttp.Rule) { r.Second = &r.First; r.First = admithttp.Bucket{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := base
			part := *base.Concurrent
			rule.Concurrent = &part
			tc.edit(&rule)
			next := &recordingHandler{}
			var errs []error
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(next)
			rec := send(h, "", "")
			if rec.Code != http.StatusInternalServerError || next.calls != 0 {
				t.Errorf("%d, handler ran %d times; want 500 and never", rec.Code, next.calls)
			}
			if len(errs) != 1 || !errors.Is(errs[0], admit.ErrInvalidRequest) {
				t.Errorf("errors %v; want one ErrInvalidRequest", errs)
			}
		})
	}
	if keys := srv.Keys(); len(keys) != 0 {
		t.Errorf("keys written: %v", keys)
	}
}

// TestConcurrentReleaseReported: a release that fails (the store went
// down while the handler ran) and a lease found expired at release (the
// handler outlived it) go to the error hook; neither crashes nor changes
// the handler's answer.
func TestConcurrentReleaseReported(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during func(srv interface{ Close() }, setTime func(time.Time))
		want   string
	}{
		{"store down", func(srv interface{ Close() }, _ func(time.Time)) { srv.Close() }, "releasing the lease"},
		{"lease expired", func(_ interface{ Close() }, setTime func(time.Time)) { setTime(minitest.Epoch.Add(31 * time.Second)) }, "had expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, c := minitest.Start(t)
			rule := concRule("release:", concSpec, wideSpec)
			var errs []error
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
				admithttp.WithDecisionTimeout(200*time.Millisecond),
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tc.during(srv, srv.SetTime)
					io.WriteString(w, "ok")
				}))
			rec := send(h, "", "")
			if rec.Code != http.StatusOK || rec.Body.String() != "ok" {
				t.Errorf("%d %q; want the handler's 200", rec.Code, rec.Body.String())
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Errorf("errors reported %v; want one saying %q", errs, tc.want)
			}
		})
	}
}

// TestConcurrentDegrade: while the store is down, Degrade refuses every
// request whose Rule has a concurrency part (admit's Degraded holds no
// leases), with a bucket or without, as Refuse does (503, Retry-After 5)
// and runs none; a Rule without one is still decided locally.
func TestConcurrentDegrade(t *testing.T) {
	srv, c := minitest.Start(t)
	g, err := admit.NewDegraded(0.5, 64)
	if err != nil {
		t.Fatal(err)
	}
	one := admit.MustConcurrency(1, 30*time.Second)
	withBucket := concRule("degrade:", one, standardSpec)
	alone := admithttp.Rule{Concurrent: withBucket.Concurrent}
	bucketOnly := admithttp.Rule{First: withBucket.First}
	var ran int
	rule := withBucket
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule },
		admithttp.Outage{NotExecuted: admithttp.Degrade(g), OutcomeUnknown: admithttp.Degrade(g)}, admithttp.WithHeaders())(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ }))
	srv.Close()
	for _, r := range []admithttp.Rule{withBucket, alone} {
		rule = r
		for i := range 3 {
			rec := send(h, "", "")
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "5" || rec.Header().Get(admithttp.PolicyField) != "" {
				t.Errorf("degraded, concurrency part (buckets %v), request %d: %d %v; want 503, Retry-After 5, no fields", r.HasBuckets(), i, rec.Code, rec.Header())
			}
		}
	}
	if ran != 0 {
		t.Errorf("%d handlers ran for a Rule with a concurrency part while degraded; want 0", ran)
	}
	rule = bucketOnly // burst 6, 3 when scaled: still decided locally
	codes := map[int]int{}
	for range 5 {
		codes[send(h, "", "").Code]++
	}
	if codes[200] != 3 || codes[429] != 2 {
		t.Errorf("degraded, a bucket of 3 without a concurrency part: %v; want 3 served, 2 refused", codes)
	}
}

// TestConcurrentClientGoneFreesSlot: a client that goes away while its
// handler runs (net/http cancels the request's context) still has its slot
// freed when the handler returns.
func TestConcurrentClientGoneFreesSlot(t *testing.T) {
	_, c := minitest.Start(t)
	rule := concRule("gone:", concSpec, wideSpec)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errs []error
	h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return rule }, refuseAll,
		admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel() // the client goes away
			<-r.Context().Done()
		}))
	sendCtx(ctx, h, "", "")
	if got := holders(t, c, rule.Concurrent.Key); got != 0 {
		t.Errorf("%d slots taken after the handler of a gone client returned", got)
	}
	if len(errs) != 0 {
		t.Errorf("errors reported: %v", errs)
	}
}

// TestConcurrentHostileKeys: a concurrency key built with admit.KeyPart
// from a header that is missing, empty, a megabyte long, full of braces or
// of binary bytes keeps its limit: with the one slot taken, the request is
// refused (never admitted, never a 5xx); with it free, admitted. A key
// built from the raw header instead is an invalid Rule (500) when the
// header is missing or too long: never unlimited.
func TestConcurrentHostileKeys(t *testing.T) {
	_, c := minitest.Start(t)
	lim := admit.New(c)
	one := admit.MustConcurrency(1, 30*time.Second)
	keyOf := func(v string) string { return "conc:{" + admit.KeyPart(v) + "}" }
	hostile := []struct {
		name  string
		value *string
	}{
		{"missing", nil}, {"empty", ptr("")}, {"1 MB", ptr(strings.Repeat("x", 1<<20))},
		{"braces", ptr("}{org}{")}, {"binary", ptr("\x00\xff\r\n:{")},
	}
	for _, raw := range []bool{false, true} {
		h := mustNew(t, lim, func(r *http.Request) admithttp.Rule {
			v := r.Header.Get("X-Org")
			key := keyOf(v)
			if raw {
				key = v
			}
			return admithttp.Rule{Concurrent: &admithttp.Concurrent{Policy: "inflight", Key: key, Spec: one}}
		}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Serve})(&recordingHandler{})
		for _, tc := range hostile {
			req := func() int {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				if tc.value != nil {
					r.Header[http.CanonicalHeaderKey("X-Org")] = []string{*tc.value}
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				return rec.Code
			}
			v := ""
			if tc.value != nil {
				v = *tc.value
			}
			if raw {
				if (v == "" || len(v) > admit.MaxKeyLen) && req() != http.StatusInternalServerError {
					t.Errorf("raw %s: not an invalid Rule", tc.name)
				}
				continue
			}
			x, err := lim.Acquire(context.Background(), admit.LeaseRequest{Key: keyOf(v), Spec: one}, nil, nil)
			if err != nil || !x.Granted() {
				t.Fatalf("%s: Acquire %v %v", tc.name, x, err)
			}
			if code := req(); code != http.StatusTooManyRequests {
				t.Errorf("%s: %d with the one slot taken; want 429", tc.name, code)
			}
			if _, err := x.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			if code := req(); code != http.StatusOK {
				t.Errorf("%s: %d with the slot free; want 200", tc.name, code)
			}
		}
	}
}

func ptr(s string) *string { return &s }

// TestConcurrentOutage: with the store down, Serve and Refuse answer a
// Rule with a concurrency part as any other. An Acquire lost in flight
// (outcome unknown: the client may use its dying connection first) may
// have taken a slot, so the middleware tries to release it, and reports
// that release's failure too; an Acquire that was not executed sent
// nothing, so there is nothing to release and no second error.
func TestConcurrentOutage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler admithttp.OutageHandler
		code    int
		outcome admithttp.Outcome
	}{
		{"serve", admithttp.Serve, http.StatusOK, admithttp.OutageServed},
		{"refuse", admithttp.Refuse, http.StatusServiceUnavailable, admithttp.OutageRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, c := minitest.Start(t)
			var errs []error
			var events []admithttp.Event
			next := &recordingHandler{}
			h := mustNew(t, admit.New(c), func(*http.Request) admithttp.Rule { return concRule("outage:", concSpec, wideSpec) },
				admithttp.Outage{NotExecuted: tc.handler, OutcomeUnknown: admithttp.Refuse},
				admithttp.WithErrorFunc(func(_ *http.Request, err error) { errs = append(errs, err) }),
				admithttp.WithOutcome(func(e admithttp.Event) { events = append(events, e) }))(next)
			srv.Close()
			for i := range 20 {
				errs, events = nil, nil
				rec := send(h, "", "")
				if len(errs) == 0 {
					t.Fatalf("request %d: %d with no error reported", i, rec.Code)
				}
				if errors.Is(errs[0], admit.ErrOutcomeUnknown) {
					if rec.Code != http.StatusServiceUnavailable || len(errs) != 2 || !strings.Contains(errs[1].Error(), "releasing the lease") {
						t.Errorf("request %d, outcome unknown: %d, errors %v; want 503 and the failed release reported", i, rec.Code, errs)
					}
					continue
				}
				if rec.Code != tc.code || next.admitted {
					t.Errorf("%d (admission %v); want %d without an Admission", rec.Code, next.admitted, tc.code)
				}
				if len(errs) != 1 || !errors.Is(errs[0], admit.ErrNotExecuted) {
					t.Errorf("errors %v; want the one not-executed Acquire", errs)
				}
				if len(events) != 1 || events[0].Outcome != tc.outcome {
					t.Errorf("events %+v; want one %v", events, tc.outcome)
				}
				return
			}
			t.Fatal("no decision was not executed in 20 requests to a closed store")
		})
	}
}

// failingClient answers every command with err; the embedded client only
// builds commands.
type failingClient struct {
	valkey.Client
	err   error
	calls int
}

func (c *failingClient) Do(context.Context, valkey.Completed) valkey.ValkeyResult {
	c.calls++
	return valkey.NewErrorResult(c.err)
}

// classOf names err's admit class: "not-executed", "outcome-unknown", or
// "none" when it is in neither (or both, which admit never returns).
func classOf(err error) string {
	ne, ou := errors.Is(err, admit.ErrNotExecuted), errors.Is(err, admit.ErrOutcomeUnknown)
	switch {
	case ne && !ou:
		return "not-executed"
	case ou && !ne:
		return "outcome-unknown"
	}
	return "none"
}

// outageLog records which Outage handler ran, with what error.
type outageLog struct {
	ran []string // "NotExecuted" or "OutcomeUnknown", one per call
	err error
}

// outage returns an Outage whose handlers record their call and answer
// 418, so that the test sees which one answered.
func (o *outageLog) outage() admithttp.Outage {
	rec := func(name string) admithttp.OutageHandler {
		return func(w http.ResponseWriter, _ *http.Request, _ http.Handler, err error) {
			o.ran, o.err = append(o.ran, name), err
			w.WriteHeader(http.StatusTeapot)
		}
	}
	return admithttp.Outage{NotExecuted: rec("NotExecuted"), OutcomeUnknown: rec("OutcomeUnknown")}
}

// TestOutagePolicyPerClass: each class goes to its own handler, and Serve,
// Refuse and a function of the caller's do what they say, for both.
func TestOutagePolicyPerClass(t *testing.T) {
	_, mini := minitest.Start(t)
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, class := range []struct {
		name  string
		cause error
		field func(*admithttp.Outage) *admithttp.OutageHandler
	}{
		{"not-executed", dialErr, func(o *admithttp.Outage) *admithttp.OutageHandler { return &o.NotExecuted }},
		{"outcome-unknown", io.EOF, func(o *admithttp.Outage) *admithttp.OutageHandler { return &o.OutcomeUnknown }},
	} {
		for _, policy := range []struct {
			name    string
			handler admithttp.OutageHandler
			status  int
			ran     bool // the wrapped handler
		}{
			{"serve", admithttp.Serve, 200, true},
			{"refuse", admithttp.Refuse, 503, false},
			{"own", func(w http.ResponseWriter, _ *http.Request, _ http.Handler, err error) {
				if classOf(err) == class.name {
					w.WriteHeader(http.StatusTeapot)
				}
			}, 418, false},
		} {
			t.Run(class.name+"/"+policy.name, func(t *testing.T) {
				client := &failingClient{Client: mini, err: class.cause}
				var log outageLog
				outage := log.outage() // the other class's handler records, and must not run
				*class.field(&outage) = policy.handler
				var reported []error
				next := &recordingHandler{}
				h := mustNew(t, admit.New(client), lanes("t:"), outage, admithttp.WithHeaders(),
					admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(next)
				rec := send(h, "standard", "u1")
				if rec.Code != policy.status || (next.calls == 1) != policy.ran {
					t.Fatalf("status %d, handler ran %d times; want %d, ran %v", rec.Code, next.calls, policy.status, policy.ran)
				}
				if len(log.ran) != 0 {
					t.Errorf("the other class's handler ran: %v", log.ran)
				}
				if client.calls != 1 {
					t.Errorf("%d commands sent; want 1 (no retry, no refund)", client.calls)
				}
				if len(reported) != 1 || classOf(reported[0]) != class.name || !errors.Is(reported[0], class.cause) {
					t.Errorf("WithErrorFunc got %v; want one %s error wrapping %v", reported, class.name, class.cause)
				}
				if next.admitted {
					t.Errorf("served on an outage with an Admission in the context: a handler would settle a reservation never made")
				}
				if f := rec.Header().Get("RateLimit") + rec.Header().Get("RateLimit-Policy"); f != "" {
					t.Errorf("rate-limit fields on an outage response: %q", f)
				}
				wantRetry := map[int]string{503: "5"}[policy.status]
				if got := rec.Header().Get("Retry-After"); got != wantRetry {
					t.Errorf("Retry-After %q; want %q", got, wantRetry)
				}
				if policy.status == 503 {
					want := map[string]any{"type": "about:blank", "title": "Service Unavailable", "status": float64(503),
						"detail": "the rate limiter is unavailable; retry later"}
					if diff := cmp.Diff(want, problemOf(t, rec)); diff != "" {
						t.Errorf("503 body (-want +got):\n%s", diff)
					}
				}
			})
		}
	}
}

// TestOutageRealClientErrors drives each class through valkey-go itself,
// without a stub: a client whose server port is closed fails to dial
// (nothing sent: NotExecuted), and a closed client gives
// valkey.ErrClosing (OutcomeUnknown, as admit classes it).
func TestOutageRealClientErrors(t *testing.T) {
	closedPort := func(t *testing.T) valkey.Client {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		// ForceSingleClient returns the client even though its first dial fails.
		c, _ := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if c == nil {
			t.Fatal("no client")
		}
		t.Cleanup(c.Close)
		return c
	}
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) valkey.Client
		ctx    func() context.Context
		want   string
		cause  error
	}{
		{"closed-port", closedPort, context.Background, "NotExecuted", nil},
		{"closed-client", func(t *testing.T) valkey.Client { _, c := minitest.Start(t); c.Close(); return c }, context.Background,
			"OutcomeUnknown", valkey.ErrClosing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log outageLog
			next := &recordingHandler{}
			h := mustNew(t, admit.New(tc.client(t)), lanes("t:"), log.outage())(next)
			rec := sendCtx(tc.ctx(), h, "standard", "u1")
			if rec.Code != 418 || next.calls != 0 || len(log.ran) != 1 || log.ran[0] != tc.want {
				t.Fatalf("status %d, handler ran %d, outage handlers %v; want 418 from %s alone", rec.Code, next.calls, log.ran, tc.want)
			}
			if tc.cause != nil && !errors.Is(log.err, tc.cause) {
				t.Errorf("error %v; want %v in its chain", log.err, tc.cause)
			}
			t.Logf("%s: %v", tc.want, log.err)
		})
	}
}

// The middleware against a real server (VALKEY_SERVER, VALKEY_ADDR or
// valkey-server on PATH; see internal/testserver): the premium story over
// real HTTP, shadow rules by the server's own bucket state, and the outage
// policy for each error class through a fault proxy. Without a server these
// tests skip, or fail under ADMIT_REQUIRE_SERVER=1.

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

// TestIntegrationProperty runs the property test (TestPropertyAgainstModel) on a
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

// TestIntegrationConcurrent: atMostN with a limit of 3 on a real server,
// whose clock runs; the bucket refills nothing while the test runs.
func TestIntegrationConcurrent(t *testing.T) {
	c := testserver.NewClient(t, testserver.Shared(t))
	bucket := admit.MustSpec(admit.Every(time.Hour), 1000)
	atMostN(t, c, concRule(testserver.Prefix(t, c), admit.MustConcurrency(3, 10*time.Second), bucket), false)
}

// The middleware against internal/model: random requests over both lanes,
// with hostile user ids and classify outputs, the server's clock moved,
// store outages (nothing sent; the reply lost after the script ran) and
// clients that go away (before sending; with the command in flight). For
// every request the answer is predicted from the model alone: status,
// every field, Retry-After, the violated policy, whether the handler ran,
// the Outcome event, and the state the server is left in.
//
// It runs on miniredis here, and on a real server whose clock the test
// steps in TestIntegrationProperty.

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
	srv, c := minitest.Start(t)
	return &miniProp{srv: srv, c: c, now: minitest.Epoch}
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
		if r < burst {
			// The model's wait for the bucket's next token.
			st, ok := m.Buckets[b.Key]
			tk, ts := model.Refill(m.Now, b.Spec, model.State{Tokens: st.Tokens, TS: st.TS}, ok)
			if int(tk) != r {
				return fmt.Errorf("model: bucket %q holds %d, Remaining %d", b.Key, tk, r)
			}
			next := time.Duration(ts+iv.Microseconds()-m.Now) * time.Microsecond
			if int(out.Denied) == i+1 {
				// Refused: t is exactly the next token's wait, whatever
				// the cost (draft -11's effective window), while
				// Retry-After is the wait for the whole cost.
				tWant = int((next + time.Second - 1) / time.Second)
				violated = b.Policy
			} else {
				// Not refused: the Interval, never shorter than the
				// next token's wait.
				tWant = int((iv + time.Second - 1) / time.Second)
				if time.Duration(tWant)*time.Second < next {
					return fmt.Errorf("%q: t=%d is shorter than the next token's %v", b.Policy, tWant, next)
				}
			}
		} else if int(out.Denied) == i+1 {
			return fmt.Errorf("model: full bucket %q refused", b.Key)
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

// TestImportsStdlibAndAdmitOnly: the package adds nothing to an importer's
// module graph. Its files, and those of edge, which it shares with
// admitgrpc, import the standard library (no dot in the first path
// element), admit itself, edge and admit's internal packages, nothing else.
func TestImportsStdlibAndAdmitOnly(t *testing.T) {
	allowed := map[string]bool{"github.com/admitkit/admit": true, "github.com/admitkit/admit/edge": true,
		"github.com/admitkit/admit/internal/deciderhook": true}
	for _, dir := range []string{".", "../edge"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		files := 0
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			files++
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(path, "/")
				if strings.Contains(first, ".") && !allowed[path] {
					t.Errorf("%s imports %s; admithttp may import the standard library and admit only", filepath.Join(dir, e.Name()), path)
				}
			}
		}
		if files == 0 {
			t.Fatalf("checked no file in %s", dir)
		}
	}
}

// TestConcurrentOnLocal: a Rule with a concurrency part on a decider that
// cannot lease (an admit.Local) is the server's error: 500 and RuleError,
// the handler never run, as the gRPC edge answers it with Internal.
func TestConcurrentOnLocal(t *testing.T) {
	local, err := admit.NewLocal(10)
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []admithttp.Outcome
	mw, err := admithttp.New(local, func(*http.Request) admithttp.Rule {
		return admithttp.Rule{Concurrent: &admithttp.Concurrent{Policy: "c", Key: "c", Spec: admit.MustConcurrency(1, time.Minute)}}
	}, refuseAll, admithttp.WithOutcome(func(e admithttp.Event) { outcomes = append(outcomes, e.Outcome) }))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	rec := httptest.NewRecorder()
	mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusInternalServerError || ran || fmt.Sprint(outcomes) != fmt.Sprint([]admithttp.Outcome{admithttp.RuleError}) {
		t.Errorf("%d, handler ran %v, outcomes %v; want 500, not run, [RuleError]", rec.Code, ran, outcomes)
	}
}
