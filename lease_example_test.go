package admit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

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
		admit.Slot{Key: "conc:{org:7}", Spec: inFlight, Name: "request-4711"},
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
	x, err := lim.Acquire(ctx, admit.Slot{Key: "conc:{gpu}", Spec: admit.MustConcurrency(4, 10*time.Second), Name: "job-42"}, nil, nil)
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
