package benchmarks

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// The scripts the benchmarks send themselves, beside what admit sends.
// shippedScript is the repository's script.lua, which admit embeds;
// uncheckedScript is it as WithoutACLPrecheck runs it; previousScript is
// the previous release's (5550b58), which takes the same arguments on a
// take. confirmScripts checks on a server that the first two are exactly
// what admit loads.
var (
	shippedScript   = readRepoFile("../script.lua")
	uncheckedScript = strings.Replace(shippedScript, "local acl = redis.acl_check_cmd --@acl", "local acl = nil --@acl", 1)
	previousScript  = readRepoFile("../testdata/script_5550b58.lua")
)

// The floors: the commands a one- and a two-bucket admission must run
// (TIME, then HMGET, HSET and PEXPIREAT a bucket) with no logic around them.
var (
	//go:embed testdata/floor_one.lua
	floorOneScript string
	//go:embed testdata/floor_two.lua
	floorTwoScript string
)

// readRepoFile reads a file of the admit repository, relative to this
// directory, where go test runs the benchmarks.
func readRepoFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(fmt.Sprintf("the benchmarks read %s from the admit repository: run them from its benchmarks directory (%v)", path, err))
	}
	return string(b)
}

// takeArgs are the arguments admit sends for a take of specs, each at
// cost 1: µs per token, burst and cost, a bucket, and no mode.
func takeArgs(specs ...admit.Spec) []string {
	var args []string
	for _, s := range specs {
		args = append(args, strconv.FormatInt(s.Interval().Microseconds(), 10), strconv.Itoa(s.Burst()), "1")
	}
	return args
}

// sha1Hex is a script's SHA-1, as EVALSHA names it.
func sha1Hex(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// confirmScripts proves, on a server that has loaded no script yet, that
// shippedScript and uncheckedScript are the scripts admit runs, and that
// takeArgs are its arguments: a Limiter (and one WithoutACLPrecheck) makes
// one call, after which the server must hold each script by the SHA-1 of
// the benchmarks' copy, and the copy, called with takeArgs, must decide as
// admit did.
func confirmScripts(tb testing.TB, c valkey.Client, prefix string) {
	tb.Helper()
	ctx := context.Background()
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		tb.Fatal(err)
	}
	spec := admit.MustSpec(admit.Every(time.Hour), 3)
	for _, s := range []struct {
		name, src string
		l         *admit.Limiter
	}{
		{"script.lua", shippedScript, admit.New(c)},
		{"WithoutACLPrecheck's script", uncheckedScript, admit.New(c, admit.WithoutACLPrecheck())},
	} {
		key := prefix + "confirm:" + sha1Hex(s.src)
		d, err := s.l.AllowOrdered(ctx, admit.Request{Key: key, Spec: spec}, nil)
		if err != nil || !d.Allowed() || d.Remaining[0] != 2 {
			tb.Fatalf("%s: admit's call: %v, %v; want allowed, 2 left", s.name, d, err)
		}
		ok, err := c.Do(ctx, c.B().ScriptExists().Sha1(sha1Hex(s.src)).Build()).AsIntSlice()
		if err != nil {
			tb.Fatal(err)
		}
		if ok[0] != 1 {
			tb.Fatalf("the benchmarks' copy of %s differs from the script admit loaded: bring scripts_test.go in line with the library", s.name)
		}
		cmd := c.B().Evalsha().Sha1(sha1Hex(s.src)).Numkeys(1).Key(key).Arg(takeArgs(spec)...).Build()
		if n, err := c.Do(ctx, cmd).AsInt64(); err != nil || n != 1 {
			tb.Fatalf("%s called with takeArgs: %d, %v; want an admission leaving 1 token", s.name, n, err)
		}
	}
}

// scriptPath is one path through the script: the Specs of its buckets
// and the Decision.Denied it must give.
type scriptPath struct {
	name   string
	first  admit.Spec
	second *admit.Spec
	want   uint8
	all    bool // AllowAll's mode 'a'
}

// scriptPaths are the five paths through the script, with a bucket that
// never runs dry and one that denies once drained, and AllowAll's two
// paths that differ from AllowOrdered's.
func scriptPaths() []scriptPath {
	open := admit.MustSpec(admit.MaxLimit, 1_000_000) // never runs dry within a benchmark; below 2^26, so an admission's reply is an integer
	shut := admit.MustSpec(admit.Every(time.Hour), 1)
	return []scriptPath{
		{"one-bucket-allowed", open, nil, 0, false},
		{"one-bucket-denied", shut, nil, 1, false},
		{"allowed", open, &open, 0, false},
		{"denied-by-first", shut, &open, 1, false},
		{"denied-by-second", open, &shut, 2, false},
		{"allowed-all", open, &open, 0, true},
		{"denied-by-second-all", open, &shut, 2, true},
	}
}

// replyDenied reads Decision.Denied from a reply of the shipped script, or
// of the previous release's: an integer is an admission, a string starts
// with denied.
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
