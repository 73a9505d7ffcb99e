package admit

import (
	"context"
	_ "embed"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// TestMain stops the shared test server after the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}

// unitEpoch is the miniredis server clock at the start of every unit test.
var unitEpoch = minitest.Epoch

// unitEnv is an in-process miniredis whose clock only moves when the test
// moves it, with a Limiter on it running the script as shipped.
type unitEnv struct {
	srv *miniredis.Miniredis
	c   valkey.Client
	l   *Limiter
	now time.Time
}

func newUnitEnv(tb testing.TB) *unitEnv {
	tb.Helper()
	return newUnitEnvScript(tb, scriptSource)
}

func newUnitEnvScript(tb testing.TB, src string) *unitEnv {
	tb.Helper()
	srv, c := minitest.Start(tb)
	return &unitEnv{srv: srv, c: c, l: newLimiter(c, valkey.NewLuaScript(src)), now: unitEpoch}
}

// advance moves the server clock by d, which may be negative.
func (e *unitEnv) advance(d time.Duration) {
	e.now = e.now.Add(d)
	e.srv.SetTime(e.now)
}

// allow runs AllowOrdered and fails the test on an error.
func (e *unitEnv) allow(tb testing.TB, first Request, second *Request) Decision {
	tb.Helper()
	d, err := e.l.AllowOrdered(context.Background(), first, second)
	if err != nil {
		tb.Fatalf("AllowOrdered: %v", err)
	}
	return d
}

// state returns a bucket's raw fields, "" when absent.
func (e *unitEnv) state(key string) (tokens, ts string) {
	if !e.srv.Exists(key) {
		return "", ""
	}
	return e.srv.HGet(key, "tokens"), e.srv.HGet(key, "ts")
}

// micros is the server clock in microseconds, as the script stores it.
func (e *unitEnv) micros() int64 { return e.now.UnixMicro() }

// baselineScript is script.lua as of commit 0b7bc55, the script before the
// denial stopped writing its bucket.
//
//go:embed testdata/script_0b7bc55.lua
var baselineScript string

// previousScript is script.lua as of commit 5550b58, the previous release:
// it takes the same arguments as the shipped script on a take.
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

// scriptPaths are the five paths through the script, with a bucket that
// never runs dry and one that denies once drained.
func scriptPaths() []scriptPath {
	open := MustSpec(MaxLimit, 1_000_000) // never runs dry within a test; below 2^26, as decode packs
	shut := MustSpec(Every(time.Hour), 1)
	return []scriptPath{
		{"one-bucket-allowed", open, nil, 0},
		{"one-bucket-denied", shut, nil, 1},
		{"allowed", open, &open, 0},
		{"denied-by-first", shut, &open, 1},
		{"denied-by-second", open, &shut, 2},
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
