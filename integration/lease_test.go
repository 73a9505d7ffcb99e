package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationLeaseKill9 starts holders processes (this test binary,
// run as a holder) that each acquire one lease of a key whose limit is
// holders, report it and sleep; kills every one with SIGKILL mid-lease;
// and checks that their slots stay taken until their leases expire on the
// server's clock, and come back then.
func TestIntegrationLeaseKill9(t *testing.T) {
	if os.Getenv("ADMIT_LEASE_HOLDER") != "" {
		t.Skip("a holder process runs TestIntegrationLeaseHolderProcess")
	}
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	key := testserver.Prefix(t, c) + "conc"
	const holders, lease = 4, 3 * time.Second
	spec := admit.MustConcurrency(holders, lease)
	ctx := context.Background()
	l := admit.New(c)

	var procs []*exec.Cmd
	for i := range holders {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIntegrationLeaseHolderProcess$", "-test.v")
		cmd.Env = append(os.Environ(), "ADMIT_LEASE_HOLDER="+srv.Addr+"|"+key+"|holder-"+strconv.Itoa(i))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		buf := make([]byte, 4096)
		var seen strings.Builder
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(seen.String(), "HOLDING") {
			n, err := out.Read(buf)
			seen.Write(buf[:n])
			if err != nil || time.Now().After(deadline) {
				t.Fatalf("holder %d: %v\n%s", i, err, seen.String())
			}
		}
		t.Logf("holder %d (pid %d): %s", i, cmd.Process.Pid, strings.TrimSpace(seen.String()[strings.Index(seen.String(), "HOLDING"):]))
	}
	x, err := l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "late"}, nil, nil)
	if err != nil || x.Granted() || x.Denied != admit.PartConcurrency {
		t.Fatalf("with %d holders alive: %v, %v; want refused by the concurrency limit", holders, x, err)
	}
	t.Logf("with %d holders alive: %v", holders, x)
	for _, p := range procs {
		if err := p.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := p.Wait()
		t.Logf("pid %d: %v", p.Process.Pid, err)
	}
	killed := time.Now()
	scores, err := c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil || len(scores) != holders {
		t.Fatalf("after the kills the key holds %v, %v; want the %d dead holders", scores, err, holders)
	}
	latest := 0.0
	for _, s := range scores {
		latest = max(latest, s.Score)
	}
	// Until the last dead lease expires, every acquire is refused; a
	// refusal's RetryAfter bounds the wait for the first slot.
	var firstFree time.Duration
	for {
		now, err := c.Do(ctx, c.B().Time().Build()).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		serverNow := float64(now[0]*1_000_000 + now[1])
		x, err := l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "late"}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if x.Granted() {
			firstFree = time.Since(killed)
			if serverNow < scores[0].Score-1000 {
				t.Fatalf("granted at server time %.0f, before the first dead lease expires at %.0f", serverNow, scores[0].Score)
			}
			t.Logf("first slot back %v after the kills (the last dead lease expires %v after the first): %v", firstFree.Round(time.Millisecond),
				time.Duration(latest-scores[0].Score)*time.Microsecond, x)
			break
		}
		if x.RetryAfter > lease {
			t.Fatalf("refused with RetryAfter %v, above the lease %v", x.RetryAfter, lease)
		}
		if time.Since(killed) > 2*lease {
			t.Fatalf("no slot came back within %v of the kills", 2*lease)
		}
		time.Sleep(min(x.RetryAfter, 50*time.Millisecond))
	}
	// Every dead holder's slot is back once its lease has expired.
	time.Sleep(time.Until(killed.Add(lease + 100*time.Millisecond)))
	got := 0
	for i := range holders {
		x, err := l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec, Name: "after-" + strconv.Itoa(i)}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if x.Granted() {
			got++
		}
	}
	t.Logf("after the leases expired: %d more slots granted (1 taken by \"late\"), limit %d", got, holders)
	if got != holders-1 {
		t.Errorf("%d slots came back, want %d", got+1, holders)
	}
}

// TestIntegrationLeaseHolderProcess is a holder of TestIntegrationLeaseKill9: it
// acquires a lease, says so, and sleeps until it is killed.
func TestIntegrationLeaseHolderProcess(t *testing.T) {
	env := os.Getenv("ADMIT_LEASE_HOLDER")
	if env == "" {
		t.Skip("run by TestIntegrationLeaseKill9")
	}
	parts := strings.SplitN(env, "|", 3)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{parts[0]}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	x, err := admit.New(c).Acquire(context.Background(), admit.LeaseRequest{Key: parts[1], Spec: admit.MustConcurrency(4, 3*time.Second), Name: parts[2]}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatalf("%v %v", x, err)
	}
	fmt.Printf("HOLDING %s pid %d: %v, TTL %v\n", parts[2], os.Getpid(), x, x.TTL)
	time.Sleep(time.Minute)
}

// TestIntegrationLeaseReleaseBeatsExtend races an Extend against a
// Release of one Lease, 2,000 rounds, and counts the rounds where
// Deadline is not zero once both returned, although the Release
// succeeded and the lease is gone from the server: an Extend that ran on
// the server before the Release but replied after it must not revive the
// Deadline.
func TestIntegrationLeaseReleaseBeatsExtend(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	key := testserver.Prefix(t, c) + "conc"
	spec := admit.MustConcurrency(1, 10*time.Second)
	ctx := context.Background()
	l := admit.New(c)
	const rounds = 2000
	stale, extendedFirst := 0, 0
	for i := range rounds {
		x, err := l.Acquire(ctx, admit.LeaseRequest{Key: key, Spec: spec}, nil, nil)
		if err != nil || !x.Granted() {
			t.Fatalf("round %d: Acquire: %v, %v", i, x, err)
		}
		start := make(chan struct{})
		extended := make(chan bool)
		go func() {
			<-start
			live, _ := x.Extend(ctx)
			extended <- live
		}()
		close(start)
		_, rerr := x.Release(ctx)
		if <-extended {
			extendedFirst++
		}
		if rerr != nil {
			t.Fatalf("round %d: Release: %v", i, rerr)
		}
		if !x.Deadline().IsZero() {
			stale++
		}
	}
	if n, err := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("%d holders left on the server (%v); want 0", n, err)
	}
	t.Logf("%d rounds: Extend live (ran before Release) in %d, Deadline not zero after Release in %d", rounds, extendedFirst, stale)
	if stale != 0 {
		t.Errorf("in %d of %d rounds Deadline pointed past the server's expiry after Release returned; want 0", stale, rounds)
	}
}
