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
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	srv.SetTime(exampleNow) // a clock that stands still: the same output on every run
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

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
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	srv.SetTime(exampleNow) // a clock that stands still: the same output on every run
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

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
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	srv.SetTime(exampleNow)
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

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
