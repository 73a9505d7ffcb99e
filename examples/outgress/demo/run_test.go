package demo

import (
	"context"
	"errors"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/worker"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"os"
	"strings"
	"testing"
	"time"
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
				addr = testenv.Shared(t).Addr
			}
			t.Setenv("VALKEY_ADDR", addr)
			// 240 messages, the pause after 80 of them, 80 more published
			// while every replica is paused, B's restart after 160: by
			// count, so a loaded machine runs the same mix (slower). The
			// drain's bound is generous: it ends once every message is
			// finished, at most 5 s (their lifetime) after the last is
			// taken, which a loaded machine delays.
			cfg := Config{
				Duration: 600 * time.Millisecond, Rate: 400, Channels: 20,
				PauseAt: 200 * time.Millisecond, PauseFor: 200 * time.Millisecond,
				Drain: 30 * time.Second, Seed: 3, RestartAt: 400 * time.Millisecond,
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := Run(ctx, cfg)
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

func checkDemo(t *testing.T, res *Result) {
	t.Helper()
	want := map[worker.Row]int64{
		worker.RowStdWarm: 1, worker.RowStdCold: 2, worker.RowPremWarm: 1, worker.RowPremCold: 2,
		worker.RowHelixAPI: 1, worker.RowHelixWarm: 1, worker.RowHelixCold: 2, worker.RowJoined: 1, worker.RowPaused: 0,
	}
	for row, n := range want {
		s := res.rows.Row(row)
		if s.N > 0 && (s.Min != n || s.Max != n || s.RoundTrips != s.Commands) {
			t.Errorf("%s: %d-%d commands in %d round trips over %d messages; want exactly %d each", worker.RowNames[row], s.Min, s.Max, s.RoundTrips, s.N, n)
		}
	}
	for _, row := range []worker.Row{worker.RowStdWarm, worker.RowStdCold, worker.RowPremWarm, worker.RowHelixAPI, worker.RowPaused} {
		if res.rows.Row(row).N == 0 {
			t.Errorf("%s: no message took this path", worker.RowNames[row])
		}
	}
	for row, n := range worker.PlanBefore[:worker.RowPremCold+1] {
		if s := res.oldShape.Row(worker.Row(row)); s.N != 1 || s.Commands != int64(n) {
			t.Errorf("old shape, %s: %d commands over %d messages, want %d over 1", worker.RowNames[row], s.Commands, s.N, n)
		}
	}
	if c := res.contract; len(c) != 4 || c[0].LimiterCalls != 2 || !c[0].Admitted || c[0].Err != nil || c[0].Charged != 1 ||
		c[1].LimiterCalls != 1 || c[1].Admitted || !errors.Is(c[1].Err, admit.ErrOutcomeUnknown) || c[1].Charged != 1 ||
		c[2].LimiterCalls != 2 || !c[2].Admitted || c[2].Err != nil || c[2].Charged != 1 ||
		c[3].LimiterCalls != 2 || !errors.Is(c[3].Err, admit.ErrOutcomeUnknown) || c[3].Charged != 1 {
		t.Errorf("error contract: %+v; want not-executed retried then admitted, outcome-unknown not repeated by default, "+
			"repeated once and admitted with RetryOutcomeUnknown, lost twice an ErrOutcomeUnknown; each charged one token", c)
	}
	if len(res.pauseLog) != 2 {
		t.Fatalf("%d pause changes, want 2", len(res.pauseLog))
	}
	for i, ev := range res.pauseLog {
		if ev.Err != nil || ev.Version != int64(i+1) || (ev.By != "A" && ev.By != "B") {
			t.Errorf("pause change %d: version %d executed by %q, %v; want version %d executed by A or B", i, ev.Version, ev.By, ev.Err, i+1)
		}
		for r, d := range ev.Seen {
			if d < 0 {
				t.Errorf("pause change %d: replica %d never saw it", i, r)
			}
		}
	}
	// The two set_paused requests: each executed by exactly one replica
	// (the queue group), as the replies said; the status request answered
	// once, from Valkey: resumed at version 2.
	executed, answered := map[string]int64{}, int64(0)
	for _, r := range res.replicas {
		executed[r.name] = r.mgmt.SetPaused
		answered += r.mgmt.Status
	}
	by := map[string]int64{}
	for _, ev := range res.pauseLog {
		by[ev.By]++
	}
	if executed["A"]+executed["B"] != 2 || executed["A"] != by["A"] || executed["B"] != by["B"] {
		t.Errorf("set_paused executed %v by the replicas' counts, %v by the replies; want 2 in all, the same", executed, by)
	}
	if s := res.status; res.statusErr != nil || answered != 1 || s.Paused || s.Version != 2 {
		t.Errorf("status %+v, %v, answered %d times; want resumed at version 2, answered once", s, res.statusErr, answered)
	}
	b := res.bus
	// A call cut short by its message's lifetime (a loaded machine delays
	// a redelivery that had little of it left) is reported, as it should
	// be, and is not a fault of the path; any other error is.
	if res.reported != res.reportedExpired || b.Errors != 0 {
		t.Errorf("%d errors reported, %d of them the message's lifetime ending during a call, %d redelivered after an error (first other: %s); want none but those",
			res.reported, res.reportedExpired, b.Errors, res.firstError)
	}
	if got := b.Acked + sum(b.Dropped[:]); got != int64(res.published) || res.unfinished != 0 || res.refused != 0 {
		t.Errorf("acked %d + dropped %d = %d, %d unfinished, %d refused; want the %d published, all finished",
			b.Acked, sum(b.Dropped[:]), got, res.unfinished, res.refused, res.published)
	}
	if res.restartErr != nil || b.AckFailures != 0 {
		t.Errorf("restart: %v; %d unconfirmed acks", res.restartErr, b.AckFailures)
	}
	if res.published != 240 || res.pausedMsgs != 80 {
		t.Errorf("%d messages published, %d of them while paused; want 240 and 80 (the mix is by count)", res.published, res.pausedMsgs)
	}
	if b.Nacked[bus.NackPaused] == 0 || b.Dropped[bus.DropMalformed] == 0 {
		t.Errorf("stats %+v: the mix should include paused and malformed messages", b)
	}
	if res.metrics.Status(helix.Status2xx) != b.Acked {
		t.Errorf("%d 2xx responses for %d acks", res.metrics.Status(helix.Status2xx), b.Acked)
	}
}

// TestMain stops the shared test server and the embedded NATS server after
// the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Stop()
	os.Exit(code)
}
