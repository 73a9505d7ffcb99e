package admitgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// serve starts a real gRPC server on 127.0.0.1 with the interceptors and
// the health service (a unary Check, a streaming Watch), and returns a
// client connected to it. Both stop with the test.
func serve(tb testing.TB, ic *admitgrpc.Interceptors) healthpb.HealthClient {
	tb.Helper()
	return serveHealth(tb, ic, health.NewServer(), nil, nil)
}

func mustLocal(tb testing.TB, clock *minitest.Clock) *admit.Local {
	tb.Helper()
	l, err := admit.NewLocal(1000, admit.WithLocalClock(clock.Time))
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

var (
	userSpec   = admit.MustSpec(admit.Every(time.Second), 2)
	sharedSpec = admit.MustSpec(admit.Every(100*time.Millisecond), 3)
)

// byUser keys a user's bucket on the x-user metadata as any string, as a
// careless server might: the tests show that no value lifts the limit.
func byUser(c *admitgrpc.Call) admitgrpc.Rule {
	var user string
	if v := c.Metadata.Get("x-user"); len(v) > 0 {
		user = v[0]
	}
	if v := c.Metadata.Get("x-user-bin"); len(v) > 0 {
		user = v[0]
	}
	shared := admitgrpc.Bucket{Policy: "shared", Key: "rl:shared", Spec: sharedSpec}
	if c.Metadata.Get("x-plan") != nil && c.Metadata.Get("x-plan")[0] == "premium" {
		return admitgrpc.Rule{First: shared}
	}
	return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "per-user", Key: user, Spec: userSpec}, Second: &shared}
}

func check(ctx context.Context, c healthpb.HealthClient, md ...string) error {
	_, err := c.Check(metadata.AppendToOutgoingContext(ctx, md...), &healthpb.HealthCheckRequest{})
	return err
}

// details reads a refusal as a client does.
func details(tb testing.TB, err error) (codes.Code, string, time.Duration, []string) {
	tb.Helper()
	st, ok := status.FromError(err)
	if !ok {
		tb.Fatalf("not a status error: %v", err)
	}
	delay, vs := retryAndQuota(st)
	var subjects []string
	for _, v := range vs {
		subjects = append(subjects, v.GetSubject())
	}
	return st.Code(), st.Message(), delay, subjects
}

// retryAndQuota reads st's details: RetryInfo's delay (-1 without one) and
// QuotaFailure's violations.
func retryAndQuota(st *status.Status) (time.Duration, []*errdetails.QuotaFailure_Violation) {
	delay := time.Duration(-1)
	var vs []*errdetails.QuotaFailure_Violation
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		case *errdetails.QuotaFailure:
			vs = append(vs, d.GetViolations()...)
		}
	}
	return delay, vs
}

var failServe = admitgrpc.OutageFunc(func(*admitgrpc.Call, admitgrpc.Rule, error) error {
	return status.Error(codes.Aborted, "test: the outage policy ran")
})

// TestRefusal: a refused call ends with ResourceExhausted, RetryInfo (the
// wait rounded up to a ms) and a QuotaFailure naming the refusing bucket;
// a second-bucket refusal names the second and charges neither.
func TestRefusal(t *testing.T) {
	for _, name := range []string{"Local", "Limiter"} {
		t.Run(name, func(t *testing.T) { testRefusal(t, name) })
	}
}

// testRefusal is TestRefusal on an admit.Local, or on an admit.Limiter
// whose miniredis reads the test's clock.
func testRefusal(t *testing.T, decider string) {
	clock := minitest.NewClock()
	var lim admit.Decider = mustLocal(t, clock)
	sync := func() {}
	if decider == "Limiter" {
		srv, client := minitest.Start(t)
		sync = func() { srv.SetTime(clock.Time()) }
		sync()
		lim = admit.New(client)
	}
	var outcomes []admitgrpc.Outcome
	ic, err := admitgrpc.New(lim, byUser, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) { outcomes = append(outcomes, r.Outcome) }))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	ctx := context.Background()
	for i := range 2 {
		if err := check(ctx, c, "x-user", "alice"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	clock.Advance(300 * time.Microsecond) // the next token is 999.7 ms away
	sync()
	err = check(ctx, c, "x-user", "alice")
	code, msg, delay, subjects := details(t, err)
	t.Logf("client sees: code %v, message %q, retry delay %v, violations %q", code, msg, delay, subjects)
	if code != codes.ResourceExhausted || delay != time.Second || len(subjects) != 1 || subjects[0] != "per-user" || !strings.Contains(msg, `"per-user"`) {
		t.Fatalf("got %v %q delay %v violations %q; want ResourceExhausted, 1s (999.7ms rounded up), [per-user]", code, msg, delay, subjects)
	}
	// The shared bucket (burst 3) has 1 token left: bob takes it, carol is
	// refused by it, and carol's own bucket is not charged (all or nothing).
	if err := check(ctx, c, "x-user", "bob"); err != nil {
		t.Fatal(err)
	}
	err = check(ctx, c, "x-user", "carol")
	code, _, delay, subjects = details(t, err)
	if code != codes.ResourceExhausted || len(subjects) != 1 || subjects[0] != "shared" || delay != 100*time.Millisecond {
		t.Fatalf("got %v delay %v violations %q; want ResourceExhausted naming shared, 100ms", code, delay, subjects)
	}
	d, _ := lim.Peek(ctx, admit.Request{Key: "carol", Spec: userSpec}, nil)
	if d.Remaining[0] != 1 { // a take would leave 1 of 2: uncharged
		t.Fatalf("carol's bucket was charged by a refusal of the shared one: a take would leave %d", d.Remaining[0])
	}
	want := []admitgrpc.Outcome{admitgrpc.Admitted, admitgrpc.Admitted, admitgrpc.Refused, admitgrpc.Admitted, admitgrpc.Refused}
	if fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", outcomes, want)
	}
}

// TestHostileMetadata: no metadata a client sends lifts the limit or
// yields codes.Internal: missing, empty, 1 MB, binary.
func TestHostileMetadata(t *testing.T) {
	clock := minitest.NewClock()
	ic, err := admitgrpc.New(mustLocal(t, clock), byUser, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	ctx := context.Background()
	huge := strings.Repeat("x", 1<<20)
	for _, tc := range []struct {
		name string
		md   []string
		pass int        // calls that pass: the per-user burst, or none
		code codes.Code // every other call's code
	}{
		{"missing", nil, 0, codes.InvalidArgument},
		{"empty", []string{"x-user", ""}, 0, codes.InvalidArgument},
		{"1MB", []string{"x-user", huge}, 0, codes.InvalidArgument},
		{"binary", []string{"x-user-bin", "\x00\xff{}\n\r"}, 2, codes.ResourceExhausted},
		{"braces", []string{"x-user", "}{"}, 2, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock.Advance(time.Hour) // every bucket full again
			ok := 0
			for i := range 6 {
				err := check(ctx, c, tc.md...)
				if err == nil {
					ok++
					continue
				}
				if code := status.Code(err); code != tc.code {
					t.Fatalf("call %d: %v, want code %v", i, err, tc.code)
				}
			}
			if ok != tc.pass {
				t.Fatalf("%d of 6 calls passed, want %d", ok, tc.pass)
			}
		})
	}
}

// failing is a store that fails every decision with err until healed.
type failing struct {
	*admit.Local
	err    atomic.Pointer[error]
	called atomic.Int64
}

func (f *failing) AllowAll(ctx context.Context, first admit.Request, second *admit.Request) (admit.Decision, error) {
	f.called.Add(1)
	if p := f.err.Load(); p != nil {
		return admit.Decision{}, *p
	}
	return f.Local.AllowAll(ctx, first, second)
}

func (f *failing) fail(err error) { f.err.Store(&err) }
func (f *failing) heal()          { f.err.Store(nil) }

// TestOutagePolicies: each policy does what it says with each error
// class, and decisions go back to the store as soon as it answers.
func TestOutagePolicies(t *testing.T) {
	notExecuted := fmt.Errorf("store down: %w", admit.ErrNotExecuted)
	unknown := fmt.Errorf("reply lost: %w", admit.ErrOutcomeUnknown)
	clock := minitest.NewClock()
	degraded, err := admit.NewDegraded(0.5, 100, admit.WithLocalClock(clock.Time))
	if err != nil {
		t.Fatal(err)
	}
	premium := []string{"x-plan", "premium"} // the shared bucket alone: burst 3, degraded 1
	for _, tc := range []struct {
		name   string
		policy admitgrpc.OutagePolicy
		err    error
		want   []codes.Code
		delay  time.Duration // RetryInfo of the last call, -1 for none
	}{
		{"serve", admitgrpc.Serve(), notExecuted, []codes.Code{codes.OK, codes.OK, codes.OK}, -1},
		{"unavailable", admitgrpc.Unavailable(1500 * time.Microsecond), unknown, []codes.Code{codes.Unavailable, codes.Unavailable, codes.Unavailable}, 2 * time.Millisecond},
		{"degrade", admitgrpc.Degrade(degraded), notExecuted, []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}, 200 * time.Millisecond},
		{"func", admitgrpc.OutageFunc(func(c *admitgrpc.Call, _ admitgrpc.Rule, err error) error {
			if !errors.Is(err, admit.ErrOutcomeUnknown) || c.FullMethod != "/grpc.health.v1.Health/Check" {
				return status.Error(codes.FailedPrecondition, "unexpected")
			}
			return status.Error(codes.Aborted, "try later")
		}), unknown, []codes.Code{codes.Aborted, codes.Aborted, codes.Aborted}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &failing{Local: mustLocal(t, clock)}
			ic, err := admitgrpc.New(store, byUser, admitgrpc.Outage{NotExecuted: tc.policy, OutcomeUnknown: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			c := serve(t, ic)
			clock.Advance(time.Hour)
			store.fail(tc.err)
			var last error
			for i, want := range tc.want {
				last = check(context.Background(), c, premium...)
				if got := status.Code(last); got != want {
					t.Fatalf("call %d during the outage: %v, want %v", i, last, want)
				}
			}
			if tc.delay >= 0 {
				if _, _, delay, _ := details(t, last); delay != tc.delay {
					t.Fatalf("retry delay %v, want %v", delay, tc.delay)
				}
			}
			// The store answers again: the very next call is its decision.
			store.heal()
			for i := range 3 {
				if err := check(context.Background(), c, premium...); err != nil {
					t.Fatalf("call %d after the store came back: %v (the store's burst is 3)", i, err)
				}
			}
			if code := status.Code(check(context.Background(), c, premium...)); code != codes.ResourceExhausted {
				t.Fatalf("4th call after the store came back: %v, want the store's refusal", code)
			}
		})
	}
}

// TestNoDefaultOutage: New refuses an Outage without both policies.
func TestNoDefaultOutage(t *testing.T) {
	l := mustLocal(t, minitest.NewClock())
	for _, o := range []admitgrpc.Outage{
		{},
		{NotExecuted: admitgrpc.Serve()},
		{OutcomeUnknown: admitgrpc.Serve()},
		{NotExecuted: admitgrpc.Degrade(nil), OutcomeUnknown: admitgrpc.Serve()},
		{NotExecuted: admitgrpc.OutageFunc(nil), OutcomeUnknown: admitgrpc.Serve()},
	} {
		if _, err := admitgrpc.New(l, byUser, o); err == nil {
			t.Errorf("New accepted Outage %+v", o)
		}
	}
	if _, err := admitgrpc.New(nil, byUser, admitgrpc.Outage{NotExecuted: admitgrpc.Serve(), OutcomeUnknown: admitgrpc.Serve()}); err == nil {
		t.Error("New accepted a nil decider")
	}
}

// blocking is a store that answers only when the call's context ends.
type blocking struct{ *admit.Local }

func (b blocking) AllowAll(ctx context.Context, _ admit.Request, _ *admit.Request) (admit.Decision, error) {
	<-ctx.Done()
	return admit.Decision{}, fmt.Errorf("%w: %w", admit.ErrOutcomeUnknown, ctx.Err())
}

// TestClientGone: a client whose deadline passes during the decision is
// not an outage: no outage policy runs, and the outcome says so; with
// WithTimeout, a store that does not answer in time is one.
func TestClientGone(t *testing.T) {
	var outcomes []admitgrpc.Outcome
	var mu sync.Mutex
	record := admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) { mu.Lock(); outcomes = append(outcomes, r.Outcome); mu.Unlock() })
	ic, err := admitgrpc.New(blocking{}, byUser, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe}, record)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if code := status.Code(check(ctx, c, "x-user", "a")); code != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", code)
	}
	ic2, err := admitgrpc.New(blocking{}, byUser, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: admitgrpc.Unavailable(time.Second)},
		record, admitgrpc.WithTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	c2 := serve(t, ic2)
	if code := status.Code(check(context.Background(), c2, "x-user", "a")); code != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable from the outage policy after WithTimeout", code)
	}
	time.Sleep(50 * time.Millisecond) // the first server notices its client gone
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 2 || !slices.Contains(outcomes, admitgrpc.ClientGone) || !slices.Contains(outcomes, admitgrpc.OutageRefused) {
		t.Fatalf("outcomes %v, want [client-gone outage-refused]", outcomes)
	}
}

// TestNoLimitOnlyByChoice: NoLimit, the zero Rule, runs the handler
// undecided (as admithttp's zero Rule does); a Rule with an empty key is
// refused, and a Rule the server got wrong is Internal.
func TestNoLimitOnlyByChoice(t *testing.T) {
	rules := map[string]admitgrpc.Rule{
		"nolimit":  admitgrpc.NoLimit,
		"zero":     {},
		"emptykey": {First: admitgrpc.Bucket{Policy: "p", Spec: userSpec}},
		"zerospec": {First: admitgrpc.Bucket{Policy: "p", Key: "k"}},
		"cost":     {First: admitgrpc.Bucket{Policy: "p", Key: "k", Spec: userSpec, Cost: 3}},
		"policy":   {First: admitgrpc.Bucket{Policy: "é", Key: "k", Spec: userSpec}},
		"samekey":  {First: admitgrpc.Bucket{Policy: "p", Key: "k", Spec: userSpec}, Second: &admitgrpc.Bucket{Policy: "q", Key: "k", Spec: userSpec}},
		"shadowns": {First: admitgrpc.Bucket{Policy: "p", Key: admitgrpc.ShadowPrefix + "x", Spec: userSpec}},
	}
	ic, err := admitgrpc.New(mustLocal(t, minitest.NewClock()), func(c *admitgrpc.Call) admitgrpc.Rule {
		return rules[c.Metadata.Get("rule")[0]]
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	want := map[string]codes.Code{
		"nolimit": codes.OK, "zero": codes.OK, "emptykey": codes.InvalidArgument, "samekey": codes.InvalidArgument,
		"shadowns": codes.InvalidArgument, "zerospec": codes.Internal, "cost": codes.Internal, "policy": codes.Internal,
	}
	for name, code := range want {
		for range 3 { // NoLimit stays unlimited past any burst
			if got := status.Code(check(context.Background(), c, "rule", name)); got != code {
				t.Errorf("%s: %v, want %v", name, got, code)
			}
		}
	}
}

// TestStream: a stream is decided once at its start; an admitted stream's
// handler sees its Admission, a refused one never starts.
func TestStream(t *testing.T) {
	clock := minitest.NewClock()
	var admissions atomic.Int64
	ic, err := admitgrpc.New(mustLocal(t, clock), func(c *admitgrpc.Call) admitgrpc.Rule {
		if !c.Stream {
			return admitgrpc.NoLimit
		}
		return byUser(c)
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			if r.Outcome == admitgrpc.Admitted && r.Call.Stream {
				admissions.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "s")
	for i := range 3 {
		ctx, cancel := context.WithCancel(ctx)
		w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Recv()
		cancel()
		switch {
		case i < 2 && err != nil:
			t.Fatalf("stream %d: %v", i, err)
		case i == 2:
			code, _, _, subjects := details(t, err)
			if code != codes.ResourceExhausted || len(subjects) != 1 || subjects[0] != "per-user" {
				t.Fatalf("stream 3: %v, want ResourceExhausted naming per-user", err)
			}
		}
	}
	if admissions.Load() != 2 {
		t.Fatalf("%d streams admitted, want 2", admissions.Load())
	}
}

// TestAdmissionInHandler: the handler sees the Admission, with the
// decider to refund on.
func TestAdmissionInHandler(t *testing.T) {
	clock := minitest.NewClock()
	lim := mustLocal(t, clock)
	ic, err := admitgrpc.New(lim, byUser, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	var got admitgrpc.Admission
	var ok bool
	h := func(ctx context.Context, _ any) (any, error) { got, ok = admitgrpc.FromContext(ctx); return nil, nil }
	md := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", "u"))
	if _, err := ic.Unary()(md, nil, &grpc.UnaryServerInfo{FullMethod: "/s/M"}, h); err != nil {
		t.Fatal(err)
	}
	if !ok || !got.Decision.Allowed() || got.Decider != admit.Decider(lim) || got.Rule.First.Key != "u" || got.Decision.Remaining != [2]int{1, 2} {
		t.Fatalf("Admission %+v, %v", got, ok)
	}
}

// TestShadow: a shadow rule decides on its own keys, reports what it
// would refuse, and never refuses.
func TestShadow(t *testing.T) {
	clock := minitest.NewClock()
	lim := mustLocal(t, clock)
	tight := admit.MustSpec(admit.Every(time.Second), 1)
	var reports []admitgrpc.ShadowReport
	ic, err := admitgrpc.New(lim, byUser, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithShadow(admitgrpc.Shadow{
			Name: "tight",
			Rule: func(_ *admitgrpc.Call, r admitgrpc.Rule) admitgrpc.Rule {
				r.First.Spec = tight
				return r
			},
			Report: func(r admitgrpc.ShadowReport) { reports = append(reports, r) },
		}))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	for i := range 2 {
		if err := check(context.Background(), c, "x-user", "z"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if len(reports) != 2 || !reports[0].Decision.Allowed() || reports[1].Decision.Allowed() || reports[1].Decision.Denied != 1 ||
		reports[1].Rule.First.Key != admitgrpc.ShadowPrefix+"tight:z" || !reports[1].Enforced.Allowed() {
		t.Fatalf("reports %+v", reports)
	}
}

// TestClassifySeesTheCall: classify gets the full method, the metadata and
// the peer, and a per-peer limit keyed on the peer's address holds.
func TestClassifySeesTheCall(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	ic, err := admitgrpc.New(mustLocal(t, minitest.NewClock()), func(c *admitgrpc.Call) admitgrpc.Rule {
		host := ""
		if c.Peer != nil && c.Peer.Addr != nil {
			host, _, _ = net.SplitHostPort(c.Peer.Addr.String())
		}
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s %q %v", c.FullMethod, host, c.Metadata.Get("x-trace"), c.Stream))
		mu.Unlock()
		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "per-peer", Key: "rl:peer:" + host, Spec: userSpec}}
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	codesSeen := []codes.Code{}
	for range 3 {
		codesSeen = append(codesSeen, status.Code(check(context.Background(), c, "x-trace", "t1")))
	}
	if fmt.Sprint(codesSeen) != fmt.Sprint([]codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}) {
		t.Fatalf("codes %v, want OK OK ResourceExhausted: the per-peer burst is 2", codesSeen)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := `/grpc.health.v1.Health/Check 127.0.0.1 ["t1"] false`; seen[0] != want {
		t.Fatalf("classify saw %q, want %q", seen[0], want)
	}
}

// A Rule's concurrency part, on miniredis (minitest.Start), whose clock
// the tests freeze so that no lease expires by itself: every slot that
// comes back was released by the interceptors.

// gauge counts the handlers in flight and the most seen at once.
type gauge struct{ now, max atomic.Int64 }

func (g *gauge) enter() {
	n := g.now.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (g *gauge) leave() { g.now.Add(-1) }

// checker is a health service whose unary Check runs check (Watch is the
// standard one's: it sends the status, then blocks until the stream ends).
type checker struct {
	*health.Server
	check func(ctx context.Context) error
}

func (c checker) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serveChecker starts a real gRPC server on 127.0.0.1 whose Check runs
// check, with the interceptors chained after outer (if any), and returns a
// client connected to it.
func serveChecker(tb testing.TB, ic *admitgrpc.Interceptors, check func(context.Context) error,
	outerUnary grpc.UnaryServerInterceptor, outerStream grpc.StreamServerInterceptor) healthpb.HealthClient {
	tb.Helper()
	return serveHealth(tb, ic, checker{Server: health.NewServer(), check: check}, outerUnary, outerStream)
}

// serveHealth starts a real gRPC server on 127.0.0.1 with the health
// service svc, the interceptors chained after outer (if any), and returns a
// client connected to it. Both stop with the test.
func serveHealth(tb testing.TB, ic *admitgrpc.Interceptors, svc healthpb.HealthServer,
	outerUnary grpc.UnaryServerInterceptor, outerStream grpc.StreamServerInterceptor, dial ...grpc.DialOption) healthpb.HealthClient {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	us := []grpc.UnaryServerInterceptor{ic.Unary()}
	ss := []grpc.StreamServerInterceptor{ic.Stream()}
	if outerUnary != nil {
		us = append([]grpc.UnaryServerInterceptor{outerUnary}, us...)
	}
	if outerStream != nil {
		ss = append([]grpc.StreamServerInterceptor{outerStream}, ss...)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(us...), grpc.ChainStreamInterceptor(ss...))
	healthpb.RegisterHealthServer(srv, svc)
	go srv.Serve(ln) //nolint:errcheck // Serve returns when Stop is called
	tb.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// holders is the number of holders in the lease key (its sorted set).
func holders(tb testing.TB, c valkey.Client, key string) int64 {
	tb.Helper()
	n, err := c.Do(context.Background(), c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// slotInfo reads a concurrency refusal: RetryInfo's delay, QuotaFailure's
// violations as subject: description.
func slotInfo(tb testing.TB, err error) (codes.Code, time.Duration, []string) {
	tb.Helper()
	st, _ := status.FromError(err)
	delay, violations := retryAndQuota(st)
	var vs []string
	for _, v := range violations {
		vs = append(vs, v.GetSubject()+": "+v.GetDescription())
	}
	return st.Code(), delay, vs
}

var concSpec = admit.MustConcurrency(3, time.Minute)

// TestConcurrentInFlight: 50 concurrent calls on a limit of 3. While the
// first 3 hold their slots, the 47 others are refused with a RetryInfo of
// the default hint, 1 s (the frozen clock's oldest lease expires a minute
// from now)
// and a QuotaFailure naming the part; the outcome hook reports them
// refused by the concurrency limit. Then 50 callers retry until each is served once
// (at most 400 attempts each): never more than 3 handlers in flight,
// counted inside the handler, and every slot released at the end.
func TestConcurrentInFlight(t *testing.T) {
	_, c := minitest.Start(t)
	const n, callers = 3, 50
	conc := &admitgrpc.Concurrent{Policy: "in-flight", Key: "conc:{org:7}", Spec: concSpec}
	var g gauge
	var refusedBySlot atomic.Int64
	hold := make(chan struct{})
	var holding atomic.Bool
	holding.Store(true)
	ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{Concurrent: conc} },
		admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			if r.Outcome == admitgrpc.Refused && r.Lease != nil && r.Lease.Denied == admit.PartConcurrency && r.Lease.Holders == n {
				refusedBySlot.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	client := serveChecker(t, ic, func(ctx context.Context) error {
		g.enter()
		defer g.leave()
		if holding.Load() {
			select {
			case <-hold:
			case <-time.After(10 * time.Second):
				return errors.New("test: never let go")
			}
		} else {
			time.Sleep(time.Millisecond)
		}
		return nil
	}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Phase 1: 3 hold, 47 refused.
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() { errs <- check(ctx, client) })
	}
	var refusals []error
	for range callers - n {
		if err := <-errs; err != nil {
			refusals = append(refusals, err)
		} else {
			t.Error("a call was served while 3 others held every slot")
		}
	}
	close(hold)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a holder: %v", err)
		}
	}
	if len(refusals) != callers-n {
		t.Fatalf("%d refusals, want %d", len(refusals), callers-n)
	}
	for _, err := range refusals {
		code, delay, vs := slotInfo(t, err)
		want := []string{"in-flight: 3 calls in flight, limit 3"}
		if code != codes.ResourceExhausted || delay != time.Second || fmt.Sprint(vs) != fmt.Sprint(want) {
			t.Fatalf("refusal %v: code %v, RetryInfo %v, violations %q; want ResourceExhausted, 1s (the default hint, under the lease's 1m0s), %q", err, code, delay, vs, want)
		}
	}
	if got := refusedBySlot.Load(); got != callers-n {
		t.Fatalf("outcome hook: %d refused by the concurrency limit with 3 holders, want %d", got, callers-n)
	}
	if g.max.Load() != n {
		t.Fatalf("phase 1: %d in flight at most, want %d", g.max.Load(), n)
	}

	// Phase 2: everyone retries until served.
	holding.Store(false)
	served := retryUntilServed(t, ctx, client, callers, 400, func(err error) error {
		if status.Code(err) != codes.ResourceExhausted {
			return err
		}
		return nil
	})
	t.Logf("limit %d, %d callers: at most %d handlers in flight; %d of %d served on retry", n, callers, g.max.Load(), served, callers)
	if g.max.Load() > n {
		t.Fatalf("%d handlers in flight at once, limit %d", g.max.Load(), n)
	}
	if served != callers {
		t.Fatalf("%d of %d callers served within 400 attempts: slots not released?", served, callers)
	}
	if h := holders(t, c, conc.Key); h != 0 {
		t.Fatalf("%d holders left after every call ended, want 0", h)
	}
}

// retryUntilServed has each of callers call client until it is served, at
// most tries times, a millisecond apart, and returns how many were served.
// A failure that refusal finds wrong (it returns an error) is the test's,
// and ends that caller's retries.
func retryUntilServed(t *testing.T, ctx context.Context, client healthpb.HealthClient, callers, tries int, refusal func(error) error) int64 {
	var served atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range tries {
				err := check(ctx, client)
				if err == nil {
					served.Add(1)
					return
				}
				if bad := refusal(err); bad != nil {
					t.Errorf("retry: %v", bad)
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	return served.Load()
}

// TestConcurrentRefusalTakesNoTokens: with a bucket beside the slot, a
// call refused by the concurrency limit takes no token, and the admitted ones one each.
func TestConcurrentRefusalTakesNoTokens(t *testing.T) {
	_, c := minitest.Start(t)
	lim := admit.New(c)
	bucket := admitgrpc.Bucket{Policy: "tpm", Key: "tpm:{org:7}", Spec: admit.MustSpec(admit.Every(time.Hour), 10)}
	rule := admitgrpc.Rule{First: bucket, Concurrent: &admitgrpc.Concurrent{Policy: "in-flight", Key: "conc:{org:7}",
		Spec: admit.MustConcurrency(1, time.Minute)}}
	ic, err := admitgrpc.New(lim, func(*admitgrpc.Call) admitgrpc.Rule { return rule },
		admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	entered, hold := make(chan struct{}, 1), make(chan struct{})
	client := serveChecker(t, ic, func(ctx context.Context) error {
		entered <- struct{}{}
		<-hold
		return nil
	}, nil, nil)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- check(ctx, client) }()
	<-entered
	for i := range 5 {
		code, _, vs := slotInfo(t, check(ctx, client))
		if code != codes.ResourceExhausted || len(vs) != 1 || !strings.HasPrefix(vs[0], "in-flight:") {
			t.Fatalf("call %d beside the holder: %v %q, want ResourceExhausted by the concurrency limit", i, code, vs)
		}
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	d, err := lim.Peek(ctx, bucket.Request(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Peek's Remaining is what a take would leave: the bucket holds one more.
	if d.Remaining[0]+1 != 9 {
		t.Fatalf("bucket holds %d tokens after 1 admitted and 5 refused by the concurrency limit, want 9", d.Remaining[0]+1)
	}
}

// panicky is a health service whose Check and Watch panic on their first
// three calls, then answer as the standard ones do.
type panicky struct {
	*health.Server
	calls *atomic.Int64
}

func (p panicky) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if p.calls.Add(1) <= 3 {
		panic("test: handler panic")
	}
	return p.Server.Check(ctx, req)
}

func (p panicky) Watch(req *healthpb.HealthCheckRequest, ws healthpb.Health_WatchServer) error {
	if p.calls.Add(1) <= 3 {
		panic("test: handler panic")
	}
	return p.Server.Watch(req, ws)
}

// panicRecoverer is the recovery a server chains outside admitgrpc's
// interceptors (grpc-go does not recover a handler's panic; the process
// would crash): it counts the handlers' panics, records the holders of
// key it sees when one reaches it, and answers Internal.
type panicRecoverer struct {
	tb              testing.TB
	c               valkey.Client
	key             string
	recovered, seen atomic.Int64
}

func (r *panicRecoverer) catch(err *error) {
	if p := recover(); p != nil {
		if p == "test: handler panic" {
			r.recovered.Add(1)
		}
		r.seen.Store(holders(r.tb, r.c, r.key))
		*err = status.Error(codes.Internal, "recovered")
	}
}

func (r *panicRecoverer) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer r.catch(&err)
	return h(ctx, req)
}

func (r *panicRecoverer) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer r.catch(&err)
	return h(srv, ss)
}

// TestConcurrentPanicReleases: a handler that panics, unary or streaming,
// frees its slot, and its panic goes on up: the recovering interceptor
// chained outside admitgrpc's sees the panic value (so admitgrpc
// re-panicked after releasing) and no holder left; after 3 panics on a
// limit of 1, the next call is admitted.
func TestConcurrentPanicReleases(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "unary", true: "stream"}[stream], func(t *testing.T) {
			_, c := minitest.Start(t)
			conc := &admitgrpc.Concurrent{Policy: "in-flight", Key: "conc:{org:7}", Spec: admit.MustConcurrency(1, time.Minute)}
			ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{Concurrent: conc} },
				admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
			if err != nil {
				t.Fatal(err)
			}
			rc := &panicRecoverer{tb: t, c: c, key: conc.Key}
			svc := panicky{Server: health.NewServer(), calls: new(atomic.Int64)}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var call func() error
			if stream {
				client := serveHealth(t, ic, svc, nil, rc.stream)
				call = func() error {
					w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
					if err == nil {
						_, err = w.Recv()
					}
					return err
				}
			} else {
				client := serveHealth(t, ic, svc, rc.unary, nil)
				call = func() error { return check(ctx, client) }
			}
			for i := range 3 {
				if err := call(); status.Code(err) != codes.Internal {
					t.Fatalf("panicking call %d: %v, want the recoverer's Internal (a refusal means the slot was kept)", i, err)
				}
				if rc.seen.Load() != 0 {
					t.Fatalf("panicking call %d: %d holders when the panic reached the recoverer, want 0", i, rc.seen.Load())
				}
			}
			if err := call(); err != nil {
				t.Fatalf("after 3 panics on a limit of 1: %v", err)
			}
			if rc.recovered.Load() != 3 {
				t.Fatalf("the recoverer saw %d panics, want 3", rc.recovered.Load())
			}
		})
	}
}

// TestConcurrentStreamHoldsSlot: a stream holds its slot until it ends; a
// stream started meanwhile is refused by the concurrency limit, and one started after
// the first ended is admitted.
func TestConcurrentStreamHoldsSlot(t *testing.T) {
	_, c := minitest.Start(t)
	conc := &admitgrpc.Concurrent{Policy: "streams", Key: "conc:{s}", Spec: admit.MustConcurrency(1, time.Minute)}
	ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{Concurrent: conc} },
		admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	client := serveChecker(t, ic, func(context.Context) error { return nil }, nil, nil)
	open := func() (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(context.Background())
		w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			cancel()
		}
		return cancel, err
	}
	end1, err := open()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		_, err := open()
		if code, _, vs := slotInfo(t, err); code != codes.ResourceExhausted || len(vs) != 1 || vs[0] != "streams: 1 calls in flight, limit 1" {
			t.Fatalf("stream beside the open one, %d: %v %q", i, err, vs)
		}
	}
	if h := holders(t, c, conc.Key); h != 1 {
		t.Fatalf("%d holders with one stream open, want 1", h)
	}
	end1()
	// The server sees the cancel and the handler returns: wait for it,
	// bounded.
	deadline := time.Now().Add(5 * time.Second)
	for holders(t, c, conc.Key) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the ended stream's slot was not released within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	end2, err := open()
	if err != nil {
		t.Fatalf("stream after the first ended: %v", err)
	}
	end2()
}

// TestConcurrentInvalidParts: an invalid concurrency part goes the invalid
// Rule's way, never to the handler; a concurrency-only Rule is valid.
func TestConcurrentInvalidParts(t *testing.T) {
	_, c := minitest.Start(t)
	spec := admit.MustConcurrency(2, time.Minute)
	bucket := admitgrpc.Bucket{Policy: "tpm", Key: "tpm:{o}", Spec: admit.MustSpec(10, 10)}
	for _, tc := range []struct {
		name  string
		rule  admitgrpc.Rule
		local bool
		want  codes.Code
	}{
		{"valid alone", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}", Spec: spec}}, false, codes.OK},
		{"valid with bucket", admitgrpc.Rule{First: bucket, Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}", Spec: spec}}, false, codes.OK},
		{"empty key", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Spec: spec}}, false, codes.InvalidArgument},
		{"long key", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: strings.Repeat("k", admit.MaxKeyLen+1), Spec: spec}}, false, codes.InvalidArgument},
		{"bucket's key", admitgrpc.Rule{First: bucket, Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: bucket.Key, Spec: spec}}, false, codes.InvalidArgument},
		{"shadow key", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: admitgrpc.ShadowPrefix + "x", Spec: spec}}, false, codes.InvalidArgument},
		{"empty policy", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Key: "c:{o}", Spec: spec}}, false, codes.Internal},
		{"bad policy", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c\n", Key: "c:{o}", Spec: spec}}, false, codes.Internal},
		{"zero spec", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}"}}, false, codes.Internal},
		{"bucket's policy", admitgrpc.Rule{First: bucket, Concurrent: &admitgrpc.Concurrent{Policy: "tpm", Key: "c:{o}", Spec: spec}}, false, codes.Internal},
		{"cross slot", admitgrpc.Rule{First: bucket, Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: "c:{other}", Spec: spec}}, false, codes.OK}, // standalone: one slot
		{"on a Local", admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}", Spec: spec}}, true, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dec admit.Decider = admit.New(c)
			if tc.local {
				dec = mustLocal(t, minitest.NewClock())
			}
			var outcome admitgrpc.Outcome
			var ruleErr error
			ic, err := admitgrpc.New(dec, func(*admitgrpc.Call) admitgrpc.Rule { return tc.rule },
				admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
				admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) { outcome, ruleErr = r.Outcome, r.Err }))
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Bool
			client := serveChecker(t, ic, func(context.Context) error { ran.Store(true); return nil }, nil, nil)
			err = check(context.Background(), client)
			if status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if tc.want != codes.OK && (ran.Load() || outcome != admitgrpc.InvalidRule || !errors.Is(ruleErr, admit.ErrInvalidRequest)) {
				t.Fatalf("handler ran %v, outcome %v, err %v; want no handler, invalid-rule, ErrInvalidRequest", ran.Load(), outcome, ruleErr)
			}
		})
	}
}

// TestConcurrentReleaseError: a release that fails goes to the error hook;
// the call's answer stands and nothing panics.
func TestConcurrentReleaseError(t *testing.T) {
	srv, c := minitest.Start(t)
	conc := &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}", Spec: admit.MustConcurrency(2, time.Minute)}
	var mu sync.Mutex
	var errs []error
	ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{Concurrent: conc} },
		admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe}, admitgrpc.WithTimeout(200*time.Millisecond),
		admitgrpc.WithErrorFunc(func(_ *admitgrpc.Call, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }))
	if err != nil {
		t.Fatal(err)
	}
	client := serveChecker(t, ic, func(context.Context) error { srv.Close(); return nil }, nil, nil)
	if err := check(context.Background(), client); err != nil {
		t.Fatalf("the call whose release failed: %v, want its handler's answer", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `releasing the lease of "c:{o}"`) {
		t.Fatalf("error hook got %v, want one release error", errs)
	}
}

// TestConcurrentDegrade: while degraded, a Rule with a concurrency part,
// with a bucket or without, is refused with Unavailable and a RetryInfo of
// 1 s, its handler never run (a Degraded holds no leases); a Rule without
// one is still decided on the Degraded's bucket.
func TestConcurrentDegrade(t *testing.T) {
	srv, c := minitest.Start(t)
	srv.Close() // every decision fails: not executed
	deg, err := admit.NewDegraded(0.5, 100)
	if err != nil {
		t.Fatal(err)
	}
	bucket := admitgrpc.Bucket{Policy: "tpm", Key: "tpm:{o}", Spec: admit.MustSpec(admit.Every(time.Hour), 4)}
	conc := &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}", Spec: admit.MustConcurrency(1, time.Minute)}
	var rule atomic.Value
	var outcomes sync.Map
	var ran atomic.Int64
	ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule { return rule.Load().(admitgrpc.Rule) },
		admitgrpc.Outage{NotExecuted: admitgrpc.Degrade(deg), OutcomeUnknown: admitgrpc.Degrade(deg)}, admitgrpc.WithTimeout(200*time.Millisecond),
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			n, _ := outcomes.LoadOrStore(r.Outcome, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}))
	if err != nil {
		t.Fatal(err)
	}
	client := serveChecker(t, ic, func(context.Context) error { ran.Add(1); return nil }, nil, nil)
	for _, r := range []admitgrpc.Rule{{Concurrent: conc}, {First: bucket, Concurrent: conc}} {
		rule.Store(r)
		for range 3 {
			err := check(context.Background(), client)
			st, _ := status.FromError(err)
			if delay, _ := retryAndQuota(st); st.Code() != codes.Unavailable || delay != time.Second {
				t.Fatalf("concurrency part (buckets %v), degraded: %v, RetryInfo %v; want Unavailable, 1s", r.HasBuckets(), err, delay)
			}
		}
	}
	if ran.Load() != 0 {
		t.Fatalf("%d handlers ran for a Rule with a concurrency part while degraded; want 0", ran.Load())
	}
	rule.Store(admitgrpc.Rule{First: bucket})
	var ok, refused int
	for range 4 {
		switch err := check(context.Background(), client); status.Code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			refused++
			if _, _, vs := slotInfo(t, err); len(vs) != 1 || !strings.HasPrefix(vs[0], "tpm:") {
				t.Fatalf("degraded refusal names %q, want the bucket", vs)
			}
		default:
			t.Fatal(err)
		}
	}
	if ok != 2 || refused != 2 { // half of a burst of 4
		t.Fatalf("degraded: %d served, %d refused; want 2 and 2", ok, refused)
	}
	count := func(o admitgrpc.Outcome) int64 {
		n, ok := outcomes.Load(o)
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	if count(admitgrpc.OutageRefused) != 6 || count(admitgrpc.DegradedAdmitted) != 2 || count(admitgrpc.DegradedRefused) != 2 || count(admitgrpc.OutageServed) != 0 {
		t.Fatalf("outcomes: outage-refused %d, degraded-admitted %d, degraded-refused %d, served %d; want 6, 2, 2, 0",
			count(admitgrpc.OutageRefused), count(admitgrpc.DegradedAdmitted), count(admitgrpc.DegradedRefused), count(admitgrpc.OutageServed))
	}
}

// TestConcurrentLostAcquireReleased: an Acquire whose reply is lost
// (outcome unknown) took a slot on the server; the interceptors release
// it when the call ends, whatever the outage policy answered.
func TestConcurrentLostAcquireReleased(t *testing.T) {
	srv, direct := minitest.Start(t)
	proxy, err := delayproxy.Start(srv.Addr(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{proxy.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	lim := admit.New(c)
	conc := &admitgrpc.Concurrent{Policy: "c", Key: "c:{o}", Spec: admit.MustConcurrency(2, time.Minute)}
	// Load the script through the proxy, so that the next EVALSHA runs.
	x, err := lim.Acquire(context.Background(), admit.LeaseRequest{Key: conc.Key, Spec: conc.Spec}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatalf("warm-up Acquire: %v %v", x, err)
	}
	if _, err := x.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name   string
		policy admitgrpc.OutagePolicy
		code   codes.Code
	}{{"serve", admitgrpc.Serve(), codes.OK}, {"unavailable", admitgrpc.Unavailable(time.Second), codes.Unavailable}} {
		t.Run(p.name, func(t *testing.T) {
			var outageErr error
			ic, err := admitgrpc.New(lim, func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{Concurrent: conc} },
				admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: p.policy},
				admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) { outageErr = r.Err }))
			if err != nil {
				t.Fatal(err)
			}
			inHandler := int64(-1)
			client := serveChecker(t, ic, func(context.Context) error { inHandler = holders(t, direct, conc.Key); return nil }, nil, nil)
			lost := proxy.Lost()
			proxy.LoseReply([]byte("EVALSHA"))
			if err := check(context.Background(), client); status.Code(err) != p.code {
				t.Fatalf("%v, want %v", err, p.code)
			}
			if proxy.Lost() != lost+1 || !errors.Is(outageErr, admit.ErrOutcomeUnknown) {
				t.Fatalf("lost %d replies, outcome error %v; want one lost, ErrOutcomeUnknown", proxy.Lost()-lost, outageErr)
			}
			if p.code == codes.OK && inHandler != 1 {
				t.Fatalf("%d holders while the handler ran, want 1: the lost Acquire's slot", inHandler)
			}
			if h := holders(t, direct, conc.Key); h != 0 {
				t.Fatalf("%d holders after the call, want 0: the lost Acquire's slot was not released", h)
			}
		})
	}
}

// TestConcurrentHostileMetadata: a lease key built carelessly from a
// metadata value (as any string) never lifts the limit nor yields
// Internal: with the key's one slot taken, every value is refused, by the
// slot or as InvalidArgument (missing, empty, 1 MB).
func TestConcurrentHostileMetadata(t *testing.T) {
	_, c := minitest.Start(t)
	lim := admit.New(c)
	one := admit.MustConcurrency(1, time.Minute)
	keyOf := func(md []string) string {
		if len(md) == 0 {
			return ""
		}
		return md[0]
	}
	ic, err := admitgrpc.New(lim, func(call *admitgrpc.Call) admitgrpc.Rule {
		return admitgrpc.Rule{Concurrent: &admitgrpc.Concurrent{Policy: "c", Key: keyOf(call.Metadata.Get("x-org")), Spec: one}}
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	client := serveChecker(t, ic, func(context.Context) error { ran.Add(1); return nil }, nil, nil)
	for _, v := range []*string{nil, new(""), new(strings.Repeat("x", 1<<20)), new("}{org}{"), new("\x00\xff\r\n:{"), new("admit-shadow:")} {
		var md []string
		name := "missing"
		if v != nil {
			md = []string{"x-org-bin", *v} // binary metadata carries any byte
			name = fmt.Sprintf("%.20q", *v)
		}
		// gRPC reads x-org-bin, not x-org: the careless classify sees the
		// value under x-org only in the text form, which cannot carry
		// every byte; send both where the text form can.
		if v != nil && printable(*v) && len(*v) < 1<<16 {
			md = append(md, "x-org", *v)
		}
		key := ""
		if v != nil && len(md) == 4 {
			key = *v
		}
		var x *admit.Lease
		if key != "" && len(key) <= admit.MaxKeyLen && !strings.HasPrefix(key, admitgrpc.ShadowPrefix) {
			x, err = lim.Acquire(context.Background(), admit.LeaseRequest{Key: key, Spec: one}, nil, nil)
			if err != nil || !x.Granted() {
				t.Fatalf("%s: Acquire %v %v", name, x, err)
			}
		}
		err := check(context.Background(), client, md...)
		switch code := status.Code(err); {
		case x != nil && code != codes.ResourceExhausted:
			t.Errorf("%s: %v with the key's one slot taken; want ResourceExhausted", name, err)
		case x == nil && code != codes.InvalidArgument:
			t.Errorf("%s: %v; want InvalidArgument", name, err)
		}
		if x != nil {
			if _, err := x.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ran.Load() != 0 {
		t.Fatalf("the handler ran %d times", ran.Load())
	}
}

// printable reports whether s is printable ASCII, as text metadata is.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// TestRootModuleStaysFree: gRPC and x/time/rate (this module's benchmark)
// are this module's dependencies, never the root module's, whose go.mod is
// what every importer of admit pays for.
func TestRootModuleStaysFree(t *testing.T) {
	root, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(root), "module github.com/admitkit/admit\n") {
		t.Fatalf("../go.mod is not admit's root module:\n%s", root)
	}
	for _, dep := range []string{"google.golang.org/grpc", "google.golang.org/genproto", "google.golang.org/protobuf", "golang.org/x/time"} {
		if strings.Contains(string(root), dep) {
			t.Errorf("the root go.mod names %s; it belongs in a nested module", dep)
		}
	}
	own, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(own), "google.golang.org/grpc ") {
		t.Fatal("this module's go.mod does not require google.golang.org/grpc: the check above would pass vacuously")
	}
}

// TestIntegrationConcurrentInFlight: on a real server, 50 callers retry
// until each is served once, against a limit of 4 slots beside a bucket
// that holds enough for every call. Never more than 4 handlers in flight
// (counted inside the handler); every caller served; no slot left taken;
// the bucket charged once per admitted call, never for a slot refusal.
func TestIntegrationConcurrentInFlight(t *testing.T) {
	c := testserver.NewClient(t, testserver.Shared(t))
	prefix := testserver.Prefix(t, c)
	const n, callers = 4, 50
	bucket := admitgrpc.Bucket{Policy: "calls", Key: prefix + "calls", Spec: admit.MustSpec(admit.Every(time.Hour), 1000)}
	conc := &admitgrpc.Concurrent{Policy: "in-flight", Key: prefix + "conc", Spec: admit.MustConcurrency(n, 10*time.Second)}
	lim := admit.New(c)
	var admitted, refusedBySlot atomic.Int64
	ic, err := admitgrpc.New(lim, func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{First: bucket, Concurrent: conc} },
		admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			switch {
			case r.Outcome == admitgrpc.Admitted:
				admitted.Add(1)
			case r.Outcome == admitgrpc.Refused && r.Lease != nil && r.Lease.Denied == admit.PartConcurrency:
				refusedBySlot.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	var g gauge
	client := serveChecker(t, ic, func(context.Context) error {
		g.enter()
		defer g.leave()
		time.Sleep(2 * time.Millisecond)
		return nil
	}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := retryUntilServed(t, ctx, client, callers, 500, func(err error) error {
		if code, delay, _ := slotInfo(t, err); code != codes.ResourceExhausted || delay <= 0 || delay > 10*time.Second {
			return fmt.Errorf("%s (RetryInfo %v)", status.Convert(err).Message(), delay)
		}
		return nil
	})
	t.Logf("limit %d, %d callers: at most %d handlers in flight; %d served, %d refusals by the slot", n, callers, g.max.Load(), served, refusedBySlot.Load())
	if g.max.Load() > n {
		t.Fatalf("%d handlers in flight at once, limit %d", g.max.Load(), n)
	}
	if served != callers || admitted.Load() != callers {
		t.Fatalf("%d served, %d admitted, of %d callers", served, admitted.Load(), callers)
	}
	if h := holders(t, c, conc.Key); h != 0 {
		t.Fatalf("%d holders left after every call ended, want 0", h)
	}
	d, err := lim.Peek(ctx, bucket.Request(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Remaining[0] + 1; got != 1000-callers {
		t.Fatalf("bucket holds %d after %d admitted and %d slot refusals, want %d", got, callers, refusedBySlot.Load(), 1000-callers)
	}
}

// TestIntegrationDegradedOutage kills the store under load and restarts
// it: 4 gRPC servers (the fleet's processes, each with its own Limiter and
// its own Degraded at 0.25) share one bucket on a real valkey-server, and
// their clients call far faster than the limit. It checks, from the
// outcome hook's counts:
//
//   - before the kill, the fleet admits what the store's bucket allows:
//     at most burst + rate × t;
//   - during the outage, each process decides alone at a quarter of the
//     Spec, and the fleet admits at most N × fraction × (burst + rate × t)
//     = burst + rate × t for the outage's length;
//   - after the restart, decisions go back to the store with no sticky
//     state: the store decides every call from its first answer on.
//
// It logs the admitted count per second beside the bound.
func TestIntegrationDegradedOutage(t *testing.T) {
	if os.Getenv("VALKEY_ADDR") != "" {
		t.Skip("kills and restarts its server; skipped on VALKEY_ADDR")
	}
	srv := testserver.Own(t)
	port := srv.Addr[strings.LastIndexByte(srv.Addr, ':')+1:]

	const (
		n        = 4
		fraction = 0.25
		before   = 3 * time.Second
		outage   = 4 * time.Second
		after    = 3 * time.Second
	)
	spec := admit.MustSpec(admit.Every(25*time.Millisecond), 40) // 40/s, burst 40
	rule := func(*admitgrpc.Call) admitgrpc.Rule {
		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "shared", Key: "rl:{api}:shared", Spec: spec}}
	}

	// Each outcome, stamped with the second of the run it happened in.
	type stamp struct {
		at  time.Duration
		o   admitgrpc.Outcome
		err error
	}
	var mu sync.Mutex
	var stamps []stamp
	start := time.Now()
	record := admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
		mu.Lock()
		stamps = append(stamps, stamp{time.Since(start), r.Outcome, r.Err})
		mu.Unlock()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var errs atomic.Int64
	for range n {
		client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true,
			ConnWriteTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		degraded, err := admit.NewDegraded(fraction, 1000)
		if err != nil {
			t.Fatal(err)
		}
		ic, err := admitgrpc.New(admit.New(client), rule,
			admitgrpc.Outage{NotExecuted: admitgrpc.Degrade(degraded), OutcomeUnknown: admitgrpc.Degrade(degraded)},
			record, admitgrpc.WithTimeout(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		c := serve(t, ic)
		for range 4 { // 4 callers a process, each a call every 2 ms: about 8,000 calls/s against a limit of 40/s
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
					if err != nil && ctx.Err() == nil && !isRefusal(err) {
						errs.Add(1)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
	}

	time.Sleep(before)
	killed := time.Since(start)
	srv.Stop() // kill -9: the store is gone
	time.Sleep(outage)
	restarted := time.Since(start)
	restart := restartServer(t, port)
	defer restart.Process.Kill()
	time.Sleep(after)
	cancel()
	wg.Wait()
	end := time.Since(start)

	mu.Lock()
	defer mu.Unlock()
	// Per second: admitted by the store, admitted degraded, refused.
	secs := int(end/time.Second) + 1
	byStore, byDegraded := make([]int, secs), make([]int, secs)
	refused := make([]int, secs)
	var firstStoreAfter time.Duration = -1
	phase := map[string][2]int{} // admitted by store, degraded, per phase
	for _, s := range stamps {
		i := int(s.at / time.Second)
		p := "before"
		switch {
		case s.at >= restarted:
			p = "after"
		case s.at >= killed:
			p = "outage"
		}
		c := phase[p]
		switch s.o {
		case admitgrpc.Admitted:
			byStore[i]++
			c[0]++
			if s.at >= restarted && firstStoreAfter < 0 {
				firstStoreAfter = s.at
			}
		case admitgrpc.DegradedAdmitted:
			byDegraded[i]++
			c[1]++
		default:
			refused[i]++
		}
		phase[p] = c
	}
	rate, burst := float64(spec.Limit()), float64(spec.Burst())
	t.Logf("store killed at %v, restarted at %v; fleet of %d at fraction %v; limit %v/s burst %v", killed.Round(time.Millisecond), restarted.Round(time.Millisecond), n, fraction, rate, burst)
	t.Logf("%6s %8s %9s %8s", "second", "store", "degraded", "refused")
	for i := range secs {
		t.Logf("%6d %8d %9d %8d", i, byStore[i], byDegraded[i], refused[i])
	}
	bound := func(d time.Duration) float64 { return burst + rate*d.Seconds() }
	fleet := func(d time.Duration) float64 { return n * fraction * bound(d) }
	t.Logf("before:  %d admitted by the store in %v, bound burst + rate × t = %.0f", phase["before"][0], killed.Round(time.Millisecond), bound(killed))
	t.Logf("outage:  %d admitted degraded (%d by the store, in flight at the kill) in %v, fleet bound N × f × (burst + rate × t) = %.0f",
		phase["outage"][1], phase["outage"][0], (restarted - killed).Round(time.Millisecond), fleet(restarted-killed))
	t.Logf("after:   %d admitted by the store, %d degraded (calls that failed while its clients reconnected), first store admission %v after the restart",
		phase["after"][0], phase["after"][1], (firstStoreAfter - restarted).Round(time.Millisecond))
	if got := float64(phase["before"][0]); got > bound(killed) {
		t.Errorf("before the kill: %v admitted, above the bound %.0f", got, bound(killed))
	}
	if got := float64(phase["outage"][1]); got > fleet(restarted-killed) {
		t.Errorf("during the outage: %v admitted degraded, above the fleet bound %.0f", got, fleet(restarted-killed))
	}
	if phase["outage"][1] == 0 {
		t.Error("nothing admitted during the outage: Degrade did not decide")
	}
	if firstStoreAfter < 0 {
		t.Fatal("the store decided nothing after its restart")
	}
	// No sticky state: a degraded decision is made only for a call whose
	// store decision failed (its report carries that error), and once the
	// store is back it decides again: in the run's last second it admits
	// at least half its rate (the rest of each second may go to calls
	// that timed out under load, which degrade one by one).
	lastStore := 0
	for _, s := range stamps {
		degraded := s.o == admitgrpc.DegradedAdmitted || s.o == admitgrpc.DegradedRefused
		if degraded && !errors.Is(s.err, admit.ErrNotExecuted) && !errors.Is(s.err, admit.ErrOutcomeUnknown) {
			t.Fatalf("a degraded decision at %v without a failed store decision (%v): sticky outage state", s.at, s.err)
		}
		if s.o == admitgrpc.Admitted && s.at >= end-time.Second {
			lastStore++
		}
	}
	if float64(lastStore) < rate/2 {
		t.Errorf("the store admitted %d in the run's last second, under half its rate %v: decisions did not go back to it", lastStore, rate)
	}
	if got, b := float64(phase["after"][0]), bound(end-restarted); got > b {
		t.Errorf("after the restart: %v admitted by the store, above burst + rate × t = %.0f", got, b)
	}
	if errs.Load() > 0 {
		t.Errorf("%d calls failed with another code than ResourceExhausted", errs.Load())
	}
}

func isRefusal(err error) bool { return status.Code(err) == codes.ResourceExhausted }

// restartServer starts the server binary again on port, as an operator
// restarts a crashed store at its address, and waits until it answers.
func restartServer(t *testing.T, port string) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(testserver.Binary(), "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait() //nolint:errcheck // reaped on kill
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return cmd
		}
	}
	t.Fatalf("%s did not listen on %s again", filepath.Base(testserver.Binary()), port)
	return nil
}

// TestGoneVersusOutageStorePaused: with the store paused (SIGSTOP) and a
// client deadline of 300 ms, every one of 100 calls is ClientGone, with
// and without a decision timeout (one longer than the client's deadline):
// a caller whose deadline passed is never an outage, and its handler never
// runs, even when valkey-go fails its call with another call's context
// error first (edge.Decide tries again). A decision timeout well before
// the deadline is an outage.
func TestGoneVersusOutageStorePaused(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	spec := admit.MustSpec(admit.Every(time.Millisecond), 1000)
	for _, tc := range []struct {
		name     string
		opts     []admitgrpc.Option
		deadline time.Duration
		outcome  admitgrpc.Outcome
	}{
		{"no timeout", nil, 300 * time.Millisecond, admitgrpc.ClientGone},
		{"timeout 1s", []admitgrpc.Option{admitgrpc.WithTimeout(time.Second)}, 300 * time.Millisecond, admitgrpc.ClientGone},
		// The decision timeout well before the client's deadline, which a
		// loaded machine must not reach first.
		{"timeout 50ms", []admitgrpc.Option{admitgrpc.WithTimeout(50 * time.Millisecond)}, 10 * time.Second, admitgrpc.OutageServed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var outcomes sync.Map
			var ran, classified atomic.Int64
			ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule {
				classified.Add(1)
				return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "p", Key: "gone:{o}", Spec: spec}}
			}, admitgrpc.Outage{NotExecuted: admitgrpc.Serve(), OutcomeUnknown: admitgrpc.Serve()}, append(tc.opts,
				admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
					n, _ := outcomes.LoadOrStore(r.Outcome, new(atomic.Int64))
					if r.Outcome != tc.outcome {
						dl, _ := r.Call.Context.Deadline()
						t.Logf("%v: %v (ctx %v, deadline in %v)", r.Outcome, r.Err, r.Call.Context.Err(), time.Until(dl))
					}
					n.(*atomic.Int64).Add(1)
				}))...)
			if err != nil {
				t.Fatal(err)
			}
			client := serveChecker(t, ic, func(context.Context) error { ran.Add(1); return nil }, nil, nil)
			if err := check(context.Background(), client); err != nil { // the store's connection is up
				t.Fatal(err)
			}
			outcomes.Clear()
			ran.Store(0)
			classified.Store(0)
			resume := testserver.Pause(t, srv)
			const calls = 100
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
					defer cancel()
					check(ctx, client) //nolint:errcheck // the outcome hook counts
				})
			}
			wg.Wait()
			// Every call that reached the interceptor is decided (its
			// context ended) before the store resumes.
			total := func() (n int64) {
				outcomes.Range(func(_, v any) bool { n += v.(*atomic.Int64).Load(); return true })
				return n
			}
			for deadline := time.Now().Add(5 * time.Second); total() < classified.Load() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			resume()
			counts := map[string]int64{}
			var wrong int64
			outcomes.Range(func(k, v any) bool {
				n := v.(*atomic.Int64).Load()
				counts[k.(admitgrpc.Outcome).String()] = n
				if k != tc.outcome {
					wrong += n
				}
				return true
			})
			// A call whose deadline passed before the server read it never
			// reaches the interceptor: count those that did.
			n := classified.Load()
			t.Logf("%d calls, %d reached the interceptor, store paused: outcomes %v, handlers run %d, not %v: %d", calls, n, counts, ran.Load(), tc.outcome, wrong)
			if wrong != 0 || counts[tc.outcome.String()] != n || n < calls/2 {
				t.Errorf("%d of %d calls decided not %v (%v); want 0, and at least %d decided", wrong, n, tc.outcome, counts, calls/2)
			}
			if tc.outcome == admitgrpc.ClientGone && ran.Load() != 0 {
				t.Errorf("%d handlers ran for callers whose deadline had passed; want 0", ran.Load())
			}
		})
	}
}

// retryExhausted is a service config whose retry policy retries
// RESOURCE_EXHAUSTED once, with a backoff of 10 ms: what a pushback
// replaces.
const retryExhausted = `{"methodConfig": [{"name": [{"service": "grpc.health.v1.Health"}], "retryPolicy": {
	"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
	"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`

// TestPushbackRetried: a refusal's grpc-retry-pushback-ms trailer is its
// RetryInfo delay in milliseconds; a real grpc-go client whose service
// config retries RESOURCE_EXHAUSTED waits that pushback (instead of its
// 10 ms backoff) and its retry is admitted: two attempts, refused then
// admitted. The measured wait is logged, not asserted.
func TestPushbackRetried(t *testing.T) {
	local, err := admit.NewLocal(100)
	if err != nil {
		t.Fatal(err)
	}
	spec := admit.MustSpec(admit.Every(250*time.Millisecond), 1)
	var mu sync.Mutex
	var attempts []time.Time
	var outcomes []admitgrpc.Outcome
	var refusedWait time.Duration // the last refusal's RetryAfter
	ic, err := admitgrpc.New(local, func(*admitgrpc.Call) admitgrpc.Rule {
		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "p", Key: "k", Spec: spec}}
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			mu.Lock()
			outcomes = append(outcomes, r.Outcome)
			if r.Outcome == admitgrpc.Refused {
				refusedWait = r.Decision.RetryAfter
			}
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	stamp := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		return h(ctx, req)
	}
	svc := health.NewServer()
	plain := serveHealth(t, ic, svc, stamp, nil)
	retrying := serveHealth(t, ic, svc, stamp, nil, grpc.WithDefaultServiceConfig(retryExhausted))

	if err := check(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	var trailer metadata.MD
	_, err = plain.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	st, _ := status.FromError(err)
	delay, _ := retryAndQuota(st)
	if got := trailer.Get(admitgrpc.PushbackTrailer); st.Code() != codes.ResourceExhausted || delay <= 0 ||
		fmt.Sprint(got) != fmt.Sprint([]string{strconv.FormatInt(delay.Milliseconds(), 10)}) {
		t.Fatalf("refusal %v, trailer %s %q; want ResourceExhausted and the RetryInfo delay %v in ms", err, admitgrpc.PushbackTrailer, got, delay)
	}

	mu.Lock()
	attempts, outcomes = nil, nil
	mu.Unlock()
	_, err = retrying.Check(context.Background(), &healthpb.HealthCheckRequest{})
	mu.Lock()
	defer mu.Unlock()
	if err != nil || len(attempts) != 2 || fmt.Sprint(outcomes) != fmt.Sprint([]admitgrpc.Outcome{admitgrpc.Refused, admitgrpc.Admitted}) {
		t.Fatalf("retrying client: %v after %d attempts, outcomes %v; want OK after 2 (refused, admitted)", err, len(attempts), outcomes)
	}
	pushback := (refusedWait + time.Millisecond - 1).Truncate(time.Millisecond)
	t.Logf("plain client: pushback %v ms, RetryInfo %v; retrying client: pushback %v, its retry came %v after its refused attempt",
		trailer.Get(admitgrpc.PushbackTrailer), delay, pushback, attempts[1].Sub(attempts[0]))
}

// TestQuotaMetadata: with WithQuotaMetadata an admitted call carries the
// quota fields in its headers and a refusal in its trailers, with t the
// time to the next token, whatever the cost: a cost of 6 on a bucket of 10
// refilling 1/s, on a frozen clock.
func TestQuotaMetadata(t *testing.T) {
	spec := admit.MustSpec(admit.Every(time.Second), 10)
	for _, with := range []bool{false, true} {
		var opts []admitgrpc.Option
		if with {
			opts = append(opts, admitgrpc.WithQuotaMetadata())
		}
		ic, err := admitgrpc.New(mustLocal(t, minitest.NewClock()), func(*admitgrpc.Call) admitgrpc.Rule {
			return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "tpm", Key: "k", Spec: spec, Cost: 6, Unit: "llm-tokens"}}
		}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		c := serve(t, ic)
		var header, trailer metadata.MD
		if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		_, err = c.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		st, _ := status.FromError(err)
		delay, vs := retryAndQuota(st)
		policy := `"tpm";q=10;qu="llm-tokens";w=10`
		want := []string{policy, `"tpm";r=4;t=1`, policy, `"tpm";r=4;t=1`}
		if !with {
			want = []string{"", "", "", ""}
		}
		got := []string{strings.Join(header.Get(admitgrpc.PolicyMetadata), ","), strings.Join(header.Get(admitgrpc.LimitMetadata), ","),
			strings.Join(trailer.Get(admitgrpc.PolicyMetadata), ","), strings.Join(trailer.Get(admitgrpc.LimitMetadata), ",")}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("WithQuotaMetadata %v: header and trailer fields %q; want %q", with, got, want)
		}
		if st.Code() != codes.ResourceExhausted || delay != 2*time.Second || len(vs) != 1 ||
			vs[0].GetDescription() != `the "tpm" bucket holds 4 llm-tokens; this call costs 6` ||
			fmt.Sprint(trailer.Get(admitgrpc.PushbackTrailer)) != "[2000]" {
			t.Errorf("refusal %v, RetryInfo %v, violations %v, pushback %q; want ResourceExhausted, 2s, 4 of 6 llm-tokens, 2000",
				err, delay, vs, trailer.Get(admitgrpc.PushbackTrailer))
		}
	}
}

// TestConcurrentRetryAfterHint: a refusal by the concurrency part says
// the Concurrent's RetryAfter, in RetryInfo and the pushback trailer, but
// never more than the time until the oldest lease expires (30 s on the
// frozen clock); 1 s when it is zero.
func TestConcurrentRetryAfterHint(t *testing.T) {
	_, c := minitest.Start(t)
	conc := admitgrpc.Concurrent{Policy: "one", Key: "hint:{o}", Spec: admit.MustConcurrency(1, 30*time.Second)}
	x, err := admit.New(c).Acquire(context.Background(), admit.LeaseRequest{Key: conc.Key, Spec: conc.Spec}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatalf("Acquire: %v, %v", x, err)
	}
	var hint atomic.Int64
	ic, err := admitgrpc.New(admit.New(c), func(*admitgrpc.Call) admitgrpc.Rule {
		cc := conc
		cc.RetryAfter = time.Duration(hint.Load())
		return admitgrpc.Rule{Concurrent: &cc}
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, ic)
	for _, tc := range []struct {
		hint, want time.Duration
		pushback   string
	}{{0, time.Second, "1000"}, {2500 * time.Millisecond, 2500 * time.Millisecond, "2500"}, {time.Hour, 30 * time.Second, "30000"}} {
		hint.Store(int64(tc.hint))
		var trailer metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		code, delay, vs := slotInfo(t, err)
		if code != codes.ResourceExhausted || delay != tc.want || fmt.Sprint(trailer.Get(admitgrpc.PushbackTrailer)) != "["+tc.pushback+"]" ||
			fmt.Sprint(vs) != "[one: 1 calls in flight, limit 1]" {
			t.Errorf("hint %v: %v, RetryInfo %v, pushback %q, violations %q; want ResourceExhausted, %v, %s", tc.hint, code, delay,
				trailer.Get(admitgrpc.PushbackTrailer), vs, tc.want, tc.pushback)
		}
	}
}
