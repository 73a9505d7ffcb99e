package admittest

// The rules of AllowOrderedOnce: one decision per id, proven through a lost
// reply.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/admitkit/admit"
)

// checkOnceLostReply: the reply of an AllowOrderedOnce is lost after the
// script ran (admit.ErrOutcomeUnknown); the retry with the same id returns
// the Decision the lost run made, and the buckets were charged once. Another
// id decides anew. The record expires after admit.OnceWindow, and once it is
// gone the same id decides anew. Script runs are counted on the proxy and,
// when the suite owns the server, in INFO commandstats.
func checkOnceLostReply(ctx context.Context, e *env) error {
	p := e.prefix("once")
	px, err := e.viaProxy(ctx, p, true)
	if err != nil {
		return err
	}
	defer px.close()
	lp := px.l
	std := req(p+"std", admit.MustSpec(admit.Every(time.Hour), 5))
	shared := req(p+"shared", admit.MustSpec(admit.Every(time.Hour), 10))
	shared.Cost = 3
	s0, err := e.stats(ctx, p)
	if err != nil {
		return err
	}
	n0 := len(px.commands())
	px.mode.Store(dropScriptReply)
	_, lost := lp.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	px.dropHeld()
	if !errors.Is(lost, admit.ErrOutcomeUnknown) {
		return fmt.Errorf("the call whose reply was dropped: %v, want admit.ErrOutcomeUnknown", lost)
	}
	var errs []error
	if sent := len(px.since(n0)); sent != 1 {
		errs = append(errs, fmt.Errorf("the proxy saw %d commands for the lost call, want 1 (no retry inside admit)", sent))
	}

	// The retry, on the client under test, with the same id.
	retry, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil {
		return fmt.Errorf("the retry with the same id: %w", err)
	}
	want := [2]int{4, 7}
	if !retry.Allowed() || retry.Remaining != want {
		errs = append(errs, fmt.Errorf("the retry returned %v %v, want the lost run's admission with Remaining %v", retry, retry.Remaining, want))
	}
	for i, key := range []string{std.Key, shared.Key} {
		if tk, err := e.tokensLeft(ctx, key); err != nil || tk != int64(want[i]) {
			errs = append(errs, fmt.Errorf("%s holds %d tokens (%v), want %d: charged once, not twice", e.short(key), tk, err, want[i]))
		}
	}
	again, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil || again != retry {
		errs = append(errs, fmt.Errorf("a third call with the same id: %v, %v; want the recorded %v", again, err, retry))
	}

	// Another id decides.
	other, err := e.l.AllowOrderedOnce(ctx, "msg-2", std, &shared)
	if err != nil || !other.Allowed() || other.Remaining != [2]int{3, 4} {
		errs = append(errs, fmt.Errorf("another id: %v %v, %v; want a new admission with Remaining [3 4]", other, other.Remaining, err))
	}
	if e.quiet() {
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		// The lost run, the retry, the third call, the other id.
		if n := s1.ScriptCalls(s0); n != 4 {
			errs = append(errs, fmt.Errorf("the server ran %d script commands, want 4", n))
		}
	}

	// The record: one string key in the first bucket's slot, expiring after
	// the window; once it has expired, the id decides anew.
	record, err := admit.OnceRecordKey(std.Key, "msg-1")
	if err != nil {
		return err
	}
	n, _, err := e.node(ctx, record)
	if err != nil {
		return err
	}
	pttl, err := n.Do(ctx, n.B().Pttl().Key(record).Build()).AsInt64()
	if err != nil || pttl <= 0 || pttl > admit.OnceWindow.Milliseconds() || pttl < admit.OnceWindow.Milliseconds()-60_000 {
		errs = append(errs, fmt.Errorf("record %s PTTL %d ms (%v), want within a minute under admit.OnceWindow (%v)", e.short(record), pttl, err, admit.OnceWindow))
	}
	if err := n.Do(ctx, n.B().Pexpire().Key(record).Milliseconds(1).Build()).Error(); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if gone, err := n.Do(ctx, n.B().Exists().Key(record).Build()).AsInt64(); err != nil || gone == 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the record did not expire within 5 s of PEXPIRE 1")
		}
	}
	anew, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil || !anew.Allowed() || anew.Remaining != [2]int{2, 1} {
		errs = append(errs, fmt.Errorf("the same id after its record expired: %v %v, %v; want a new admission with Remaining [2 1]", anew, anew.Remaining, err))
	}
	return errors.Join(errs...)
}

// checkOnceReplayMarked: reserve then settle, retried. Burst 9: take 4,
// then AllowOrderedOnce reserves 5 and the caller refunds the unused 3,
// settling only a Decision that is not Replayed; the same again with the
// same id replays and settles nothing. The bucket ends at 3, not 6.
func checkOnceReplayMarked(ctx context.Context, e *env) error {
	p := e.prefix("once-replay")
	spec := admit.MustSpec(admit.Every(time.Hour), 9)
	job := admit.Request{Key: p + "job", Spec: spec, Cost: 4}
	if d, err := e.l.AllowOrdered(ctx, job, nil); err != nil || !d.Allowed() {
		return fmt.Errorf("take 4: %v, %v", d, err)
	}
	job.Cost = 5
	var errs []error
	for i := range 2 {
		d, err := e.l.AllowOrderedOnce(ctx, "job-1", job, nil)
		if err != nil || !d.Allowed() || d.Remaining[0] != 0 {
			return fmt.Errorf("attempt %d: %v %v, %v; want the reservation admitted with 0 left", i+1, d, d.Remaining, err)
		}
		if d.Replayed() != (i == 1) {
			errs = append(errs, fmt.Errorf("attempt %d: Replayed() = %v, want %v", i+1, d.Replayed(), i == 1))
		}
		if !d.Replayed() {
			if err := e.l.Refund(ctx, admit.Request{Key: job.Key, Spec: spec, Cost: 3}, nil); err != nil {
				return err
			}
		}
	}
	if tk, err := e.tokensLeft(ctx, job.Key); err != nil || tk != 3 {
		errs = append(errs, fmt.Errorf("%s holds %d tokens (%v) after the recipe ran twice, want 3 (settled once)", e.short(job.Key), tk, err))
	}
	return errors.Join(errs...)
}

// checkOnceFirstDenial: a first-bucket denial charged nothing, so
// AllowOrderedOnce records nothing and writes nothing (the bucket and the
// record key byte for byte), and once the bucket holds a token the same id
// is admitted; a second-bucket denial charged the first bucket, so it is
// recorded and replayed, and the replay writes nothing (both buckets and
// the record byte for byte).
func checkOnceFirstDenial(ctx context.Context, e *env) error {
	p := e.prefix("once-deny")
	std := req(p+"std", admit.MustSpec(admit.Every(time.Hour), 2))
	shared := req(p+"shared", admit.MustSpec(admit.Every(time.Hour), 1))
	empty := req(p+"empty", admit.MustSpec(admit.Every(time.Hour), 1))
	if d, err := e.l.AllowOrdered(ctx, empty, nil); err != nil || !d.Allowed() {
		return fmt.Errorf("drain %s: %v, %v", e.short(empty.Key), d, err)
	}
	if d, err := e.l.AllowOrdered(ctx, shared, nil); err != nil || !d.Allowed() {
		return fmt.Errorf("drain %s: %v, %v", e.short(shared.Key), d, err)
	}
	rec, err := admit.OnceRecordKey(empty.Key, "m")
	if err != nil {
		return err
	}
	b0, err := e.snap(ctx, empty.Key)
	if err != nil {
		return err
	}
	var errs []error
	for i := range 3 {
		d, err := e.l.AllowOrderedOnce(ctx, "m", empty, nil)
		if err != nil || d.Denied != 1 || d.Replayed() {
			errs = append(errs, fmt.Errorf("call %d on an empty bucket: %v replayed %v, %v; want denied by bucket 1, not a replay", i+1, d, d.Replayed(), err))
		}
	}
	if b1, err := e.snap(ctx, empty.Key); err != nil || b1 != b0 {
		errs = append(errs, fmt.Errorf("the denied bucket changed: %v -> %v (%v)", b0, b1, err))
	}
	if r, err := e.snap(ctx, rec); err != nil || r.exists {
		errs = append(errs, fmt.Errorf("a first-bucket denial left a record %s: %v (%v)", e.short(rec), r, err))
	}
	// With a token back, the same id decides anew: no denial was recorded.
	if err := e.l.Refund(ctx, empty, nil); err != nil {
		return err
	}
	if d, err := e.l.AllowOrderedOnce(ctx, "m", empty, nil); err != nil || !d.Allowed() || d.Replayed() {
		errs = append(errs, fmt.Errorf("the same id once the bucket holds a token: %v replayed %v, %v; want a fresh admission", d, d.Replayed(), err))
	}

	d1, err := e.l.AllowOrderedOnce(ctx, "n", std, &shared)
	if err != nil || d1.Denied != 2 || d1.Replayed() {
		return fmt.Errorf("second denial: %v, %v", d1, err)
	}
	recN, err := admit.OnceRecordKey(std.Key, "n")
	if err != nil {
		return err
	}
	keys := []string{std.Key, shared.Key, recN}
	before, err := e.snaps(ctx, keys)
	if err != nil {
		return err
	}
	d2, err := e.l.AllowOrderedOnce(ctx, "n", std, &shared)
	if err != nil || d2.Denied != 2 || !d2.Replayed() || d2.Remaining != d1.Remaining || d2.RetryAfter != d1.RetryAfter {
		errs = append(errs, fmt.Errorf("second denial replayed: %v %v replayed %v, %v; want the recorded %v %v, replayed", d2, d2.Remaining, d2.Replayed(), err, d1, d1.Remaining))
	}
	if err := e.unchanged(ctx, keys, before); err != nil {
		errs = append(errs, fmt.Errorf("the replay of a second denial wrote: %w", err))
	}
	if tk, err := e.tokensLeft(ctx, std.Key); err != nil || tk != 1 {
		errs = append(errs, fmt.Errorf("%s holds %d tokens (%v), want 1: charged once by the recorded second denial", e.short(std.Key), tk, err))
	}
	return errors.Join(errs...)
}

// checkOnceReuse: the same id with a different request (bucket count,
// second key, either Cost or either Spec) is refused as not executed
// (admit.ErrOnceIDReused, an admit.ErrInvalidRequest, saying so) and writes
// nothing, the record included; a foreign string in the record is
// admit.ErrCorruptState, a hash there admit.ErrWrongType, neither an
// admission and neither writing.
func checkOnceReuse(ctx context.Context, e *env) error {
	p := e.prefix("once-reuse")
	spec := admit.MustSpec(admit.Every(time.Hour), 5)
	std, shared := req(p+"std", spec), req(p+"shared", spec)
	if d, err := e.l.AllowOrderedOnce(ctx, "id", std, &shared); err != nil || !d.Allowed() {
		return fmt.Errorf("first call: %v, %v", d, err)
	}
	withCost := func(r admit.Request, c int) *admit.Request { r.Cost = c; return &r }
	withSpec := func(r admit.Request, s admit.Spec) *admit.Request { r.Spec = s; return &r }
	minutely := admit.MustSpec(admit.Every(time.Minute), 5)
	other := req(p+"other", spec)
	rec, err := admit.OnceRecordKey(std.Key, "id")
	if err != nil {
		return err
	}
	keys := []string{std.Key, shared.Key, other.Key, rec}
	snapAll := func() ([]snapshot, error) {
		var out []snapshot
		for _, k := range keys {
			s, err := e.snap(ctx, k)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	var errs []error
	for _, tc := range []struct {
		name   string
		first  admit.Request
		second *admit.Request
	}{
		{"one bucket instead of two", std, nil},
		{"another second key", std, &other},
		{"another first Cost", *withCost(std, 2), &shared},
		{"another second Cost", std, withCost(shared, 2)},
		{"another first Spec", *withSpec(std, minutely), &shared},
		{"another second Spec", std, withSpec(shared, minutely)},
	} {
		s0, err := snapAll()
		if err != nil {
			return err
		}
		d, err := e.l.AllowOrderedOnce(ctx, "id", tc.first, tc.second)
		if !errors.Is(err, admit.ErrOnceIDReused) || !errors.Is(err, admit.ErrInvalidRequest) || !errors.Is(err, admit.ErrNotExecuted) ||
			d.Allowed() || !strings.Contains(fmt.Sprint(err), "different request") {
			errs = append(errs, fmt.Errorf("%s: %v, %v; want admit.ErrOnceIDReused (an admit.ErrInvalidRequest) saying \"different request\", not executed", tc.name, d, err))
		}
		if s1, err := snapAll(); err != nil || fmt.Sprint(s1) != fmt.Sprint(s0) {
			errs = append(errs, fmt.Errorf("%s wrote: %v -> %v (%v)", tc.name, s0, s1, err))
		}
	}

	one := req(p+"one", spec)
	rec, err = admit.OnceRecordKey(one.Key, "x")
	if err != nil {
		return err
	}
	a := e.admin
	// Strings that are not a record: no reply and request, or a reply
	// without its request.
	for _, foreign := range []string{"hello", "", "0 0 4 -1", "0 0 4 -1|"} {
		if err := a.Do(ctx, a.B().Set().Key(rec).Value(foreign).Build()).Error(); err != nil {
			return err
		}
		before, err := e.snap(ctx, rec)
		if err != nil {
			return err
		}
		d, err := e.l.AllowOrderedOnce(ctx, "x", one, nil)
		if !errors.Is(err, admit.ErrCorruptState) || !errors.Is(err, admit.ErrNotExecuted) || d.Allowed() {
			errs = append(errs, fmt.Errorf("record holding %q: %v, %v; want admit.ErrCorruptState, not executed", foreign, d, err))
		}
		if b, err := e.snap(ctx, one.Key); err != nil || b.exists {
			errs = append(errs, fmt.Errorf("record holding %q: the bucket was written: %v (%v)", foreign, b, err))
		}
		if after, err := e.snap(ctx, rec); err != nil || after != before {
			errs = append(errs, fmt.Errorf("record holding %q: the record changed: %v -> %v (%v)", foreign, before, after, err))
		}
	}
	if err := a.Do(ctx, a.B().Del().Key(rec).Build()).Error(); err != nil {
		return err
	}
	if err := a.Do(ctx, a.B().Hset().Key(rec).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
		return err
	}
	d, err := e.l.AllowOrderedOnce(ctx, "x", one, nil)
	if !errors.Is(err, admit.ErrWrongType) || !errors.Is(err, admit.ErrNotExecuted) || d.Allowed() || !strings.Contains(fmt.Sprint(err), "once-record") {
		errs = append(errs, fmt.Errorf("record holding a hash: %v, %v; want admit.ErrWrongType naming the once-record", d, err))
	}
	return errors.Join(errs...)
}

// checkOnceNoCollision: (first key, id) pairs that the previous encoding,
// "<key>:once:<id>", mapped to one record each decide and charge on their
// own. (Untagged keys, whose records lie outside the suite's prefix, are
// covered by the package's unit tests and FuzzOnceKey.)
func checkOnceNoCollision(ctx context.Context, e *env) error {
	p := e.prefix("once-collide")
	spec := admit.MustSpec(admit.Every(time.Hour), 3)
	var errs []error
	for _, call := range []struct{ key, id string }{
		{p + "a", "x:once:y"}, {p + "a:once:x", "y"},
		{p + "b", "1:2"}, {p + "b:once:1", "2"},
	} {
		d, err := e.l.AllowOrderedOnce(ctx, call.id, req(call.key, spec), nil)
		if err != nil || !d.Allowed() || d.Replayed() || d.Remaining[0] != 2 {
			errs = append(errs, fmt.Errorf("key %s id %q: %v %v replayed %v, %v; want a fresh admission with 2 left",
				e.short(call.key), call.id, d, d.Remaining, d.Replayed(), err))
		}
	}
	return errors.Join(errs...)
}
