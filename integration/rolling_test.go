package integration

import (
	"context"
	"fmt"
	"github.com/admitkit/admit"
	"strconv"
	"strings"
	"testing"
	"time"

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
	c, p := keyspace(t)
	ctx := context.Background()
	std, shared := admit.MustSpec(admit.Every(time.Hour), 6), admit.MustSpec(admit.Every(time.Hour), 4)
	keys := []string{p + "std", p + "shared"}
	// The previous release's script (testdata/script_5550b58.lua): the one
	// copy of an older script the tests keep, since no model of a release
	// that is gone can stand in for the bytes it runs.
	previous, current := valkey.NewLuaScript(readRepoFile("testdata/script_5550b58.lua")), valkey.NewLuaScript(shipped)
	// call returns the reply's fields: denied, retry_us, rem1, rem2.
	call := func(old bool, cost int) ([4]int64, error) {
		script := current
		if old {
			script = previous
		}
		stdPer, stdBurst := specArgs(std)
		sharedPer, sharedBurst := specArgs(shared)
		text, err := replyOf(script.Exec(ctx, c, keys, []string{stdPer, stdBurst, costArg(cost), sharedPer, sharedBurst, costArg(cost)}), 2)
		var f [4]int64
		if err != nil {
			return f, err
		}
		fields := strings.Fields(text)
		if len(fields) != 4 {
			return f, fmt.Errorf("reply %q: want 4 fields", text)
		}
		for i, s := range fields {
			if f[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				return f, fmt.Errorf("reply %q: %v", text, err)
			}
		}
		return f, nil
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
		got, err := call(step.old, step.cost)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		cost := int64(step.cost)
		want := [4]int64{0, 0, tokens[0], -1} // denied, retry_us, rem1, rem2
		switch {
		case tokens[0] < cost:
			want[0] = 1
		case tokens[1] < cost:
			want[0], tokens[0] = 2, tokens[0]-cost
			want[2], want[3] = tokens[0], tokens[1]
		default:
			tokens[0], tokens[1] = tokens[0]-cost, tokens[1]-cost
			want[2], want[3] = tokens[0], tokens[1]
		}
		if want[0] != 0 {
			// The wait runs from the server's now to the moment the
			// bucket holds cost again: at most cost tokens' time away.
			if got[1] <= 0 || got[1] > cost*time.Hour.Microseconds() {
				t.Errorf("call %d (previous script %v): retry %d µs, want in (0, %d]", i, step.old, got[1], cost*time.Hour.Microseconds())
			}
			want[1] = got[1]
		}
		if got != want {
			t.Errorf("call %d (previous script %v, cost %d): reply %v, want %v", i, step.old, cost, got, want)
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
			ttl := []admit.Spec{std, shared}[b].TTL().Milliseconds()
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
