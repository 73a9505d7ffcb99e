package admit

import (
	"context"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// TestMain stops the shared test server after the last test.
func TestMain(m *testing.M) { testserver.Main(m) }

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
