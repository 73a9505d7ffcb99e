package admitgrpc_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/admitkit/admit/internal/testserver"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestIntegrationConcurrentInFlight: on a real server, 50 callers retry
// until each is served once, against a limit of 4 slots beside a bucket
// that holds enough for every call. Never more than 4 handlers in flight
// (counted inside the handler); every caller served; no slot left taken;
// the bucket charged once per admitted call, never for a slot refusal.
func TestIntegrationConcurrentInFlight(t *testing.T) {
	c := testserver.NewClient(t, testserver.Shared(t))
	prefix := testserver.Prefix(t, c)
	const n, callers = 4, 50
	bucket := admitgrpc.Bucket{Policy: "calls", Key: prefix + "calls", Spec: admit.MustSpec(admit.Every(time.Hour), 1000)}
	conc := &admitgrpc.Concurrent{Policy: "in-flight", Key: prefix + "conc", Spec: admit.MustConcurrency(n, 10*time.Second)}
	lim := admit.New(c)
	var admitted, refusedBySlot atomic.Int64
	ic, err := admitgrpc.New(lim, func(*admitgrpc.Call) admitgrpc.Rule { return admitgrpc.Rule{First: bucket, Concurrent: conc} },
		admitgrpc.Outage{NotExecuted: failServe, OutcomeUnknown: failServe},
		admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
			switch {
			case r.Outcome == admitgrpc.Admitted:
				admitted.Add(1)
			case r.Outcome == admitgrpc.Refused && r.Lease != nil && r.Lease.Denied == admit.PartSlot:
				refusedBySlot.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	var g gauge
	client := serveChecker(t, ic, func(context.Context) error {
		g.enter()
		defer g.leave()
		time.Sleep(2 * time.Millisecond)
		return nil
	}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var served atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range 500 {
				err := check(ctx, client)
				if err == nil {
					served.Add(1)
					return
				}
				if code, delay, _ := slotInfo(t, err); code != codes.ResourceExhausted || delay <= 0 || delay > 10*time.Second {
					t.Errorf("retry: %v (RetryInfo %v)", status.Convert(err).Message(), delay)
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	t.Logf("limit %d, %d callers: at most %d handlers in flight; %d served, %d refusals by the slot", n, callers, g.max.Load(), served.Load(), refusedBySlot.Load())
	if g.max.Load() > n {
		t.Fatalf("%d handlers in flight at once, limit %d", g.max.Load(), n)
	}
	if served.Load() != callers || admitted.Load() != callers {
		t.Fatalf("%d served, %d admitted, of %d callers", served.Load(), admitted.Load(), callers)
	}
	if h := holders(t, c, conc.Key); h != 0 {
		t.Fatalf("%d holders left after every call ended, want 0", h)
	}
	d, err := lim.Peek(ctx, bucket.Request(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Remaining[0] + 1; got != 1000-callers {
		t.Fatalf("bucket holds %d after %d admitted and %d slot refusals, want %d", got, callers, refusedBySlot.Load(), 1000-callers)
	}
}
