package admit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

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
