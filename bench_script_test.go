package admit

import (
	"context"
	_ "embed"
	"errors"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/mutate"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// baselineScript is script.lua as of commit 0b7bc55, before the trust
// issue's checks: the baseline the server-side cost is compared with.
//
//go:embed testdata/script_0b7bc55.lua
var baselineScript string

// previousScript is script.lua as of 5550b58, the release before issue
// 17's argument checks and once-record changes: it takes the same
// arguments as the shipped script on a take.
//
//go:embed testdata/script_5550b58.lua
var previousScript string

// scriptPath is one path through the script: the Specs of its buckets
// and the Decision.Denied it must give.
type scriptPath struct {
	name   string
	first  Spec
	second *Spec
	want   uint8
}

// scriptPaths are the five paths the script-cost benchmarks measure, with
// a bucket that never runs dry and one that denies once drained.
func scriptPaths() []scriptPath {
	open := MustSpec(MaxLimit, 1_000_000) // never runs dry within a benchmark; below 2^26, as decode packs
	shut := MustSpec(Every(time.Hour), 1)
	return []scriptPath{
		{"one-bucket-allowed", open, nil, 0},
		{"one-bucket-denied", shut, nil, 1},
		{"allowed", open, &open, 0},
		{"denied-by-first", shut, &open, 1},
		{"denied-by-second", open, &shut, 2},
	}
}

// BenchmarkScriptServerCost puts the shipped script side by side with the
// baseline, and with the shipped script minus its ACL pre-check, on every
// path. Each script runs on a server of its own, and every iteration calls
// all three in turn, so that whatever else the machine does weighs on all
// alike; server-µs/op is each script's own time from INFO commandstats
// (usec of EVALSHA over its calls, the commands it runs included), so
// network and client time do not blur it. Each script gets the arguments of
// its own version, sent with valkey.Lua.Exec; the client's allocations are
// BenchmarkAllowOrdered's.
//
//	go test -run '^$' -bench ScriptServerCost -count 6 .
func BenchmarkScriptServerCost(b *testing.B) {
	ctx := context.Background()
	// The baseline takes 3 arguments a bucket (the third the expiry); the
	// current script 3 a bucket too (the third the cost), and no mode for
	// a take.
	noACL, err := mutate.Apply(scriptSource, "--", mutate.Edit{At: "acl", Old: "redis.acl_check_cmd", New: "false"})
	if err != nil {
		b.Fatalf("the ACL pre-check is not where the benchmark expects it: %v", err)
	}
	type variant struct {
		name, src string
		args      func(...Spec) []string
		c         valkey.Client
	}
	variants := []*variant{
		{name: "baseline-0b7bc55", src: baselineScript, args: baselineArgs},
		{name: "current", src: scriptSource, args: takeArgs},
		{name: "current-without-acl-check", src: noACL, args: takeArgs},
	}
	for _, v := range variants {
		v.c = testserver.NewClient(b, testserver.Own(b))
	}
	for _, p := range scriptPaths() {
		b.Run("path="+p.name, func(b *testing.B) {
			type run struct {
				script     *valkey.Lua
				keys, args []string
			}
			runs := make([]run, len(variants))
			for i, v := range variants {
				key := testserver.Prefix(b, v.c)
				runs[i] = run{valkey.NewLuaScript(v.src), []string{key + "first"}, v.args(p.first)}
				if p.second != nil {
					runs[i].keys, runs[i].args = append(runs[i].keys, key+"second"), v.args(p.first, *p.second)
				}
				// Drain the shut buckets and load the script before timing.
				for range 2 {
					if err := runs[i].script.Exec(ctx, v.c, runs[i].keys, runs[i].args).Error(); err != nil {
						b.Fatal(err)
					}
				}
				if err := v.c.Do(ctx, v.c.B().ConfigResetstat().Build()).Error(); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				for i, v := range variants {
					reply := runs[i].script.Exec(ctx, v.c, runs[i].keys, runs[i].args)
					var denied int64
					if arr, err := reply.ToArray(); err == nil { // the baseline's {denied, retry}
						if denied, err = arr[0].AsInt64(); err != nil {
							b.Fatal(err)
						}
					} else if denied, err = replyDenied(reply); err != nil {
						b.Fatal(err)
					}
					if denied != int64(p.want) {
						b.Fatalf("%s: denied %d, want %d", v.name, denied, p.want)
					}
				}
			}
			b.StopTimer()
			usec := make([]float64, len(variants))
			for i, v := range variants {
				st := testserver.CommandStats(b, v.c)["evalsha"]
				if st.Calls == 0 {
					b.Fatalf("%s: no EVALSHA counted", v.name)
				}
				usec[i] = float64(st.Usec) / float64(st.Calls)
				b.ReportMetric(usec[i], v.name+"-server-µs/op")
			}
			b.ReportMetric(usec[1]/usec[0], "current/baseline")
		})
	}
}

// replyDenied reads Decision.Denied from a reply of the shipped script, or
// of 5550b58's: an integer is an admission (decode), a string starts with
// denied.
func replyDenied(r valkey.ValkeyResult) (int64, error) {
	if m, err := r.ToMessage(); err == nil && m.IsInt64() {
		return 0, nil
	}
	s, err := r.ToString() // "denied retry rem1 rem2"
	if err != nil {
		return 0, err
	}
	if s == "" {
		return 0, errors.New("empty reply")
	}
	return int64(s[0] - '0'), nil
}
