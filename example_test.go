package admit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/admitkit/admit"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// Specs are values built once, typically at package level, and shared.
var (
	chatShared   = admit.MustSpec(admit.Every(1500*time.Millisecond), 20) // 20 per 30 s
	chatStandard = admit.MustSpec(admit.Every(3*time.Second), 10)         // at most 10 per 30 s of those
)

func ExampleNewSpec() {
	spec, err := admit.NewSpec(admit.Every(1500*time.Millisecond), 20)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(spec)
	fmt.Println("refill from empty:", spec.TTL())

	_, err = admit.NewSpec(admit.Every(time.Second), 0)
	fmt.Println(err)
	// Output:
	// 0.666667/s burst 20 (1.5s per token)
	// refill from empty: 30s
	// admit: invalid spec: burst 0 must be at least 1
}

func ExampleEvery() {
	fmt.Println(admit.Every(100*time.Millisecond) == admit.Limit(10))
	// Output: true
}

// The standard lane checks its own bucket, then the shared one; the premium
// lane uses the shared bucket alone. This example starts its own in-process
// server; in production, pass your valkey.Client to admit.New.
func ExampleLimiter_AllowOrdered() {
	client, done := inProcessClient()
	defer done()

	lim := admit.New(client)
	ctx := context.Background()
	standard := admit.Request{Key: "rl:{chan:42}:standard", Spec: chatStandard}
	shared := admit.Request{Key: "rl:{chan:42}:shared", Spec: chatShared}

	admitted := 0
	for range 15 {
		d, err := lim.AllowOrdered(ctx, standard, &shared)
		if err != nil {
			log.Fatal(err) // a denial is not an error
		}
		if d.Allowed() {
			admitted++
		}
	}
	fmt.Println("standard admitted:", admitted)

	premium := 0
	for range 15 {
		if d, err := lim.AllowOrdered(ctx, shared, nil); err == nil && d.Allowed() {
			premium++
		}
	}
	fmt.Println("premium admitted:", premium)
	// Output:
	// standard admitted: 10
	// premium admitted: 10
}

// Every error is either ErrNotExecuted (safe to retry) or ErrOutcomeUnknown
// (tokens may have been taken); the reason sentinels say what went wrong.
func ExampleErrNotExecuted() {
	lim := admit.New(nil) // no client: refused before anything is sent
	_, err := lim.AllowOrdered(context.Background(), admit.Request{Key: "k", Spec: chatShared}, nil)
	switch {
	case errors.Is(err, admit.ErrNotExecuted):
		fmt.Println("not executed; invalid request:", errors.Is(err, admit.ErrInvalidRequest))
	case errors.Is(err, admit.ErrOutcomeUnknown):
		fmt.Println("tokens may have been consumed; fail open or closed")
	}
	// Output: not executed; invalid request: true
}

// With a real server: dial it once and share the Limiter. This example
// needs a server at 127.0.0.1:6379, so it has no Output line and only
// compiles.
func ExampleNew() {
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lim := admit.New(client)

	d, err := lim.AllowOrdered(context.Background(),
		admit.Request{Key: "rl:{chan:42}:standard", Spec: chatStandard},
		&admit.Request{Key: "rl:{chan:42}:shared", Spec: chatShared})
	switch {
	case err != nil:
		log.Print(err)
	case !d.Allowed():
		log.Printf("bucket %d refused; retry in %v", d.Denied, d.RetryAfter)
	}
}

// A Limiter whose ACL user may run every write admit makes (here the
// default user, which may run any command on any key) can skip the
// script's ACL precheck. Its decisions are the same; see WithoutACLPrecheck
// for what a user short of a permission would get instead.
func ExampleWithoutACLPrecheck() {
	client, done := inProcessClient()
	defer done()

	lim := admit.New(client, admit.WithoutACLPrecheck())
	ctx := context.Background()
	standard := admit.Request{Key: "rl:{chan:42}:standard", Spec: admit.MustSpec(admit.Every(3*time.Second), 2)}
	shared := admit.Request{Key: "rl:{chan:42}:shared", Spec: chatShared}
	for range 3 {
		d, err := lim.AllowOrdered(ctx, standard, &shared)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d, "- shared bucket left:", d.Remaining[1])
	}
	// Output:
	// allowed - shared bucket left: 19
	// allowed - shared bucket left: 18
	// denied by bucket 1, retry after 3s - shared bucket left: -1
}

// An edge that answers 429 when the shared bucket is empty should not also
// spend the caller's own bucket: AllowAll charges nothing unless both
// buckets admit, and still decides in one round trip.
func ExampleLimiter_AllowAll() {
	client, done := inProcessClient()
	defer done()

	lim := admit.New(client)
	ctx := context.Background()
	user := admit.Request{Key: "rl:{api}:user:7", Spec: admit.MustSpec(admit.Every(time.Second), 5)}
	shared := admit.Request{Key: "rl:{api}:shared", Spec: admit.MustSpec(admit.Every(time.Second), 2)}

	for range 3 {
		d, err := lim.AllowAll(ctx, user, &shared)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d, "user bucket holds", d.Remaining[0])
	}
	// Output:
	// allowed user bucket holds 4
	// allowed user bucket holds 3
	// denied by bucket 2, retry after 1s user bucket holds 3
}

// exampleNow is the examples' server clock. It stands still (miniredis
// answers TIME with it), so an example prints the same on every run
// however slowly the machine runs it.
var exampleNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// inProcessClient is a client to an in-process miniredis, for the
// examples; use a real Valkey in production.
func inProcessClient() (valkey.Client, func()) {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	srv.SetTime(exampleNow)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		log.Fatal(err)
	}
	return c, func() { c.Close(); srv.Close() }
}

// Reserve an estimate, do the work, then give back what was not used.
func ExampleLimiter_Refund() {
	client, done := inProcessClient()
	defer done()
	lim := admit.New(client)
	ctx := context.Background()
	tokensPerMinute := admit.MustSpec(admit.Every(time.Minute/6000), 6000)

	reserve := admit.Request{Key: "llm:{team:7}:tpm", Spec: tokensPerMinute, Cost: 800}
	d, err := lim.AllowOrdered(ctx, reserve, nil)
	if err != nil || !d.Allowed() {
		log.Fatal(d, err)
	}
	fmt.Println("reserved 800, left:", d.Remaining[0])

	used := 300 // the response was shorter than the estimate
	if err := lim.Refund(ctx, admit.Request{Key: reserve.Key, Spec: tokensPerMinute, Cost: reserve.Cost - used}, nil); err != nil {
		log.Fatal(err)
	}
	d, _ = lim.AllowOrdered(ctx, admit.Request{Key: reserve.Key, Spec: tokensPerMinute, Cost: 1}, nil)
	fmt.Println("after the refund and one more token, left:", d.Remaining[0])
	// Output:
	// reserved 800, left: 5200
	// after the refund and one more token, left: 5699
}

// After ErrOutcomeUnknown, retry with the same id: the decision is made
// once, and a retry gets it back without taking anything.
func ExampleLimiter_AllowOrderedOnce() {
	client, done := inProcessClient()
	defer done()
	lim := admit.New(client)
	ctx := context.Background()
	std := admit.Request{Key: "rl:{chan:42}:standard", Spec: chatStandard}
	shared := admit.Request{Key: "rl:{chan:42}:shared", Spec: chatShared}

	first, err := lim.AllowOrderedOnce(ctx, "msg-1001", std, &shared)
	if err != nil {
		log.Fatal(err)
	}
	retry, err := lim.AllowOrderedOnce(ctx, "msg-1001", std, &shared) // say the first reply was lost
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first, first.Remaining)
	fmt.Println(retry, retry.Remaining, "(the same decision; nothing taken twice)")
	// Output:
	// allowed [9 19]
	// allowed [9 19] (the same decision; nothing taken twice)
}

// Under a flood, repeated first-bucket denials are answered locally.
func ExampleWithDenialCache() {
	client, done := inProcessClient()
	defer done()
	lim := admit.New(client, admit.WithDenialCache(10_000))
	ctx := context.Background()
	r := admit.Request{Key: "rl:{abuser}", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}

	for i := range 4 {
		d, err := lim.AllowOrdered(ctx, r, nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(i, d.Allowed())
	}
	// Calls 2 and 3 were refused without a round trip, until the server's
	// RetryAfter for call 1 has passed on the local clock.

	// Output:
	// 0 true
	// 1 false
	// 2 false
	// 3 false
}

// Count every call by what it was and how it ended, for a dashboard: here
// into a map, in a service into a metrics library's counters. A Release of
// a granted lease that finds it no longer live is worth watching: its
// holder ran past its lease, and another may have had its slot.
func ExampleWithObserver() {
	client, done := inProcessClient()
	defer done()
	var mu sync.Mutex
	counts := map[string]int{}
	lim := admit.New(client, admit.WithObserver(func(o admit.Observation) {
		outcome := "ok"
		switch o.Op {
		case admit.OpRefund:
		case admit.OpRelease, admit.OpExtend:
			switch {
			case !o.Lease.Granted():
				outcome = "not held" // a refused lease: nothing was sent
			case !o.Live:
				outcome = "not live" // expired: the holder ran past its lease
			}
		case admit.OpAcquire:
			if !o.Lease.Granted() {
				outcome = "refused by " + o.Lease.Denied.String()
			}
		default:
			if !o.Decision.Allowed() {
				outcome = "denied"
			}
		}
		if o.Err != nil {
			outcome = "error"
		}
		mu.Lock()
		counts[o.Op.String()+" "+outcome]++
		mu.Unlock()
	}))
	ctx := context.Background()
	hourly := admit.Request{Key: "rl:{user:1}", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	lim.AllowOrdered(ctx, hourly, nil)
	lim.AllowOrdered(ctx, hourly, nil)
	slot := admit.LeaseRequest{Key: "conc:{user:1}", Spec: admit.MustConcurrency(1, time.Minute)}
	x, _ := lim.Acquire(ctx, slot, nil, nil)
	y, _ := lim.Acquire(ctx, slot, nil, nil)
	x.Release(ctx)
	y.Release(ctx)

	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Println(k, counts[k])
	}
	// Output:
	// acquire ok 1
	// acquire refused by concurrency 1
	// release not held 1
	// release ok 1
	// take denied 1
	// take ok 1
}

// A single process limits itself with a Local: the same Specs, Requests
// and Decisions as a Limiter on Valkey, with no store. (The clock is
// fixed here, so the example prints the same on every run; by default a
// Local reads the process's monotonic clock.)
func ExampleLocal() {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	lim, err := admit.NewLocal(100000, admit.WithLocalClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	standard := admit.Request{Key: "rl:{chan:42}:standard", Spec: admit.MustSpec(admit.Every(3*time.Second), 2)}
	shared := admit.Request{Key: "rl:{chan:42}:shared", Spec: admit.MustSpec(admit.Every(1500*time.Millisecond), 3)}
	for i := 1; i <= 3; i++ {
		d, err := lim.AllowAll(ctx, standard, &shared)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("standard %d: %v, remaining %v\n", i, d, d.Remaining)
	}
	d, _ := lim.AllowAll(ctx, shared, nil) // premium: the shared bucket alone
	fmt.Printf("premium: %v, remaining %v\n", d, d.Remaining)
	d, _ = lim.AllowAll(ctx, shared, nil)
	fmt.Printf("premium: %v, remaining %v\n", d, d.Remaining)
	// Output:
	// standard 1: allowed, remaining [1 2]
	// standard 2: allowed, remaining [0 1]
	// standard 3: denied by bucket 1, retry after 3s, remaining [0 -1]
	// premium: allowed, remaining [0 -1]
	// premium: denied by bucket 1, retry after 1.5s, remaining [0 -1]
}

// During a store outage, each of a fleet's processes decides at a fraction
// of every Spec: 4 processes at 0.25 admit at most the limit together.
func ExampleDegraded() {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	fallback, err := admit.NewDegraded(0.25, 100000, admit.WithLocalClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	spec := admit.MustSpec(admit.Every(100*time.Millisecond), 20) // 10/s, burst 20
	scaled, _ := fallback.Scale(spec)
	fmt.Println("store's Spec:   ", spec)
	fmt.Println("while degraded: ", scaled)
	admitted := 0
	for range 10 {
		if d, err := fallback.AllowAll(context.Background(), admit.Request{Key: "rl:{api}:shared", Spec: spec}, nil); err == nil && d.Allowed() {
			admitted++
		}
	}
	fmt.Println("admitted of 10 at once:", admitted)
	// Output:
	// store's Spec:    10/s burst 20 (100ms per token)
	// while degraded:  2.5/s burst 5 (400ms per token)
	// admitted of 10 at once: 5
}

// Code written against a Decider runs on a Limiter (a fleet sharing
// Valkey), on a Local (one process, or a test with no server), or on a
// Degraded (a store outage's fallback).
func ExampleDecider() {
	send := func(ctx context.Context, lim admit.Decider, channel string) string {
		spec := admit.MustSpec(admit.Every(time.Second), 1)
		d, err := lim.AllowAll(ctx, admit.Request{Key: "rl:{chan:" + channel + "}:shared", Spec: spec}, nil)
		switch {
		case err != nil:
			return "error: " + err.Error()
		case !d.Allowed():
			return "wait " + d.RetryAfter.String()
		}
		return "sent"
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	local, err := admit.NewLocal(1000, admit.WithLocalClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	fmt.Println(send(ctx, local, "42"))
	fmt.Println(send(ctx, local, "42"))
	// Output:
	// sent
	// wait 1s
}

func ExampleConcurrency_String() {
	fmt.Println(admit.MustConcurrency(10, 30*time.Second))
	// Output: 10 at once, lease 30s
}

// At most 10 requests in flight per organisation, and 100,000 tokens a
// minute, decided together: nothing is taken when either refuses.
func ExampleLimiter_Acquire() {
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lim := admit.New(client)
	inFlight := admit.MustConcurrency(10, 30*time.Second)
	perMinute := admit.MustSpec(admit.Every(600*time.Microsecond), 100_000)

	ctx := context.Background()
	x, err := lim.Acquire(ctx,
		admit.LeaseRequest{Key: "conc:{org:7}", Spec: inFlight, Name: "request-4711"},
		&admit.Request{Key: "tpm:{org:7}", Spec: perMinute, Cost: 1200}, nil)
	// Safe in every case: a refused Lease sends nothing; one whose outcome
	// is unknown frees the slot it may hold.
	defer x.Release(context.WithoutCancel(ctx))
	switch {
	case errors.Is(err, admit.ErrOutcomeUnknown):
		log.Printf("retry under the name %q, or give up: the Release frees what it may hold", x.Name)
		return
	case err != nil:
		log.Fatal(err)
	case !x.Granted():
		fmt.Printf("429: the %v refused; retry after %v\n", x.Denied, x.RetryAfter)
		return
	}
	fmt.Printf("granted until %v; %d in flight\n", x.Deadline().Format(time.TimeOnly), x.Holders)
}

// A long job renews its lease while it runs, and stops when the lease is
// lost.
func ExampleLease_Extend() {
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lim := admit.New(client)
	ctx := context.Background()
	x, err := lim.Acquire(ctx, admit.LeaseRequest{Key: "conc:{gpu}", Spec: admit.MustConcurrency(4, 10*time.Second), Name: "job-42"}, nil, nil)
	if err != nil || !x.Granted() {
		log.Fatal(x, err)
	}
	defer x.Release(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Minute) // the job
	}()
	tick := time.NewTicker(3 * time.Second) // well within the lease
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			ok, err := x.Extend(ctx)
			if err != nil {
				continue // outcome unknown: extend again at the next tick
			}
			if !ok {
				log.Print("the lease expired: another holder may have the slot; stop the job")
				return
			}
		}
	}
}
