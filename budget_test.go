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

// TestWait: Wait sleeps until admitted; returns at once, having sent one
// attempt, when the token cannot come before the deadline; and never
// repeats an attempt whose outcome is unknown.
func TestWait(t *testing.T) {
	t.Run("deadline before the token: at once, one attempt", func(t *testing.T) {
		e := newUnitEnv(t)
		r := Request{Key: "w", Spec: MustSpec(Every(time.Hour), 1)}
		e.allow(t, r, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rec := &recordingClient{Client: e.c}
		d, err := New(rec).Wait(ctx, r, nil)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotExecuted) || d.Denied != 1 || d.RetryAfter != time.Hour || ctx.Err() != nil {
			t.Errorf("got %v, %v (ctx %v); want the 1h denial, DeadlineExceeded and ErrNotExecuted before the deadline", d, err, ctx.Err())
		}
		if len(rec.cmds) != 1 {
			t.Errorf("%d commands sent, want 1 attempt: %q", len(rec.cmds), rec.cmds)
		}
	})
	t.Run("cancelled while sleeping", func(t *testing.T) {
		e := newUnitEnv(t)
		r := Request{Key: "w", Spec: MustSpec(Every(time.Hour), 1)}
		e.allow(t, r, nil)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(20 * time.Millisecond); cancel() }()
		d, err := e.l.Wait(ctx, r, nil)
		if !errors.Is(err, context.Canceled) || d.Allowed() {
			t.Errorf("got %v, %v; want context.Canceled", d, err)
		}
	})
	t.Run("outcome unknown is not repeated", func(t *testing.T) {
		e := newUnitEnvScript(t, "return 'garbage'")
		rec := &recordingClient{Client: e.c}
		d, err := newLimiter(rec, e.l.script).Wait(context.Background(), Request{Key: "w", Spec: perSecond3}, nil)
		if !errors.Is(err, ErrOutcomeUnknown) || d.Allowed() {
			t.Errorf("got %v, %v; want ErrOutcomeUnknown", d, err)
		}
		if len(rec.cmds) != 2 || rec.cmds[0][0] != "EVALSHA" || rec.cmds[1][0] != "EVAL" { // EVAL after NOSCRIPT
			t.Errorf("commands sent: %q; want one attempt (EVALSHA, then EVAL after NOSCRIPT)", rec.cmds)
		}
	})
	t.Run("admitted after sleeping", func(t *testing.T) {
		// miniredis's clock does not move by itself: a script that denies
		// once with a 1 ms wait, then admits.
		e := newUnitEnvScript(t, "if redis.call('INCR', 'calls') == 1 then return '1 1000 0 -1' end return '0 0 0 -1'")
		d, err := e.l.Wait(context.Background(), Request{Key: "w", Spec: perSecond3}, nil)
		if calls, _ := e.srv.Get("calls"); err != nil || !d.Allowed() || calls != "2" {
			t.Errorf("got %v, %v after %s attempts; want allowed at the second", d, err, calls)
		}
	})
}

// TestWaitRefundsAfterSecondDenial: an attempt the second bucket refuses
// charges the first bucket (the ordered transitions); Wait gives that charge
// back before it sleeps or gives up, so only the admitted attempt costs
// anything. (Before the fix, each refused attempt left the first bucket
// charged, and the deadline error still said nothing was taken.)
func TestWaitRefundsAfterSecondDenial(t *testing.T) {
	e := newUnitEnv(t)
	spec := MustSpec(Every(time.Hour), 1)
	first, second := Request{Key: "w:{x}:a", Spec: spec}, Request{Key: "w:{x}:b", Spec: spec}
	e.allow(t, second, nil) // the second bucket is empty for an hour
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := e.l.Wait(ctx, first, &second)
	if d.Denied != 2 || !errors.Is(err, ErrNotExecuted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, %v; want the second bucket's denial, ErrNotExecuted and DeadlineExceeded", d, err)
	}
	if tk, _ := e.state(first.Key); tk != "1" {
		t.Errorf("first bucket holds %q tokens after Wait gave up, want 1: its charge must be refunded", tk)
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
