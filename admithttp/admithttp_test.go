package admithttp_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/google/go-cmp/cmp"
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
			_, c := newMini(t)
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
	_, c := newMini(t)
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
		srv, cl := newMini(t)
		h := mustNew(t, admit.New(cl), func(*http.Request) admithttp.Rule {
			return admithttp.Rule{First: admithttp.Bucket{Policy: "p", Key: "k", Spec: spec}}
		}, refuseAll)(&recordingHandler{})
		if rec := send(h, "", ""); rec.Code != 200 {
			t.Fatalf("first request: %d", rec.Code)
		}
		srv.SetTime(t0.Add(c.after))
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
	_, c := newMini(t)
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
			srv, cl := newMini(t)
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
	srv, c := newMini(t)
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
	_, c := newMini(t)
	lim := admit.New(c)
	classify := lanes("t:")
	report := func(admithttp.ShadowReport) {}
	rule := func(*http.Request, admithttp.Rule) admithttp.Rule { return admithttp.Rule{} }
	for _, tc := range []struct {
		name     string
		lim      *admit.Limiter
		classify func(*http.Request) admithttp.Rule
		outage   admithttp.Outage
		opts     []admithttp.Option
		says     string
	}{
		{"no-outage", lim, classify, admithttp.Outage{}, nil, "Outage needs both NotExecuted and OutcomeUnknown"},
		{"no-not-executed", lim, classify, admithttp.Outage{OutcomeUnknown: admithttp.Refuse}, nil, "Outage needs both"},
		{"no-outcome-unknown", lim, classify, admithttp.Outage{NotExecuted: admithttp.Serve}, nil, "Outage needs both"},
		{"no-limiter", nil, classify, refuseAll, nil, "nil *admit.Limiter"},
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
			_, c := newMini(t)
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
			srv, c := newMini(t)
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
	_, c := newMini(t)
	if _, err := admithttp.New(admit.New(c), lanes("t:"), refuseAll); err != nil {
		t.Errorf("a Limiter with a client: %v", err)
	}
}
