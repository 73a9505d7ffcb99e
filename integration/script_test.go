package integration

import (
	"context"
	"github.com/admitkit/admit"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

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
