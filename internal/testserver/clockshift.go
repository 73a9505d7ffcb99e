package testserver

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// clockshiftSource (C, named .c.in so that go build ignores it) is an LD_PRELOAD shim that shifts the wall clock a
// server reads by an offset the test sets: see [StartClockShifted].
//
//go:embed clockshift.c.in
var clockshiftSource string

// Clock moves the wall clock of a server started by [StartClockShifted].
type Clock struct{ f *os.File }

// Set makes the server's wall clock read real time + offset. The offset is
// written in place, so the server sees it on its next clock read.
func (c *Clock) Set(tb testing.TB, offset time.Duration) {
	tb.Helper()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(offset.Microseconds()))
	if _, err := c.f.WriteAt(b[:], 0); err != nil {
		tb.Fatalf("set server clock offset: %v", err)
	}
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
	if err := checkShift(srv, clock, tb); err != nil {
		tb.Fatal(err)
	}
	return srv, clock
}

// checkShift proves the shim works: TIME moves by the offset set.
func checkShift(srv *Server, clock *Clock, tb testing.TB) error {
	c := NewClient(tb, srv)
	read := func() (time.Time, error) {
		v, err := c.Do(tb.Context(), c.B().Time().Build()).AsStrSlice()
		if err != nil || len(v) != 2 {
			return time.Time{}, fmt.Errorf("TIME: %v %v", v, err)
		}
		var s, us int64
		fmt.Sscan(v[0], &s)
		fmt.Sscan(v[1], &us)
		return time.Unix(s, us*1000), nil
	}
	clock.Set(tb, -time.Hour)
	back, err := read()
	clock.Set(tb, 0)
	if err != nil {
		return err
	}
	if d := time.Since(back); d < 59*time.Minute || d > 61*time.Minute {
		return fmt.Errorf("the clock shim did not move the server's TIME: 1 h back read %v, %v behind the host", back, d)
	}
	return nil
}
