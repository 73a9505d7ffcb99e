package admit

import (
	"context"
	_ "embed"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// baselineScript is script.lua as of commit 0b7bc55, before the trust
// issue's checks: the baseline the server-side cost is compared with.
//
//go:embed testdata/script_0b7bc55.lua
var baselineScript string

// BenchmarkScriptServerCost puts the shipped script side by side with the
// baseline, and with the shipped script minus its ACL pre-check, on every
// path, on one server the benchmark owns: server-µs/op is the script's own
// time from INFO commandstats (usec of EVALSHA over its calls, the
// commands it runs included), so network and client time do not blur it.
// Each script gets the arguments of its own version, sent with
// valkey.Lua.Exec; the client's allocations are BenchmarkAllowOrdered's.
//
//	go test -run '^$' -bench ScriptServerCost -count 6 .
func BenchmarkScriptServerCost(b *testing.B) {
	srv := testserver.Own(b)
	c := testserver.NewClient(b, srv)
	ctx := context.Background()
	open := MustSpec(MaxLimit, 1<<30) // never runs dry within a benchmark
	shut := MustSpec(Every(time.Hour), 1)
	// The baseline takes 3 arguments a bucket and no mode; the current
	// script a mode, then 4 arguments a bucket (cost last).
	baselineArgs := func(specs ...Spec) (args []string) {
		for _, s := range specs {
			args = append(args, s.intervalArg, s.burstArg, s.ttlArg)
		}
		return args
	}
	currentArgs := func(specs ...Spec) []string {
		args := []string{modeTake}
		for _, s := range specs {
			args = append(args, s.intervalArg, s.burstArg, s.ttlArg, "1")
		}
		return args
	}
	scripts := []struct {
		name, src string
		args      func(...Spec) []string
	}{
		{"baseline-0b7bc55", baselineScript, baselineArgs},
		{"current", scriptSource, currentArgs},
		{"current-without-acl-check", strings.Replace(scriptSource, "if mode ~= 'p' and redis.acl_check_cmd then", "if false then", 1), currentArgs},
	}
	if scripts[2].src == scriptSource {
		b.Fatal("the ACL pre-check is not where the benchmark expects it")
	}
	paths := []struct {
		name   string
		first  Spec
		second *Spec
		want   uint8
	}{
		{"one-bucket-allowed", open, nil, 0},
		{"one-bucket-denied", shut, nil, 1},
		{"allowed", open, &open, 0},
		{"denied-by-first", shut, &open, 1},
		{"denied-by-second", open, &shut, 2},
	}
	for _, p := range paths {
		for _, s := range scripts {
			b.Run("path="+p.name+"/script="+s.name, func(b *testing.B) {
				script := valkey.NewLuaScript(s.src)
				key := testserver.Prefix(b, c)
				keys, args := []string{key + "first"}, s.args(p.first)
				if p.second != nil {
					keys, args = append(keys, key+"second"), s.args(p.first, *p.second)
				}
				// Drain the shut buckets and load the script before timing.
				for range 2 {
					if err := script.Exec(ctx, c, keys, args).Error(); err != nil {
						b.Fatal(err)
					}
				}
				if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for b.Loop() {
					reply := script.Exec(ctx, c, keys, args)
					var denied int64
					if arr, err := reply.ToArray(); err == nil { // the baseline's {denied, retry}
						denied, err = arr[0].AsInt64()
						if err != nil {
							b.Fatal(err)
						}
					} else if str, err := reply.ToString(); err == nil { // "denied retry rem1 rem2"
						denied = int64(str[0] - '0')
					} else {
						b.Fatal(err)
					}
					if denied != int64(p.want) {
						b.Fatalf("denied %d, want %d", denied, p.want)
					}
				}
				b.StopTimer()
				st := testserver.CommandStats(b, c)["evalsha"]
				if st.Calls > 0 {
					b.ReportMetric(float64(st.Usec)/float64(st.Calls), "server-µs/op")
				}
			})
		}
	}
}
