package admittest

// The rules of a bucket's edges: a live Spec change, and a hash that is not
// a bucket.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
)

// checkLiveSpecChange: a new Spec on a bucket that holds state takes effect
// on the next call without resetting it (docs/key-schema.md, "Changing a Spec on a live
// bucket"): a raised burst grants no instant tokens, a lowered burst caps
// the tokens, a changed rate recounts the part-token at the new interval,
// and the next write gives the new Spec's TTL.
func checkLiveSpecChange(ctx context.Context, e *env) error {
	p := e.prefix("spec-change")
	hourly := func(burst int) admit.Spec { return admit.MustSpec(admit.Every(time.Hour), burst) }
	admitted := func(r admit.Request, max int) (int, error) {
		n := 0
		for range max + 1 {
			d, err := e.l.AllowOrdered(ctx, r, nil)
			if err != nil || !d.Allowed() {
				return n, err
			}
			n++
		}
		return n, nil
	}
	var errs []error

	raised := req(p+"raised", hourly(3))
	if n, err := admitted(raised, 3); err != nil || n != 3 {
		return fmt.Errorf("burst 3: %d admitted, %v", n, err)
	}
	raised.Spec = hourly(10)
	if n, err := admitted(raised, 10); err != nil || n != 0 {
		errs = append(errs, fmt.Errorf("burst raised from 3 to 10 on an empty bucket: %d admitted at once (%v), want 0", n, err))
	}

	lowered := req(p+"lowered", hourly(10))
	if _, err := e.l.AllowOrdered(ctx, lowered, nil); err != nil { // 9 left
		return err
	}
	lowered.Spec = hourly(3)
	if n, err := admitted(lowered, 10); err != nil || n != 3 {
		errs = append(errs, fmt.Errorf("burst lowered from 10 to 3 with 9 tokens left: %d admitted (%v), want 3", n, err))
	}

	// Half an hour into a 1 h token; at 1 per 20 min that half hour is one
	// token and 10 min towards the next, which the stored ts keeps.
	rate := req(p+"rate", hourly(2))
	now, err := e.serverTime(ctx, rate.Key)
	if err != nil {
		return err
	}
	half, twenty := (30 * time.Minute).Microseconds(), (20 * time.Minute).Microseconds()
	if err := e.seed(ctx, rate.Key, model.State{Tokens: 0, TS: now - half}, now); err != nil {
		return err
	}
	rate.Spec = admit.MustSpec(admit.Every(20*time.Minute), 2)
	if d, err := e.l.AllowOrdered(ctx, rate, nil); err != nil || !d.Allowed() {
		errs = append(errs, fmt.Errorf("rate changed to 1 per 20 min, 30 min after ts: %v, %v; want allowed", d, err))
	}
	obs, err := e.readBucket(ctx, rate.Key)
	if err != nil {
		return err
	}
	if tk, ts, err := obs.parse(); err != nil || tk != 0 || ts != now-half+twenty {
		errs = append(errs, fmt.Errorf("after the rate change: tokens %d ts %d (%v), want 0 and %d: one new interval credited, the remainder kept", tk, ts, err, now-half+twenty))
	}

	ttl := req(p+"ttl", hourly(2))
	if _, err := e.l.AllowOrdered(ctx, ttl, nil); err != nil {
		return err
	}
	ttl.Spec = admit.MustSpec(admit.Every(time.Minute), 2)
	t0, err := e.serverTime(ctx, ttl.Key)
	if err != nil {
		return err
	}
	if _, err := e.l.AllowOrdered(ctx, ttl, nil); err != nil {
		return err
	}
	t1, err := e.serverTime(ctx, ttl.Key)
	if err != nil {
		return err
	}
	after, err := e.snap(ctx, ttl.Key)
	if err != nil {
		return err
	}
	lo, hi := t0/1000+ttl.Spec.TTL().Milliseconds(), (t1+999)/1000+ttl.Spec.TTL().Milliseconds()
	if !between(lo, hi, after.expireAt) {
		errs = append(errs, fmt.Errorf("PEXPIRETIME after a write with the new Spec %d, want the new Spec's TTL from then: %d..%d", after.expireAt, lo, hi))
	}
	return errors.Join(errs...)
}

// checkForeignHash: a hash that is not a bucket (neither tokens nor ts, as
// a user record at that key) fails the call with admit.ErrCorruptState, and
// neither key changes, alone, as the first bucket or as the second.
func checkForeignHash(ctx context.Context, e *env) error {
	p := e.prefix("foreign-hash")
	user, other := p+"user:42", p+"bucket"
	if err := e.admin.Do(ctx, e.admin.B().Hset().Key(user).FieldValue().FieldValue("name", "alice").Build()).Error(); err != nil {
		return err
	}
	spec := admit.MustSpec(admit.Every(time.Second), 3)
	var errs []error
	for _, tc := range []struct {
		name   string
		first  admit.Request
		second *admit.Request
	}{
		{"alone", req(user, spec), nil},
		{"first of two", req(user, spec), &admit.Request{Key: other, Spec: spec}},
		{"second of two", req(other, spec), &admit.Request{Key: user, Spec: spec}},
	} {
		before, err := e.snaps(ctx, []string{user, other})
		if err != nil {
			return err
		}
		d, err := e.l.AllowOrdered(ctx, tc.first, tc.second)
		if !errors.Is(err, admit.ErrCorruptState) || !errors.Is(err, admit.ErrNotExecuted) || d.Allowed() {
			errs = append(errs, fmt.Errorf("%s: %v, %v; want admit.ErrCorruptState, not executed", tc.name, d, err))
		}
		after, err := e.snaps(ctx, []string{user, other})
		if err != nil {
			return err
		}
		for _, k := range []string{user, other} {
			if after[k] != before[k] {
				errs = append(errs, fmt.Errorf("%s: %s changed: before %v, after %v", tc.name, e.short(k), before[k], after[k]))
			}
		}
	}
	return errors.Join(errs...)
}
