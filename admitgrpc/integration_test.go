package admitgrpc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitgrpc"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// TestIntegrationDegradedOutage kills the store under load and restarts
// it: 4 gRPC servers (the fleet's processes, each with its own Limiter and
// its own Degraded at 0.25) share one bucket on a real valkey-server, and
// their clients call far faster than the limit. It checks, from the
// outcome hook's counts:
//
//   - before the kill, the fleet admits what the store's bucket allows:
//     at most burst + rate × t;
//   - during the outage, each process decides alone at a quarter of the
//     Spec, and the fleet admits at most N × fraction × (burst + rate × t)
//     = burst + rate × t for the outage's length;
//   - after the restart, decisions go back to the store with no sticky
//     state: the store decides every call from its first answer on.
//
// It logs the admitted count per second beside the bound.
func TestIntegrationDegradedOutage(t *testing.T) {
	if os.Getenv("VALKEY_ADDR") != "" {
		t.Skip("kills and restarts its server; skipped on VALKEY_ADDR")
	}
	srv := testserver.Own(t)
	port := srv.Addr[strings.LastIndexByte(srv.Addr, ':')+1:]

	const (
		n        = 4
		fraction = 0.25
		before   = 3 * time.Second
		outage   = 4 * time.Second
		after    = 3 * time.Second
	)
	spec := admit.MustSpec(admit.Every(25*time.Millisecond), 40) // 40/s, burst 40
	rule := func(*admitgrpc.Call) admitgrpc.Rule {
		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "shared", Key: "rl:{api}:shared", Spec: spec}}
	}

	// Each outcome, stamped with the second of the run it happened in.
	type stamp struct {
		at  time.Duration
		o   admitgrpc.Outcome
		err error
	}
	var mu sync.Mutex
	var stamps []stamp
	start := time.Now()
	record := admitgrpc.WithOutcomeFunc(func(r admitgrpc.Report) {
		mu.Lock()
		stamps = append(stamps, stamp{time.Since(start), r.Outcome, r.Err})
		mu.Unlock()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var errs atomic.Int64
	for range n {
		client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true,
			ConnWriteTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		degraded, err := admit.NewDegraded(fraction, 1000)
		if err != nil {
			t.Fatal(err)
		}
		ic, err := admitgrpc.New(admit.New(client), rule,
			admitgrpc.Outage{NotExecuted: admitgrpc.Degrade(degraded), OutcomeUnknown: admitgrpc.Degrade(degraded)},
			record, admitgrpc.WithTimeout(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		c := serve(t, ic)
		for range 4 { // 4 callers a process, each a call every 2 ms: about 8,000 calls/s against a limit of 40/s
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
					if err != nil && ctx.Err() == nil && !isRefusal(err) {
						errs.Add(1)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
	}

	time.Sleep(before)
	killed := time.Since(start)
	srv.Stop() // kill -9: the store is gone
	time.Sleep(outage)
	restarted := time.Since(start)
	restart := restartServer(t, port)
	defer restart.Process.Kill()
	time.Sleep(after)
	cancel()
	wg.Wait()
	end := time.Since(start)

	mu.Lock()
	defer mu.Unlock()
	// Per second: admitted by the store, admitted degraded, refused.
	secs := int(end/time.Second) + 1
	byStore, byDegraded := make([]int, secs), make([]int, secs)
	refused := make([]int, secs)
	var firstStoreAfter time.Duration = -1
	phase := map[string][2]int{} // admitted by store, degraded, per phase
	for _, s := range stamps {
		i := int(s.at / time.Second)
		p := "before"
		switch {
		case s.at >= restarted:
			p = "after"
		case s.at >= killed:
			p = "outage"
		}
		c := phase[p]
		switch s.o {
		case admitgrpc.Admitted:
			byStore[i]++
			c[0]++
			if s.at >= restarted && firstStoreAfter < 0 {
				firstStoreAfter = s.at
			}
		case admitgrpc.DegradedAdmitted:
			byDegraded[i]++
			c[1]++
		default:
			refused[i]++
		}
		phase[p] = c
	}
	rate, burst := float64(spec.Limit()), float64(spec.Burst())
	t.Logf("store killed at %v, restarted at %v; fleet of %d at fraction %v; limit %v/s burst %v", killed.Round(time.Millisecond), restarted.Round(time.Millisecond), n, fraction, rate, burst)
	t.Logf("%6s %8s %9s %8s", "second", "store", "degraded", "refused")
	for i := range secs {
		t.Logf("%6d %8d %9d %8d", i, byStore[i], byDegraded[i], refused[i])
	}
	bound := func(d time.Duration) float64 { return burst + rate*d.Seconds() }
	fleet := func(d time.Duration) float64 { return n * fraction * bound(d) }
	t.Logf("before:  %d admitted by the store in %v, bound burst + rate × t = %.0f", phase["before"][0], killed.Round(time.Millisecond), bound(killed))
	t.Logf("outage:  %d admitted degraded (%d by the store, in flight at the kill) in %v, fleet bound N × f × (burst + rate × t) = %.0f",
		phase["outage"][1], phase["outage"][0], (restarted - killed).Round(time.Millisecond), fleet(restarted-killed))
	t.Logf("after:   %d admitted by the store, %d degraded (calls that failed while its clients reconnected), first store admission %v after the restart",
		phase["after"][0], phase["after"][1], (firstStoreAfter - restarted).Round(time.Millisecond))
	if got := float64(phase["before"][0]); got > bound(killed) {
		t.Errorf("before the kill: %v admitted, above the bound %.0f", got, bound(killed))
	}
	if got := float64(phase["outage"][1]); got > fleet(restarted-killed) {
		t.Errorf("during the outage: %v admitted degraded, above the fleet bound %.0f", got, fleet(restarted-killed))
	}
	if phase["outage"][1] == 0 {
		t.Error("nothing admitted during the outage: Degrade did not decide")
	}
	if firstStoreAfter < 0 {
		t.Fatal("the store decided nothing after its restart")
	}
	// No sticky state: a degraded decision is made only for a call whose
	// store decision failed (its report carries that error), and once the
	// store is back it decides again: in the run's last second it admits
	// at least half its rate (the rest of each second may go to calls
	// that timed out under load, which degrade one by one).
	lastStore := 0
	for _, s := range stamps {
		degraded := s.o == admitgrpc.DegradedAdmitted || s.o == admitgrpc.DegradedRefused
		if degraded && !errors.Is(s.err, admit.ErrNotExecuted) && !errors.Is(s.err, admit.ErrOutcomeUnknown) {
			t.Fatalf("a degraded decision at %v without a failed store decision (%v): sticky outage state", s.at, s.err)
		}
		if s.o == admitgrpc.Admitted && s.at >= end-time.Second {
			lastStore++
		}
	}
	if float64(lastStore) < rate/2 {
		t.Errorf("the store admitted %d in the run's last second, under half its rate %v: decisions did not go back to it", lastStore, rate)
	}
	if got, b := float64(phase["after"][0]), bound(end-restarted); got > b {
		t.Errorf("after the restart: %v admitted by the store, above burst + rate × t = %.0f", got, b)
	}
	if errs.Load() > 0 {
		t.Errorf("%d calls failed with another code than ResourceExhausted", errs.Load())
	}
}

func isRefusal(err error) bool { return status.Code(err) == codes.ResourceExhausted }

// restartServer starts the server binary again on port, as an operator
// restarts a crashed store at its address, and waits until it answers.
func restartServer(t *testing.T, port string) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(testserver.Binary(), "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait() //nolint:errcheck // reaped on kill
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return cmd
		}
	}
	t.Fatalf("%s did not listen on %s again", filepath.Base(testserver.Binary()), port)
	return nil
}
