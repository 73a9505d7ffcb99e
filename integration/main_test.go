package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestMain stops the shared test server after the last test.
func TestMain(m *testing.M) { testserver.Main(m) }

// shipped is script.lua, the script admit.New runs, as tests that send it
// themselves (EVALSHA, EVAL) read it. The mutant runner (TestMutants in the
// root package) builds these tests with a mutated script in script.lua's
// place (go test -overlay) and names that file in ADMIT_TEST_SCRIPT, so
// that these tests send the mutant too.
var shipped = func() string {
	if path := os.Getenv("ADMIT_TEST_SCRIPT"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		return string(b)
	}
	return readRepoFile("script.lua")
}()

// readRepoFile reads a file of the repository, by its path from the root.
func readRepoFile(path string) string {
	b, err := os.ReadFile("../" + path)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// withoutACLPrecheck is src with its ACL precheck turned off, as
// admit.WithoutACLPrecheck runs it (TestWithoutACLPrecheckSource pins the
// line in the package).
func withoutACLPrecheck(src string) string {
	return strings.Replace(src, "local acl = redis.acl_check_cmd --@acl", "local acl = nil --@acl", 1)
}

// errclassSpec is the Spec of the error-class tests.
var errclassSpec = admit.MustSpec(admit.Every(time.Hour), 5)

// keyspace is the preamble of a test on the shared server: a client to it and
// a key prefix of the test's own, whose keys are deleted when it ends.
func keyspace(t *testing.T) (valkey.Client, string) {
	t.Helper()
	c := testserver.NewClient(t, testserver.Shared(t))
	return c, testserver.Prefix(t, c)
}

// takeArgs are the arguments AllowOrdered sends for specs, each at cost 1:
// 3 a bucket and no mode.
func takeArgs(specs ...admit.Spec) []string {
	var args []string
	for _, s := range specs {
		per, burst := specArgs(s)
		args = append(args, per, burst, "1")
	}
	return args
}

// specArgs are the arguments the script takes for a Spec: microseconds
// per token, and burst.
func specArgs(s admit.Spec) (per, burst string) {
	return strconv.FormatInt(s.Interval().Microseconds(), 10), strconv.Itoa(s.Burst())
}

// costArg is the argument the script takes for a Request's Cost, 0
// meaning 1.
func costArg(cost int) string { return strconv.Itoa(max(cost, 1)) }

// The script's modes, sent after the buckets' arguments; a take sends
// none.
const (
	modeAll    = "a"
	modePeek   = "p"
	modeRefund = "r"
	modeOnce   = "o"
)

// onceWindowArg is admit.OnceWindow as the script takes it, in
// milliseconds.
var onceWindowArg = strconv.FormatInt(admit.OnceWindow.Milliseconds(), 10)

// argvCase is a direct call of the script, as any user allowed EVALSHA can
// make it, with arguments admit itself never sends.
type argvCase struct {
	name string
	keys []string // "b1", "b2", "rec": replaced by the run's key names
	args []string
}

// badArgv lists arguments the script must refuse before its first write:
// unchecked, per 0 would store tokens "-nan" then fail, burst 2^63 charge
// then fail, a negative per or burst delete the bucket (full again), cost
// -5 mint tokens, cost 0.5 store a fraction and a record window "abc"
// charge and then fail.
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
	script := valkey.NewLuaScript(shipped)
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

// replyOf is the script's reply as the string it stands for (replyText).
func replyOf(resp valkey.ValkeyResult, buckets int) (string, error) {
	text, _, err := replyText(resp, buckets)
	return text, err
}
