package testserver

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// clockshiftSource (C, named .c.in so that go build ignores it) is an LD_PRELOAD shim that shifts the wall clock a
// server reads by an offset the test sets: see [StartClockShifted].
//
//go:embed clockshift.c.in
var clockshiftSource string

// Clock moves the wall clock of a server started by [StartClockShifted].
type Clock struct {
	f      *os.File
	c      valkey.Client // the server's, once started: Set waits until its TIME shows the offset
	offset time.Duration // the offset set last
}

// Set makes the server's wall clock read real time + offset, and returns
// once the server's TIME shows it. The offset is written in place, so the
// server sees it on its next clock read; but Valkey 9.1 serves TIME (and
// a script's TIME) from a wall clock it re-reads only about once a
// millisecond, when its event loop wakes (measured: the first TIME after
// a change still read the old offset about every other time, for 1 to 6
// ms; 8.0, 8.1 and Redis 7.0 and 8.0 read the new one at once). A step of
// a few microseconds cannot be told from the old offset by TIME, so Set
// passes through a parking offset an hour before both the old and the new
// one: it waits until TIME is within a minute of the parking offset, then
// until it is within a minute of the new one, which proves that the
// server re-read its clock after the new offset was written. Nothing runs
// on the server in between (the caller is the only client while it
// steps), and a clock an hour back expires nothing.
func (c *Clock) Set(tb testing.TB, offset time.Duration) {
	tb.Helper()
	if c.c != nil {
		park := min(c.offset, offset) - time.Hour
		c.write(tb, park)
		c.await(tb, park)
	}
	c.write(tb, offset)
	c.offset = offset
	if c.c != nil {
		c.await(tb, offset)
	}
}

func (c *Clock) write(tb testing.TB, offset time.Duration) {
	tb.Helper()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(offset.Microseconds()))
	if _, err := c.f.WriteAt(b[:], 0); err != nil {
		tb.Fatalf("set server clock offset: %v", err)
	}
}

// await waits (2 s at most) until the server's TIME is within a minute of
// the host's clock + offset.
func (c *Clock) await(tb testing.TB, offset time.Duration) {
	tb.Helper()
	var last time.Duration
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		at, err := serverTime(tb, c.c)
		if err != nil {
			tb.Fatal(err)
		}
		last = time.Until(at)
		if d := last - offset; d > -time.Minute && d < time.Minute {
			return
		}
	}
	tb.Fatalf("the clock shim did not move the server's TIME: offset %v set, TIME still %v from the host's clock after 2s", offset, last.Round(time.Millisecond))
}

// serverTime is the server's TIME.
func serverTime(tb testing.TB, c valkey.Client) (time.Time, error) {
	v, err := c.Do(tb.Context(), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(v) != 2 {
		return time.Time{}, fmt.Errorf("TIME: %v %v", v, err)
	}
	s, err1 := strconv.ParseInt(v[0], 10, 64)
	us, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("TIME: %q is not seconds and microseconds", v)
	}
	return time.Unix(s, us*1000), nil
}

// StartClockShifted starts a fresh server of Binary() whose wall clock
// (TIME, and so every script's TIME) is real time plus an offset that the
// returned Clock sets, through an LD_PRELOAD shim compiled with the C
// compiler on PATH. Monotonic clocks are untouched, so the server's timers
// keep working. Linux only; skips (or fails under ADMIT_REQUIRE_SERVER=1)
// where the shim cannot be built.
func StartClockShifted(tb testing.TB) (*Server, *Clock) {
	tb.Helper()
	if os.Getenv("VALKEY_ADDR") != "" {
		tb.Skip("needs a server started with a shifted clock; skipped on VALKEY_ADDR")
	}
	if runtime.GOOS != "linux" {
		tb.Skip("the clock shim is an LD_PRELOAD library: Linux only")
	}
	bin := Binary()
	if bin == "" {
		SkipOrFail(tb, Help)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		SkipOrFail(tb, "no C compiler (cc) on PATH to build the clock shim")
	}
	dir := tb.TempDir()
	src, lib, offsetPath := filepath.Join(dir, "clockshift.c"), filepath.Join(dir, "clockshift.so"), filepath.Join(dir, "offset")
	if err := os.WriteFile(src, []byte(clockshiftSource), 0o644); err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		tb.Fatalf("build the clock shim: %v\n%s", err, out)
	}
	f, err := os.OpenFile(offsetPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	clock := &Clock{f: f}
	clock.Set(tb, 0)
	srv, err := StartEnv(bin, []string{"LD_PRELOAD=" + lib, "ADMIT_CLOCKSHIFT_FILE=" + offsetPath})
	if err != nil {
		tb.Fatalf("server with a shifted clock: %v", err)
	}
	tb.Cleanup(srv.Stop)
	// Prove the shim works: TIME moves by the offset set, and back.
	clock.c = NewClient(tb, srv)
	clock.Set(tb, -time.Hour)
	clock.Set(tb, 0)
	tally(tb, "ran")
	return srv, clock
}
