package admit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAllowOrderedOnce: the first call with an id decides and records;
// the same id returns the recorded Decision and takes nothing; another id
// decides anew; the record expires after OnceWindow.
func TestAllowOrderedOnce(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	spec := MustSpec(Every(time.Second), 3)
	std, shared := Request{Key: "o:{c}:std", Spec: spec}, Request{Key: "o:{c}:shared", Spec: spec, Cost: 2}
	d1, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil || !d1.Allowed() || d1.Remaining != [2]int{2, 1} {
		t.Fatalf("first call: %+v, %v; want allowed with Remaining [2 1]", d1, err)
	}
	before := e.srv.Dump()
	for range 3 {
		d, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
		if err != nil || d != d1 {
			t.Errorf("same id: %+v, %v; want the recorded %+v", d, err, d1)
		}
	}
	if after := e.srv.Dump(); after != before {
		t.Errorf("a replayed id changed the server:\n%s\n%s", before, after)
	}
	if d, err := e.l.AllowOrderedOnce(ctx, "msg-2", std, &shared); err != nil || d.Denied != 2 || d.Remaining != [2]int{1, 1} {
		t.Errorf("another id: %+v, %v; want a new decision, denied by the shared bucket", d, err)
	}
	// The record holds the reply and expires after OnceWindow.
	rec := "o:{c}:std:once:msg-1"
	if v, err := e.srv.Get(rec); err != nil || v != "0 0 2 1" {
		t.Errorf("record %q = %q, %v; want \"0 0 2 1\"", rec, v, err)
	}
	if ttl := e.srv.TTL(rec); ttl != OnceWindow {
		t.Errorf("record TTL %v, want OnceWindow (%v)", ttl, OnceWindow)
	}
	e.advance(OnceWindow) // miniredis expires keys as its clock moves
	if e.srv.Exists(rec) {
		t.Fatalf("record %q outlived OnceWindow", rec)
	}
	d, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, nil)
	if v, _ := e.srv.Get(rec); err != nil || d.Remaining != [2]int{2, -1} || v != "0 0 2 -1" {
		t.Errorf("after the window: %+v, %v, record %q; want a new decision (std refilled, 2 left) recorded", d, err, v)
	}
}

// TestOnceBadInput: ids and keys that cannot be recorded are refused before
// anything is sent.
func TestOnceBadInput(t *testing.T) {
	e := newUnitEnv(t)
	r := Request{Key: "k", Spec: perSecond3}
	for _, tc := range []struct {
		name, id string
		first    Request
	}{
		{"empty id", "", r},
		{"id over MaxOnceIDLen", strings.Repeat("x", MaxOnceIDLen+1), r},
		{"key with } and no hash tag", "id", Request{Key: "a}b", Spec: perSecond3}},
		{"empty key", "id", Request{Spec: perSecond3}},
	} {
		before := e.srv.CommandCount()
		d, err := e.l.AllowOrderedOnce(context.Background(), tc.id, tc.first, nil)
		if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, ErrNotExecuted) || d.Allowed() || e.srv.CommandCount() != before {
			t.Errorf("%s: %v, %v; want ErrInvalidRequest and nothing sent", tc.name, d, err)
		}
	}
	if _, err := e.l.AllowOrderedOnce(context.Background(), strings.Repeat("x", MaxOnceIDLen), r, nil); err != nil {
		t.Errorf("an id of MaxOnceIDLen bytes: %v", err)
	}
}
