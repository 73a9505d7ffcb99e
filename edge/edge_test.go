package edge_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
	"github.com/admitkit/admit/internal/minitest"
)

// TestCheck: every fault Check finds names its part, says whether it is
// in a key (what a client's value may have made it), reads as what to fix,
// and is an invalid request that was not executed; keys are checked
// before anything else, so a Rule with a hostile key and a code fault is
// the client's.
func TestCheck(t *testing.T) {
	spec := admit.MustSpec(admit.Every(time.Second), 5)
	conc := admit.MustConcurrency(2, time.Minute)
	b := func(policy, key string) edge.Bucket { return edge.Bucket{Policy: policy, Key: key, Spec: spec} }
	two := func(first, second edge.Bucket) edge.Rule { return edge.Rule{First: first, Second: &second} }
	withConc := func(r edge.Rule, c edge.Concurrent) edge.Rule { r.Concurrent = &c; return r }
	long := strings.Repeat("k", admit.MaxKeyLen+1)
	for _, tc := range []struct {
		name  string
		rule  edge.Rule
		part  int
		inKey bool
		says  string
	}{
		{"empty key", edge.Rule{First: b("p", "")}, 1, true, "empty Key"},
		{"long key", two(b("p", "a"), b("q", long)), 2, true, "over"},
		{"shadow key", edge.Rule{First: b("p", edge.ShadowPrefix+"a")}, 1, true, "namespace"},
		{"one key twice", two(b("p", "a"), b("q", "a")), 2, true, "own key"},
		{"slot key empty", withConc(edge.Rule{}, edge.Concurrent{Policy: "c", Spec: conc}), 0, true, "empty Key"},
		{"slot key is a bucket's", withConc(edge.Rule{First: b("p", "a")}, edge.Concurrent{Policy: "c", Key: "a", Spec: conc}), 0, true, "own key"},
		{"key before code", two(edge.Bucket{Key: "a"}, b("q", "")), 2, true, "empty Key"},
		{"zero spec", edge.Rule{First: edge.Bucket{Policy: "p", Key: "a"}}, 1, false, "zero Spec"},
		{"cost above burst", edge.Rule{First: edge.Bucket{Policy: "p", Key: "a", Spec: spec, Cost: 6}}, 1, false, "burst 5"},
		{"negative cost", edge.Rule{First: edge.Bucket{Policy: "p", Key: "a", Spec: spec, Cost: -1}}, 1, false, "burst"},
		{"no policy", edge.Rule{First: b("", "a")}, 1, false, "empty policy name"},
		{"policy not ascii", edge.Rule{First: b("café", "a")}, 1, false, "printable ASCII"},
		{"unit not ascii", edge.Rule{First: edge.Bucket{Policy: "p", Key: "a", Spec: spec, Unit: "\n"}}, 1, false, "unit"},
		{"one policy twice", two(b("p", "a"), b("p", "b")), 2, false, "name each bucket"},
		{"slot zero spec", withConc(edge.Rule{}, edge.Concurrent{Policy: "c", Key: "s"}), 0, false, "zero Spec"},
		{"slot policy is a bucket's", withConc(edge.Rule{First: b("p", "a")}, edge.Concurrent{Policy: "p", Key: "s", Spec: conc}), 0, false, "name each part"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := edge.Check(tc.rule)
			if f == nil {
				t.Fatal("no fault")
			}
			if f.Part != tc.part || f.InKey != tc.inKey || !strings.Contains(f.Error(), tc.says) {
				t.Errorf("fault in part %d, in a key %v: %v; want part %d, in a key %v, saying %q", f.Part, f.InKey, f, tc.part, tc.inKey, tc.says)
			}
			if !errors.Is(f, admit.ErrInvalidRequest) || !errors.Is(f, admit.ErrNotExecuted) {
				t.Errorf("%v is not ErrInvalidRequest and ErrNotExecuted", f)
			}
		})
	}
	for _, r := range []edge.Rule{
		{First: b("p", "a")},
		two(b("p", "a"), edge.Bucket{Policy: "q", Key: "b", Spec: spec, Cost: 5, Unit: "llm-tokens"}),
		withConc(edge.Rule{}, edge.Concurrent{Policy: "c", Key: "s", Spec: conc}),
		withConc(two(b("p", "a"), b("q", "b")), edge.Concurrent{Policy: "c", Key: "s", Spec: conc}),
	} {
		if f := edge.Check(r); f != nil {
			t.Errorf("Check(%+v): %v; want a valid Rule", r, f)
		}
	}
}

// TestRuleBuckets: a Rule names its buckets in order, and only a Rule with
// a concurrency part and neither bucket names none (its Requests are the
// zero Request and nil, nothing to refund).
func TestRuleBuckets(t *testing.T) {
	spec := admit.MustSpec(admit.Every(time.Second), 5)
	first, second := edge.Bucket{Policy: "p", Key: "a", Spec: spec}, edge.Bucket{Policy: "q", Key: "b", Spec: spec, Cost: 2}
	slot := &edge.Concurrent{Policy: "c", Key: "s"}
	for _, tc := range []struct {
		rule edge.Rule
		want []edge.Bucket
	}{
		{edge.Rule{First: first}, []edge.Bucket{first}},
		{edge.Rule{First: first, Second: &second}, []edge.Bucket{first, second}},
		{edge.Rule{Concurrent: slot}, nil},
		{edge.Rule{First: first, Concurrent: slot}, []edge.Bucket{first}},
		{edge.Rule{Second: &second, Concurrent: slot}, []edge.Bucket{{}, second}},
	} {
		got := tc.rule.Buckets()
		if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) || (len(got) > 1 && got[1] != tc.want[1]) {
			t.Errorf("%+v: buckets %+v, want %+v", tc.rule, got, tc.want)
		}
		r1, r2 := tc.rule.Requests()
		if len(tc.want) == 0 && (r1 != (admit.Request{}) || r2 != nil) {
			t.Errorf("%+v: requests %+v, %v; want none", tc.rule, r1, r2)
		}
		if len(tc.want) == 2 && (r2 == nil || *r2 != tc.want[1].Request()) {
			t.Errorf("%+v: second request %v, want %+v", tc.rule, r2, tc.want[1].Request())
		}
	}
	if got := (edge.Bucket{}).Tokens(); got != 1 {
		t.Errorf("a Cost of 0 takes %d tokens, want 1", got)
	}
}

// TestDecide, on miniredis with its clock standing still: buckets alone
// are one AllowAll, with no Lease; with a concurrency part, one Acquire
// whose refusal by the concurrency limit carries its RetryAfter (the oldest
// lease's time left) and the buckets' Remaining: not evaluated (-1), and
// untouched (the next grant leaves 0 of 3). Releasing a
// granted lease frees its slot; releasing one found expired says that
// the handler outlived it.
func TestDecide(t *testing.T) {
	srv, c := minitest.Start(t)
	lim := admit.New(c)
	ctx := context.Background()
	bucket := edge.Bucket{Policy: "b", Key: "{o}:b", Spec: admit.MustSpec(admit.Every(time.Hour), 3)}

	res, err := edge.Decide(ctx, lim, edge.Rule{First: bucket}, time.Second)
	if err != nil || !res.Allowed() || res.Lease != nil || res.Decision.Remaining[0] != 2 {
		t.Fatalf("buckets alone: %+v, %v; want admitted, no lease, 2 left", res, err)
	}

	rule := edge.Rule{First: bucket, Concurrent: &edge.Concurrent{Policy: "c", Key: "{o}:c", Spec: admit.MustConcurrency(1, time.Minute)}}
	held, err := edge.Decide(ctx, lim, rule, 0)
	if err != nil || !held.Allowed() || held.Lease == nil || held.Denied() != 0 || held.Decision.Remaining[0] != 1 {
		t.Fatalf("first slot: %+v, %v; want granted, 1 left", held, err)
	}
	refused, err := edge.Decide(ctx, lim, rule, 0)
	if err != nil || refused.Allowed() || refused.Denied() != admit.PartConcurrency ||
		refused.Decision.RetryAfter != edge.DefaultConcurrencyRetryAfter || refused.Decision.Remaining != [2]int{-1, -1} {
		t.Fatalf("second lease: %+v (RetryAfter %v, Remaining %v), %v; want refused by the concurrency limit, retry after the default 1s, the bucket not evaluated", refused, refused.Decision.RetryAfter, refused.Decision.Remaining, err)
	}
	hinted := rule.Clone()
	for _, tc := range []struct{ hint, want time.Duration }{{250 * time.Millisecond, 250 * time.Millisecond}, {time.Hour, time.Minute}} {
		hinted.Concurrent.RetryAfter = tc.hint
		res, err := edge.Decide(ctx, lim, hinted, 0)
		if err != nil || res.Denied() != admit.PartConcurrency || res.Decision.RetryAfter != tc.want {
			t.Fatalf("hint %v: %v, retry after %v; want refused, retry after %v (the hint, capped by the oldest lease's 1m left)", tc.hint, err, res.Decision.RetryAfter, tc.want)
		}
	}

	if err := edge.Release(ctx, held.Lease, 0); err != nil {
		t.Fatalf("release: %v", err)
	}
	again, err := edge.Decide(ctx, lim, rule, 0)
	if err != nil || !again.Allowed() || again.Decision.Remaining[0] != 0 {
		t.Fatalf("after the release: %+v, %v; want granted, the bucket's last token taken", again, err)
	}
	srv.SetTime(minitest.Epoch.Add(2 * time.Minute))
	if err := edge.Release(ctx, again.Lease, 0); err == nil || !strings.Contains(err.Error(), "had expired") {
		t.Fatalf("release of an expired lease: %v; want the handler said to have outlived it", err)
	}
}

// TestCheckDecider: nil and a Limiter without a client are refused, saying
// what to pass, with nothing sent (the hook package admit sets); a Limiter
// with a client, a Local and a Degraded are accepted.
func TestCheckDecider(t *testing.T) {
	srv, c := minitest.Start(t)
	local, err := admit.NewLocal(10)
	if err != nil {
		t.Fatal(err)
	}
	deg, err := admit.NewDegraded(0.5, 10)
	if err != nil {
		t.Fatal(err)
	}
	before := srv.CommandCount()
	for _, tc := range []struct {
		name string
		dec  admit.Decider
		want string
	}{
		{"nil", nil, "nil decider"},
		{"no client", admit.New(nil), "has no client"},
		{"nil Limiter", (*admit.Limiter)(nil), "has no client"},
		{"Limiter", admit.New(c), ""},
		{"Local", local, ""},
		{"Degraded", deg, ""},
	} {
		err := edge.CheckDecider(tc.dec)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
	if n := srv.CommandCount() - before; n != 0 {
		t.Errorf("CheckDecider sent %d commands; want none", n)
	}
}

// TestJudge: a decision's verdict; a failed one is Gone when the caller's
// context ended or its deadline passed (whatever the error), and an
// outage of its class otherwise; an invalid Rule is Invalid even then.
func TestJudge(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(live)
	cancel()
	passed := passedDeadline{live} // its timer has not fired yet
	notExec := fmt.Errorf("store down: %w", admit.ErrNotExecuted)
	unknown := fmt.Errorf("lost: %w", admit.ErrOutcomeUnknown)
	invalid := fmt.Errorf("bad: %w", admit.ErrInvalidRequest)
	other := errors.New("a Decider of your own's")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want edge.Verdict
	}{
		{"not executed", live, notExec, edge.NotExecuted},
		{"outcome unknown", live, unknown, edge.OutcomeUnknown},
		{"unclassed", live, other, edge.OutcomeUnknown},
		{"invalid", live, invalid, edge.Invalid},
		{"ended, not executed", ended, notExec, edge.Gone},
		{"ended, outcome unknown", ended, unknown, edge.Gone},
		{"deadline passed, timer not fired", passed, unknown, edge.Gone},
		{"ended, invalid", ended, invalid, edge.Invalid},
	} {
		if got := edge.Judge(tc.ctx, edge.Result{}, tc.err); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
	if edge.Judge(ended, edge.Result{Decision: admit.Decision{}}, nil) != edge.Refuse {
		t.Error("a decided refusal whose caller then left: not Refuse")
	}
}

// passedDeadline is a context whose deadline has passed although its Err
// is still nil: a timer that has not fired yet, as admit may see it.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestDecideRetriesAnotherCallsContextError: a decision that failed, not
// executed, with a context error that is not the caller's (another call's,
// as valkey-go hands out) is decided again, at most 16 more times while
// the caller waits; a dial that timed out, the caller's own context
// ending, and any other error are answered at once.
func TestDecideRetriesAnotherCallsContextError(t *testing.T) {
	foreign := fmt.Errorf("%w: another call's context: %w", admit.ErrNotExecuted, context.Canceled)
	dial := fmt.Errorf("%w: could not connect: %w", admit.ErrNotExecuted,
		&net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded})
	unknown := fmt.Errorf("%w: in flight: %w", admit.ErrOutcomeUnknown, context.Canceled)
	rule := edge.Rule{First: edge.Bucket{Policy: "p", Key: "k", Spec: admit.MustSpec(admit.Every(time.Second), 1)}}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		errs      []error // one a call; nil admits
		wantCalls int
		wantErr   error
	}{
		{"foreign twice, then decided", context.Background(), []error{foreign, foreign, nil}, 3, nil},
		{"foreign every time", context.Background(), nil, 17, foreign},
		{"dial timed out", context.Background(), []error{dial, nil}, 1, dial},
		{"outcome unknown", context.Background(), []error{unknown, nil}, 1, unknown},
		{"the caller's own context ended", ended, []error{foreign, nil}, 1, foreign},
	} {
		dec := &scriptedDecider{errs: tc.errs, always: foreign}
		_, err := edge.Decide(tc.ctx, dec, rule, 0)
		if dec.calls != tc.wantCalls || err != tc.wantErr {
			t.Errorf("%s: %d calls, %v; want %d calls, %v", tc.name, dec.calls, err, tc.wantCalls, tc.wantErr)
		}
	}
}

// scriptedDecider fails its AllowAll calls with errs in turn (a nil
// admits), then with always.
type scriptedDecider struct {
	admit.Decider
	errs   []error
	always error
	calls  int
}

func (s *scriptedDecider) AllowAll(context.Context, admit.Request, *admit.Request) (admit.Decision, error) {
	s.calls++
	err := s.always
	if s.calls <= len(s.errs) {
		err = s.errs[s.calls-1]
	}
	if err != nil {
		return admit.Decision{}, err
	}
	return admit.Decision{Remaining: [2]int{0, -1}}, nil
}

// TestRulePolicyOf: a part's policy and key, the first part's for 0 or a
// part the Rule lacks, the concurrency part's for a Rule without buckets.
func TestRulePolicyOf(t *testing.T) {
	spec, conc := admit.MustSpec(admit.Every(time.Second), 1), admit.MustConcurrency(1, time.Second)
	first, second := edge.Bucket{Policy: "f", Key: "kf", Spec: spec}, edge.Bucket{Policy: "s", Key: "ks", Spec: spec}
	c := edge.Concurrent{Policy: "c", Key: "kc", Spec: conc}
	full := edge.Rule{First: first, Second: &second, Concurrent: &c}
	for _, tc := range []struct {
		name        string
		rule        edge.Rule
		part        admit.Part
		policy, key string
	}{
		{"first", full, admit.PartFirst, "f", "kf"},
		{"second", full, admit.PartSecond, "s", "ks"},
		{"concurrency", full, admit.PartConcurrency, "c", "kc"},
		{"none", full, 0, "f", "kf"},
		{"second it lacks", edge.Rule{First: first}, admit.PartSecond, "f", "kf"},
		{"concurrency it lacks", edge.Rule{First: first}, admit.PartConcurrency, "f", "kf"},
		{"no buckets", edge.Rule{Concurrent: &c}, 0, "c", "kc"},
	} {
		if p, k := tc.rule.PolicyOf(tc.part); p != tc.policy || k != tc.key {
			t.Errorf("%s: %q, %q; want %q, %q", tc.name, p, k, tc.policy, tc.key)
		}
	}
}
