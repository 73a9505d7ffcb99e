package worker

import (
	"errors"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/limits"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCommandsPerMessage counts, from the server's INFO commandstats, the
// commands each path sends: the plan's table, before and after, exactly.
// It runs on a server of its own, so no other traffic is counted.
func TestCommandsPerMessage(t *testing.T) {
	srv := testenv.Own(t)
	e := newEnv(t, srv)
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		e.seed(t, id, false)
	}
	start := testenv.CommandStats(t, e.raw)
	// The Limiter's observer (metrics.ObserveLimiter) counts every call that
	// reached the server: exactly the script runs the server counted, but
	// for the pause writes (SetPaused's compare-and-swap is a script too).
	var pauseWrites int64
	defer func() {
		end := testenv.CommandStats(t, e.raw)
		runs := end["evalsha"].Calls - start["evalsha"].Calls - (end["evalsha"].Failed - start["evalsha"].Failed) + end["eval"].Calls - start["eval"].Calls - pauseWrites
		if got := e.metrics.ScriptRuns(); got != runs || runs == 0 {
			t.Errorf("the observer counted %d script runs, the server %d", got, runs)
		}
	}()
	// once: the path decides with AllowOrderedOnce (the worker's), not
	// with AllowOrdered (the legacy path's).
	measure := func(t *testing.T, want map[string]int64, once bool, send func() (Path, error)) (Path, error) {
		t.Helper()
		before := testenv.CommandStats(t, e.raw)
		path, err := send()
		after := testenv.CommandStats(t, e.raw)
		if diff := cmp.Diff(want, commandDelta(t, before, after, once)); diff != "" {
			t.Errorf("commands (-want +got):\n%s", diff)
		}
		return path, err
	}
	send := func(lane limits.Lane, body string) func() (Path, error) {
		return func() (Path, error) { return e.process(t, lane, body) }
	}
	legacy := func(lane limits.Lane, body string) func() (Path, error) {
		return func() (Path, error) {
			_, p, err := e.worker.LegacyPrepare(testenv.Ctx(t), lane, &bus.Message{Data: []byte(body), Published: e.worker.cfg.Now()})
			return p, err
		}
	}

	// With no cached script, the first decision costs EVALSHA (NOSCRIPT)
	// and EVAL; every later one is one EVALSHA. (The server is fresh; the
	// flush covers VALKEY_ADDR with VALKEY_ALLOW_DESTRUCTIVE=1.)
	if err := e.raw.Do(testenv.Ctx(t), e.raw.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := measure(t, map[string]int64{"evalsha": 1, "eval": 1, "hgetall": 1}, e.worker.cfg.RetryOutcomeUnknown, send(limits.LaneStandard, chat("5"))); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		lane limits.Lane
		body string
		old  bool
		want map[string]int64
	}{
		{"after/standard/cold", limits.LaneStandard, chat("1"), false, map[string]int64{"hgetall": 1, "evalsha": 1}},
		{"after/standard/warm", limits.LaneStandard, chat("1"), false, map[string]int64{"evalsha": 1}},
		{"after/premium/cold", limits.LanePremium, chat("2"), false, map[string]int64{"hgetall": 1, "evalsha": 1}},
		{"after/premium/warm", limits.LanePremium, chat("2"), false, map[string]int64{"evalsha": 1}},
		{"after/helix-api/system", limits.LaneSystem, `{"kind":"api","method":"GET","path":"/helix/users"}`, false, map[string]int64{"evalsha": 1}},
		{"after/announce/warm", limits.LaneStandard, `{"kind":"announce","channel":"1","text":"hi"}`, false, map[string]int64{"evalsha": 1}},
		{"before/standard/cold", limits.LaneStandard, chat("3"), true, map[string]int64{"get": 1, "hgetall": 1, "evalsha": 2}},
		{"before/standard/warm", limits.LaneStandard, chat("3"), true, map[string]int64{"get": 1, "evalsha": 2}},
		{"before/premium/cold", limits.LanePremium, chat("4"), true, map[string]int64{"get": 1, "hgetall": 1, "evalsha": 1}},
		{"before/premium/warm", limits.LanePremium, chat("4"), true, map[string]int64{"get": 1, "evalsha": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := send(c.lane, c.body)
			if c.old {
				f = legacy(c.lane, c.body)
			}
			p, err := measure(t, c.want, !c.old && e.worker.cfg.RetryOutcomeUnknown, f)
			if err != nil || !p.Admitted {
				t.Errorf("path %+v, err %v: want admitted and sent; the counts are for that path", p, err)
			}
		})
	}

	t.Run("after/paused", func(t *testing.T) {
		if _, err := e.pause.SetPaused(testenv.Ctx(t), true, 0); err != nil {
			t.Fatal(err)
		}
		pauseWrites++
		p, err := measure(t, map[string]int64{}, true, send(limits.LaneStandard, chat("1")))
		var nack *bus.ExpectedNack
		if !p.Paused || !errors.As(err, &nack) || nack.Reason != bus.NackPaused {
			t.Errorf("path %+v, err %v: want stopped by the pause with an expected nack", p, err)
		}
	})
}
