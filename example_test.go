package admit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
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
