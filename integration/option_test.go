package integration

import (
	"context"
	"errors"
	"fmt"
	"github.com/admitkit/admit"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationWithoutACLPrecheckSameAsShipped: for a user that may run
// every command (the default user), WithoutACLPrecheck's script decides and
// writes exactly what the shipped script does. A seeded random sequence of
// takes of one and two buckets, refunds, takes once (ids reused, for
// replays and refusals) and peeks, on three bucket keys whose Specs change
// now and then, with a clock that moves forward and now and then back, and
// a bucket now and then corrupted, deleted or given a foreign field: each
// call runs the shipped script, then, from the same state restored byte for
// byte, the variant, with the same clock, and the two must give the same
// reply or error, byte for byte, and leave the same state (every key's DUMP
// and absolute expiry). Both scripts read the clock from a hash the test
// sets (HMGET, in place of TIME, the one change made to either), a day
// ahead of the server's, so that every expiry written lies in the future.
func TestIntegrationWithoutACLPrecheckSameAsShipped(t *testing.T) {
	admin, p := keyspace(t)
	ctx := context.Background()
	clockKey := p + "clock"
	fixed := func(src string) *valkey.Lua {
		t.Helper()
		// Every read of TIME (a decision's, and a lease call's alone) is
		// redis.pcall('TIME'), all replaced.
		if strings.Count(src, "redis.pcall('TIME')") == 0 || strings.Contains(src, "redis.call('TIME')") {
			t.Fatal("the script reads TIME other than with redis.pcall('TIME')")
		}
		return valkey.NewLuaScript(strings.ReplaceAll(src, "redis.pcall('TIME')", "redis.pcall('HMGET', '"+clockKey+"', 's', 'us')"))
	}
	shipped, variant := fixed(shipped), fixed(withoutACLPrecheck(shipped))

	tm, err := admin.Do(ctx, admin.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sec, err := strconv.ParseInt(tm[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	now := (sec + 86400) * 1_000_000 // µs, a day ahead

	buckets := []string{p + "k0", p + "k1", p + "k2"}
	records := []string{p + "r0", p + "r1"}
	all := append(slices.Clone(buckets), records...)
	window, err := strconv.ParseInt(onceWindowArg, 10, 64)
	if err != nil {
		t.Fatal(err)
	}

	do := func(cmd valkey.Completed) valkey.ValkeyResult {
		t.Helper()
		r := admin.Do(ctx, cmd)
		if err := r.Error(); err != nil && !valkey.IsValkeyNil(err) {
			t.Fatalf("%q: %v", cmd.Commands(), err)
		}
		return r
	}
	type keyState struct {
		dump string // "" when absent
		at   int64  // PEXPIRETIME: -1 no expiry, -2 absent
	}
	state := func() map[string]keyState {
		t.Helper()
		s := map[string]keyState{}
		for _, k := range all {
			dump, _ := do(admin.B().Dump().Key(k).Build()).ToString()
			at, err := do(admin.B().Arbitrary("PEXPIRETIME").Keys(k).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			s[k] = keyState{dump, at}
		}
		return s
	}
	restore := func(s map[string]keyState) {
		t.Helper()
		for k, ks := range s {
			if ks.dump == "" {
				do(admin.B().Del().Key(k).Build())
				continue
			}
			do(admin.B().Arbitrary("RESTORE").Keys(k).Args(strconv.FormatInt(max(ks.at, 0), 10), ks.dump, "REPLACE", "ABSTTL").Build())
		}
	}
	// show is a state as text: each key's DUMP and absolute expiry; a
	// record rewritten by the call (SET PX, relative to the server's own
	// clock, which moves between the two calls) shows its window instead.
	show := func(before, after map[string]keyState) string {
		t.Helper()
		var b strings.Builder
		for _, k := range all {
			ks, at := after[k], strconv.FormatInt(after[k].at, 10)
			if slices.Contains(records, k) && ks.at > 0 && ks.at != before[k].at {
				ms, err := do(admin.B().Pttl().Key(k).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				at = fmt.Sprintf("rewritten, PTTL %d ms", ms)
				if ms > window-60_000 && ms <= window {
					at = "rewritten with the window"
				}
			}
			fmt.Fprintf(&b, "%s %q expiry %s; ", strings.TrimPrefix(k, p), ks.dump, at)
		}
		return b.String()
	}
	call := func(script *valkey.Lua, keys, args []string) string {
		reply, _, err := replyText(script.Exec(ctx, admin, keys, args), len(args)/3)
		if err != nil {
			return "error: " + err.Error()
		}
		return reply
	}

	specs := []admit.Spec{
		admit.MustSpec(admit.Every(time.Millisecond), 3),
		admit.MustSpec(admit.Every(250*time.Millisecond), 20),
		admit.MustSpec(admit.Every(time.Second), 5),
		admit.MustSpec(admit.Every(time.Hour), 2),
	}
	rng := rand.New(rand.NewPCG(22, 75))
	keySpec := map[string]admit.Spec{}
	for _, k := range buckets {
		keySpec[k] = specs[rng.IntN(len(specs))]
	}
	const steps = 600
	lastOnce := map[string][2][]string{} // a record's last call: keys, args
	outcomes := map[string]int{}
	differ := 0
	for i := range steps {
		// Now and then a bucket is changed behind admit's back (an HSET
		// on a key that holds a string fails, and changes nothing).
		switch k := buckets[rng.IntN(3)]; rng.IntN(80) {
		case 0, 5, 6, 7, 8, 9, 10, 11:
			do(admin.B().Del().Key(k).Build())
		case 1:
			admin.Do(ctx, admin.B().Hset().Key(k).FieldValue().FieldValue("name", "alice").Build())
		case 2:
			admin.Do(ctx, admin.B().Hset().Key(k).FieldValue().FieldValue("tokens", "abc").Build())
		case 3: // refill credited up to an hour ahead: a clock stepped back
			admin.Do(ctx, admin.B().Hset().Key(k).FieldValue().FieldValue("ts", strconv.FormatInt(now+3_600_000_000, 10)).Build())
		case 4:
			do(admin.B().Set().Key(k).Value("x").Build())
		}
		switch rng.IntN(20) {
		case 0: // a step back
			now -= int64(rng.IntN(2_000_000))
		case 1: // up to an hour
			now += int64(rng.IntN(3_600_000_000))
		case 3, 4, 5, 6:
			now += int64(rng.IntN(1_000_000))
		case 7, 8, 9:
			now += int64(rng.IntN(1000))
		default: // the clock stands still
		}
		do(admin.B().Hset().Key(clockKey).FieldValue().
			FieldValue("s", strconv.FormatInt(now/1_000_000, 10)).FieldValue("us", strconv.FormatInt(now%1_000_000, 10)).Build())

		n := 1 + rng.IntN(2)
		perm := rng.Perm(3)
		keys := []string{buckets[perm[0]], buckets[perm[1]]}[:n]
		var args []string
		for _, k := range keys {
			if rng.IntN(25) == 0 {
				keySpec[k] = specs[rng.IntN(len(specs))]
			}
			s, cost := keySpec[k], 1
			if rng.IntN(3) == 0 {
				cost = 1 + rng.IntN(s.Burst())
			}
			per, burst := specArgs(s)
			args = append(args, per, burst, costArg(cost))
		}
		kind := ""
		switch r := rng.IntN(20); {
		case r < 10: // take: no mode
		case r < 13:
			args, kind = append(args, modeRefund), "refund "
		case r < 18:
			// A record's id is used again with the same request (a
			// replay, when the first call was recorded), with another
			// (refused), or dropped first (decided afresh).
			rk := records[rng.IntN(2)]
			switch rng.IntN(4) {
			case 0, 1:
				if last, ok := lastOnce[rk]; ok {
					keys, args = slices.Clone(last[0]), slices.Clone(last[1])
					break
				}
				keys, args = append(keys, rk), append(args, modeOnce, onceWindowArg)
			case 2:
				keys, args = append(keys, rk), append(args, modeOnce, onceWindowArg)
			case 3:
				do(admin.B().Del().Key(rk).Build())
				keys, args = append(keys, rk), append(args, modeOnce, onceWindowArg)
			}
			lastOnce[rk] = [2][]string{keys, args}
			n, kind = len(keys)-1, "once "
		default:
			args, kind = append(args, modePeek), "peek "
		}

		before := state()
		want := call(shipped, keys, args)
		wantState := state()
		restore(before)
		got := call(variant, keys, args)
		gotState := state()
		if ws, gs := show(before, wantState), show(before, gotState); got != want || gs != ws {
			differ++
			if differ <= 10 {
				t.Errorf("call %d: keys %q, args %q:\nshipped %s | %s\nvariant %s | %s", i, keys, args, want, ws, got, gs)
			}
		}
		outcome := want
		switch {
		case strings.HasPrefix(want, "error: "):
			outcome, _, _ = strings.Cut(strings.TrimPrefix(want, "error: "), " ")
		case strings.HasPrefix(want, "R "):
			outcome = "replay"
		default:
			outcome, _, _ = strings.Cut(want, " ")
			outcome = map[string]string{"0": "admitted", "1": "denied by 1", "2": "denied by 2"}[outcome]
			if kind == "refund " {
				outcome = "refunded"
			}
		}
		outcomes[kind+strconv.Itoa(n)+" "+outcome]++
	}
	if differ > 0 {
		t.Errorf("%d of %d calls differ", differ, steps)
	}
	// The sequence must reach every path the precheck guards.
	for _, o := range []string{"1 admitted", "2 admitted", "1 denied by 1", "2 denied by 2",
		"refund 1 refunded", "refund 2 refunded", "once 1 admitted", "once 2 admitted", "once 1 replay", "once 2 denied by 2"} {
		if outcomes[o] == 0 {
			t.Errorf("no call of outcome %q in %d: %v", o, steps, outcomes)
		}
	}
	t.Logf("%d calls, the shipped script's outcomes: %v", steps, outcomes)
}

// TestIntegrationWithoutACLPrecheckRisk documents, on a real server, what
// WithoutACLPrecheck gives up. For a user refused a write after the call's
// first one, the shipped script refuses the call with NOPERM before it
// writes anything (TestIntegrationACL covers every such write), while the
// variant runs the first write, then fails on the refused one: the error
// is classed outcome unknown and the first write stays. Each case states
// the exact state the variant leaves. A user refused the first write still
// gets NOPERM and no change, option or not.
func TestIntegrationWithoutACLPrecheckRisk(t *testing.T) {
	srv := testserver.Own(t)
	admin := testserver.NewClient(t, srv)
	ctx := context.Background()
	user := func(t *testing.T, name string, rules ...string) valkey.Client {
		t.Helper()
		args := append([]string{"SETUSER", name, "reset", "on", "nopass"}, rules...)
		if err := admin.Do(ctx, admin.B().Arbitrary("ACL").Args(args...).Build()).Error(); err != nil {
			t.Fatalf("ACL %q: %v", args, err)
		}
		t.Cleanup(func() { admin.Do(context.Background(), admin.B().AclDeluser().Username(name).Build()) })
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: name, Password: "x",
			TLSConfig: srv.TLS, DisableCache: true})
		if err != nil {
			t.Fatalf("connect as %s: %v", name, err)
		}
		t.Cleanup(c.Close)
		return c
	}
	serverNow := func(t *testing.T) int64 {
		t.Helper()
		tm, err := admin.Do(ctx, admin.B().Time().Build()).AsStrSlice()
		if err != nil || len(tm) != 2 {
			t.Fatalf("TIME: %q, %v", tm, err)
		}
		s, err1 := strconv.ParseInt(tm[0], 10, 64)
		us, err2 := strconv.ParseInt(tm[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("TIME: %q", tm)
		}
		return s*1_000_000 + us
	}
	// charged checks that key holds exactly {tokens, ts} with ts in
	// [from, to], the server's times around the call that wrote it, and an
	// expiry as wanted: ttl < 0 none, else a PTTL in (0, ttl + 1 ms] (the
	// expiry is rounded up to the next ms).
	charged := func(t *testing.T, key, tokens string, from, to int64, ttl time.Duration) {
		t.Helper()
		m, err := admin.Do(ctx, admin.B().Hgetall().Key(key).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		ts, err := strconv.ParseInt(m["ts"], 10, 64)
		if len(m) != 2 || m["tokens"] != tokens || err != nil || ts < from || ts > to {
			t.Errorf("%s holds %q; want exactly tokens %s and ts in [%d, %d]", key, m, tokens, from, to)
		}
		pttl, err := admin.Do(ctx, admin.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ttl < 0 && pttl != -1:
			t.Errorf("%s has PTTL %d ms; want -1, no expiry", key, pttl)
		case ttl >= 0 && (pttl <= 0 || pttl > ttl.Milliseconds()+1):
			t.Errorf("%s has PTTL %d ms; want (0, %d]", key, pttl, ttl.Milliseconds()+1)
		}
	}
	absent := func(t *testing.T, keys ...string) {
		t.Helper()
		n, err := admin.Do(ctx, admin.B().Exists().Key(keys...).Build()).AsInt64()
		if err != nil || n != 0 {
			t.Errorf("%d of %q exist (%v); want none", n, keys, err)
		}
	}
	refused := func(t *testing.T, d admit.Decision, err error, want string) {
		t.Helper()
		if d != (admit.Decision{}) || !errors.Is(err, admit.ErrNotExecuted) || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, %v; want the zero Decision and an error classed not executed, naming %q", d, err, want)
		}
	}
	// unknown checks for an error classed outcome unknown: admit's, naming
	// want, or with want "" the server's own failure of the script.
	unknown := func(t *testing.T, d admit.Decision, err error, want string) {
		t.Helper()
		ok := d == (admit.Decision{}) && errors.Is(err, admit.ErrOutcomeUnknown) && !errors.Is(err, admit.ErrNotExecuted)
		if want == "" {
			ok = ok && strings.Contains(err.Error(), "admit: outcome unknown: the server failed the script") && !strings.Contains(err.Error(), "NOPERM")
		} else {
			ok = ok && strings.Contains(err.Error(), want) && strings.Contains(err.Error(), "after bucket 1 was written, which stays")
		}
		if !ok {
			t.Errorf("got %v, %v; want the zero Decision and an error classed outcome unknown, naming %q", d, err, want)
		}
	}
	// precheckThenNot runs AllowOrdered as c with the precheck, which must
	// refuse with NOPERM naming want and write nothing, then
	// WithoutACLPrecheck, and returns the server's times around that call
	// and its Decision and error.
	precheckThenNot := func(t *testing.T, c valkey.Client, a admit.Request, b *admit.Request, want string) (from, to int64, d admit.Decision, err error) {
		t.Helper()
		d, err = admit.New(c).AllowOrdered(ctx, a, b)
		refused(t, d, err, want)
		if b != nil {
			absent(t, a.Key, b.Key)
		} else {
			absent(t, a.Key)
		}
		from = serverNow(t)
		d, err = admit.New(c, admit.WithoutACLPrecheck()).AllowOrdered(ctx, a, b)
		return from, serverNow(t), d, err
	}
	// The script's ADMITPARTIAL: a write on bucket 2's key refused after
	// bucket 1's.
	const bucket2 = "admit: outcome unknown: the server refused"
	spec := admit.MustSpec(admit.Every(time.Second), 5)

	t.Run("no pexpireat, one bucket", func(t *testing.T) {
		c := user(t, "no-pexpireat", "+@all", "-pexpireat", "~*")
		a := admit.Request{Key: "{np}a", Spec: spec}
		from, to, d, err := precheckThenNot(t, c, a, nil, "NOPERM admit: the ACL user may not run PEXPIREAT on bucket 1's key")
		unknown(t, d, err, "")
		charged(t, a.Key, "4", from, to, -1) // charged, and never expires
		t.Logf("the server's error: %v", err)
	})
	t.Run("pexpireat on bucket 1's key only, two buckets", func(t *testing.T) {
		c := user(t, "pexpireat-a-only", "+@all", "-pexpireat", "~*", "(+pexpireat ~{sel}a)")
		a, b := admit.Request{Key: "{sel}a", Spec: spec}, admit.Request{Key: "{sel}b", Spec: spec}
		from, to, d, err := precheckThenNot(t, c, a, &b, "NOPERM admit: the ACL user may not run PEXPIREAT on bucket 2's key")
		unknown(t, d, err, "")
		charged(t, a.Key, "4", from, to, spec.TTL())
		charged(t, b.Key, "4", from, to, -1)
	})
	t.Run("hset on bucket 1's key only, two buckets", func(t *testing.T) {
		c := user(t, "hset-a-only", "+@all", "-hset", "~*", "(+hset ~{selh}a)")
		a, b := admit.Request{Key: "{selh}a", Spec: spec}, admit.Request{Key: "{selh}b", Spec: spec}
		from, to, d, err := precheckThenNot(t, c, a, &b, "NOPERM admit: the ACL user may not run HSET on bucket 2's key")
		unknown(t, d, err, bucket2)
		charged(t, a.Key, "4", from, to, spec.TTL())
		absent(t, b.Key)
	})
	// A second-bucket denial charges bucket 1, then lengthens bucket 2's
	// expiry (PEXPIREAT GT, under pcall): refused, that is the script's
	// NOPERM, but after bucket 1's write, so outcome unknown.
	t.Run("pexpireat on bucket 1's key only, second-bucket denial", func(t *testing.T) {
		c := user(t, "pexpireat-c-only", "+@all", "-pexpireat", "~*", "(+pexpireat ~{seld}a)")
		a, b := admit.Request{Key: "{seld}a", Spec: spec}, admit.Request{Key: "{seld}b", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
		if d, err := admit.New(admin).AllowOrdered(ctx, b, nil); err != nil || !d.Allowed() {
			t.Fatalf("drain %s: %v, %v", b.Key, d, err)
		}
		drained := keysState(t, admin, b.Key)
		d, err := admit.New(c).AllowOrdered(ctx, a, &b)
		refused(t, d, err, "NOPERM admit: the ACL user may not run PEXPIREAT on bucket 2's key")
		absent(t, a.Key)
		if got := keysState(t, admin, b.Key); got != drained {
			t.Errorf("bucket 2 changed:\nbefore %s\nafter  %s", drained, got)
		}

		from := serverNow(t)
		d, err = admit.New(c, admit.WithoutACLPrecheck()).AllowOrdered(ctx, a, &b)
		to := serverNow(t)
		unknown(t, d, err, bucket2)
		charged(t, a.Key, "4", from, to, spec.TTL())
		if got := keysState(t, admin, b.Key); got != drained {
			t.Errorf("bucket 2 changed:\nbefore %s\nafter  %s", drained, got)
		}
	})
	// A refund of two buckets writes bucket 1 first, then bucket 2 (HSET,
	// under pcall): refused, bucket 1's refund stays.
	t.Run("hset on bucket 1's key only, refund", func(t *testing.T) {
		c := user(t, "hset-r-only", "+@all", "-hset", "~*", "(+hset ~{selr}a)")
		a, b := admit.Request{Key: "{selr}a", Spec: spec}, admit.Request{Key: "{selr}b", Spec: spec}
		from := serverNow(t)
		for range 2 {
			if d, err := admit.New(admin).AllowOrdered(ctx, a, &b); err != nil || !d.Allowed() {
				t.Fatalf("charge: %v, %v", d, err)
			}
		}
		to := serverNow(t)
		before := keysState(t, admin, a.Key, b.Key)
		err := admit.New(c).Refund(ctx, a, &b)
		refused(t, admit.Decision{}, err, "NOPERM admit: the ACL user may not run HSET on bucket 2's key")
		if got := keysState(t, admin, a.Key, b.Key); got != before {
			t.Errorf("the buckets changed:\nbefore %s\nafter  %s", before, got)
		}

		err = admit.New(c, admit.WithoutACLPrecheck()).Refund(ctx, a, &b)
		unknown(t, admit.Decision{}, err, bucket2)
		charged(t, a.Key, "4", from, to, spec.TTL()) // refunded: 3 + 1
		charged(t, b.Key, "3", from, to, spec.TTL()) // as charged
	})
	t.Run("no set, once", func(t *testing.T) {
		c := user(t, "no-set", "+@all", "-set", "~*")
		a := admit.Request{Key: "{ns}a", Spec: spec}
		rec, err := admit.OnceRecordKey(a.Key, "job-1")
		if err != nil {
			t.Fatal(err)
		}
		d, err := admit.New(c).AllowOrderedOnce(ctx, "job-1", a, nil)
		refused(t, d, err, "NOPERM admit: the ACL user may not run SET")
		absent(t, a.Key, rec)

		// Each retry of the same id charges the bucket again: no record.
		// (Within a second no token comes back, so ts stays the first
		// call's.)
		l := admit.New(c, admit.WithoutACLPrecheck())
		from := serverNow(t)
		for _, tokens := range []string{"4", "3"} {
			d, err = l.AllowOrderedOnce(ctx, "job-1", a, nil)
			to := serverNow(t)
			unknown(t, d, err, "")
			charged(t, a.Key, tokens, from, to, spec.TTL())
			absent(t, rec)
		}
	})
	// The first write runs under pcall either way: its refusal is NOPERM,
	// not executed, with nothing written, option or not.
	t.Run("no hset, one bucket", func(t *testing.T) {
		c := user(t, "no-hset", "+@all", "-hset", "~*")
		a := admit.Request{Key: "{nh}a", Spec: spec}
		for _, l := range []*admit.Limiter{admit.New(c), admit.New(c, admit.WithoutACLPrecheck())} {
			d, err := l.AllowOrdered(ctx, a, nil)
			refused(t, d, err, "NOPERM admit: the ACL user may not run HSET on bucket 1's key")
			absent(t, a.Key)
		}
	})
}
