package admittest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
)

// concurrent load: every check that races uses this many calls.
const goroutines, callsEach = 64, 50

// checkConcurrency: 64 goroutines × 50 calls admit exactly what burst and
// refill allow over the server-measured window, on both paths. Buckets are
// seeded half an interval past a refill boundary, with an interval of a
// minute, so the count is exact as long as the window is under 30 s (a real
// server takes well under a second; miniredis, one script at a time in
// gopher-lua, about 5 s under the race detector); the model is
// evaluated at the server's TIME before and after, and both must agree.
func checkConcurrency(ctx context.Context, e *env) error {
	const n = goroutines * callsEach
	everyMinute := func(burst int) admit.Spec { return admit.MustSpec(admit.Every(time.Minute), burst) }
	I := 60 * sec
	type bucket struct {
		r    admit.Request
		seed seedAt
	}
	// race seeds the buckets, runs the calls, and returns the decision
	// counts, the tokens each bucket has by the model, and the window.
	race := func(name string, bs []bucket, call func(g int) (admit.Decision, error)) (counts [3]int, avail []int64, err error) {
		t0, err := e.serverTime(ctx, bs[0].r.Key)
		if err != nil {
			return counts, nil, err
		}
		for _, b := range bs {
			if err := e.seed(ctx, b.r.Key, model.State{Tokens: b.seed.tokens, TS: t0 + b.seed.tsOffset}, t0); err != nil {
				return counts, nil, err
			}
		}
		before, err := e.serverTime(ctx, bs[0].r.Key)
		if err != nil {
			return counts, nil, err
		}
		counts, err = runConcurrently(ctx, goroutines, callsEach, call)
		if err != nil {
			return counts, nil, fmt.Errorf("%s: %w", name, err)
		}
		after, err := e.serverTime(ctx, bs[0].r.Key)
		if err != nil {
			return counts, nil, err
		}
		for _, b := range bs {
			st := model.State{Tokens: b.seed.tokens, TS: t0 + b.seed.tsOffset}
			lo, _ := model.Refill(before, b.r.Spec, st, true)
			hi, _ := model.Refill(after, b.r.Spec, st, true)
			if lo != hi {
				return counts, nil, fmt.Errorf("%s: inconclusive, the server window of %dµs crossed a refill", name, after-before)
			}
			avail = append(avail, lo)
		}
		return counts, avail, nil
	}
	// left checks a bucket's final tokens and that its ts moved by whole
	// intervals only.
	left := func(name string, b bucket, want int64) error {
		if tk, err := e.tokensLeft(ctx, b.r.Key); err != nil || tk != want {
			return fmt.Errorf("%s: %s has tokens %d (%v), want %d", name, e.short(b.r.Key), tk, err, want)
		}
		return nil
	}
	var errs []error

	// One bucket: 20 tokens stored, 2 earned since.
	p := e.prefix("concurrency")
	one := bucket{req(p+"one", everyMinute(60)), seedAt{20, -2*I - I/2}}
	counts, avail, err := race("one bucket", []bucket{one}, func(int) (admit.Decision, error) { return e.l.AllowOrdered(ctx, one.r, nil) })
	if err != nil {
		return err
	}
	if want := [3]int{int(avail[0]), n - int(avail[0]), 0}; counts != want {
		errs = append(errs, fmt.Errorf("one bucket: admitted/denied1/denied2 = %v, want %v (burst and refill allow %d)", counts, want, avail[0]))
	}
	errs = append(errs, left("one bucket", one, 0))

	// Two buckets, the standard bucket runs out first: its denials leave
	// the shared bucket alone, so premium can still take exactly the rest.
	p = e.prefix("concurrency")
	std := bucket{req(p+"std", everyMinute(40)), seedAt{8, -3*I - I/2}}
	shared := bucket{req(p+"shared", everyMinute(100)), seedAt{25, -I - I/2}}
	counts, avail, err = race("standard-limited", []bucket{std, shared}, func(int) (admit.Decision, error) {
		return e.l.AllowOrdered(ctx, std.r, &shared.r)
	})
	if err != nil {
		return err
	}
	a, h := int(avail[0]), int(avail[1]) // 11 and 26
	if want := [3]int{a, n - a, 0}; counts != want {
		errs = append(errs, fmt.Errorf("standard-limited: admitted/denied1/denied2 = %v, want %v", counts, want))
	}
	errs = append(errs, left("standard-limited", std, 0), left("standard-limited", shared, int64(h-a)))
	// Premium then takes what the shared bucket holds, as stored, plus
	// what it earns by the time premium runs: on a slow server that time
	// may be past the next token.
	obs, err := e.readBucket(ctx, shared.r.Key)
	if err != nil {
		return err
	}
	tk, ts, err := obs.parse()
	if err != nil {
		return fmt.Errorf("standard-limited: %s: %w", e.short(shared.r.Key), err)
	}
	before, err := e.serverTime(ctx, shared.r.Key)
	if err != nil {
		return err
	}
	prem, err := runConcurrently(ctx, goroutines, callsEach, func(int) (admit.Decision, error) { return e.l.AllowOrdered(ctx, shared.r, nil) })
	if err != nil {
		return err
	}
	after, err := e.serverTime(ctx, shared.r.Key)
	if err != nil {
		return err
	}
	lo, _ := model.Refill(before, shared.r.Spec, model.State{Tokens: tk, TS: ts}, true)
	hi, _ := model.Refill(after, shared.r.Spec, model.State{Tokens: tk, TS: ts}, true)
	switch {
	case lo != hi:
		errs = append(errs, fmt.Errorf("standard-limited: premium: inconclusive, the server window of %dµs crossed a refill", after-before))
	case prem[0] != int(lo):
		errs = append(errs, fmt.Errorf("standard-limited: premium then took %d, want exactly the %d shared tokens standard traffic left (%d stored, %d earned since)", prem[0], lo, tk, lo-tk))
	}

	// Two buckets, the shared bucket runs out first: every second-bucket
	// denial still charges the standard bucket.
	p = e.prefix("concurrency")
	std = bucket{req(p+"std", everyMinute(40)), seedAt{30, -I / 2}}
	shared = bucket{req(p+"shared", everyMinute(100)), seedAt{6, -2*I - I/2}}
	counts, avail, err = race("shared-limited", []bucket{std, shared}, func(int) (admit.Decision, error) {
		return e.l.AllowOrdered(ctx, std.r, &shared.r)
	})
	if err != nil {
		return err
	}
	a, h = int(avail[0]), int(avail[1]) // 30 and 8
	if want := [3]int{h, n - a, a - h}; counts != want {
		errs = append(errs, fmt.Errorf("shared-limited: admitted/denied1/denied2 = %v, want %v", counts, want))
	}
	errs = append(errs, left("shared-limited", std, 0), left("shared-limited", shared, 0))
	return errors.Join(errs...)
}

// checkPremiumReservation: standard and premium traffic race on one shared
// bucket; premium admissions never fall below shared capacity minus
// standard capacity, and every shared token is accounted for.
func checkPremiumReservation(ctx context.Context, e *env) error {
	p := e.prefix("premium")
	std, shared := req(p+"std", admit.MustSpec(admit.Every(time.Hour), 30)), req(p+"shared", admit.MustSpec(admit.Every(time.Hour), 100))
	before, err := e.serverTime(ctx, p)
	if err != nil {
		return err
	}
	for _, r := range []admit.Request{std, shared} {
		if err := e.seed(ctx, r.Key, model.State{Tokens: int64(r.Spec.Burst()), TS: before - sec}, before); err != nil {
			return err
		}
	}
	var stdAdmitted, stdDenied2, premAdmitted atomic64
	_, err = runConcurrently(ctx, goroutines, callsEach, func(g int) (admit.Decision, error) {
		if g%2 == 0 {
			d, err := e.l.AllowOrdered(ctx, std, &shared)
			stdAdmitted.addIf(d.Allowed())
			stdDenied2.addIf(d.Denied == 2)
			return d, err
		}
		d, err := e.l.AllowOrdered(ctx, shared, nil)
		premAdmitted.addIf(d.Allowed())
		return d, err
	})
	if err != nil {
		return err
	}
	s, d2, pa := stdAdmitted.get(), stdDenied2.get(), premAdmitted.get()
	var errs []error
	if pa < 100-30 {
		errs = append(errs, fmt.Errorf("premium admitted %d, below the reserved 100 - 30 = 70", pa))
	}
	if s+pa != 100 {
		errs = append(errs, fmt.Errorf("standard %d + premium %d admissions = %d, want the 100 shared tokens", s, pa, s+pa))
	}
	if tk, err := e.tokensLeft(ctx, std.Key); err != nil || tk != int64(30-s-d2) {
		errs = append(errs, fmt.Errorf("std tokens %d (%v), want 30 - %d admitted - %d denied by shared = %d", tk, err, s, d2, 30-s-d2))
	}
	return errors.Join(errs...)
}

// runConcurrently runs call goroutines × calls times, all goroutines
// released at once, and counts the decisions by Denied. The first error
// ends the run.
func runConcurrently(ctx context.Context, goroutines, calls int, call func(g int) (admit.Decision, error)) ([3]int, error) {
	var counts [3]atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for range calls {
				if ctx.Err() != nil || firstErr.Load() != nil {
					return
				}
				d, err := call(g)
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if int(d.Denied) < len(counts) {
					counts[d.Denied].Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return [3]int{}, *p
	}
	if err := ctx.Err(); err != nil {
		return [3]int{}, err
	}
	return [3]int{int(counts[0].Load()), int(counts[1].Load()), int(counts[2].Load())}, nil
}

// atomic64 counts across goroutines.
type atomic64 struct{ atomic.Int64 }

func (a *atomic64) addIf(b bool) {
	if b {
		a.Add(1)
	}
}

func (a *atomic64) get() int { return int(a.Load()) }
