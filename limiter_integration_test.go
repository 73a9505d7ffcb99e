package admit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// realEnv is a Limiter on a real server, with the test's own key prefix.
type realEnv struct {
	srv    *testserver.Server
	c      valkey.Client
	l      *Limiter
	prefix string
}

func newRealEnv(tb testing.TB) *realEnv {
	tb.Helper()
	srv := testserver.Shared(tb)
	c := testserver.NewClient(tb, srv)
	return &realEnv{srv: srv, c: c, l: New(c), prefix: testserver.Prefix(tb, c)}
}

func (e *realEnv) do(tb testing.TB, cmd valkey.Completed) valkey.ValkeyResult {
	tb.Helper()
	return e.c.Do(context.Background(), cmd)
}

// dump returns a key's DUMP payload and PTTL: byte-for-byte state.
func (e *realEnv) dump(tb testing.TB, key string) string {
	tb.Helper()
	payload, err := e.do(tb, e.c.B().Dump().Key(key).Build()).ToString()
	if valkey.IsValkeyNil(err) {
		payload, err = "(absent)", nil
	}
	if err != nil {
		tb.Fatalf("DUMP %s: %v", key, err)
	}
	pttl, err := e.do(tb, e.c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("PTTL %s: %v", key, err)
	}
	return fmt.Sprintf("%q pttl>0:%v", payload, pttl > 0)
}

func (e *realEnv) hash(tb testing.TB, key string) map[string]string {
	tb.Helper()
	m, err := e.do(tb, e.c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		tb.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

func TestIntegrationTransitions(t *testing.T) {
	e := newRealEnv(t)
	t.Logf("server: %s at %s", e.srv.Version, e.srv.Addr)
	slow := MustSpec(Every(time.Hour), 2) // no refill within the test
	std, shared := Request{e.prefix + "std", slow}, Request{e.prefix + "shared", MustSpec(Every(time.Hour), 3)}
	ctx := context.Background()

	// allow, allow: both consumed.
	if d, err := e.l.AllowOrdered(ctx, std, &shared); err != nil || !d.Allowed() {
		t.Fatalf("row allow/allow: got %v, %v; want allowed", d, err)
	}
	if got := e.hash(t, std.Key)["tokens"] + "," + e.hash(t, shared.Key)["tokens"]; got != "1,2" {
		t.Errorf("row allow/allow: tokens std,shared = %s, want 1,2", got)
	}
	// Premium lane takes the shared bucket down to zero.
	for range 2 {
		if d, err := e.l.AllowOrdered(ctx, shared, nil); err != nil || !d.Allowed() {
			t.Fatalf("premium: got %v, %v; want allowed", d, err)
		}
	}
	// allow, deny: first consumed, second refused.
	d, err := e.l.AllowOrdered(ctx, std, &shared)
	if err != nil || d.Denied != 2 || d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
		t.Fatalf("row allow/deny: got %v, %v; want denied by bucket 2 with 0 < RetryAfter <= 1h", d, err)
	}
	if got := e.hash(t, std.Key)["tokens"]; got != "0" {
		t.Errorf("row allow/deny: std tokens = %s, want 0 (consumed)", got)
	}
	// deny, any: second untouched byte for byte.
	before := e.dump(t, shared.Key)
	d, err = e.l.AllowOrdered(ctx, std, &shared)
	if err != nil || d.Denied != 1 {
		t.Fatalf("row deny/any: got %v, %v; want denied by bucket 1", d, err)
	}
	if after := e.dump(t, shared.Key); after != before {
		t.Errorf("row deny/any: second bucket changed:\nbefore %s\nafter  %s", before, after)
	}
}

// TestIntegrationOneCommandPerDecision: in steady state every decision is
// exactly one EVALSHA, on both paths, counted by the server.
func TestIntegrationOneCommandPerDecision(t *testing.T) {
	e := newRealEnv(t)
	spec := MustSpec(1000, 1000)
	first, second := Request{e.prefix + "a", spec}, Request{e.prefix + "b", spec}
	ctx := context.Background()
	if _, err := e.l.AllowOrdered(ctx, first, &second); err != nil { // loads the script if needed
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		second *Request
	}{{"two buckets", &second}, {"one bucket", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			const calls = 50
			before := testserver.CommandStats(t, e.c)
			for range calls {
				if _, err := e.l.AllowOrdered(ctx, first, tc.second); err != nil {
					t.Fatal(err)
				}
			}
			after := testserver.CommandStats(t, e.c)
			if n := after["evalsha"].Calls - before["evalsha"].Calls; n != calls {
				t.Errorf("EVALSHA calls = %d for %d decisions, want %d", n, calls, calls)
			}
			// The commands the script runs inside (TIME, HMGET, HSET, PEXPIRE)
			// are counted too; none of them is a round trip.
			for _, cmd := range []string{"eval", "script|load", "script", "ping"} {
				if n := after[cmd].Calls - before[cmd].Calls; n != 0 {
					t.Errorf("%s calls = %d, want 0", cmd, n)
				}
			}
		})
	}
}

// TestIntegrationRefusalsWriteNothing: wrong type and corrupt state fail
// the call with no write to either key.
func TestIntegrationRefusalsWriteNothing(t *testing.T) {
	e := newRealEnv(t)
	spec := MustSpec(1, 5)
	good, bad := Request{e.prefix + "good", spec}, Request{e.prefix + "bad", spec}
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		first, sec  Request
		setup       valkey.Completed
		reason      error
		goodPresent bool
	}{
		{"string at the second key", good, bad, e.c.B().Set().Key(bad.Key).Value("x").Build(), ErrWrongType, false},
		{"list at the first key", bad, good, e.c.B().Rpush().Key(bad.Key).Element("x").Build(), ErrWrongType, false},
		{"corrupt second bucket", good, bad, e.c.B().Hset().Key(bad.Key).FieldValue().FieldValue("tokens", "x").FieldValue("ts", "1").Build(), ErrCorruptState, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.do(t, e.c.B().Del().Key(good.Key, bad.Key).Build())
			if err := e.do(t, tc.setup).Error(); err != nil {
				t.Fatal(err)
			}
			beforeGood, beforeBad := e.dump(t, good.Key), e.dump(t, bad.Key)
			_, err := e.l.AllowOrdered(ctx, tc.first, &tc.sec)
			if !errors.Is(err, tc.reason) || !errors.Is(err, ErrNotExecuted) {
				t.Errorf("err = %v; want %v and ErrNotExecuted", err, tc.reason)
			}
			if after := e.dump(t, good.Key); after != beforeGood {
				t.Errorf("good key changed: before %s after %s", beforeGood, after)
			}
			if after := e.dump(t, bad.Key); after != beforeBad {
				t.Errorf("bad key changed: before %s after %s", beforeBad, after)
			}
		})
	}
}

// TestIntegrationKeySchema pins the stored fields on a real server: the
// same names and encoding as TestKeySchema, with the server's own clock.
func TestIntegrationKeySchema(t *testing.T) {
	e := newRealEnv(t)
	r := Request{e.prefix + "schema", MustSpec(Every(time.Hour), 3)}
	ctx := context.Background()
	before := serverMicros(t, e.c)
	for range 2 {
		if _, err := e.l.AllowOrdered(ctx, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	after := serverMicros(t, e.c)
	m := e.hash(t, r.Key)
	if len(m) != 2 || m["tokens"] != "1" {
		t.Fatalf("HGETALL = %v, want exactly tokens=1 and ts", m)
	}
	var ts int64
	if _, err := fmt.Sscan(m["ts"], &ts); err != nil || fmt.Sprint(ts) != m["ts"] || ts < before || ts > after {
		t.Errorf("ts = %q, want a decimal integer of server µs in [%d, %d]", m["ts"], before, after)
	}
	pttl, err := e.do(t, e.c.B().Pttl().Key(r.Key).Build()).AsInt64()
	if err != nil || pttl <= 3*time.Hour.Milliseconds()-5000 || pttl > 3*time.Hour.Milliseconds() {
		t.Errorf("PTTL = %d, %v; want just under %d (burst × interval)", pttl, err, 3*time.Hour.Milliseconds())
	}
}

func serverMicros(tb testing.TB, c valkey.Client) int64 {
	tb.Helper()
	t, err := c.Do(context.Background(), c.B().Time().Build()).AsIntSlice()
	if err != nil || len(t) != 2 {
		tb.Fatalf("TIME: %v %v", t, err)
	}
	return t[0]*1_000_000 + t[1]
}

// TestIntegrationKeySlotMatchesServer: keySlot agrees with CLUSTER KEYSLOT
// of a cluster-enabled server on thousands of keys, hash tags included.
func TestIntegrationKeySlotMatchesServer(t *testing.T) {
	srv := testserver.Own(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := []string{"", "{", "}", "{}", "{}x", "a{}{b}", "foo{{bar}}zap", "{user1000}.following", "x{y", "é{ü}"}
	for i := range 3000 {
		keys = append(keys, fmt.Sprintf("rl:{chan:%d}:standard", i), fmt.Sprintf("k%d\xff%d", i, i*7919))
	}
	cmds := make(valkey.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().ClusterKeyslot().Key(k).Build()
	}
	for i, r := range c.DoMulti(context.Background(), cmds...) {
		want, err := r.AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", keys[i], err)
		}
		if got := keySlot(keys[i]); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, server says %d", keys[i], got, want)
		}
	}
}
