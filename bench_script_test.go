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
//
//	go test -run '^$' -bench ScriptServerCost -count 6 .
func BenchmarkScriptServerCost(b *testing.B) {
	srv := testserver.Own(b)
	c := testserver.NewClient(b, srv)
	ctx := context.Background()
	open := MustSpec(MaxLimit, 1<<30) // never runs dry within a benchmark
	shut := MustSpec(Every(time.Hour), 1)
	scripts := []struct{ name, src string }{
		{"baseline-0b7bc55", baselineScript},
		{"current", scriptSource},
		{"current-without-acl-check", strings.Replace(scriptSource, "if redis.acl_check_cmd then", "if false then", 1)},
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
				l := newLimiter(c, valkey.NewLuaScript(s.src))
				key := testserver.Prefix(b, c)
				first := Request{Key: key + "first", Spec: p.first}
				var second *Request
				if p.second != nil {
					second = &Request{Key: key + "second", Spec: *p.second}
				}
				// Drain the shut buckets and load the script before timing.
				for range 2 {
					if _, err := l.AllowOrdered(ctx, first, second); err != nil {
						b.Fatal(err)
					}
				}
				if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					d, err := l.AllowOrdered(ctx, first, second)
					if err != nil || d.Denied != p.want {
						b.Fatalf("got %v, %v; want Denied %d", d, err, p.want)
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
