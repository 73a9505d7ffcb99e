package benchmarks

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// The sorted-set semaphore recipe teams hand-roll, with the server's clock
// (TIME) so that it compares with admit's: prune, count, add. It has no
// expiry on its key, no replay and no validation.
const leaseRecipeAcquire = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ARGV[2], ARGV[3])
  return 1
end
return 0`

const leaseRecipeRelease = `return redis.call('ZREM', KEYS[1], ARGV[3])`

// The floors: the commands admit's acquire and release must run, with no
// logic around them (no check, no decision, no ACL precheck, a constant
// reply), called with the shipped script's arguments. leaseFloorReads
// are the reads of an acquire, granted or refused.
const leaseFloorReads = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local name = string.match(ARGV[2], '^%d+ %d+ (.+)$')
redis.call('ZSCORE', KEYS[1], name)
redis.call('ZCARD', KEYS[1])
redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('ZCOUNT', KEYS[1], now + 1, '+inf')
`

const leaseFloorGrant = leaseFloorReads + `redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + 1000, name)
redis.call('PEXPIREAT', KEYS[1], t[1] * 1000 + 1000)
return '0 0 -1 -1 1 1000 0'`

const leaseFloorRefused = leaseFloorReads + `redis.call('ZRANGE', KEYS[1], now + 1, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
return '3 1 -1 -1 1 0 0'`

const leaseFloorRelease = `
local t = redis.call('TIME')
local name = string.match(ARGV[2], '^%d+ %d+ (.+)$')
redis.call('ZSCORE', KEYS[1], name)
redis.call('ZREM', KEYS[1], name)
return '1'`

// BenchmarkLeaseServerTime measures what a lease call costs the
// server: the shipped script, the floor of the commands it must run, and
// the sorted-set semaphore recipe (ZREMRANGEBYSCORE, ZCARD, ZADD; ZREM to
// release), each driven in turn by valkey-benchmark (one connection,
// pipeline 16) on one hot key, with random names (__rand_int__). Before
// each run CONFIG RESETSTAT, after it INFO commandstats: usec_per_call of
// EVALSHA, the script's commands included, network and client excluded.
// Paths: an acquire granted (lease 1 ms, so each grant also prunes what
// expired), an acquire refused (10,000 live holders), a release of a live
// holder (the names an acquire run with the same --seed granted). Each
// loop iteration is one rep; it reports each script's median µs per call
// and the median of the reps' shipped/floor and shipped/recipe.
//
//	go test -run '^$' -bench LeaseServerTime -benchtime 5x
func BenchmarkLeaseServerTime(b *testing.B) {
	tool := ""
	for _, name := range []string{"valkey-benchmark", "redis-benchmark"} {
		if p, err := exec.LookPath(name); err == nil {
			tool = p
			break
		}
	}
	if tool == "" {
		testserver.SkipOrFail(b, "BenchmarkLeaseServerTime needs valkey-benchmark or redis-benchmark on PATH")
	}
	srv := testserver.Own(b)
	if srv.TLS != nil {
		b.Skip("valkey-benchmark runs here without TLS")
	}
	host, port, _ := strings.Cut(srv.Addr, ":")
	c := testserver.NewClient(b, srv)
	ctx := context.Background()
	load := func(src string) string {
		sha, err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		return sha
	}
	shipped := load(shippedScript)
	const calls = 50000
	// bench runs n calls of sha on key with args, and returns EVALSHA's
	// server µs per call.
	bench := func(sha, key string, n int, seed string, args ...string) float64 {
		if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
			b.Fatal(err)
		}
		cmd := []string{"-h", host, "-p", port, "-q", "-c", "1", "-P", "16", "-n", strconv.Itoa(n), "-r", "1000000000", "--seed", seed,
			"EVALSHA", sha, "1", key}
		cmd = append(cmd, args...)
		if out, err := exec.Command(tool, cmd...).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", tool, err, out)
		}
		st := testserver.CommandStats(b, c)["evalsha"]
		if st.Calls != int64(n) || st.Failed != 0 {
			b.Fatalf("%d EVALSHA counted (%d failed), want %d", st.Calls, st.Failed, n)
		}
		return float64(st.Usec) / float64(st.Calls)
	}
	zcard := func(key string) int64 {
		n, err := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64()
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	fill := func(key string, n int) {
		c.Do(ctx, c.B().Del().Key(key).Build())
		now := time.Now().Add(time.Hour).UnixMicro()
		cmds := make(valkey.Commands, 0, n)
		for i := range n {
			cmds = append(cmds, c.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(now+int64(i)), "filler-"+strconv.Itoa(i)).Build())
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				b.Fatal(err)
			}
		}
	}
	type script struct{ name, sha, mode string }
	// argsOf is a script's arguments: admit's mode and "limit lease_µs
	// name", or the recipe's limit, lease_µs and name.
	argsOf := func(s script, limit, lease string) []string {
		if s.name == "recipe" {
			return []string{limit, lease, "__rand_int__"}
		}
		return []string{s.mode, limit + " " + lease + " __rand_int__"}
	}
	for _, p := range []struct {
		name    string
		scripts []script
		run     func(s script, rep int) float64
	}{
		{"acquire-granted", []script{{"shipped", shipped, "l"}, {"floor", load(leaseFloorGrant), "l"}, {"recipe", load(leaseRecipeAcquire), ""}},
			func(s script, rep int) float64 {
				key := "bench-lease:granted:" + s.name
				c.Do(ctx, c.B().Del().Key(key).Build())
				us := bench(s.sha, key, calls, strconv.Itoa(rep), argsOf(s, "10000", "1000")...)
				if n := zcard(key); n >= 10000 {
					b.Fatalf("%s: %d holders: the acquires were refused", s.name, n)
				}
				return us
			}},
		{"acquire-refused", []script{{"shipped", shipped, "l"}, {"floor", load(leaseFloorRefused), "l"}, {"recipe", load(leaseRecipeAcquire), ""}},
			func(s script, rep int) float64 {
				key := "bench-lease:refused:" + s.name
				fill(key, 10000)
				us := bench(s.sha, key, calls, strconv.Itoa(rep), argsOf(s, "10000", "3600000000")...)
				if n := zcard(key); n != 10000 {
					b.Fatalf("%s: %d holders, want the 10,000 filled: an acquire was granted", s.name, n)
				}
				return us
			}},
		{"release", []script{{"shipped", shipped, "f"}, {"floor", load(leaseFloorRelease), "f"}, {"recipe", load(leaseRecipeRelease), ""}},
			func(s script, rep int) float64 {
				key := "bench-lease:release:" + s.name
				c.Do(ctx, c.B().Del().Key(key).Build())
				seed := strconv.Itoa(1000 + rep)
				bench(shipped, key, 10000, seed, "l", "10000 3600000000 __rand_int__") // the holders, then release them
				held := zcard(key)
				us := bench(s.sha, key, 10000, seed, argsOf(s, "10000", "3600000000")...)
				if n := zcard(key); n != 0 || held < 9990 {
					b.Fatalf("%s: %d holders acquired, %d left after the release run, want 0", s.name, held, n)
				}
				return us
			}},
	} {
		b.Run("path="+p.name, func(b *testing.B) {
			usec := make([][]float64, len(p.scripts))
			var toFloor, toRecipe []float64
			rep := 0
			for b.Loop() {
				for k := range p.scripts {
					i := (k + rep) % len(p.scripts)
					usec[i] = append(usec[i], p.run(p.scripts[i], rep))
				}
				toFloor = append(toFloor, usec[0][rep]/usec[1][rep])
				toRecipe = append(toRecipe, usec[0][rep]/usec[2][rep])
				rep++
			}
			for i, s := range p.scripts {
				b.ReportMetric(leaseMedian(usec[i]), s.name+"-server-µs/call")
			}
			b.ReportMetric(leaseMedian(toFloor), "shipped/floor")
			b.ReportMetric(leaseMedian(toRecipe), "shipped/recipe")
		})
	}
}

func leaseMedian(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
