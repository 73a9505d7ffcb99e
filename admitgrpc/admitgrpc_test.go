package admitgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/alicebob/miniredis/v2"
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

// testClock is a clock the tests move by hand.
type testClock struct{ now atomic.Int64 }

func (c *testClock) time() time.Time         { return time.UnixMicro(c.now.Load()) }
func (c *testClock) advance(d time.Duration) { c.now.Add(d.Microseconds()) }

func newTestClock() *testClock {
	c := &testClock{}
	c.now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMicro())
	return c
}

// serve starts a real gRPC server on 127.0.0.1 with the interceptors and
// the health service (a unary Check, a streaming Watch), and returns a
// client connected to it. Both stop with the test.
func serve(tb testing.TB, ic *admitgrpc.Interceptors, opts ...grpc.ServerOption) healthpb.HealthClient {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	opts = append(opts, grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln) //nolint:errcheck // Serve returns when Stop is called
	tb.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func mustLocal(tb testing.TB, clock *testClock) *admit.Local {
	tb.Helper()
	l, err := admit.NewLocal(1000, admit.WithLocalClock(clock.time))
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
	var delay time.Duration = -1
	var subjects []string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				subjects = append(subjects, v.GetSubject())
			}
		}
	}
	return st.Code(), st.Message(), delay, subjects
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
	clock := newTestClock()
	var lim admit.Decider = mustLocal(t, clock)
	sync := func() {}
	if decider == "Limiter" {
		srv := miniredis.RunT(t)
		sync = func() { srv.SetTime(clock.time()) }
		sync()
		client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
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
	clock.advance(300 * time.Microsecond) // the next token is 999.7 ms away
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
	clock := newTestClock()
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
			clock.advance(time.Hour) // every bucket full again
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
	clock := newTestClock()
	degraded, err := admit.NewDegraded(0.5, 100, admit.WithLocalClock(clock.time))
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
			clock.advance(time.Hour)
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
	l := mustLocal(t, newTestClock())
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

// TestNoLimitOnlyByChoice: NoLimit runs the handler undecided; the zero
// Rule and a Rule with an empty key are refused, and a Rule the server got
// wrong is Internal.
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
	ic, err := admitgrpc.New(mustLocal(t, newTestClock()), func(c *admitgrpc.Call) admitgrpc.Rule {
		return rules[c.Metadata.Get("rule")[0]]
	}, admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe})
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, ic)
	want := map[string]codes.Code{
		"nolimit": codes.OK, "zero": codes.InvalidArgument, "emptykey": codes.InvalidArgument, "samekey": codes.InvalidArgument,
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
	clock := newTestClock()
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
	clock := newTestClock()
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
	clock := newTestClock()
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
	ic, err := admitgrpc.New(mustLocal(t, newTestClock()), func(c *admitgrpc.Call) admitgrpc.Rule {
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
