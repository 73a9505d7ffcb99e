package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// failoverCall is one decision of the failover test's traffic: its own key
// (a counting bucket: a fresh key per call, so whether the call ran shows in
// whether the key exists), which primary's slots it went to, when it ended,
// and how it failed.
type failoverCall struct {
	key     string
	primary int
	end     time.Time
	err     error
}

// TestFailover runs decisions under traffic on a cluster of 3 primaries and
// 3 replicas the test starts, through one client, while it fails a primary
// over twice:
//
//   - CLUSTER FAILOVER on a replica (a manual, coordinated failover): no
//     call fails, and the new primary, whose script cache is empty (a
//     replica receives a script's writes, not the script), answers the
//     first EVALSHA with NOSCRIPT, after which the call goes through EVAL.
//   - kill -9 of another primary: calls on its slots fail until its replica
//     is promoted, then resume on the same client. Every error is in exactly
//     one of admit's classes, and a call classed not executed never ran: its
//     key does not exist.
//
// It reports the time to recover and the errors by class and cause. It
// needs VALKEY_FAILOVER=1 and a server binary (about 15 s).
func TestFailover(t *testing.T) {
	if os.Getenv("VALKEY_FAILOVER") != "1" {
		t.Skip("starts a 6-node cluster and kills a primary; set VALKEY_FAILOVER=1 to run it")
	}
	bin := testserver.Binary()
	if bin == "" {
		testserver.SkipOrFail(t, testserver.Help)
	}
	rc, err := testserver.StartReplicatedCluster(bin, 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Stop()
	t.Logf("%s: 3 primaries, 3 replicas, cluster-node-timeout 1s", rc.Version)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: rc.Addrs(), DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := admit.New(c)
	ctx := context.Background()

	// A hash tag per primary, so that each goroutine's calls go to one.
	tags := make([]string, len(rc.Primaries))
	for i := 0; slices.Contains(tags, ""); i++ {
		if i == 10_000 {
			t.Fatal("found no hash tag for every primary")
		}
		tag := fmt.Sprintf("fo%d", i)
		slot, err := c.Do(ctx, c.B().ClusterKeyslot().Key(tag).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if p := int(slot) * len(rc.Primaries) / 16384; tags[p] == "" {
			tags[p] = tag
		}
	}

	// The traffic: 2 goroutines per primary, a call every 2 ms each, at
	// most 60 s and 30000 calls each.
	var mu sync.Mutex
	var calls []failoverCall
	stop := make(chan struct{})
	var wg sync.WaitGroup
	spec := admit.MustSpec(admit.Every(time.Hour), 10)
	deadline := time.Now().Add(60 * time.Second)
	for g := range 2 * len(rc.Primaries) {
		p := g % len(rc.Primaries)
		wg.Go(func() {
			for i := range 30_000 {
				select {
				case <-stop:
					return
				default:
				}
				if time.Now().After(deadline) {
					return
				}
				key := fmt.Sprintf("fo:{%s}:%d:%d", tags[p], g, i)
				callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := l.AllowOrdered(callCtx, admit.Request{Key: key, Spec: spec}, nil)
				cancel()
				mu.Lock()
				calls = append(calls, failoverCall{key: key, primary: p, end: time.Now(), err: err})
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	stopTraffic := func() {
		close(stop)
		wg.Wait()
	}
	// firstSuccess waits until a call to primary p's slots that ended after
	// since has succeeded, and returns when it ended.
	firstSuccess := func(p int, since time.Time, within time.Duration) (time.Time, error) {
		for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			for _, call := range calls {
				if call.primary == p && call.err == nil && call.end.After(since) {
					mu.Unlock()
					return call.end, nil
				}
			}
			mu.Unlock()
		}
		return time.Time{}, fmt.Errorf("no call to primary %d's slots succeeded within %v", p, within)
	}
	direct := func(s *testserver.Server) valkey.Client {
		cl, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			stopTraffic()
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	if _, err := firstSuccess(0, time.Time{}, 10*time.Second); err != nil {
		stopTraffic()
		t.Fatal(err)
	}

	// 1. CLUSTER FAILOVER: replica 0 takes over primary 0, coordinated.
	r0 := direct(rc.Replicas[0])
	before, err := testserver.ReadCommandStats(ctx, r0)
	if err != nil {
		stopTraffic()
		t.Fatal(err)
	}
	manualStart := time.Now()
	if err := r0.Do(ctx, r0.B().ClusterFailover().Build()).Error(); err != nil {
		stopTraffic()
		t.Fatalf("CLUSTER FAILOVER: %v", err)
	}
	if err := waitRole(ctx, r0, "master", 15*time.Second); err != nil {
		stopTraffic()
		t.Fatal(err)
	}
	promoted := time.Now()
	manualRecovered, err := firstSuccess(0, promoted, 15*time.Second)
	if err != nil {
		stopTraffic()
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	manualEnd := time.Now()
	after, err := testserver.ReadCommandStats(ctx, r0)
	if err != nil {
		stopTraffic()
		t.Fatal(err)
	}

	// 2. kill -9 of primary 1: its replica is promoted by the cluster.
	killed := time.Now()
	rc.Primaries[1].Stop() // SIGKILL
	recovered, recoverErr := firstSuccess(1, killed, 30*time.Second)
	time.Sleep(300 * time.Millisecond)
	stopTraffic()

	// The manual failover: no call failed, and the new primary fell back
	// from EVALSHA to EVAL.
	var manualErrs []string
	for _, call := range calls {
		if call.err != nil && !call.end.Before(manualStart) && call.end.Before(manualEnd) {
			manualErrs = append(manualErrs, call.err.Error())
		}
	}
	if len(manualErrs) > 0 {
		t.Errorf("CLUSTER FAILOVER: %d calls failed, want 0; first: %s", len(manualErrs), manualErrs[0])
	}
	noscript := after["evalsha"].Failed - before["evalsha"].Failed
	evals := after["eval"].Calls - before["eval"].Calls
	if noscript < 1 || evals < 1 {
		t.Errorf("new primary: %d failed EVALSHA (NOSCRIPT) and %d EVAL, want at least 1 of each: the fallback was not observed", noscript, evals)
	}
	t.Logf("CLUSTER FAILOVER: promoted in %v, calls to its slots succeeded again %v after the promotion; %d failed EVALSHA (NOSCRIPT) and %d EVAL on the new primary; 0 errors among %d calls",
		promoted.Sub(manualStart).Round(time.Millisecond), manualRecovered.Sub(promoted).Round(time.Millisecond), noscript, evals, countBetween(calls, manualStart, manualEnd))

	// kill -9: every error in exactly one class, not-executed calls never
	// ran, and the calls resumed.
	if recoverErr != nil {
		t.Error(recoverErr)
	}
	byClass := map[string]int{}
	byCause := map[string]int{}
	var notExecuted, unknown []string
	okOnKilled, lostOnKilled := 0, 0
	var okKeys []string
	for _, call := range calls {
		if call.end.Before(killed) {
			continue
		}
		if call.err == nil {
			if call.primary == 1 {
				okOnKilled++
				okKeys = append(okKeys, call.key)
			}
			continue
		}
		ne, ou := errors.Is(call.err, admit.ErrNotExecuted), errors.Is(call.err, admit.ErrOutcomeUnknown)
		class := "unclassed"
		switch {
		case ne && !ou:
			class = "not executed"
			notExecuted = append(notExecuted, call.key)
		case ou && !ne:
			class = "outcome unknown"
			unknown = append(unknown, call.key)
		default:
			t.Errorf("call on %s: %v is in both classes or neither, want exactly one", call.key, call.err)
		}
		byClass[class]++
		byCause[class+", "+errorCause(call.err)]++
	}
	for _, k := range notExecuted {
		n, err := existsSettled(ctx, c, k)
		if err != nil {
			t.Fatalf("EXISTS %s: %v", k, err)
		}
		if n != 0 {
			t.Errorf("%s: the call was classed not executed, but its bucket exists: it ran", k)
		}
	}
	unknownRan := 0
	for _, k := range unknown {
		if n, err := existsSettled(ctx, c, k); err == nil && n == 1 {
			unknownRan++
		}
	}
	for _, k := range okKeys {
		if n, err := existsSettled(ctx, c, k); err == nil && n == 0 {
			lostOnKilled++
		}
	}
	var causes []string
	for cause, n := range byCause {
		causes = append(causes, fmt.Sprintf("%d %s", n, cause))
	}
	sort.Strings(causes)
	t.Logf("kill -9: calls to its slots succeeded again %v after the kill; errors by class %v; by cause [%s]; %d not-executed calls, none ran; %d outcome-unknown calls, %d of which ran; %d calls admitted on its slots after the kill, %d of whose buckets are gone (acknowledged before the replica had them: asynchronous replication)",
		recovered.Sub(killed).Round(time.Millisecond), byClass, strings.Join(causes, "; "), len(notExecuted), len(unknown), unknownRan, okOnKilled, lostOnKilled)
}

func countBetween(calls []failoverCall, from, to time.Time) int {
	n := 0
	for _, c := range calls {
		if !c.end.Before(from) && c.end.Before(to) {
			n++
		}
	}
	return n
}

// waitRole waits until the node says role:role in INFO replication.
func waitRole(ctx context.Context, c valkey.Client, role string, within time.Duration) error {
	var last string
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		info, err := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
		if err != nil {
			last = err.Error()
			continue
		}
		if last = testserver.InfoFields(info)["role"]; last == role {
			return nil
		}
	}
	return fmt.Errorf("role %s after %v, want %s", last, within, role)
}

// errorCause names what an error came from, for the report: the server's
// error code, or the transport failure.
func errorCause(err error) string {
	var verr *valkey.ValkeyError
	if errors.As(err, &verr) {
		code, _, _ := strings.Cut(verr.Error(), " ")
		return "server " + code
	}
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "EOF"):
		return "EOF"
	case strings.Contains(s, "connection reset"):
		return "connection reset"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// existsSettled is EXISTS key once the client's slot map has caught up with
// the failover: the command is retried, for at most 10 s, while the client
// has no node for the key's slot or the cluster is still settling.
func existsSettled(ctx context.Context, c valkey.Client, key string) (int64, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64()
		if err == nil || time.Now().After(deadline) {
			return n, err
		}
		if !errors.Is(err, valkey.ErrNoSlot) && !strings.Contains(err.Error(), "CLUSTERDOWN") && !strings.Contains(err.Error(), "TRYAGAIN") {
			return n, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
