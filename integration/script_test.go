package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/aclrules"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/google/go-cmp/cmp"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationScriptRefusesBadArgv: a direct call with arguments admit
// never sends is refused before the first write, on a real server (whose
// Lua converts "nan", "inf" and "0x10" as numbers, unlike miniredis's).
func TestIntegrationScriptRefusesBadArgv(t *testing.T) {
	c, prefix := keyspace(t)
	ctx := context.Background()
	snap := func() string {
		var b strings.Builder
		for _, k := range []string{"{t}b1", "{t}b2", "{t}rec"} {
			v, _ := c.Do(ctx, c.B().Dump().Key(prefix+k).Build()).ToString()
			ttl, _ := c.Do(ctx, c.B().Pexpiretime().Key(prefix+k).Build()).AsInt64()
			b.WriteString(k + " " + v + " " + strconv.FormatInt(ttl, 10) + "\n")
		}
		return b.String()
	}
	checkArgv(t, c, prefix, snap)
}

// TestIntegrationScriptCommands counts, on a real server, the commands the
// script runs inside each decision on buckets that exist: TIME once, one
// HMGET a bucket read, HSET and PEXPIREAT for a bucket charged, PEXPIREAT
// (GT) alone for a bucket denied, EXISTS never. These are the fewest
// commands a decision can run, with no write on a denied bucket: the floor under the
// server time BENCHMARKS.md measures, and what a change to the script must
// not quietly add to. A new bucket costs one EXISTS more.
func TestIntegrationScriptCommands(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	l := admit.New(c)
	const calls = 10
	type counts map[string]int64
	open, shut := admit.MustSpec(admit.MaxLimit, 1_000_000), admit.MustSpec(admit.Every(time.Hour), 1)
	for _, p := range []struct {
		name   string
		first  admit.Spec
		second *admit.Spec
		denied uint8
	}{
		{"one-bucket-allowed", open, nil, 0},
		{"one-bucket-denied", shut, nil, 1},
		{"allowed", open, &open, 0},
		{"denied-by-first", shut, &open, 1},
		{"denied-by-second", open, &shut, 2},
	} {
		t.Run(p.name, func(t *testing.T) {
			prefix := testserver.Prefix(t, c)
			first := admit.Request{Key: prefix + "first", Spec: p.first}
			var second *admit.Request
			if p.second != nil {
				second = &admit.Request{Key: prefix + "second", Spec: *p.second}
			}
			decide := func() {
				t.Helper()
				d, err := l.AllowOrdered(ctx, first, second)
				if err != nil || d.Denied != p.denied {
					t.Fatalf("%v, %v; want denied %d", d, err, p.denied)
				}
			}
			reset := func() {
				t.Helper()
				if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			inner := func() counts {
				t.Helper()
				got := counts{}
				for name, st := range testserver.CommandStats(t, c) {
					switch name {
					case "time", "hmget", "hset", "pexpireat", "exists", "pexpire", "hgetall", "get", "set", "del":
						got[name] = st.Calls
					}
				}
				return got
			}
			buckets := int64(1)
			if second != nil {
				buckets = 2
			}
			// The first call, on new buckets, reads them all (EXISTS for
			// each) and admits: a shut bucket starts with its one token.
			reset()
			if d, err := l.AllowOrdered(ctx, first, second); err != nil || !d.Allowed() {
				t.Fatalf("first call: %v, %v; want allowed", d, err)
			}
			if got := inner()["exists"]; got != buckets {
				t.Errorf("first call on new buckets: %d EXISTS, want %d", got, buckets)
			}
			reset()
			for range calls {
				decide()
			}
			want := counts{"time": calls, "hmget": calls * buckets}
			charged, denied := int64(0), int64(0) // buckets a call charges, and denies
			switch p.denied {
			case 0:
				charged = buckets
			case 1:
				denied = 1
			case 2:
				charged, denied = 1, 1
			}
			if charged > 0 {
				want["hset"] = calls * charged
			}
			want["pexpireat"] = calls * (charged + denied)
			if diff := cmp.Diff(want, inner()); diff != "" {
				t.Errorf("commands inside %d decisions (-want +got):\n%s", calls, diff)
			}
		})
	}
}

// TestIntegrationFIPSOnly runs this test binary again under
// GODEBUG=fips140=only, where SHA-1 panics: importing admit must not kill
// the program, and decisions must work, with valkey-go loading the
// script's SHA-1 from the server (SCRIPT LOAD), for the shipped script and
// for WithoutACLPrecheck's.
func TestIntegrationFIPSOnly(t *testing.T) {
	if os.Getenv("ADMIT_FIPS_CHILD") == "1" {
		fipsChild(t)
		return
	}
	srv := testserver.Shared(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestIntegrationFIPSOnly$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "GODEBUG=fips140=only", "ADMIT_FIPS_CHILD=1", "VALKEY_ADDR="+srv.Addr)
	out, err := cmd.CombinedOutput()
	for _, want := range []string{"fips-only decisions: allowed, allowed, denied by bucket 1", "fips-only decisions without the ACL precheck: allowed, allowed, denied by bucket 1"} {
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("child under GODEBUG=fips140=only: %v; want %q in\n%s", err, want, out)
		}
	}
}

func fipsChild(t *testing.T) {
	spec := admit.MustSpec(admit.Every(time.Hour), 2)
	c, p := keyspace(t)
	for _, l := range []struct {
		name string
		opts []admit.Option
	}{{"", nil}, {" without the ACL precheck", []admit.Option{admit.WithoutACLPrecheck()}}} {
		lim := admit.New(c, l.opts...)
		var got []string
		for range 3 {
			d, err := lim.AllowOrdered(context.Background(), admit.Request{Key: p + "fips" + l.name, Spec: spec}, nil)
			if err != nil {
				t.Fatalf("decision under fips140=only: %v", err)
			}
			got = append(got, d.String())
		}
		t.Logf("fips-only decisions%s: %s", l.name, strings.Join(got, ", "))
	}
}

// TestIntegrationAdmissionReplyPacking: an untracked admission's reply is
// an integer exactly when decode can unpack it (rem1 alone, or both counts
// below 2^26), on a real server, whose Lua hands numbers back as integers;
// and AllowOrdered reads the same Remaining either way, at the bounds of
// the packing.
func TestIntegrationAdmissionReplyPacking(t *testing.T) {
	c, prefix := keyspace(t)
	ctx := context.Background()
	l := admit.New(c)
	const bound = 1 << 26
	for i, tc := range []struct {
		bursts  []int64 // a fresh bucket is full: an admission leaves burst - 1
		integer bool
	}{
		{[]int64{1}, true},
		{[]int64{1 << 40}, true},
		{[]int64{bound, bound}, true}, // leaves 2^26 - 1 in each
		{[]int64{bound + 1, 5}, false},
		{[]int64{5, bound + 1}, false},
		{[]int64{2*bound + 1, 3}, false},
		{[]int64{3, 2*bound + 1}, false},
		{[]int64{1, 1}, true},
		{[]int64{7, 1000}, true},
		{[]int64{bound, 2}, true},
	} {
		var specs []admit.Spec
		var reqs []admit.Request
		for j, burst := range tc.bursts {
			s, err := admit.NewSpec(admit.MaxLimit, int(burst))
			if err != nil {
				t.Fatal(err)
			}
			specs = append(specs, s)
			reqs = append(reqs, admit.Request{Key: prefix + "{p}" + strconv.Itoa(i) + ":" + strconv.Itoa(j), Spec: s})
		}
		keys := []string{reqs[0].Key}
		if len(reqs) == 2 {
			keys = append(keys, reqs[1].Key)
		}
		raw, err := valkey.NewLuaScriptReadOnly(shipped).Exec(ctx, c, keys, append(takeArgs(specs...), modePeek)).ToMessage()
		if err != nil {
			t.Fatal(err)
		}
		if raw.IsInt64() != tc.integer {
			t.Errorf("bursts %v: peek replied %v, want an integer: %v", tc.bursts, raw, tc.integer)
		}
		want := [2]int{int(tc.bursts[0] - 1), -1}
		var second *admit.Request
		if len(reqs) == 2 {
			want[1], second = int(tc.bursts[1]-1), &reqs[1]
		}
		d, err := l.AllowOrdered(ctx, reqs[0], second)
		if err != nil || !d.Allowed() || d.Remaining != want {
			t.Errorf("bursts %v: AllowOrdered = %+v, %v; want admitted with %v left", tc.bursts, d, err, want)
		}
	}
}

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

// TestIntegrationOOMWritesNothing backs the decision to ship the script
// without a "#!lua" shebang: on a server over maxmemory the script's first
// write is refused, and since it writes only after every read, no key
// changes and the error is ErrNotExecuted.
func TestIntegrationOOMWritesNothing(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	l := admit.New(c)
	spec := admit.MustSpec(admit.Every(time.Hour), 5)
	first, second := admit.Request{Key: "oom:{x}:1", Spec: spec}, admit.Request{Key: "oom:{x}:2", Spec: spec}
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil {
		t.Fatal(err)
	}
	fresh := admit.Request{Key: "oom:{x}:fresh", Spec: spec}
	read := func() []string {
		var out []string
		for _, k := range []string{first.Key, second.Key, fresh.Key} {
			v, err := c.Do(ctx, c.B().Dump().Key(k).Build()).ToString()
			if err != nil && !valkey.IsValkeyNil(err) {
				t.Fatalf("DUMP %s: %v", k, err)
			}
			out = append(out, v)
		}
		return out
	}
	before := read()
	restore := overMaxmemory(t, c)

	for _, tc := range []struct {
		name   string
		first  admit.Request
		second *admit.Request
	}{{"existing buckets", first, &second}, {"fresh bucket", fresh, nil}} {
		_, err := l.AllowOrdered(ctx, tc.first, tc.second)
		if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) {
			t.Errorf("%s: err = %v; want ErrNotExecuted (OOM refused before any write)", tc.name, err)
		}
		if err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("%s: err = %v; want the server's OOM refusal", tc.name, err)
		}
	}
	restore()
	after := read()
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("key %d changed under OOM: %q -> %q", i, before[i], after[i])
		}
	}
}

// TestIntegrationOOMStillDenies is the other half of the no-shebang
// decision (docs/newer-servers.md): on a server over maxmemory a denial, a
// first-bucket denial of AllowOrderedOnce and a Peek are still decided,
// because the script only reads and, at most, lengthens an expiry
// (PEXPIREAT is not refused under OOM). With a "#!lua" line the server
// would refuse each of these calls before running it, and a caller that
// fails open on ErrNotExecuted would admit exactly the traffic a denial
// refuses. A second-bucket denial charges the first bucket, so like an
// admission it is refused, with nothing written.
func TestIntegrationOOMStillDenies(t *testing.T) {
	srv := testserver.Own(t)
	c := testserver.NewClient(t, srv)
	ctx := context.Background()
	l := admit.New(c)
	drained := admit.Request{Key: "oomdeny:{x}:drained", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	open := admit.Request{Key: "oomdeny:{x}:open", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}
	for _, r := range []admit.Request{drained, open} {
		if d, err := l.AllowOrdered(ctx, r, nil); err != nil || !d.Allowed() {
			t.Fatalf("AllowOrdered %s: %+v, %v; want allowed", r.Key, d, err)
		}
	}
	peek, err := l.Peek(ctx, open, nil)
	if err != nil || !peek.Allowed() {
		t.Fatalf("Peek before OOM: %+v, %v; want allowed", peek, err)
	}
	record, err := admit.OnceRecordKey(drained.Key, "id-1")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{drained.Key, open.Key, record}
	read := func() []string {
		var out []string
		for _, k := range keys {
			out = append(out, ecRawKey(t, c, k))
		}
		return out
	}
	before := read()
	restore := overMaxmemory(t, c)

	denied := func(name string, d admit.Decision, err error) {
		t.Helper()
		if err != nil || d.Denied != 1 || d.RetryAfter <= 0 || d.RetryAfter > time.Hour || d.Remaining != [2]int{0, -1} {
			t.Errorf("%s under OOM: %+v, %v; want denied by bucket 1, RetryAfter in (0, 1h], Remaining [0 -1]", name, d, err)
		}
	}
	d, err := l.AllowOrdered(ctx, drained, nil)
	denied("one-bucket denial", d, err)
	d, err = l.AllowOrdered(ctx, drained, &open)
	denied("first-bucket denial", d, err)
	d, err = l.AllowOrderedOnce(ctx, "id-1", drained, nil)
	denied("AllowOrderedOnce first-bucket denial", d, err)
	if d, err := l.Peek(ctx, open, nil); err != nil || d != peek {
		t.Errorf("Peek under OOM: %+v, %v; want %+v, as before", d, err, peek)
	}
	_, err = l.AllowOrdered(ctx, open, &drained)
	if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("second-bucket denial under OOM: err = %v; want ErrNotExecuted with the server's OOM refusal", err)
	}
	restore()
	after := read()
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("%s changed under OOM: %s -> %s", keys[i], before[i], after[i])
		}
	}
}

// overMaxmemory puts the server over maxmemory (1 byte, noeviction), so that
// every write is refused with OOM, and returns a function, also run at the
// end of the test, that puts back the server's own maxmemory and policy.
func overMaxmemory(t *testing.T, c valkey.Client) (restore func()) {
	t.Helper()
	ctx := context.Background()
	was, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory", "maxmemory-policy").Build()).AsStrMap()
	if err != nil || was["maxmemory"] == "" || was["maxmemory-policy"] == "" {
		t.Fatalf("CONFIG GET maxmemory maxmemory-policy: %v %v", was, err)
	}
	restore = func() {
		c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", was["maxmemory"]).
			ParameterValue("maxmemory-policy", was["maxmemory-policy"]).Build())
	}
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "noeviction").ParameterValue("maxmemory", "1").Build()).Error(); err != nil {
		t.Fatalf("CONFIG SET maxmemory: %v", err)
	}
	t.Cleanup(restore)
	return restore
}

// TestIntegrationClockStepBounded steps a real server's clock (an
// LD_PRELOAD shim shifts its TIME): a step back freezes a bucket for at
// most one full refill, and the test counts what a clock flapping back and
// forth over-admits with that bound; for a bucket alone and for the second
// bucket of a call (whose first never runs dry), since the script reads
// each bucket in lines of its own. (Before the fix, the wait after a 24 h
// step back was 24 h.)
func TestIntegrationClockStepBounded(t *testing.T) {
	srv, clock := testserver.StartClockShifted(t)
	c := testserver.NewClient(t, srv)
	l := admit.New(c)
	ctx := context.Background()
	spec := admit.MustSpec(admit.Every(time.Hour), 3) // full refill 3 h; real time in this test earns nothing
	p := testserver.Prefix(t, c)
	for _, bucket := range []int{1, 2} {
		t.Run(fmt.Sprintf("bucket %d", bucket), func(t *testing.T) {
			// The first bucket of a bucket-2 call: a burst no test here drains.
			open := admit.Request{Key: p + "open", Spec: admit.MustSpec(admit.Every(time.Second), 1_000_000)}
			drain := func(r admit.Request) (admitted int, last admit.Decision) {
				t.Helper()
				for range spec.Burst() + 1 { // bounded: a bucket holds at most Burst
					var d admit.Decision
					var err error
					if bucket == 1 {
						d, err = l.AllowOrdered(ctx, r, nil)
					} else {
						d, err = l.AllowOrdered(ctx, open, &r)
					}
					if err != nil {
						t.Fatalf("%s: %v", r.Key, err)
					}
					if !d.Allowed() {
						if int(d.Denied) != bucket {
							t.Fatalf("%s: %v, want denied by bucket %d", r.Key, d, bucket)
						}
						return admitted, d
					}
					admitted++
				}
				t.Fatalf("%s admitted more than its burst at one clock reading", r.Key)
				return
			}

			r := admit.Request{Key: fmt.Sprintf("%sstep:%d", p, bucket), Spec: spec}
			clock.Set(t, 24*time.Hour)
			drain(r)
			clock.Set(t, 0)
			if n, d := drain(r); n != 0 || d.RetryAfter != 3*time.Hour {
				t.Errorf("after a 24 h step back: admitted %d, then %v; want 0, then denied with RetryAfter exactly one full refill (3h)", n, d)
			}

			// Flapping: K back-and-forth cycles of delta. With the bound, each cycle
			// whose step back exceeds (burst-1) intervals admits one more burst on
			// the way forward; a smaller flap admits nothing extra.
			const cycles = 5
			for _, tc := range []struct {
				delta time.Duration
				want  int // admitted over the whole flapping, first reading included
			}{
				{24 * time.Hour, 3 + cycles*3}, // unbounded freeze: 3 + 3 (the first forward step only)
				{2 * time.Hour, 3 + 2},         // (burst-1) intervals: the same as an unbounded freeze
			} {
				clock.Set(t, 0)
				r := admit.Request{Key: fmt.Sprintf("%sflap:%d:%v", p, bucket, tc.delta), Spec: spec}
				total, _ := drain(r)
				for range cycles {
					clock.Set(t, tc.delta)
					n, _ := drain(r)
					total += n
					clock.Set(t, 0)
					n, _ = drain(r)
					total += n
				}
				if total != tc.want {
					t.Errorf("flapping by %v, %d cycles: admitted %d, want %d", tc.delta, cycles, total, tc.want)
				}
				t.Logf("flapping by %v, %d cycles, burst 3, interval 1h: %d admitted (%d over one burst)", tc.delta, cycles, total, total-3)
			}
			clock.Set(t, 0)
		})
	}
}

// keysState is every key's DUMP and PTTL, to compare byte for byte.
func keysState(t *testing.T, c valkey.Client, keys ...string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range keys {
		dump, err := c.Do(context.Background(), c.B().Dump().Key(k).Build()).ToString()
		if err != nil && !valkey.IsValkeyNil(err) {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		pttl, err := c.Do(context.Background(), c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		if pttl > 0 {
			pttl = 1 // present with an expiry; the exact ms left moves with time
		}
		b.WriteString(k + "=" + strings.ToValidUTF8(dump, "?") + " pttl=" + time.Duration(pttl).String() + "; ")
	}
	return b.String()
}

// leastPrivilege is docs/acl.md's least-privilege ACL for admit, without the
// key pattern.
const leastPrivilege = aclrules.LeastPrivilege

// TestIntegrationACL runs decisions as ACL users that lack one permission
// each: every call fails, names what is missing, is classed not executed,
// and leaves both buckets byte for byte as they were (no partial charge, no
// key without an expiry). The least-privilege user decides normally.
// (Before the fix, a user without HMGET got ErrWrongType on a key that did
// not exist, and a user without PEXPIRE charged the second bucket, left the
// first one alone, and left the second key with no expiry.)
func TestIntegrationACL(t *testing.T) {
	srv := testserver.Own(t)
	admin := testserver.NewClient(t, srv)
	ctx := context.Background()
	p := "rl:{acl}:"
	std, shared := admit.Request{Key: p + "std", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}, admit.Request{Key: p + "shared", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}

	client := func(name, rules string, selectors ...string) valkey.Client {
		t.Helper()
		args := append(append([]string{name, "reset", "on", ">pw"}, strings.Fields(rules)...), selectors...)
		if err := admin.Do(ctx, admin.B().AclSetuser().Username(args[0]).Rule(args[1:]...).Build()).Error(); err != nil {
			t.Fatalf("ACL SETUSER %s %s: %v", name, rules, err)
		}
		// Registered before the client's Close, so it runs after it: on a
		// shared server (VALKEY_ADDR with VALKEY_ALLOW_DESTRUCTIVE=1) no user stays.
		t.Cleanup(func() { admin.Do(context.Background(), admin.B().AclDeluser().Username(name).Build()) })
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: name, Password: "pw", DisableCache: true})
		if err != nil {
			t.Fatalf("connect as %s: %v", name, err)
		}
		t.Cleanup(c.Close)
		return c
	}
	user := func(name, rules string, selectors ...string) *admit.Limiter {
		t.Helper()
		return admit.New(client(name, rules, selectors...))
	}

	good := user("admit", leastPrivilege+" ~"+p+"*")
	drained := admit.Request{Key: p + "drained", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	if d, err := good.AllowOrdered(ctx, drained, nil); err != nil || !d.Allowed() {
		t.Fatalf("drain: %v, %v", d, err)
	}
	// Fresh buckets, then one call each so that both hold state to protect.
	if d, err := good.AllowOrdered(ctx, std, &shared); err != nil || !d.Allowed() {
		t.Fatalf("least-privilege user: %v, %v; want allowed", d, err)
	}

	// A denial writes one command only (PEXPIREAT GT), unchecked beforehand:
	// its refusal must still name the permission and change nothing.
	t.Run("no pexpireat, denial", func(t *testing.T) {
		l := user("no-pexpireat-denial", strings.Replace(leastPrivilege, "+pexpireat", "", 1)+" ~"+p+"*")
		before := keysState(t, admin, drained.Key)
		d, err := l.AllowOrdered(ctx, drained, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "PEXPIREAT") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming PEXPIREAT, not executed", d, err)
		}
		if after := keysState(t, admin, drained.Key); after != before {
			t.Errorf("the bucket changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	// A one-bucket admission's HSET is its first write, unchecked beforehand
	// and run under pcall: its refusal must name HSET and change nothing.
	t.Run("no hset, one bucket", func(t *testing.T) {
		l := user("no-hset-one", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*")
		before := keysState(t, admin, std.Key)
		d, err := l.AllowOrdered(ctx, std, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "HSET") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming HSET, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key); after != before {
			t.Errorf("the bucket changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	// HSET granted on one bucket only, by an ACL selector. An admission
	// writes bucket 1 first: HSET std runs under pcall, so where only
	// shared may be written the first write fails whole; where only std
	// may be written the first write would succeed and the third (HSET
	// shared) fail, so the precheck must cover every write after the first.
	t.Run("hset on the standard bucket only", func(t *testing.T) {
		l := user("hset-std-only", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*", "(+hset ~"+std.Key+")")
		before := keysState(t, admin, std.Key, shared.Key)
		d, err := l.AllowOrdered(ctx, std, &shared)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "HSET on bucket 2") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming HSET on bucket 2, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key, shared.Key); after != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	t.Run("hset on the shared bucket only", func(t *testing.T) {
		l := user("hset-shared-only", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*", "(+hset ~"+shared.Key+")")
		before := keysState(t, admin, std.Key, shared.Key)
		d, err := l.AllowOrdered(ctx, std, &shared)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "HSET on bucket 1") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming HSET on bucket 1, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key, shared.Key); after != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	// The script writes each bucket in lines of its own, so each bucket's
	// PEXPIREAT check is proven on its own: a one-bucket admission (bucket
	// 1's check alone stands between HSET and a key with no expiry), then
	// PEXPIREAT granted on bucket 1's key only, for an admission (bucket 2
	// STORE) and for a second-bucket denial (bucket 2 KEEP).
	t.Run("no pexpireat, one bucket", func(t *testing.T) {
		l := user("no-pexpireat-one", strings.Replace(leastPrivilege, "+pexpireat", "", 1)+" ~"+p+"*")
		before := keysState(t, admin, std.Key)
		d, err := l.AllowOrdered(ctx, std, nil)
		if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "PEXPIREAT on bucket 1") || d.Allowed() {
			t.Errorf("got %v, %v; want NOPERM naming PEXPIREAT on bucket 1, not executed", d, err)
		}
		if after := keysState(t, admin, std.Key); after != before {
			t.Errorf("the bucket changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	stdOnly := user("pexpireat-std-only", strings.Replace(leastPrivilege, "+pexpireat", "", 1)+" ~"+p+"*", "(+pexpireat ~"+std.Key+")")
	drained2 := admit.Request{Key: p + "drained2", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	if d, err := good.AllowOrdered(ctx, drained2, nil); err != nil || !d.Allowed() {
		t.Fatalf("drain: %v, %v", d, err)
	}
	for _, second := range []admit.Request{shared, drained2} {
		t.Run("pexpireat on the standard bucket only, second bucket "+strings.TrimPrefix(second.Key, p), func(t *testing.T) {
			before := keysState(t, admin, std.Key, second.Key)
			d, err := stdOnly.AllowOrdered(ctx, std, &second)
			if !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(fmt.Sprint(err), "PEXPIREAT on bucket 2") || d.Allowed() {
				t.Errorf("got %v, %v; want NOPERM naming PEXPIREAT on bucket 2, not executed", d, err)
			}
			if after := keysState(t, admin, std.Key, second.Key); after != before {
				t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	// Bucket 2's HSET is the first write only in a refund whose bucket 1
	// has no key (it is full already: nothing to write): the refusal of
	// that first write, run under pcall, must name HSET on bucket 2.
	t.Run("hset on the standard bucket only, refund of an absent first bucket", func(t *testing.T) {
		c := client("hset-std-only-refund", strings.Replace(leastPrivilege, "+hset", "", 1)+" ~"+p+"*", "(+hset ~"+p+"absent)")
		keys := []string{p + "absent", shared.Key}
		before := keysState(t, admin, keys...)
		err := valkey.NewLuaScript(shipped).Exec(ctx, c, keys, append(takeArgs(std.Spec, shared.Spec), modeRefund)).Error()
		if err == nil || !strings.Contains(err.Error(), "NOPERM admit: the ACL user may not run HSET on bucket 2") {
			t.Errorf("got %v; want NOPERM naming HSET on bucket 2", err)
		}
		if after := keysState(t, admin, keys...); after != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	for _, tc := range []struct {
		name, rules, want string
	}{
		{"no hmget", strings.Replace(leastPrivilege, "+hmget", "", 1) + " ~" + p + "*", "HMGET"},
		{"no hset", strings.Replace(leastPrivilege, "+hset", "", 1) + " ~" + p + "*", "HSET"},
		{"no pexpireat", strings.Replace(leastPrivilege, "+pexpireat", "", 1) + " ~" + p + "*", "PEXPIREAT"},
		{"no time", strings.Replace(leastPrivilege, "+time", "", 1) + " ~" + p + "*", "TIME"},
		{"no exists", strings.Replace(leastPrivilege, "+exists", "", 1) + " ~" + p + "*", "EXISTS"},
		{"shared bucket read-only", leastPrivilege + " ~" + p + "std %R~" + p + "shared", "NOPERM"}, // refused by EVAL itself, before the script runs
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := user(strings.ReplaceAll(tc.name, " ", "-"), tc.rules)
			keys := []string{std.Key, shared.Key}
			if tc.want == "EXISTS" {
				keys = []string{p + "fresh-std", p + "fresh-shared"} // EXISTS runs for a key with no bucket fields
			}
			first, second := admit.Request{Key: keys[0], Spec: std.Spec}, admit.Request{Key: keys[1], Spec: shared.Spec}
			before := keysState(t, admin, keys...)
			d, err := l.AllowOrdered(ctx, first, &second)
			if err == nil || !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || d.Allowed() {
				t.Fatalf("got %v, %v; want an error classed not executed", d, err)
			}
			if errors.Is(err, admit.ErrWrongType) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name the missing permission %q", err, tc.want)
			}
			if after := keysState(t, admin, keys...); after != before {
				t.Errorf("a refused call changed the buckets:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}
