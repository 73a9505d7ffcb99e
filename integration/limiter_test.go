package integration

import (
	"context"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationPeekOnReplica is the conformance rule peek-on-replica,
// which needs a replica the suite cannot start: a client built with
// SendToReplicas (read-only commands to the replica) runs Peek's
// EVALSHA_RO on the replica, and AllowOrdered's and Refund's EVALSHA on the
// primary. The servers' INFO commandstats prove where each ran, and the
// peeks on the replica see the state the primary's decisions replicated.
func TestIntegrationPeekOnReplica(t *testing.T) {
	primary, replica := testserver.OwnReplicated(t)
	pAdmin, rAdmin := testserver.NewClient(t, primary), testserver.NewClient(t, replica)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// replicated waits (at most 10 s) until the replica has every write the
	// primary made: it increments a mark on the primary and polls the
	// replica for the new value; the replication stream is in order, so
	// every earlier write has reached the replica too. (WAIT would not do:
	// it counts the writes of its own connection, and valkey-go sends it on
	// a connection of its own.)
	var mark string
	replicated := func() {
		t.Helper()
		want, err := pAdmin.Do(ctx, pAdmin.B().Incr().Key(mark).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		for range 500 {
			got, err := rAdmin.Do(ctx, rAdmin.B().Get().Key(mark).Build()).AsInt64()
			if err == nil && got == want {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("the replica did not receive the primary's writes within 10s")
	}

	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:    []string{primary.Addr},
		Standalone:     valkey.StandaloneOption{ReplicaAddress: []string{replica.Addr}},
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
		DisableCache:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim := admit.New(c)
	p := testserver.Prefix(t, pAdmin)
	mark = p + "replication-mark"
	first := admit.Request{Key: p + "std", Spec: admit.MustSpec(admit.Every(time.Hour), 5), Cost: 2}
	second := admit.Request{Key: p + "shared", Spec: admit.MustSpec(admit.Every(time.Hour), 4), Cost: 1}

	// Warm both script caches (the replica's first EVALSHA_RO is a
	// NOSCRIPT, then EVAL_RO) and leave state to replicate: 3 and 3 tokens.
	if d, err := lim.AllowOrdered(ctx, first, &second); err != nil || !d.Allowed() || d.Remaining != [2]int{3, 3} {
		t.Fatalf("AllowOrdered: %v, %v, Remaining %v; want allowed with Remaining [3 3]", d, err, d.Remaining)
	}
	replicated()
	if _, err := lim.Peek(ctx, first, &second); err != nil {
		t.Fatalf("Peek: %v", err)
	}

	type counts struct{ evalsha, evalshaRO, eval, evalRO int64 }
	read := func(c valkey.Client) counts {
		s := testserver.CommandStats(t, c)
		return counts{s["evalsha"].Calls, s["evalsha_ro"].Calls, s["eval"].Calls, s["eval_ro"].Calls}
	}
	delta := func(a, b counts) counts {
		return counts{b.evalsha - a.evalsha, b.evalshaRO - a.evalshaRO, b.eval - a.eval, b.evalRO - a.evalRO}
	}
	step := func(name string, wantPrimary, wantReplica counts, calls func()) {
		t.Helper()
		p0, r0 := read(pAdmin), read(rAdmin)
		calls()
		if got := delta(p0, read(pAdmin)); got != wantPrimary {
			t.Errorf("%s: primary ran %+v, want %+v", name, got, wantPrimary)
		}
		if got := delta(r0, read(rAdmin)); got != wantReplica {
			t.Errorf("%s: replica ran %+v, want %+v", name, got, wantReplica)
		}
	}

	const peeks = 5
	step("5 peeks", counts{}, counts{evalshaRO: peeks}, func() {
		for i := range peeks {
			d, err := lim.Peek(ctx, first, &second)
			if err != nil || !d.Allowed() || d.Remaining != [2]int{1, 2} {
				t.Errorf("peek %d on the replica: %v, %v, Remaining %v; want allowed with Remaining [1 2]", i, d, err, d.Remaining)
			}
		}
	})
	step("2 decisions and a refund", counts{evalsha: 3}, counts{}, func() {
		for i, want := range []struct {
			denied    uint8
			remaining [2]int
		}{{0, [2]int{1, 2}}, {1, [2]int{1, -1}}} {
			d, err := lim.AllowOrdered(ctx, first, &second)
			if err != nil || d.Denied != want.denied || d.Remaining != want.remaining {
				t.Errorf("decision %d on the primary: %v, %v, Remaining %v; want Denied %d, Remaining %v", i, d, err, d.Remaining, want.denied, want.remaining)
			}
		}
		if err := lim.Refund(ctx, admit.Request{Key: first.Key, Spec: first.Spec, Cost: 1}, nil); err != nil {
			t.Errorf("Refund: %v", err)
		}
	})
	replicated()
	// The replica now holds 2 and 2 tokens: a peek sees the first bucket
	// admit (2 - 2 = 0 left) and the second too (2 - 1 = 1 left).
	step("a peek after replication", counts{}, counts{evalshaRO: 1}, func() {
		d, err := lim.Peek(ctx, first, &second)
		if err != nil || !d.Allowed() || d.Remaining != [2]int{0, 1} {
			t.Errorf("peek on the replica after replication: %v, %v, Remaining %v; want allowed with Remaining [0 1]", d, err, d.Remaining)
		}
	})
}
