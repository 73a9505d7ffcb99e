package main

import (
	"errors"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
)

// TestDemo runs a short demo on the in-process miniredis (what a fresh
// machine gets) and on the real server, and checks what it reports: exact
// commands per path, the pause reaching both replicas, no error reported,
// and every message accounted for.
func TestDemo(t *testing.T) {
	for _, mode := range []string{"miniredis", "valkey"} {
		t.Run(mode, func(t *testing.T) {
			addr := ""
			if mode == "valkey" {
				addr = testserver.Shared(t).Addr
			}
			t.Setenv("VALKEY_ADDR", addr)
			cfg := demoConfig{
				Duration: 600 * time.Millisecond, Rate: 400, Channels: 20,
				PauseAt: 200 * time.Millisecond, PauseFor: 200 * time.Millisecond,
				Drain: 6 * time.Second, Seed: 3, RestartAt: 400 * time.Millisecond,
			}
			res, err := runDemo(testenv.Ctx(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkDemo(t, res)
			var out strings.Builder
			res.Print(&out)
			for _, title := range []string{"1. Valkey commands", "2. Pause", "3. Limiter", "4. Delivery", "5. Latency", "6. HTTP"} {
				if !strings.Contains(out.String(), title) {
					t.Errorf("report lacks %q:\n%s", title, out.String())
				}
			}
		})
	}
}

func checkDemo(t *testing.T, res *demoResult) {
	t.Helper()
	want := map[pathRow]int64{
		rowStdWarm: 1, rowStdCold: 2, rowPremWarm: 1, rowPremCold: 2,
		rowHelixAPI: 1, rowHelixWarm: 1, rowHelixCold: 2, rowJoined: 1, rowPaused: 0,
	}
	for row, n := range want {
		s := res.rows.row(row)
		if s.n > 0 && (s.min != n || s.max != n || s.roundTrips != s.commands) {
			t.Errorf("%s: %d-%d commands in %d round trips over %d messages; want exactly %d each", rowNames[row], s.min, s.max, s.roundTrips, s.n, n)
		}
	}
	for _, row := range []pathRow{rowStdWarm, rowStdCold, rowPremWarm, rowHelixAPI, rowPaused} {
		if res.rows.row(row).n == 0 {
			t.Errorf("%s: no message took this path", rowNames[row])
		}
	}
	for row, n := range planBefore[:rowPremCold+1] {
		if s := res.oldShape.row(pathRow(row)); s.n != 1 || s.commands != int64(n) {
			t.Errorf("old shape, %s: %d commands over %d messages, want %d over 1", rowNames[row], s.commands, s.n, n)
		}
	}
	if c := res.contract; len(c) != 2 || c[0].limiterCalls != 2 || !c[0].admitted || c[0].err != nil ||
		c[1].limiterCalls != 1 || !errors.Is(c[1].err, admit.ErrOutcomeUnknown) {
		t.Errorf("error contract: %+v; want not-executed retried then admitted, outcome-unknown not repeated", c)
	}
	if len(res.pauseLog) != 2 {
		t.Fatalf("%d pause changes, want 2", len(res.pauseLog))
	}
	for i, ev := range res.pauseLog {
		if ev.err != nil || ev.version != int64(i+1) {
			t.Errorf("pause change %d: version %d, %v", i, ev.version, ev.err)
		}
		for r, d := range ev.seen {
			if d < 0 {
				t.Errorf("pause change %d: replica %d never saw it", i, r)
			}
		}
	}
	b := res.bus
	if res.reported != 0 || b.Errors != 0 {
		t.Errorf("%d errors reported (first: %s); want none", res.reported, res.firstError)
	}
	if got := b.Acked + sum(b.Dropped[:]); got != int64(res.published) || res.unfinished != 0 || res.refused != 0 {
		t.Errorf("acked %d + dropped %d = %d, %d unfinished, %d refused; want the %d published, all finished",
			b.Acked, sum(b.Dropped[:]), got, res.unfinished, res.refused, res.published)
	}
	if res.restartErr != nil || b.AckFailures != 0 {
		t.Errorf("restart: %v; %d unconfirmed acks", res.restartErr, b.AckFailures)
	}
	if b.Nacked[bus.NackPaused] == 0 || b.Dropped[bus.DropMalformed] == 0 {
		t.Errorf("stats %+v: the mix should include paused and malformed messages", b)
	}
	if res.metrics.Status(helix.Status2xx) != b.Acked {
		t.Errorf("%d 2xx responses for %d acks", res.metrics.Status(helix.Status2xx), b.Acked)
	}
}
