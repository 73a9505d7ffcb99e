package admit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

var perSecond3 = MustSpec(Every(time.Second), 3) // 1 token/s, burst 3

// step is one call in a step table: move the server clock by advance, then
// call, and expect want.
type step struct {
	rule    string
	advance time.Duration
	second  bool // two-bucket call when true
	want    Decision
	// remaining: compare want.Remaining too; otherwise only Denied and
	// RetryAfter are compared.
	remaining bool
}

// runSteps runs steps against first (and second, where a step asks for it)
// and names the rule of every step that disagrees.
func runSteps(t *testing.T, e *unitEnv, first, second Request, steps []step) {
	t.Helper()
	for i, st := range steps {
		e.advance(st.advance)
		var sec *Request
		if st.second {
			sec = &second
		}
		got, err := e.l.AllowOrdered(context.Background(), first, sec)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, st.rule, err)
		}
		st.want.decided = true // every step is a decision the server made
		if !st.remaining {
			st.want.Remaining = got.Remaining // this table pins Denied and RetryAfter only
		}
		if got != st.want {
			t.Errorf("step %d (%s): got %v, want %v", i, st.rule, got, st.want)
		}
	}
}

func denied(bucket uint8, after time.Duration) Decision {
	return Decision{Denied: bucket, RetryAfter: after, decided: true}
}

func TestAllowOrderedBucketStates(t *testing.T) {
	e := newUnitEnv(t)
	first, second := Request{Key: "s:1", Spec: perSecond3}, Request{Key: "s:2", Spec: MustSpec(Every(2*time.Second), 2)}
	runSteps(t, e, first, second, []step{
		{rule: "fresh bucket is full", want: Decision{}},
		{rule: "partially full admits", advance: 100 * time.Millisecond},
		{rule: "last token", advance: 100 * time.Millisecond},
		{rule: "empty denies until the first token", advance: 100 * time.Millisecond, want: denied(1, 700*time.Millisecond)},
		{rule: "one µs short still denies", advance: 700*time.Millisecond - time.Microsecond, want: denied(1, time.Microsecond)},
		{rule: "just refilled admits", advance: time.Microsecond},
		{rule: "refill remainder is kept", advance: 1500 * time.Millisecond},
		{rule: "no token left after remainder", want: denied(1, 500*time.Millisecond)},
		{rule: "full again after a long idle", advance: time.Hour, second: true},
		{rule: "two-bucket path", second: true},
		{rule: "second bucket empty", second: true, want: denied(2, 2*time.Second)},
		{rule: "the second's denial charged the first", want: denied(1, time.Second)},
	})
}

// TestRefillNoDrift: after N seconds a bucket has admitted exactly burst +
// floor(N / interval) requests, however the calls fall.
func TestRefillNoDrift(t *testing.T) {
	for _, tc := range []struct {
		spec    Spec
		seconds int
		step    time.Duration
	}{
		{MustSpec(Every(1500*time.Millisecond), 20), 300, 100 * time.Millisecond},
		{MustSpec(3, 4), 120, 37 * time.Millisecond},           // 333334 µs per token
		{MustSpec(Limit(0.1), 2), 600, 999 * time.Millisecond}, // 10 s per token
	} {
		t.Run(tc.spec.String(), func(t *testing.T) {
			e := newUnitEnv(t)
			r := Request{Key: "drift", Spec: tc.spec}
			admitted := 0
			end := e.now.Add(time.Duration(tc.seconds) * time.Second)
			for range 100_000 {
				if d := e.allow(t, r, nil); d.Allowed() {
					admitted++
					continue
				}
				if !e.now.Add(tc.step).Before(end) && e.now.Add(tc.step) != end {
					break
				}
				e.advance(tc.step)
			}
			elapsed := e.now.Sub(unitEpoch)
			want := tc.spec.Burst() + int(elapsed/tc.spec.Interval())
			if admitted != want {
				t.Errorf("after %v admitted %d, want burst %d + floor(%v / %v) = %d",
					elapsed, admitted, tc.spec.Burst(), elapsed, tc.spec.Interval(), want)
			}
		})
	}
}

func TestBadInputRefusedBeforeSending(t *testing.T) {
	e := newUnitEnv(t)
	ok := Request{Key: "k:{x}:1", Spec: perSecond3}
	cluster := newLimiter(clusterMode{e.c}, e.l.script)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name   string
		l      *Limiter
		ctx    context.Context
		first  Request
		second *Request
		reason error
	}{
		{"empty first key", e.l, context.Background(), Request{Key: "", Spec: perSecond3}, nil, ErrInvalidRequest},
		{"zero first spec", e.l, context.Background(), Request{Key: "k", Spec: Spec{}}, nil, ErrInvalidRequest},
		{"empty second key", e.l, context.Background(), ok, &Request{Key: "", Spec: perSecond3}, ErrInvalidRequest},
		{"zero second spec", e.l, context.Background(), ok, &Request{Key: "k2", Spec: Spec{}}, ErrInvalidRequest},
		{"same key twice", e.l, context.Background(), ok, &ok, ErrInvalidRequest},
		{"nil context", e.l, nil, ok, nil, ErrInvalidRequest},
		{"nil Limiter", nil, context.Background(), ok, nil, ErrInvalidRequest},
		{"Limiter without client", New(nil), context.Background(), ok, nil, ErrInvalidRequest},
		{"context already canceled", e.l, canceled, ok, nil, context.Canceled},
		{"cross-slot keys on a cluster", cluster, context.Background(), Request{Key: "rl:{chan:1}:std", Spec: perSecond3}, &Request{Key: "rl:{chan:2}:shared", Spec: perSecond3}, ErrCrossSlot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.srv.CommandCount()
			d, err := tc.l.AllowOrdered(tc.ctx, tc.first, tc.second)
			if !errors.Is(err, tc.reason) || !errors.Is(err, ErrNotExecuted) || errors.Is(err, ErrOutcomeUnknown) {
				t.Errorf("err = %v; want %v and ErrNotExecuted only", err, tc.reason)
			}
			if d != (Decision{}) {
				t.Errorf("decision = %+v, want the zero Decision with an error", d)
			}
			if n := e.srv.CommandCount() - before; n != 0 {
				t.Errorf("%d commands reached the server, want 0", n)
			}
		})
	}
	t.Run("same-slot keys on a cluster pass the check", func(t *testing.T) {
		d, err := cluster.AllowOrdered(context.Background(), Request{Key: "rl:{chan:1}:std", Spec: perSecond3}, &Request{Key: "rl:{chan:1}:shared", Spec: perSecond3})
		if err != nil || !d.Allowed() {
			t.Errorf("got %v, %v; want allowed", d, err)
		}
	})
}

// clusterMode makes a standalone client report cluster mode, to exercise the
// client-side slot check without a cluster.
type clusterMode struct{ valkey.Client }

func (clusterMode) Mode() valkey.ClientMode { return valkey.ClientModeCluster }

// TestMalformedRepliesAreErrors: a reply the script never gives is
// ErrBadReply with outcome unknown, never a panic or a made-up Decision.
func TestMalformedRepliesAreErrors(t *testing.T) {
	for _, src := range []string{
		"return -1",            // an admission count below zero
		"return 2^53",          // or beyond an exact Lua number
		"return {0, 0, 3, -1}", // the previous reply shape, an array
		"return 'x'",
		"return ''",
		"return '0 0 2'",
		"return '0 0 2 -1 0'",
		"return '0  0 2 -1'",
		"return ' 0 0 2 -1'",
		"return '0 0 2 -1 '",
		"return 'a 0 2 -1'",
		"return '0 0 2.5 -1'",
		"return '0 0 99999999999999999999 -1'",
		"return '3 5 2 -1'",
		"return '2 5 2 -1'", // bucket 2 on a one-bucket call
		"return '-1 5 2 -1'",
		"return '1 0 0 -1'",  // a denial must carry a wait
		"return '0 5 2 -1'",  // an admission must not
		"return '1 -5 0 -1'", // a negative wait
		"return '0 0 -1 -1'", // the first bucket is always evaluated
		"return '0 0 2 5'",   // a one-bucket call has no second bucket
		"return '0 0 2 -2'",
	} {
		t.Run(src, func(t *testing.T) {
			e := newUnitEnvScript(t, src)
			d, err := e.l.AllowOrdered(context.Background(), Request{Key: "k", Spec: perSecond3}, nil)
			if !errors.Is(err, ErrBadReply) || !errors.Is(err, ErrOutcomeUnknown) || d.Allowed() {
				t.Errorf("got %v, %v; want ErrBadReply and ErrOutcomeUnknown", d, err)
			}
		})
	}
	for _, src := range []string{
		"return '0 0 2 -1'", // the second bucket of a two-bucket call must be evaluated unless the first denied
		"return '1 5 0 3'",  // after a first-bucket denial the second is not evaluated
	} {
		t.Run("two buckets: "+src, func(t *testing.T) {
			e := newUnitEnvScript(t, src)
			d, err := e.l.AllowOrdered(context.Background(), Request{Key: "k", Spec: perSecond3}, &Request{Key: "k2", Spec: perSecond3})
			if !errors.Is(err, ErrBadReply) || d.Allowed() {
				t.Errorf("got %v, %v; want ErrBadReply", d, err)
			}
		})
	}
	for _, tc := range []struct {
		src    string
		second bool
		want   Decision
	}{
		{"return '0 0 2 -1'", false, Decision{Remaining: [2]int{2, -1}, decided: true}},
		{"return '1 1500 0 -1'", true, Decision{Denied: 1, RetryAfter: 1500 * time.Microsecond, Remaining: [2]int{0, -1}, decided: true}},
		{"return '2 7 4 0'", true, Decision{Denied: 2, RetryAfter: 7 * time.Microsecond, Remaining: [2]int{4, 0}, decided: true}},
	} {
		t.Run("well formed: "+tc.src, func(t *testing.T) {
			e := newUnitEnvScript(t, tc.src)
			var second *Request
			if tc.second {
				second = &Request{Key: "k2", Spec: perSecond3}
			}
			d, err := e.l.AllowOrdered(context.Background(), Request{Key: "k", Spec: perSecond3}, second)
			if err != nil || d != tc.want {
				t.Errorf("got %+v, %v; want %+v", d, err, tc.want)
			}
		})
	}
}

// TestNewRunsTheShippedScript: New's Limiter names the shipped script, the
// SHA-1 of script.lua, in its EVALSHA. (The arguments after it are the rule
// host-clock-plays-no-part's, which TestConformanceMiniredis runs.)
func TestNewRunsTheShippedScript(t *testing.T) {
	rec := &recordingClient{Client: newUnitEnv(t).c}
	if _, err := New(rec).AllowOrdered(context.Background(), Request{Key: "k", Spec: perSecond3}, nil); err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum([]byte(scriptSource))
	if len(rec.cmds) == 0 || len(rec.cmds[0]) < 2 || rec.cmds[0][0] != "EVALSHA" || rec.cmds[0][1] != hex.EncodeToString(sum[:]) {
		t.Errorf("commands sent %q; want EVALSHA %x first", rec.cmds, sum)
	}
}

// recordingClient records the commands it is asked to run.
type recordingClient struct {
	valkey.Client
	cmds [][]string
}

func (r *recordingClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	r.cmds = append(r.cmds, append([]string(nil), cmd.Commands()...))
	return r.Client.Do(ctx, cmd)
}

// TestZeroDecisionIsNotAllowed: every error comes with the zero Decision,
// and a caller that looks at the Decision before the error must fail
// closed. (Before the fix, Decision{}.Allowed() was true.)
func TestZeroDecisionIsNotAllowed(t *testing.T) {
	var d Decision
	if d.Allowed() {
		t.Error("the zero Decision reports Allowed")
	}
	if got, want := d.String(), "no decision"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	e := newUnitEnv(t)
	for _, tc := range []struct {
		name   string
		first  Request
		second *Request
	}{
		{"invalid request", Request{Key: "", Spec: perSecond3}, nil},
		{"server refusal", Request{Key: "wrong-type", Spec: perSecond3}, nil},
	} {
		e.srv.Set("wrong-type", "x")
		d, err := e.l.AllowOrdered(context.Background(), tc.first, tc.second)
		if err == nil || d.Allowed() {
			t.Errorf("%s: got %v, %v; want an error and a Decision that is not allowed", tc.name, d, err)
		}
	}
	d, err := newUnitEnvScript(t, "return '0 0 2 -1'").l.AllowOrdered(context.Background(), Request{Key: "k", Spec: perSecond3}, nil)
	if err != nil || !d.Allowed() || d.String() != "allowed" {
		t.Errorf("a server admission: got %v, %v; want allowed", d, err)
	}
}

// nothingClient is a valkey.Client on which every method panics: the nil
// interface it embeds has no methods to call.
type nothingClient struct{ valkey.Client }

// TestNewCallsNothingOnTheClient: New only stores the client, so a mock
// client needs no expectation for it. (Before the fix, New called Mode.)
func TestNewCallsNothingOnTheClient(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("New called a method of the client: %v", r)
		}
	}()
	if l := New(nothingClient{}); l == nil || l.client == nil {
		t.Fatal("New did not keep the client")
	}
	// A one-bucket call that is refused client-side touches nothing either.
	_, err := New(nothingClient{}).AllowOrdered(context.Background(), Request{}, nil)
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("err = %v, want ErrInvalidRequest", err)
	}
}

// TestCostBoundsRefusedBeforeSending: a negative Cost, or one above the
// Spec's burst, is ErrInvalidRequest and nothing reaches the server; 0
// means 1 and the burst itself is accepted.
func TestCostBoundsRefusedBeforeSending(t *testing.T) {
	e := newUnitEnv(t)
	spec := MustSpec(Every(time.Second), 5)
	for _, tc := range []struct {
		name          string
		first, second Request
		ok            bool
	}{
		{"first cost -1", Request{Key: "a", Spec: spec, Cost: -1}, Request{}, false},
		{"first cost burst+1", Request{Key: "a", Spec: spec, Cost: 6}, Request{}, false},
		{"second cost -1", Request{Key: "a", Spec: spec}, Request{Key: "b", Spec: spec, Cost: -1}, false},
		{"second cost burst+1", Request{Key: "a", Spec: spec}, Request{Key: "b", Spec: spec, Cost: 6}, false},
		{"cost 0 means 1", Request{Key: "z", Spec: spec}, Request{}, true},
		{"cost burst", Request{Key: "y", Spec: spec, Cost: 5}, Request{}, true},
	} {
		var second *Request
		if tc.second.Key != "" {
			second = &tc.second
		}
		for _, call := range []struct {
			name string
			do   func() (Decision, error)
		}{
			{"AllowOrdered", func() (Decision, error) { return e.l.AllowOrdered(context.Background(), tc.first, second) }},
			{"Peek", func() (Decision, error) { return e.l.Peek(context.Background(), tc.first, second) }},
			{"Refund", func() (Decision, error) { return Decision{}, e.l.Refund(context.Background(), tc.first, second) }},
		} {
			before := e.srv.CommandCount()
			d, err := call.do()
			sent := e.srv.CommandCount() - before
			switch {
			case tc.ok && err != nil:
				t.Errorf("%s, %s: %v", tc.name, call.name, err)
			case !tc.ok && (!errors.Is(err, ErrInvalidRequest) || !errors.Is(err, ErrNotExecuted) || sent != 0 || d.Allowed()):
				t.Errorf("%s, %s: got %v, %v with %d commands sent; want ErrInvalidRequest and nothing sent", tc.name, call.name, d, err, sent)
			}
		}
	}
	d, err := e.l.AllowOrdered(context.Background(), Request{Key: "x", Spec: spec}, nil)
	if err != nil || d.Remaining[0] != 4 {
		t.Errorf("cost 0: %+v, %v; want one token taken, 4 left", d, err)
	}
}

// TestPeekErrorsAreNotExecuted: a Peek writes nothing, so whatever happens
// on the wire its failure is ErrNotExecuted, never "tokens may have been
// consumed". Here the client is closed: for AllowOrdered that is outcome
// unknown.
func TestPeekErrorsAreNotExecuted(t *testing.T) {
	e := newUnitEnv(t)
	r := Request{Key: "pk", Spec: perSecond3}
	e.c.Close()
	if _, err := e.l.AllowOrdered(context.Background(), r, nil); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("AllowOrdered on a closed client: %v; the control expects ErrOutcomeUnknown", err)
	}
	d, err := e.l.Peek(context.Background(), r, nil)
	if !errors.Is(err, ErrNotExecuted) || errors.Is(err, ErrOutcomeUnknown) || d.Allowed() || strings.Contains(err.Error(), "consumed") {
		t.Errorf("Peek on a closed client: %v, %v; want ErrNotExecuted, saying nothing was taken", d, err)
	}
	if !errors.Is(err, valkey.ErrClosing) {
		t.Errorf("Peek on a closed client: %v; want valkey.ErrClosing kept in the chain", err)
	}
}
