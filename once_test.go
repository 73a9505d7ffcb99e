package admit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// TestAllowOrderedOnce: the first call with an id decides and records;
// the same id returns the recorded Decision, marked Replayed, and takes
// nothing; another id decides anew; the record expires after OnceWindow.
func TestAllowOrderedOnce(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	spec := MustSpec(Every(time.Second), 3)
	std, shared := Request{Key: "o:{c}:std", Spec: spec}, Request{Key: "o:{c}:shared", Spec: spec, Cost: 2}
	d1, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil || !d1.Allowed() || d1.Replayed() || d1.Remaining != [2]int{2, 1} {
		t.Fatalf("first call: %+v, %v; want allowed with Remaining [2 1]", d1, err)
	}
	before := e.srv.Dump()
	for range 3 {
		d, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
		replay := d1
		replay.replayed = true
		if err != nil || d != replay {
			t.Errorf("same id: %+v, %v; want the recorded %+v, replayed", d, err, d1)
		}
	}
	if after := e.srv.Dump(); after != before {
		t.Errorf("a replayed id changed the server:\n%s\n%s", before, after)
	}
	if d, err := e.l.AllowOrderedOnce(ctx, "msg-2", std, &shared); err != nil || d.Denied != 2 || d.Remaining != [2]int{1, 1} {
		t.Errorf("another id: %+v, %v; want a new decision, denied by the shared bucket", d, err)
	}
	// The record holds the reply and the request, and expires after
	// OnceWindow.
	rec := "o:{c}:std:once:msg-1:9"
	if v, err := e.srv.Get(rec); err != nil || v != "0 0 2 1|1000000 3 1 1000000 3 2 o:{c}:shared" {
		t.Errorf("record %q = %q, %v; want \"0 0 2 1|1000000 3 1 1000000 3 2 o:{c}:shared\"", rec, v, err)
	}
	if ttl := e.srv.TTL(rec); ttl != OnceWindow {
		t.Errorf("record TTL %v, want OnceWindow (%v)", ttl, OnceWindow)
	}
	e.advance(OnceWindow) // miniredis expires keys as its clock moves
	if e.srv.Exists(rec) {
		t.Fatalf("record %q outlived OnceWindow", rec)
	}
	d, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, nil)
	if v, _ := e.srv.Get(rec); err != nil || d.Replayed() || d.Remaining != [2]int{2, -1} || v != "0 0 2 -1|1000000 3 1" {
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

// unitSnapshot is every key's value and TTL on the unit server: what a call
// that writes nothing must leave as it was.
func (e *unitEnv) snapshot() string {
	var b strings.Builder
	b.WriteString(e.srv.Dump())
	for _, k := range e.srv.Keys() {
		b.WriteString(k + " ttl " + e.srv.TTL(k).String() + "\n")
	}
	return b.String()
}

// TestOnceRecordsNeverShareAKey: two distinct (first key, id) pairs never
// read each other's record. Before the fix the record was
// "{<key>}:once:<id>" for an untagged key and "<key>:once:<id>" for a
// tagged one, so key "k" and key "{k}" with id "x" shared "{k}:once:x",
// and key "a{t}" with id "x:once:y" shared "a{t}:once:x:once:y" with key
// "a{t}:once:x" and id "y": the second caller got the first's admission
// and its bucket was never charged.
func TestOnceRecordsNeverShareAKey(t *testing.T) {
	ctx := context.Background()
	spec := MustSpec(Every(time.Hour), 3)
	for _, pair := range [][2]struct{ key, id string }{
		{{"k", "x"}, {"{k}", "x"}},
		{{"a{t}", "x:once:y"}, {"a{t}:once:x", "y"}},
		{{"{k}:once:x", "y"}, {"{k}", "x:once:y"}},
	} {
		e := newUnitEnv(t)
		for i, call := range pair {
			d, err := e.l.AllowOrderedOnce(ctx, call.id, Request{Key: call.key, Spec: spec}, nil)
			if err != nil || !d.Allowed() || d.Replayed() || d.Remaining[0] != 2 {
				t.Errorf("call %d, key %q id %q: %v %v replayed %v, %v; want a fresh admission with 2 left", i+1, call.key, call.id, d, d.Remaining, d.Replayed(), err)
			}
			if tk, _ := e.state(call.key); tk != "2" {
				t.Errorf("call %d: bucket %q holds %q tokens, want 2: charged", i+1, call.key, tk)
			}
		}
	}
}

// TestOnceReplayIsMarked: reserve then settle, retried with the same id,
// refunds once. Burst 9: AllowOrdered takes 4 (5 left); AllowOrderedOnce
// reserves 5 (0 left) and the caller refunds the unused 3 (3 left); the
// retry with the same id is a replay, which the caller does not settle, so
// the bucket ends at 3. Before the fix a replay could not be told from a
// fresh admission and the bucket ended at 6.
func TestOnceReplayIsMarked(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	spec := MustSpec(Every(time.Hour), 9)
	if d, err := e.l.AllowOrdered(ctx, Request{Key: "job", Spec: spec, Cost: 4}, nil); err != nil || !d.Allowed() || d.Replayed() {
		t.Fatalf("take 4: %v, %v", d, err)
	}
	reserve := Request{Key: "job", Spec: spec, Cost: 5}
	for i := range 2 {
		d, err := e.l.AllowOrderedOnce(ctx, "job-1", reserve, nil)
		if err != nil || !d.Allowed() || d.Remaining[0] != 0 {
			t.Fatalf("attempt %d: %v %v, %v; want the reservation admitted with 0 left", i+1, d, d.Remaining, err)
		}
		if d.Replayed() != (i == 1) {
			t.Errorf("attempt %d: Replayed() = %v, want %v", i+1, d.Replayed(), i == 1)
		}
		if !d.Replayed() {
			if err := e.l.Refund(ctx, Request{Key: "job", Spec: spec, Cost: 3}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if tk, _ := e.state("job"); tk != "3" {
		t.Errorf("the bucket holds %q tokens after the recipe ran twice, want 3 (refunded once)", tk)
	}
}

// TestOnceFirstDenialIsNotRecorded: a first-bucket denial charged nothing,
// so AllowOrderedOnce records nothing and writes nothing; the same id,
// once the bucket holds a token, decides anew. Before the fix the denial
// was recorded and replayed for the whole OnceWindow.
func TestOnceFirstDenialIsNotRecorded(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	spec := MustSpec(Every(time.Second), 1)
	r := Request{Key: "msg", Spec: spec}
	if d := e.allow(t, r, nil); !d.Allowed() {
		t.Fatalf("drain: %v", d)
	}
	before := e.snapshot()
	d, err := e.l.AllowOrderedOnce(ctx, "m-1", r, nil)
	if err != nil || d.Denied != 1 || d.Replayed() {
		t.Fatalf("on an empty bucket: %v, %v; want denied by bucket 1, not a replay", d, err)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("a first-bucket denial wrote:\nbefore %s\nafter  %s", before, after)
	}
	e.advance(d.RetryAfter)
	d, err = e.l.AllowOrderedOnce(ctx, "m-1", r, nil)
	if err != nil || !d.Allowed() || d.Replayed() {
		t.Errorf("the same id once a token is back: %v replayed %v, %v; want a fresh admission", d, d.Replayed(), err)
	}
}

// TestOnceSecondDenialIsRecorded: a second-bucket denial charged the first
// bucket, so it is recorded and replayed like an admission.
func TestOnceSecondDenialIsRecorded(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	std, shared := Request{Key: "s:{c}:std", Spec: MustSpec(Every(time.Hour), 3)}, Request{Key: "s:{c}:shared", Spec: MustSpec(Every(time.Hour), 1)}
	if d := e.allow(t, shared, nil); !d.Allowed() {
		t.Fatalf("drain shared: %v", d)
	}
	d1, err := e.l.AllowOrderedOnce(ctx, "m", std, &shared)
	if err != nil || d1.Denied != 2 || d1.Replayed() {
		t.Fatalf("%v, %v; want denied by bucket 2", d1, err)
	}
	before := e.snapshot()
	d2, err := e.l.AllowOrderedOnce(ctx, "m", std, &shared)
	if err != nil || d2.Denied != 2 || !d2.Replayed() || d2.Remaining != d1.Remaining || d2.RetryAfter != d1.RetryAfter {
		t.Errorf("retry: %v %v replayed %v, %v; want the recorded %v %v, replayed", d2, d2.Remaining, d2.Replayed(), err, d1, d1.Remaining)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("a replay wrote:\nbefore %s\nafter  %s", before, after)
	}
}

// TestOnceIDReusedForAnotherRequest: the same id with a different request
// is refused as not executed, naming the reuse, and writes nothing; a
// foreign string in the record is corrupt state, a hash there the wrong
// type, neither an admission. Before the fix a one-bucket call replaying a
// two-bucket record failed with ErrBadReply (outcome unknown), and a
// different Cost, Spec or second key got the old decision.
func TestOnceIDReusedForAnotherRequest(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	spec, other := MustSpec(Every(time.Hour), 5), MustSpec(Every(time.Minute), 5)
	std, shared := Request{Key: "r:{c}:std", Spec: spec}, Request{Key: "r:{c}:shared", Spec: spec}
	if d, err := e.l.AllowOrderedOnce(ctx, "id", std, &shared); err != nil || !d.Allowed() {
		t.Fatalf("first call: %v, %v", d, err)
	}
	withCost := func(r Request, c int) Request { r.Cost = c; return r }
	withSpec := func(r Request, s Spec) Request { r.Spec = s; return r }
	otherShared := Request{Key: "r:{c}:other", Spec: spec}
	for _, tc := range []struct {
		name   string
		first  Request
		second *Request
	}{
		{"one bucket instead of two", std, nil},
		{"another second key", std, &otherShared},
		{"another first Cost", withCost(std, 2), &shared},
		{"another second Cost", std, ptr(withCost(shared, 2))},
		{"another first Spec", withSpec(std, other), &shared},
		{"another second Spec", std, ptr(withSpec(shared, other))},
	} {
		before := e.snapshot()
		d, err := e.l.AllowOrderedOnce(ctx, "id", tc.first, tc.second)
		if !errors.Is(err, ErrOnceIDReused) || !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, ErrNotExecuted) || d.Allowed() {
			t.Errorf("%s: %v, %v; want ErrOnceIDReused, not executed", tc.name, d, err)
		} else if !strings.Contains(err.Error(), "different request") {
			t.Errorf("%s: %q does not name the reuse", tc.name, err)
		}
		if after := e.snapshot(); after != before {
			t.Errorf("%s wrote:\nbefore %s\nafter  %s", tc.name, before, after)
		}
	}

	one := Request{Key: "r:{d}:one", Spec: spec}
	rec, err := onceKey(one.Key, "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, foreign := range []string{"hello", "0 0 4 -1", "", "0 0 4 -1|"} {
		if err := e.srv.Set(rec, foreign); err != nil {
			t.Fatal(err)
		}
		before := e.snapshot()
		d, err := e.l.AllowOrderedOnce(ctx, "x", one, nil)
		if !errors.Is(err, ErrCorruptState) || !errors.Is(err, ErrNotExecuted) || d.Allowed() {
			t.Errorf("record holding %q: %v, %v; want ErrCorruptState, not executed", foreign, d, err)
		}
		if after := e.snapshot(); after != before {
			t.Errorf("record holding %q: the call wrote", foreign)
		}
	}
	e.srv.Del(rec)
	e.srv.HSet(rec, "f", "v")
	d, err := e.l.AllowOrderedOnce(ctx, "x", one, nil)
	if !errors.Is(err, ErrWrongType) || !errors.Is(err, ErrNotExecuted) || d.Allowed() || !strings.Contains(err.Error(), "once-record") {
		t.Errorf("record holding a hash: %v, %v; want ErrWrongType naming the once-record", d, err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestReplayShapes: a reply marked as a replay is a replay only from
// AllowOrderedOnce (another script under the same SHA could send one to
// AllowOrdered: ErrBadReply, outcome unknown), and a malformed replay ran
// nothing, so it is ErrCorruptState, not executed, never an admission.
func TestReplayShapes(t *testing.T) {
	e := newUnitEnv(t)
	ctx := context.Background()
	r := Request{Key: "rs", Spec: perSecond3}
	replaying := newLimiter(e.c, valkey.NewLuaScript("return 'R 0 0 2 -1'"))
	if d, err := replaying.AllowOrdered(ctx, r, nil); !errors.Is(err, ErrBadReply) || !errors.Is(err, ErrOutcomeUnknown) || d.Allowed() {
		t.Errorf("AllowOrdered given a replay: %v, %v; want ErrBadReply, outcome unknown", d, err)
	}
	if d, err := replaying.AllowOrderedOnce(ctx, "id", r, nil); err != nil || !d.Allowed() || !d.Replayed() {
		t.Errorf("AllowOrderedOnce given a replay: %v replayed %v, %v; want an admission, replayed", d, d.Replayed(), err)
	}
	malformed := newLimiter(e.c, valkey.NewLuaScript("return 'R 0 5 2 -1'"))
	if d, err := malformed.AllowOrderedOnce(ctx, "id", r, nil); !errors.Is(err, ErrCorruptState) || !errors.Is(err, ErrNotExecuted) || d.Allowed() {
		t.Errorf("AllowOrderedOnce given a malformed replay: %v, %v; want ErrCorruptState, not executed", d, err)
	}
}
