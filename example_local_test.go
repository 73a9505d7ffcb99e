package admit_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/admitkit/admit"
)

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
