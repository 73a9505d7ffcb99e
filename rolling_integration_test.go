package admit

import (
	"context"
	_ "embed"
	"strconv"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationRollingDeploy: during a rolling deploy the previous
// release's script and the shipped one decide on the same buckets. Calls
// alternate between the two, in a mixed order, on one standard and one
// shared bucket, with costs 1 and 2. The Specs refill one token an hour, so
// no token comes back during the test and every decision is known: each
// Decision, each stored tokens field, a ts that stays where the first write
// put it, and an expiry of one full refill from that write must be what one
// script alone would give.
func TestIntegrationRollingDeploy(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	p := testserver.Prefix(t, c)
	std, shared := MustSpec(Every(time.Hour), 6), MustSpec(Every(time.Hour), 4)
	keys := []string{p + "std", p + "shared"}
	previous, shipped := valkey.NewLuaScript(previousScript), valkey.NewLuaScript(scriptSource)
	call := func(old bool, cost int) (Decision, error) {
		if !old {
			return decode(shipped.Exec(ctx, c, keys, []string{
				std.intervalArg, std.burstArg, strconv.Itoa(cost), shared.intervalArg, shared.burstArg, strconv.Itoa(cost)}), 2)
		}
		return decode(previous.Exec(ctx, c, keys, []string{
			std.intervalArg, std.burstArg, strconv.Itoa(cost), shared.intervalArg, shared.burstArg, strconv.Itoa(cost)}), 2)
	}
	field := func(key, name string) int64 {
		t.Helper()
		v, err := c.Do(ctx, c.B().Hget().Key(key).Field(name).Build()).AsInt64()
		if err != nil {
			t.Fatalf("HGET %s %s: %v", key, name, err)
		}
		return v
	}
	tokens := [2]int64{6, 4} // what the model holds
	var ts [2]int64          // the first write's ts, which no later call moves
	for i, step := range []struct {
		old  bool
		cost int
	}{
		{true, 1}, {false, 1}, {false, 2}, // both admit: 5 3, 4 2, 2 0
		{true, 1}, {false, 1}, // shared denies, std charged: 1 0, 0 0
		{true, 1}, {false, 2}, // std denies

	} {
		d, err := call(step.old, step.cost)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		cost := int64(step.cost)
		want := Decision{Remaining: [2]int{int(tokens[0]), -1}, decided: true}
		switch {
		case tokens[0] < cost:
			want.Denied = 1
		case tokens[1] < cost:
			want.Denied, tokens[0] = 2, tokens[0]-cost
			want.Remaining = [2]int{int(tokens[0]), int(tokens[1])}
		default:
			tokens[0], tokens[1] = tokens[0]-cost, tokens[1]-cost
			want.Remaining = [2]int{int(tokens[0]), int(tokens[1])}
		}
		if want.Denied != 0 {
			// RetryAfter runs from the server's now to the moment the
			// bucket holds cost again: at most cost tokens' time away.
			if d.RetryAfter <= 0 || d.RetryAfter > time.Duration(cost)*time.Hour {
				t.Errorf("call %d (previous script %v): RetryAfter %v, want in (0, %v]", i, step.old, d.RetryAfter, time.Duration(cost)*time.Hour)
			}
			want.RetryAfter = d.RetryAfter
		}
		if d != want {
			t.Errorf("call %d (previous script %v, cost %d): %+v, want %+v", i, step.old, cost, d, want)
		}
		for b, key := range keys {
			if got := field(key, "tokens"); got != tokens[b] {
				t.Errorf("call %d: %s holds %d tokens, want %d", i, key, got, tokens[b])
			}
			got := field(key, "ts")
			if ts[b] == 0 {
				ts[b] = got
			}
			if got != ts[b] {
				t.Errorf("call %d: %s ts moved from %d to %d", i, key, ts[b], got)
			}
			pttl, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
			ttl := []Spec{std, shared}[b].TTL().Milliseconds()
			// The expiry is the write's now rounded up to a ms, plus ttl.
			if err != nil || pttl <= ttl-10_000 || pttl > ttl+1 {
				t.Errorf("call %d: %s PTTL %d ms, %v; want one full refill (%d ms, +1 for the rounding) from a write in this test", i, key, pttl, err, ttl)
			}
		}
	}
	if tokens != [2]int64{0, 0} {
		t.Fatalf("the schedule ends at %v tokens; it is meant to drain both buckets", tokens)
	}
}
