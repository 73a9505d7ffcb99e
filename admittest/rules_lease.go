package admittest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/aclrules"
)

// Concurrency leases: one rule per promise of Limiter.Acquire and its
// Lease's Extend and Release.

// leaseState is a lease key as the server holds it.
type leaseState struct {
	holders  map[string]int64 // name → score (µs)
	expireAt int64            // PEXPIRETIME, ms; -2 when absent
}

func (e *env) readLease(ctx context.Context, key string) (leaseState, error) {
	a := e.admin
	zs, err := a.Do(ctx, a.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		return leaseState{}, fmt.Errorf("ZRANGE %s: %w", e.short(key), err)
	}
	s := leaseState{holders: map[string]int64{}, expireAt: -2}
	for _, z := range zs {
		s.holders[z.Member] = int64(z.Score)
	}
	if len(zs) > 0 {
		if s.expireAt, err = a.Do(ctx, a.B().Pexpiretime().Key(key).Build()).AsInt64(); err != nil {
			return s, fmt.Errorf("PEXPIRETIME %s: %w", e.short(key), err)
		}
	}
	return s, nil
}

// schema checks the lease key's schema: every holder's score a whole µs,
// and the key expiring when its latest lease does (rounded up to a ms),
// never before; with onlyLive, no holder whose lease ended before now.
func (s leaseState) schema(now int64, onlyLive bool) error {
	if len(s.holders) == 0 {
		return nil
	}
	latest := int64(0)
	for name, at := range s.holders {
		latest = max(latest, at)
		if onlyLive && at <= now {
			return fmt.Errorf("holder %q expired at %d, before %d, is still in the key: a grant prunes every expired holder", name, at, now)
		}
	}
	if want := (latest + 999) / 1000; s.expireAt != want {
		return fmt.Errorf("the lease key's PEXPIRETIME is %d, want %d: the end of its latest lease, rounded up to a ms", s.expireAt, want)
	}
	return nil
}

// checkLeaseLimit: 64 goroutines race Acquire on a key of limit 5, and
// exactly 5 are granted; with a bucket of burst 3 beside it, exactly 3,
// the rest refused by the bucket, all or nothing, and the bucket charged
// exactly 3 times.
func checkLeaseLimit(ctx context.Context, e *env) error {
	p := e.prefix("lease-limit")
	spec := admit.MustConcurrency(5, time.Hour)
	var errs []error
	for _, tc := range []struct {
		name   string
		bucket *admit.Request
		want   int
		denied admit.Part
	}{
		{"a lease alone", nil, 5, admit.PartConcurrency},
		{"with a bucket of burst 3", &admit.Request{Key: p + "bucket", Spec: admit.MustSpec(admit.Every(time.Hour), 3)}, 3, admit.PartFirst},
	} {
		key := p + "conc:" + strconv.Itoa(tc.want)
		var mu sync.Mutex
		got := map[admit.Part]int{}
		var firstErr error
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range 4 {
					x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: fmt.Sprintf("g%d-%d", g, i)}, tc.bucket, nil)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if x.Granted() && x.Replayed() {
						got[99]++
					} else {
						got[x.Denied]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			return fmt.Errorf("%s: %w", tc.name, firstErr)
		}
		if got[0] != tc.want || got[tc.denied] != 4*goroutines-tc.want || got[99] != 0 {
			errs = append(errs, fmt.Errorf("%s: %d racing acquires on limit 5: %d granted, %d refused by the %v, %d replayed; want exactly %d granted, the rest refused by the %v",
				tc.name, 4*goroutines, got[0], got[tc.denied], tc.denied, got[99], tc.want, tc.denied))
		}
		now, err := e.serverTime(ctx, key)
		if err != nil {
			return err
		}
		st, err := e.readLease(ctx, key)
		if err != nil {
			return err
		}
		if len(st.holders) != tc.want {
			errs = append(errs, fmt.Errorf("%s: the lease key holds %d holders, want %d", tc.name, len(st.holders), tc.want))
		}
		if err := st.schema(now, true); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
		if tc.bucket != nil {
			if tk, err := e.tokensLeft(ctx, tc.bucket.Key); err != nil || tk != 0 {
				errs = append(errs, fmt.Errorf("%s: the bucket holds %d tokens (%v), want 0: charged once per grant", tc.name, tk, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkLeaseDeadHolder: holders that never release (dead) keep their
// slots until their leases expire on the server's clock, and not a moment
// longer; a refusal's RetryAfter is the time until the oldest expires; the
// grant that follows prunes every expired holder.
func checkLeaseDeadHolder(ctx context.Context, e *env) error {
	p := e.prefix("lease-dead")
	key := p + "conc"
	const lease = 400 * time.Millisecond
	spec := admit.MustConcurrency(3, lease)
	for i := range 3 {
		x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "dead-" + strconv.Itoa(i)}, nil, nil)
		if err != nil || !x.Granted() {
			return fmt.Errorf("holder %d: %v, %v; want granted", i, x, err)
		}
		if i < 2 {
			time.Sleep(40 * time.Millisecond)
		}
	}
	st, err := e.readLease(ctx, key)
	if err != nil {
		return err
	}
	oldest, latest := int64(-1), int64(0)
	for _, at := range st.holders {
		if oldest < 0 || at < oldest {
			oldest = at
		}
		latest = max(latest, at)
	}
	if err := st.schema(0, false); err != nil {
		return err
	}
	// Refused until the oldest lease ends; RetryAfter says when.
	for {
		t0, err := e.serverTime(ctx, key)
		if err != nil {
			return err
		}
		x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "next"}, nil, nil)
		if err != nil {
			return err
		}
		t1, err := e.serverTime(ctx, key)
		if err != nil {
			return err
		}
		if x.Granted() {
			if t1 < oldest {
				return fmt.Errorf("granted at server time %d..%d, before the oldest dead lease ends at %d", t0, t1, oldest)
			}
			lo, hi := 1, 1 // this one, and the dead holders still live
			for _, at := range st.holders {
				if at > t1 {
					lo++
				}
				if at > t0 {
					hi++
				}
			}
			if x.Holders < lo || x.Holders > hi {
				return fmt.Errorf("granted with %d holders, want %d..%d: this one and the dead holders whose leases have not ended", x.Holders, lo, hi)
			}
			break
		}
		if t0 > oldest {
			return fmt.Errorf("refused at server time %d, after the oldest dead lease ended at %d: %v", t0, oldest, x)
		}
		if x.Denied != admit.PartConcurrency || x.RetryAfter.Microseconds() < oldest-t1 || x.RetryAfter.Microseconds() > oldest-t0 {
			return fmt.Errorf("refused with %v; want the slot, retry after %d..%dµs, the time until the oldest lease ends", x, oldest-t1, oldest-t0)
		}
		time.Sleep(min(x.RetryAfter, 20*time.Millisecond))
	}
	now, err := e.serverTime(ctx, key)
	if err != nil {
		return err
	}
	if st, err = e.readLease(ctx, key); err != nil {
		return err
	}
	if err := st.schema(now, true); err != nil {
		return err
	}
	// Every dead holder's slot comes back once its lease ends.
	time.Sleep(time.Duration(latest-now)*time.Microsecond + 5*time.Millisecond)
	granted := 0
	for i := range 3 {
		x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "after-" + strconv.Itoa(i)}, nil, nil)
		if err != nil {
			return err
		}
		if x.Granted() {
			granted++
		}
	}
	if granted != 2 {
		return fmt.Errorf("after every dead lease ended, %d of 3 acquires granted; want 2 (\"next\" holds the third slot)", granted)
	}
	return nil
}

// checkLeaseAllOrNothing: an Acquire with two buckets takes nothing when
// any part refuses (the slot, then bucket 1, then bucket 2, named in that
// order), and takes one slot and each bucket's Cost once when none does.
func checkLeaseAllOrNothing(ctx context.Context, e *env) error {
	p := e.prefix("lease-all")
	key := p + "conc"
	spec := admit.MustConcurrency(1, time.Hour)
	b1 := admit.Request{Key: p + "b1", Spec: admit.MustSpec(admit.Every(time.Hour), 5), Cost: 2}
	b2 := admit.Request{Key: p + "b2", Spec: admit.MustSpec(admit.Every(time.Hour), 5), Cost: 3}
	keys := []string{key, b1.Key, b2.Key}
	var errs []error
	refused := func(name string, seeds map[string]seedAt, holder bool, want admit.Part) {
		if _, err := e.seedKeys(ctx, keys[1:], seeds); err != nil {
			errs = append(errs, err)
			return
		}
		e.admin.Do(ctx, e.admin.B().Del().Key(key).Build())
		if holder {
			if x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "holder"}, nil, nil); err != nil || !x.Granted() {
				errs = append(errs, fmt.Errorf("%s: the holder: %v, %v", name, x, err))
				return
			}
		}
		before, err := e.snaps(ctx, keys)
		if err != nil {
			errs = append(errs, err)
			return
		}
		x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "x"}, &b1, &b2)
		if err != nil || x.Granted() || x.Denied != want {
			errs = append(errs, fmt.Errorf("%s: %v, %v; want refused by the %v", name, x, err, want))
		}
		if err := e.unchanged(ctx, keys, before); err != nil {
			errs = append(errs, fmt.Errorf("%s: a refusal took something: %w", name, err))
		}
	}
	if e.cluster {
		// Keys in two slots are refused before anything is sent.
		other := admit.LeaseRequest{Key: e.base + "{lease-all-elsewhere}:conc", Spec: spec, Name: "x"}
		s1, err1 := e.slotOf(ctx, other.Key)
		s2, err2 := e.slotOf(ctx, b1.Key)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if s1 != s2 {
			x, err := e.l.Acquire(ctx, other, &b1, nil)
			if !errors.Is(err, admit.ErrCrossSlot) || !errors.Is(err, admit.ErrNotExecuted) || x.Granted() {
				errs = append(errs, fmt.Errorf("a slot key in another hash slot than the bucket's: %v, %v; want admit.ErrCrossSlot", x, err))
			}
		}
	}
	refused("the slot taken", map[string]seedAt{b1.Key: {5, 0}, b2.Key: {5, 0}}, true, admit.PartConcurrency)
	refused("bucket 1 short", map[string]seedAt{b1.Key: {1, 0}, b2.Key: {5, 0}}, false, admit.PartFirst)
	refused("bucket 2 short", map[string]seedAt{b1.Key: {5, 0}, b2.Key: {2, 0}}, false, admit.PartSecond)

	// Nothing refuses: one slot, each bucket's Cost, once.
	if _, err := e.seedKeys(ctx, keys[1:], map[string]seedAt{b1.Key: {5, 0}, b2.Key: {5, 0}}); err != nil {
		return err
	}
	e.admin.Do(ctx, e.admin.B().Del().Key(key).Build())
	x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "x"}, &b1, &b2)
	if err != nil || !x.Granted() || x.Remaining != [2]int{3, 2} || x.Holders != 1 {
		errs = append(errs, fmt.Errorf("nothing short: %v %v, %v; want granted, Remaining [3 2], 1 holder", x, x.Remaining, err))
	}
	again, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "x"}, &b1, &b2)
	if err != nil || !again.Replayed() || again.Remaining != [2]int{-1, -1} {
		errs = append(errs, fmt.Errorf("the same name again: %v, %v; want the lease replayed, no bucket evaluated", again, err))
	}
	for k, want := range map[string]int64{b1.Key: 3, b2.Key: 2} {
		if tk, err := e.tokensLeft(ctx, k); err != nil || tk != want {
			errs = append(errs, fmt.Errorf("%s holds %d tokens (%v), want %d: charged once", e.short(k), tk, err, want))
		}
	}
	return errors.Join(errs...)
}

// checkLeaseRefusalWritesNothing: a refused Acquire, a refused Extend and
// a Release of a name the key does not hold write nothing, even where
// expired holders wait to be pruned; a lease key of another type, or a
// sorted set admit did not write, fails the call with ErrWrongType or
// ErrCorruptState, not executed, nothing written.
func checkLeaseRefusalWritesNothing(ctx context.Context, e *env) error {
	p := e.prefix("lease-refusal")
	key, b := p+"conc", admit.Request{Key: p + "bucket", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}
	keys := []string{key, b.Key}
	var errs []error
	now, err := e.serverTime(ctx, key)
	if err != nil {
		return err
	}
	// Two live holders and an expired one, as admit would have left them.
	a := e.admin
	for _, cmd := range []valkey.Completed{
		a.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(now+3600*sec), "live-1").ScoreMember(float64(now+3600*sec+1), "live-2").
			ScoreMember(float64(now-sec), "expired").Build(),
		a.B().Pexpireat().Key(key).MillisecondsTimestamp((now + 3600*sec + 1 + 999) / 1000).Build(),
	} {
		if err := a.Do(ctx, cmd).Error(); err != nil {
			return err
		}
	}
	if _, err := e.seedKeys(ctx, []string{b.Key}, map[string]seedAt{b.Key: {5, 0}}); err != nil {
		return err
	}
	spec := admit.MustConcurrency(2, time.Minute)
	before, err := e.snaps(ctx, keys)
	if err != nil {
		return err
	}
	x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "new"}, &b, nil)
	if err != nil || x.Denied != admit.PartConcurrency || x.Holders != 2 {
		errs = append(errs, fmt.Errorf("acquire on a full key: %v, %v; want refused by the concurrency limit, 2 holders", x, err))
	}
	if ok, err := e.l.Lease(admit.LeaseRequest{Key: key, Spec: spec, Name: "expired"}).Extend(ctx); ok || err != nil {
		errs = append(errs, fmt.Errorf("extend of an expired lease: %v, %v; want false", ok, err))
	}
	for _, name := range []string{"unknown", "Live-1"} {
		if held, err := e.l.Lease(admit.LeaseRequest{Key: key, Spec: spec, Name: name}).Release(ctx); held || err != nil {
			errs = append(errs, fmt.Errorf("release of %q: %v, %v; want false", name, held, err))
		}
	}
	if err := e.unchanged(ctx, keys, before); err != nil {
		errs = append(errs, fmt.Errorf("a refusal wrote: %w", err))
	}
	// Not a lease key: wrong type, corrupt.
	for _, tc := range []struct {
		name   string
		setup  valkey.Completed
		reason error
	}{
		{"a string at the lease key", a.B().Set().Key(p + "bad").Value("x").Build(), admit.ErrWrongType},
		{"a hash at the lease key", a.B().Hset().Key(p+"bad").FieldValue().FieldValue("tokens", "1").Build(), admit.ErrWrongType},
		{"a fractional score", a.B().Zadd().Key(p+"bad").ScoreMember().ScoreMember(float64(now)+3600e6+0.5, "m").Build(), admit.ErrCorruptState},
		{"an infinite score", a.B().Zadd().Key(p+"bad").ScoreMember().ScoreMember(1e300, "m").Build(), admit.ErrCorruptState},
	} {
		a.Do(ctx, a.B().Del().Key(p+"bad").Build())
		if err := a.Do(ctx, tc.setup).Error(); err != nil {
			return err
		}
		before, err := e.snaps(ctx, []string{p + "bad", b.Key})
		if err != nil {
			return err
		}
		x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: p + "bad", Spec: spec}, &b, nil)
		if !errors.Is(err, tc.reason) || !errors.Is(err, admit.ErrNotExecuted) || x.Granted() {
			errs = append(errs, fmt.Errorf("%s: %v, %v; want %v, not executed", tc.name, x, err, tc.reason))
		}
		if err := e.unchanged(ctx, []string{p + "bad", b.Key}, before); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// checkLeaseReleaseIdempotent: Release frees the slot and reports true
// once, false after; an expired lease is reported false, and cannot be
// extended; a live one is extended to now + its lease, never shorter.
func checkLeaseReleaseIdempotent(ctx context.Context, e *env) error {
	p := e.prefix("lease-release")
	key := p + "conc"
	spec := admit.MustConcurrency(1, time.Hour)
	var errs []error
	x, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "a"}, nil, nil)
	if err != nil || !x.Granted() {
		return fmt.Errorf("acquire: %v, %v", x, err)
	}
	t0, err := e.serverTime(ctx, key)
	if err != nil {
		return err
	}
	if ok, err := x.Extend(ctx); !ok || err != nil {
		errs = append(errs, fmt.Errorf("extend of a live lease: %v, %v; want true", ok, err))
	}
	t1, err := e.serverTime(ctx, key)
	if err != nil {
		return err
	}
	st, err := e.readLease(ctx, key)
	if err != nil {
		return err
	}
	if at := st.holders["a"]; at < t0+3600*sec || at > t1+3600*sec {
		errs = append(errs, fmt.Errorf("extended to %d, want now + 1h: %d..%d", at, t0+3600*sec, t1+3600*sec))
	}
	if err := st.schema(t1, true); err != nil {
		errs = append(errs, err)
	}
	// A shorter Concurrency does not shorten it.
	if ok, err := e.l.Lease(admit.LeaseRequest{Key: key, Spec: admit.MustConcurrency(1, time.Second), Name: "a"}).Extend(ctx); !ok || err != nil {
		errs = append(errs, fmt.Errorf("extend with a shorter lease: %v, %v", ok, err))
	} else if st2, err := e.readLease(ctx, key); err != nil || st2.holders["a"] != st.holders["a"] || st2.expireAt != st.expireAt {
		errs = append(errs, fmt.Errorf("extend with a shorter lease moved the lease: %v → %v (%v)", st, st2, err))
	}
	for i, want := range []bool{true, false, false} {
		if held, err := x.Release(ctx); held != want || err != nil {
			errs = append(errs, fmt.Errorf("release %d: %v, %v; want %v", i+1, held, err, want))
		}
	}
	if ok, err := x.Extend(ctx); ok || err != nil {
		errs = append(errs, fmt.Errorf("extend after release: %v, %v; want false", ok, err))
	}
	if n, err := e.admin.Do(ctx, e.admin.B().Exists().Key(key).Build()).AsInt64(); err != nil || n != 0 {
		errs = append(errs, fmt.Errorf("the key outlived its last holder: EXISTS %d, %v", n, err))
	}
	y, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "a"}, nil, nil)
	if err != nil || !y.Granted() || y.Replayed() {
		errs = append(errs, fmt.Errorf("acquire under the released name: %v, %v; want a new grant", y, err))
	}
	// An expired lease: released false, removed.
	// A short lease after a long one: the key lives as long as the long one.
	short := admit.MustConcurrency(2, 20*time.Millisecond)
	if _, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: p + "short", Spec: admit.MustConcurrency(2, time.Hour), Name: "keeps-the-key"}, nil, nil); err != nil {
		return err
	}
	z, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: p + "short", Spec: short, Name: "z"}, nil, nil)
	if err != nil || !z.Granted() {
		return fmt.Errorf("acquire a short lease: %v, %v", z, err)
	}
	if st, err := e.readLease(ctx, p+"short"); err != nil {
		return err
	} else if err := st.schema(0, false); err != nil {
		errs = append(errs, fmt.Errorf("a short lease after a long one: %w", err))
	}
	time.Sleep(40 * time.Millisecond)
	if ok, err := z.Extend(ctx); ok || err != nil {
		errs = append(errs, fmt.Errorf("extend of an expired lease: %v, %v; want false", ok, err))
	}
	if held, err := z.Release(ctx); held || err != nil {
		errs = append(errs, fmt.Errorf("release of an expired lease: %v, %v; want false", held, err))
	}
	return errors.Join(errs...)
}

// checkLeaseRetrySafe: an Acquire whose reply is lost is ErrOutcomeUnknown;
// retried under the same name it returns the lease the lost call granted,
// marked as a replay, and takes nothing more: one slot, one Cost.
func checkLeaseRetrySafe(ctx context.Context, e *env) error {
	p := e.prefix("lease-retry")
	px, err := e.viaProxy(ctx, p, true)
	if err != nil {
		return err
	}
	defer px.close()
	lp := px.l
	key := p + "conc"
	spec := admit.MustConcurrency(2, time.Hour)
	b := admit.Request{Key: p + "bucket", Spec: admit.MustSpec(admit.Every(time.Hour), 5), Cost: 2}
	px.mode.Store(dropScriptReply)
	lost, lerr := lp.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "job-7"}, &b, nil)
	px.dropHeld()
	if !errors.Is(lerr, admit.ErrOutcomeUnknown) || lost.Granted() {
		return fmt.Errorf("the acquire whose reply was dropped: %v, %v; want admit.ErrOutcomeUnknown", lost, lerr)
	}
	var errs []error
	retry, err := e.l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "job-7"}, &b, nil)
	if err != nil || !retry.Granted() || !retry.Replayed() || retry.Holders != 1 {
		errs = append(errs, fmt.Errorf("the retry under the same name: %v, %v; want the lost call's lease, replayed, 1 holder", retry, err))
	}
	if tk, err := e.tokensLeft(ctx, b.Key); err != nil || tk != 3 {
		errs = append(errs, fmt.Errorf("the bucket holds %d tokens (%v), want 3: charged once, not twice", tk, err))
	}
	if st, err := e.readLease(ctx, key); err != nil || len(st.holders) != 1 {
		errs = append(errs, fmt.Errorf("the lease key holds %v (%v), want one holder", st.holders, err))
	}
	if held, err := e.l.Lease(admit.LeaseRequest{Key: key, Spec: spec, Name: "job-7"}).Release(ctx); !held || err != nil {
		errs = append(errs, fmt.Errorf("release by name on the client under test: %v, %v; want true", held, err))
	}
	return errors.Join(errs...)
}

// leaseACL is what a user needs for leases beside the buckets' commands.
const leaseACL = aclrules.Leases

// checkLeaseLeastPrivilege: as a user allowed only the commands admit's
// docs list (docs/acl.md and docs/leases.md) on the rule's keys, Acquire
// with a bucket, Extend and Release work; a user refused ZADD,
// ZREMRANGEBYSCORE or PEXPIREAT gets NOPERM, not executed, and nothing is
// written: not the bucket's charge, not a prune.
func checkLeaseLeastPrivilege(ctx context.Context, e *env) error {
	if err := e.canCreateUsers(); err != nil {
		return err
	}
	p := e.prefix("lease-acl")
	base := "-@all +evalsha +eval +time +hmget +hset +pexpireat +exists " + leaseACL
	user := func(rules string) (*admit.Limiter, func(), error) { return e.aclUser(ctx, p, rules) }
	key := p + "conc"
	b := admit.Request{Key: p + "bucket", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}
	spec := admit.MustConcurrency(2, time.Hour)
	var errs []error

	l, done, err := user(base)
	if err != nil {
		return err
	}
	x, err := l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "a"}, &b, nil)
	if err != nil || !x.Granted() {
		errs = append(errs, fmt.Errorf("acquire as the least-privilege user: %v, %v; want granted", x, err))
	}
	if ok, err := x.Extend(ctx); !ok || err != nil {
		errs = append(errs, fmt.Errorf("extend as the least-privilege user: %v, %v", ok, err))
	}
	if held, err := x.Release(ctx); !held || err != nil {
		errs = append(errs, fmt.Errorf("release as the least-privilege user: %v, %v", held, err))
	}
	done()

	// An expired holder, so that a grant would prune; and a live one.
	now, err := e.serverTime(ctx, key)
	if err != nil {
		return err
	}
	a := e.admin
	for _, cmd := range []valkey.Completed{
		a.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(now-sec), "expired").ScoreMember(float64(now+3600*sec), "live").Build(),
		a.B().Pexpireat().Key(key).MillisecondsTimestamp((now + 3600*sec + 999) / 1000).Build(),
	} {
		if err := a.Do(ctx, cmd).Error(); err != nil {
			return err
		}
	}
	for _, missing := range []string{"+zadd", "+zremrangebyscore", "+pexpireat"} {
		l, done, err := user(strings.Replace(base, missing, "", 1))
		if err != nil {
			return err
		}
		keys := []string{key, b.Key}
		before, err := e.snaps(ctx, keys)
		if err != nil {
			done()
			return err
		}
		x, err := l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "b"}, &b, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || x.Granted() || !strings.Contains(fmt.Sprint(err), "NOPERM") {
			errs = append(errs, fmt.Errorf("acquire without %s: %v, %v; want NOPERM, not executed", missing, x, err))
		}
		if missing != "+zremrangebyscore" {
			ok, err := l.Lease(admit.LeaseRequest{Key: key, Spec: spec, Name: "live"}).Extend(ctx)
			if !errors.Is(err, admit.ErrNotExecuted) || ok {
				errs = append(errs, fmt.Errorf("extend without %s: %v, %v; want NOPERM, not executed", missing, ok, err))
			}
		}
		if err := e.unchanged(ctx, keys, before); err != nil {
			errs = append(errs, fmt.Errorf("without %s: %w", missing, err))
		}
		done()
	}
	return errors.Join(errs...)
}
