package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRun runs the demo on the in-process server and checks the story it
// tells: standard traffic stops at its own 6, premium still gets its 4.
func TestRun(t *testing.T) {
	t.Setenv("VALKEY_ADDR", "")
	var out strings.Builder
	// The in-process server's clock stands still: no bucket refills while
	// a slow machine runs the story.
	if err := run(context.Background(), &out, time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	count := func(prefix, what string) int {
		n := 0
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), prefix) && strings.Contains(line, what) {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		prefix, what string
		want         int
	}{
		{"standard #", "admitted", 6},
		{"standard #", "denied by the standard bucket", 2},
		{"premium  #", "admitted", 4},
		{"premium  #", "denied by the shared bucket", 2},
	} {
		if got := count(c.prefix, c.what); got != c.want {
			t.Errorf("%q lines with %q: %d, want %d\n%s", c.prefix, c.what, got, c.want, out.String())
		}
	}
}
