package admit

import (
	"context"
	"errors"
	"math/rand/v2"
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

// TestOnceKeyBounds: onceKey refuses an empty id, one over MaxOnceIDLen
// and a key whose record could not share its slot, with ErrInvalidRequest.
func TestOnceKeyBounds(t *testing.T) {
	for _, tc := range []struct {
		key, id string
		ok      bool
	}{
		{"k", "", false},
		{"k", strings.Repeat("x", MaxOnceIDLen+1), false},
		{"k", strings.Repeat("x", MaxOnceIDLen), true},
		{"a}b", "id", false},
		{"a{t}b", "id", true},
		{"", "id", false},
	} {
		_, err := onceKey(tc.key, tc.id)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("onceKey(%q, %d-byte id) = %v; want ok %v", tc.key, len(tc.id), err, tc.ok)
		}
	}
}

// TestOnceKeySlot: the record always hashes to its first key's slot.
func TestOnceKeySlot(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := "ab{}:x"
	for range 50_000 {
		b := make([]byte, 1+rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		key := string(b)
		rec, err := onceKey(key, "id{}")
		if err != nil {
			if _, tagged := slotPart(key); tagged || !strings.Contains(key, "}") {
				t.Fatalf("onceKey(%q) refused: %v", key, err)
			}
			continue
		}
		if keySlot(rec) != keySlot(key) {
			t.Fatalf("record %q is in slot %d, its key %q in %d", rec, keySlot(rec), key, keySlot(key))
		}
	}
}

// FuzzOnceKey: two distinct (key, id) pairs that onceKey accepts never get
// the same record, and every record hashes to its key's cluster slot. The
// seeds are the pairs that share a record when it is named without its
// key's length ("k" and "{k}" with one id; "a{t}" with id "x:once:y" and
// "a{t}:once:x" with id "y"); go test runs them every time.
// Run with: go test -run '^$' -fuzz FuzzOnceKey
func FuzzOnceKey(f *testing.F) {
	for _, s := range [][4]string{
		{"k", "x", "{k}", "x"},
		{"a{t}", "x:once:y", "a{t}:once:x", "y"},
		{"{k}:once:x", "y", "{k}", "x:once:y"},
		{"{}", "x", "{}x", ""},
		{"a{b}c", "\x00", "a{b}c\x00", ""},
		{"{{a}}", "}", "{{a}", "}}"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, k1, id1, k2, id2 string) {
		r1, err1 := onceKey(k1, id1)
		r2, err2 := onceKey(k2, id2)
		if err1 == nil && keySlot(r1) != keySlot(k1) {
			t.Fatalf("record %q of key %q is in slot %d, the key in %d", r1, k1, keySlot(r1), keySlot(k1))
		}
		if err1 != nil || err2 != nil || k1 == k2 && id1 == id2 {
			return
		}
		if r1 == r2 {
			t.Fatalf("(%q, %q) and (%q, %q) share the record %q", k1, id1, k2, id2, r1)
		}
	})
}
