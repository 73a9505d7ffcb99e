package admit_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/admitkit/admit"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

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
