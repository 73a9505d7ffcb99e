package admitgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A gRPC server whose callers each get 2 calls at once, then one a second,
// and what a client reads from a refusal. The decider here is an
// admit.Local on a clock that stands still, so the example prints the same
// on every run; a fleet uses admit.New(client).
func Example() {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	lim, err := admit.NewLocal(10000, admit.WithLocalClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	perCaller := admit.MustSpec(admit.Every(time.Second), 2)
	degraded, err := admit.NewDegraded(0.25, 10000) // a quarter each, for a fleet of 4
	if err != nil {
		log.Fatal(err)
	}
	ic, err := admitgrpc.New(lim, func(c *admitgrpc.Call) admitgrpc.Rule {
		caller := ""
		if v := c.Metadata.Get("x-caller"); len(v) > 0 {
			caller = v[0]
		}
		// A missing x-caller makes the key "rl:caller:": one bucket for
		// every anonymous caller, limited too. A value over admit.MaxKeyLen
		// is refused with InvalidArgument, never served.
		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "per-caller", Key: "rl:caller:" + caller, Spec: perCaller}}
	}, admitgrpc.Outage{NotExecuted: admitgrpc.Degrade(degraded), OutcomeUnknown: admitgrpc.Unavailable(time.Second)})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // returns at Stop
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-caller", "alice")
	for i := 1; i <= 3; i++ {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			fmt.Printf("call %d: OK\n", i)
			continue
		}
		st, _ := status.FromError(err)
		fmt.Printf("call %d: code %v, message %q\n", i, st.Code(), st.Message())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				fmt.Println("  retry delay:", d.GetRetryDelay().AsDuration())
			case *errdetails.QuotaFailure:
				for _, v := range d.GetViolations() {
					fmt.Printf("  violation: subject %q, %s\n", v.GetSubject(), v.GetDescription())
				}
			}
		}
	}
	// Output:
	// call 1: OK
	// call 2: OK
	// call 3: code ResourceExhausted, message "admit: rate limit \"per-caller\" exceeded; retry after 1s"
	//   retry delay: 1s
	//   violation: subject "per-caller", the "per-caller" bucket holds 0 tokens; this call costs 1
}

// At most 2 calls of an organisation in flight, beside its calls per
// minute, decided in one Acquire: a third call while two run is refused by
// the slot, and served once one of them has returned. The store here is
// an in-process miniredis whose clock stands still; a fleet shares a
// Valkey.
func ExampleConcurrent() {
	store := miniredis.NewMiniRedis()
	if err := store.Start(); err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	store.SetTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{store.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	perMinute := admit.MustSpec(admit.Every(time.Second), 60)
	inflight := admit.MustConcurrency(2, 30*time.Second) // a lease longer than the slowest handler
	ic, err := admitgrpc.New(admit.New(client), func(c *admitgrpc.Call) admitgrpc.Rule {
		var org string
		if v := c.Metadata.Get("x-org"); len(v) > 0 {
			org = admit.KeyPart(v[0])
		}
		return admitgrpc.Rule{
			// RetryAfter: about how long a handler holds its place, the
			// wait a refusal says (at most until the oldest lease expires).
			Concurrent: &admitgrpc.Concurrent{Policy: "inflight", Key: "conc:{org:" + org + "}", Spec: inflight, RetryAfter: 2 * time.Second},
			First:      admitgrpc.Bucket{Policy: "per-minute", Key: "rpm:{org:" + org + "}", Spec: perMinute},
		}
	}, admitgrpc.Outage{NotExecuted: admitgrpc.Serve(), OutcomeUnknown: admitgrpc.Unavailable(time.Second)})
	if err != nil {
		log.Fatal(err)
	}

	started, finish := make(chan struct{}), make(chan struct{})
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, checker{Server: health.NewServer(), check: func(context.Context) error {
		started <- struct{}{}
		<-finish // a slow upstream
		return nil
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // Serve returns when Stop is called
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	call := func() error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-org", "acme")
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	done := make(chan error)
	for range 2 {
		go func() { done <- call() }()
		<-started
	}
	st := status.Convert(call()) // both slots are taken
	fmt.Println(st.Code(), st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			fmt.Println("retry in", d.GetRetryDelay().AsDuration())
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				fmt.Printf("violated %q: %s\n", v.GetSubject(), v.GetDescription())
			}
		}
	}
	close(finish)
	fmt.Println(<-done, <-done)
	go func() { <-started }()
	fmt.Println(call()) // a slot is free again
	// Output:
	// ResourceExhausted admit: concurrency limit "inflight" reached; retry after 2s
	// retry in 2s
	// violated "inflight": 2 calls in flight, limit 2
	// <nil> <nil>
	// <nil>
}

// A client that honours a refusal's RetryInfo: it waits the delay the
// server gave before trying again (a grpc-go service config that retries
// RESOURCE_EXHAUSTED does the same from the grpc-retry-pushback-ms
// trailer). Here the wait moves the server's frozen clock instead of
// sleeping, so that the example prints the same on every run.
func Example_retryInfoClient() {
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	sleep := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() } // time.Sleep(d) in a real client
	lim, err := admit.NewLocal(100, admit.WithLocalClock(clock))
	if err != nil {
		log.Fatal(err)
	}
	spec := admit.MustSpec(admit.Every(2*time.Second), 1)
	ic, err := admitgrpc.New(lim, func(*admitgrpc.Call) admitgrpc.Rule {
		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "per-caller", Key: "rl:caller", Spec: spec}}
	}, admitgrpc.Outage{NotExecuted: admitgrpc.Serve(), OutcomeUnknown: admitgrpc.Serve()})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // returns at Stop
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	// call tries at most 3 times, waiting each refusal's RetryInfo delay.
	call := func(ctx context.Context) error {
		for attempt := 1; ; attempt++ {
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted || attempt == 3 {
				return err
			}
			delay := time.Second // a backoff of your own when the server gives none
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					delay = ri.GetRetryDelay().AsDuration()
				}
			}
			fmt.Printf("attempt %d: %v; waiting %v\n", attempt, st.Code(), delay)
			sleep(delay)
		}
	}
	for i := 1; i <= 2; i++ {
		fmt.Printf("call %d: %v\n", i, call(context.Background()))
	}
	// Output:
	// call 1: <nil>
	// attempt 1: ResourceExhausted; waiting 2s
	// call 2: <nil>
}
