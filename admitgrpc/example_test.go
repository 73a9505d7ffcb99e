package admitgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
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
