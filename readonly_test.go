package admit

import (
	"context"
	"testing"
)

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
