package admit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// TestServerClockFarFromHost: on a server whose clock is decades from the
// host's, before and after it, refill follows the server clock to the
// microsecond and the stored ts is in server µs. (admittest's
// host-clock-plays-no-part checks on a real server that no time goes on the
// wire.)
func TestServerClockFarFromHost(t *testing.T) {
	for _, epoch := range []time.Time{unitEpoch, time.Date(1999, 12, 31, 23, 59, 59, 999_999_000, time.UTC)} {
		e := newUnitEnv(t)
		e.now = epoch
		e.srv.SetTime(epoch)
		r := Request{Key: "clock", Spec: MustSpec(Every(time.Second), 2)}
		for i, st := range []struct {
			advance time.Duration
			want    Decision
		}{
			{0, Decision{Remaining: [2]int{1, -1}, decided: true}},
			{0, Decision{Remaining: [2]int{0, -1}, decided: true}},
			{0, Decision{Denied: 1, RetryAfter: time.Second, Remaining: [2]int{0, -1}, decided: true}},
			{999_999 * time.Microsecond, Decision{Denied: 1, RetryAfter: time.Microsecond, Remaining: [2]int{0, -1}, decided: true}},
			{time.Microsecond, Decision{Remaining: [2]int{0, -1}, decided: true}},
		} {
			e.advance(st.advance)
			if d := e.allow(t, r, nil); d != st.want {
				t.Errorf("server clock at %v, step %d: got %v, want %v", epoch, i, d, st.want)
			}
		}
		if tk, ts := e.state(r.Key); tk != "0" || ts != strconv.FormatInt(epoch.Add(time.Second).UnixMicro(), 10) {
			t.Errorf("server clock at %v: stored tokens %q ts %q, want 0 and %d (server µs)", epoch, tk, ts, epoch.Add(time.Second).UnixMicro())
		}
	}
}

// TestOnlyDeclaredKeys: after allowed and denied calls on both paths, the
// database holds exactly the keys the calls named. (admittest's
// only-declared-keys checks the same on a real server.)
func TestOnlyDeclaredKeys(t *testing.T) {
	e := newUnitEnv(t)
	a, b, c := Request{Key: "m:{x}:a", Spec: MustSpec(Every(time.Hour), 2)}, Request{Key: "m:{x}:b", Spec: MustSpec(Every(time.Hour), 1)}, Request{Key: "m:{x}:c", Spec: MustSpec(Every(time.Hour), 3)}
	for i, call := range []struct {
		first  Request
		second *Request
		want   uint8
	}{{a, &b, 0}, {a, &b, 2}, {a, &b, 1}, {c, nil, 0}, {b, nil, 1}, {c, &a, 2}} {
		if d, err := e.l.AllowOrdered(context.Background(), call.first, call.second); err != nil || d.Denied != call.want {
			t.Fatalf("call %d: %v, %v; want Denied %d", i, d, err, call.want)
		}
	}
	declared := map[string]bool{a.Key: true, b.Key: true, c.Key: true}
	keys := e.srv.Keys()
	for _, k := range keys {
		if !declared[k] {
			t.Errorf("the script wrote %q, a key it was not given", k)
		}
	}
	if len(keys) != len(declared) {
		t.Errorf("keys %v, want the %d declared", keys, len(declared))
	}
}

// takeArgs are the arguments AllowOrdered sends for specs, each at cost 1:
// 3 a bucket and no mode.
func takeArgs(specs ...Spec) []string {
	var args []string
	for _, s := range specs {
		args = append(args, s.intervalArg, s.burstArg, "1")
	}
	return args
}

// baselineArgs are the arguments the 0b7bc55 script took for specs: µs per
// token, burst and expiry in milliseconds, a bucket.
func baselineArgs(specs ...Spec) []string {
	var args []string
	for _, s := range specs {
		args = append(args, s.intervalArg, s.burstArg, strconv.FormatInt(s.TTL().Milliseconds(), 10))
	}
	return args
}

// argvCase is a direct call of the script, as any user allowed EVALSHA can
// make it, with arguments admit itself never sends.
type argvCase struct {
	name string
	keys []string // "b1", "b2", "rec": replaced by the run's key names
	args []string
}

// badArgv lists arguments the script must refuse before its first write.
// Before the fix, per 0 stored tokens "-nan" then failed, burst 2^63
// charged then failed, a negative per or burst deleted the bucket (full
// again), cost -5 minted tokens, cost 0.5 stored a fraction and a record
// window "abc" charged and then failed.
var badArgv = func() []argvCase {
	var cs []argvCase
	one := func(name string, per, burst, cost string) {
		cs = append(cs, argvCase{name, []string{"b1"}, []string{per, burst, cost}})
	}
	for _, per := range []string{"0", "-1", "1.5", "abc", "nan", "inf", "-inf", "0x10", " 5", "", "1e3", "9007199254740993"} {
		one("per "+per, per, "3", "1")
	}
	for _, burst := range []string{"0", "-3", "9223372036854775808", "2.5", "nan", "abc", ""} {
		one("burst "+burst, "1000000", burst, "1")
	}
	for _, cost := range []string{"-5", "0", "0.5", "4", "abc", "nan", ""} {
		one("cost "+cost, "1000000", "3", cost)
	}
	one("burst x per over 2^50", "1099511627776", "2048", "1")
	// The same numbers in the second bucket, the first one valid: the
	// script checks each bucket's numbers in its own lines.
	for _, c := range slices.Clone(cs) {
		cs = append(cs, argvCase{"second bucket, " + c.name, []string{"b1", "b2"}, append([]string{"1000000", "3", "1"}, c.args...)})
	}
	for _, w := range []string{"abc", "0", "-1", "1.5", "", "nan"} {
		cs = append(cs, argvCase{"record window " + w, []string{"b1", "rec"}, []string{"1000000", "3", "1", "o", w}})
	}
	cs = append(cs,
		argvCase{"take once without a record key", []string{"b1"}, []string{"1000000", "3", "1", "o", "120000"}},
		argvCase{"unknown mode", []string{"b1"}, []string{"1000000", "3", "1", "x"}},
		argvCase{"three buckets", []string{"b1", "b2", "rec"}, []string{"1000000", "3", "1", "1000000", "3", "1", "1000000", "3", "1"}},
		argvCase{"no bucket", []string{}, []string{}},
		argvCase{"two buckets, one key", []string{"b1"}, []string{"1000000", "3", "1", "1000000", "3", "1"}},
		argvCase{"one bucket, two keys", []string{"b1", "b2"}, []string{"1000000", "3", "1"}},
		argvCase{"second bucket bad cost", []string{"b1", "b2"}, []string{"1000000", "3", "1", "1000000", "3", "-1"}},
		argvCase{"refund bad cost", []string{"b1"}, []string{"1000000", "3", "-2", "r"}},
	)
	return cs
}()

// goodArgv is the control: the same shapes with valid arguments run.
var goodArgv = []argvCase{
	{"take", []string{"b1"}, []string{"1000000", "3", "1"}},
	{"take two", []string{"b1", "b2"}, []string{"1000000", "3", "1", "1000000", "3", "2"}},
	{"refund", []string{"b1"}, []string{"1000000", "3", "1", "r"}},
	{"once", []string{"b1", "rec"}, []string{"1000000", "3", "1", "o", "120000"}},
}

// checkArgv runs every bad case against the script on c, with the keys
// under prefix seeded as buckets, and requires an ADMITARGS error and no
// change to any key (snap: every key's value and expiry); then each good
// case must run.
func checkArgv(t *testing.T, c valkey.Client, prefix string, snap func() string) {
	t.Helper()
	ctx := context.Background()
	script := valkey.NewLuaScript(scriptSource)
	names := map[string]string{"b1": prefix + "{t}b1", "b2": prefix + "{t}b2", "rec": prefix + "{t}rec"}
	seed := func() {
		t.Helper()
		if err := c.Do(ctx, c.B().Del().Key(names["rec"]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{names["b1"], names["b2"]} {
			if err := c.Do(ctx, c.B().Hset().Key(k).FieldValue().FieldValue("tokens", "2").FieldValue("ts", "1").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, c.B().Pexpire().Key(k).Milliseconds(3_600_000).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	keysOf := func(ks []string) []string {
		out := make([]string, len(ks))
		for i, k := range ks {
			out[i] = names[k]
		}
		return out
	}
	for _, tc := range badArgv {
		seed()
		before := snap()
		err := script.Exec(ctx, c, keysOf(tc.keys), tc.args).Error()
		if err == nil || !strings.Contains(err.Error(), "ADMITARGS") {
			t.Errorf("%s (argv %q): %v; want an ADMITARGS error", tc.name, tc.args, err)
		}
		if after := snap(); after != before {
			t.Errorf("%s (argv %q) wrote:\nbefore %s\nafter  %s", tc.name, tc.args, before, after)
		}
	}
	for _, tc := range goodArgv {
		seed()
		if err := script.Exec(ctx, c, keysOf(tc.keys), tc.args).Error(); err != nil {
			t.Errorf("control %s (argv %q): %v", tc.name, tc.args, err)
		}
	}
}

// TestScriptRefusesBadArgv: on miniredis (the embedded server users test
// with); TestIntegrationScriptRefusesBadArgv runs the same on a real server.
func TestScriptRefusesBadArgv(t *testing.T) {
	e := newUnitEnv(t)
	checkArgv(t, e.c, "argv:", e.snapshot)
}

// replyText is the script's reply as the string it stands for: an
// admission's integer (decode) written out as "0 0 rem1 rem2" for a call on
// buckets buckets, unpacked here rather than by decode so that the tests
// check the packing on their own; integer says the reply was one.
func replyText(resp valkey.ValkeyResult, buckets int) (text string, integer bool, err error) {
	if m, err := resp.ToMessage(); err == nil && m.IsInt64() {
		v, _ := m.ToInt64()
		if buckets == 2 {
			return fmt.Sprintf("0 0 %d %d", v>>26, v&(1<<26-1)), true, nil
		}
		return fmt.Sprintf("0 0 %d -1", v), true, nil
	}
	text, err = resp.ToString()
	return text, false, err
}
