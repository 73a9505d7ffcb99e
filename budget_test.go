package admit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// TestCostTransitions: the three transitions with "consume" meaning Cost
// tokens, exact RetryAfter until the refusing bucket holds its Cost, and
// Remaining after every call.
func TestCostTransitions(t *testing.T) {
	e := newUnitEnv(t)
	spec := MustSpec(Every(time.Second), 10)
	std, shared := Request{Key: "c:{x}:std", Spec: spec, Cost: 4}, Request{Key: "c:{x}:shared", Spec: spec, Cost: 3}
	call := func(first Request, second *Request) Decision {
		t.Helper()
		d, err := e.l.AllowOrdered(context.Background(), first, second)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i, tc := range []struct {
		advance time.Duration
		second  bool
		want    Decision
		state   [2]string // tokens after the call
	}{
		{0, true, Decision{Remaining: [2]int{6, 7}}, [2]string{"6", "7"}},
		{0, true, Decision{Remaining: [2]int{2, 4}}, [2]string{"2", "4"}},
		{0, true, Decision{Denied: 1, RetryAfter: 2 * time.Second, Remaining: [2]int{2, -1}}, [2]string{"2", "4"}},
		{2 * time.Second, true, Decision{Remaining: [2]int{0, 3}}, [2]string{"0", "3"}},   // shared refilled 2 too: 4+2-3
		{4 * time.Second, false, Decision{Remaining: [2]int{0, -1}}, [2]string{"0", "3"}}, // one bucket: shared untouched
		{0, true, Decision{Denied: 1, RetryAfter: 4 * time.Second, Remaining: [2]int{0, -1}}, [2]string{"0", "3"}},
	} {
		e.advance(tc.advance)
		var second *Request
		if tc.second {
			second = &shared
		}
		got := call(std, second)
		tc.want.decided = true
		if got != tc.want {
			t.Errorf("step %d: got %+v, want %+v", i, got, tc.want)
		}
		if tk1, _ := e.state(std.Key); tk1 != tc.state[0] {
			t.Errorf("step %d: std tokens %q, want %q", i, tk1, tc.state[0])
		}
		if tk2, _ := e.state(shared.Key); tk2 != tc.state[1] {
			t.Errorf("step %d: shared tokens %q, want %q", i, tk2, tc.state[1])
		}
	}
	// The second bucket refuses: std is charged its Cost, shared is not.
	e.advance(10 * time.Second) // std refills to full
	e.srv.HSet(shared.Key, "tokens", "2", "ts", strconv.FormatInt(e.micros(), 10))
	got := call(std, &shared)
	if got.Denied != 2 {
		t.Fatalf("got %v, want denied by the second bucket", got)
	}
	if got.Remaining[0] != 6 || got.Remaining[1] != 2 || got.RetryAfter != time.Second {
		t.Errorf("denied by second: %+v, want Remaining [6 2] and RetryAfter 1s", got)
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

// TestPeekWritesNothing: Peek returns what AllowOrdered would, and no key,
// field or expiry changes.
func TestPeekWritesNothing(t *testing.T) {
	e := newUnitEnv(t)
	spec := MustSpec(Every(time.Second), 3)
	std, shared := Request{Key: "p:{x}:std", Spec: spec, Cost: 2}, Request{Key: "p:{x}:shared", Spec: spec}
	e.allow(t, std, &shared) // std 1, shared 2
	e.advance(300 * time.Millisecond)
	for i, want := range []Decision{
		{Denied: 1, RetryAfter: 700 * time.Millisecond, Remaining: [2]int{1, -1}, decided: true},
	} {
		before, ttl1, ttl2 := e.srv.Dump(), e.srv.TTL(std.Key), e.srv.TTL(shared.Key)
		got, err := e.l.Peek(context.Background(), std, &shared)
		if err != nil || got != want {
			t.Errorf("peek %d: got %+v, %v; want %+v", i, got, err, want)
		}
		if after := e.srv.Dump(); after != before || e.srv.TTL(std.Key) != ttl1 || e.srv.TTL(shared.Key) != ttl2 {
			t.Errorf("peek %d changed the server:\nbefore %s\nafter  %s", i, before, after)
		}
		if d := e.allow(t, std, &shared); d != got {
			t.Errorf("peek %d said %+v, AllowOrdered then said %+v", i, got, d)
		}
	}
	// A peek on absent keys creates nothing.
	if d, err := e.l.Peek(context.Background(), Request{Key: "p:{x}:new", Spec: spec}, nil); err != nil || d.Remaining != [2]int{2, -1} || e.srv.Exists("p:{x}:new") {
		t.Errorf("peek of a new bucket: %+v, %v, exists %v; want allowed with 2 left and no key", d, err, e.srv.Exists("p:{x}:new"))
	}
}

// TestRefund: a refund gives the Cost back, capped at burst; it never
// creates a key; it keeps the part-token in ts.
func TestRefund(t *testing.T) {
	e := newUnitEnv(t)
	spec := MustSpec(Every(time.Second), 10)
	r := Request{Key: "r:{x}", Spec: spec, Cost: 8}
	e.allow(t, r, nil) // 2 left
	e.advance(1500 * time.Millisecond)
	if err := e.l.Refund(context.Background(), Request{Key: r.Key, Spec: spec, Cost: 5}, nil); err != nil {
		t.Fatal(err)
	}
	wantTS := unitEpoch.Add(time.Second).UnixMicro() // 1 s credited, the half second kept
	if tk, ts := e.state(r.Key); tk != "8" || ts != strconv.FormatInt(wantTS, 10) {
		t.Errorf("after refunding 5 of 8, 1.5 s later: tokens %q ts %q, want 8 and %d", tk, ts, wantTS)
	}
	if err := e.l.Refund(context.Background(), Request{Key: r.Key, Spec: spec, Cost: 10}, nil); err != nil {
		t.Fatal(err)
	}
	if tk, _ := e.state(r.Key); tk != "10" {
		t.Errorf("a refund above burst: tokens %q, want the burst, 10", tk)
	}
	if err := e.l.Refund(context.Background(), Request{Key: "r:{x}:absent", Spec: spec, Cost: 3}, nil); err != nil || e.srv.Exists("r:{x}:absent") {
		t.Errorf("refund of an absent (full) bucket: %v, created %v; want nil and no key", err, e.srv.Exists("r:{x}:absent"))
	}
}

// TestPeekOnMiniredis: miniredis, the embedded server of the quickstart
// and of users' unit tests, does not count TIME as a read-only command, so
// EVALSHA_RO fails there; Peek falls back to the same script in its
// read-only mode through EVALSHA, which writes nothing (the server's dump
// and every TTL are unchanged). Before the fix Peek failed there, and said
// "outcome unknown: tokens may have been consumed".
func TestPeekOnMiniredis(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	l := New(e.c)
	r := Request{Key: "pk", Spec: perSecond3}
	if d := e.allow(t, r, nil); !d.Allowed() {
		t.Fatal(d)
	}
	for i := range 2 { // the second Peek goes straight to EVALSHA
		before := e.snapshot()
		d, err := l.Peek(ctx, r, nil)
		if err != nil || !d.Allowed() || d.Remaining != [2]int{1, -1} {
			t.Errorf("Peek %d on miniredis: %v %v, %v; want allowed with 1 left after the take", i+1, d, d.Remaining, err)
		}
		if after := e.snapshot(); after != before {
			t.Errorf("Peek %d wrote:\nbefore %s\nafter  %s", i+1, before, after)
		}
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
