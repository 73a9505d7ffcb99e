package rollout

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/canary"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/internal/testenv"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
)

// TestRolloutDemo runs the rollout on the real server: a baseline with
// every step off, and a roll over three replicas: the canary turning the
// steps on one by one, then the two others taking every step at once;
// every count-based gate passes at every window (429s, auth failures, the
// premium reserve, drops, redeliveries, commands per warm message, the
// workers' script runs against the server's, connection churn), on windows
// sized by message count: 300 messages, more until the baseline and the
// replica judged have each admitted 20 warm messages per lane, every
// message finished inside its window.
//
// The timing gates (pre-HTTP latency and its p95 and p99, pause propagation, snapshot age)
// are not asserted: a test never asserts durations, and on a loaded
// machine they move by buckets (a canary's pre-HTTP p95 105 ms against the
// baseline's 12.8 ms, one run in four, beside a CPU hog); their logic is
// TestEvaluateEachGateFails' and TestLatencyGate's (package canary), on
// constructed samples. A roll that a timing gate stopped is accepted (the
// stop is TestRollStopsAtFailingGate's), one stopped by another gate is
// not; a roll that was not stopped reached all three replicas. What is
// asserted of the timing gates is that each was computed from
// observations on both sides: pre-HTTP latencies, pause changes (each
// window waits for both replicas to measure its last one) and snapshot age
// readings.
func TestRolloutDemo(t *testing.T) {
	t.Setenv("VALKEY_ADDR", testenv.Shared(t).Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 8*windowLimit) // a bound per window; each takes seconds
	defer cancel()
	var out strings.Builder
	res, err := Run(ctx, 300, 300, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if testing.Verbose() {
		os.Stdout.WriteString(out.String())
	}
	timing := []string{canary.GateLatency, canary.GateP95, canary.GateP99, canary.GatePropagation, canary.GatePauseAge}
	for i, rep := range res.reports {
		for _, g := range rep.Gates {
			if !g.Pass && !slices.Contains(timing, g.Name) {
				t.Errorf("window %d (%s): gate %q failed:\n%s", i+1, res.steps[i], g.Name, out.String())
				return
			}
		}
		for _, name := range timing {
			if g, ok := rep.Gate(name); !ok || g.BaselineN <= 0 || g.CanaryN <= 0 {
				t.Errorf("window %d (%s): gate %q computed from %v baseline and %v canary observations; want some on both sides:\n%s",
					i+1, res.steps[i], name, g.BaselineN, g.CanaryN, out.String())
			}
		}
		for _, name := range []string{canary.GateCmdStandard, canary.GateCmdPremium} {
			if g, _ := rep.Gate(name); g.CanaryN < 20 {
				t.Errorf("window %d (%s): gate %q judged %v warm messages; want at least 20 (the window's MinWarm)", i+1, res.steps[i], name, g.CanaryN)
			}
		}
	}
	if res.roll.Complete() {
		if want := []string{"canary", "replica-2", "replica-3"}; !slices.Equal(res.roll.Rolled, want) || len(res.reports) != 6+2 {
			t.Errorf("a complete roll: rolled %q in %d windows; want %q in 8 (six canary steps, then one window each):\n%s",
				res.roll.Rolled, len(res.reports), want, out.String())
		}
	} else {
		t.Logf("the roll was stopped by a timing gate at %s (not asserted):\n%s", res.roll.Failed, out.String())
	}
}

// TestRollStopsAtFailingGate rolls the new version over three replicas
// beside a baseline on the old one, a window and its gates after each
// replica's deploy. With a fault deployed on the second (it double-charges
// the shared bucket: the premium reserve gate fails), the roll stops at
// step 2: the first replica stays on the new version, the second is rolled
// back, and the third's step never starts (its worker is the one deployed
// at its start, every step off), and the roll says so. Without the fault,
// the roll reaches all three. The timing gates are opened wide (every
// latency tolerated, hour-long pause bounds): this test never asserts
// durations, and a timing gate failing on a loaded machine must not stop
// the roll it tests.
func TestRollStopsAtFailingGate(t *testing.T) {
	srv := testenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*windowLimit)
	defer cancel()
	f, err := startFleet(ctx, fleetConfig{Dial: fleetenv.DialAddr(srv.Addr), NATSURL: testenv.NATSURL(t),
		Prefix: fmt.Sprintf("outgress-roll:%x:", time.Now().UnixNano()), Channels: 20, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	wc := windowConfig{Rate: 300, Messages: 300, MinWarm: 20, Seed: 200, Server: canary.ValkeyScriptRuns(f.admin),
		Bounds: canary.Bounds{InFlight: 2 * fleetenv.Workers(), LatencyTolerance: 1000, Propagation: time.Hour, MaxAge: time.Hour}}
	names := func() (n []string) {
		for _, r := range f.rolled {
			n = append(n, r.name)
		}
		return n
	}()

	var out strings.Builder
	res := &rolloutResult{}
	if err := f.roll(ctx, rollConfig{Window: wc, Faults: map[int]worker.Config{1: {DoubleChargeShared: true}}}, &out, res); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	third := f.rolled[2]
	if r := res.roll; r.Complete() || r.Failed != names[1] || !r.RolledBack || !slices.Equal(r.Rolled, names[:1]) || !slices.Equal(r.Left, names[2:]) || len(res.reports) != 2 {
		t.Errorf("a failing gate at step 2: %+v, %d windows; want %s rolled, %s failed and rolled back, %s left, 2 windows:\n%s",
			r, len(res.reports), names[0], names[1], names[2], out.String())
	}
	if g, _ := res.reports[len(res.reports)-1].Gate(canary.GateReserve); g.Pass {
		t.Errorf("step 2's premium reserve gate passed with the double charge:\n%s", out.String())
	}
	if third.deploys != 1 || third.off != worker.AllSteps || f.rolled[1].off != worker.AllSteps || f.rolled[0].off != 0 {
		t.Errorf("after the stop: %s deployed %d times, off %v (want once, every step off); %s off %v (rolled back: all); %s off %v (new: none)",
			names[2], third.deploys, third.off, names[1], f.rolled[1].off, names[0], f.rolled[0].off)
	}
	if !strings.Contains(out.String(), "Roll stopped at step 2 of 3: replica "+names[1]+" its gates failed, rolled back to the old version; on the new version: "+names[0]+"; left on the old version: "+names[2]) ||
		strings.Contains(out.String(), "Roll step 3") {
		t.Errorf("the roll's lines do not say where it stopped:\n%s", out.String())
	}

	// The whole fleet back on the old version, then a roll without the fault.
	for _, r := range f.rolled {
		if err := f.deploy(r, worker.AllSteps, worker.Config{}); err != nil {
			t.Fatal(err)
		}
	}
	out.Reset()
	res = &rolloutResult{}
	wc.Seed = 300
	if err := f.roll(ctx, rollConfig{Window: wc}, &out, res); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if r := res.roll; !r.Complete() || !slices.Equal(r.Rolled, names) || len(res.reports) != 3 {
		t.Errorf("a passing roll: %+v, %d windows; want all of %q rolled in 3:\n%s", r, len(res.reports), names, out.String())
	}
	for _, r := range f.rolled {
		if r.off != 0 {
			t.Errorf("after a complete roll, %s runs with %v off; want every step on", r.name, r.off)
		}
	}
	if testing.Verbose() {
		t.Logf("the passing roll:\n%s", out.String())
	}
}

// TestCanaryGatesFail makes each gate fail on purpose, with a canary that
// has every step on beside a baseline that has every step on too, and
// asserts the verdict: a canary that double-charges the shared bucket
// fails the premium reserve gate, one that adds a round trip fails the
// commands-per-warm-message gates, one with 429s up fails the 429 gate, and
// one whose pause events are lost (so a change reaches it only at its next
// reconcile, 3.2 to 4.8 s later) fails the propagation gate. The same
// window with no fault passes each of those gates first, but for the
// propagation gate, a timing gate: there the window with events asserts
// that the canary applied them (the verdict, milliseconds against 2.2 s, is
// printed, not asserted: a test never asserts durations, and a loaded
// machine has delayed an event by 860 ms). The failing side rests on the
// lost event's reconcile coming at least 3.2 s after it, which load only
// delays further.
func TestCanaryGatesFail(t *testing.T) {
	srv := testenv.Shared(t)
	dial := fleetenv.DialAddr(srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 6*windowLimit) // six windows, each bounded
	defer cancel()
	f, err := startFleet(ctx, fleetConfig{Dial: dial, NATSURL: testenv.NATSURL(t),
		Prefix: fmt.Sprintf("outgress-gates:%x:", time.Now().UnixNano()), Channels: 20,
		// The canary reconciles every 4 s (3.2 to 4.8 s apart), failing
		// closed at 10 s: a lost event reaches it past the 2.2 s
		// bound, whatever the load.
		CanaryPause: pause.Config{ReconcileEvery: 4 * time.Second, MaxAge: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	if err := f.deploy(f.baseline, 0, worker.Config{}); err != nil {
		t.Fatal(err)
	}
	srvCount := canary.ValkeyScriptRuns(f.admin)
	seed := uint64(100)
	// Each window is 300 messages, and more until each replica has
	// admitted 40 warm messages on each of the standard and premium lanes:
	// then a gate expected to fail has the messages to fail on (an extra
	// round trip, 2.00 against 1, fails a ± 0.10 rule, not a 2-message
	// window's ± 1.05; a third of responses 429, a 3-SE rule over 80 and
	// more of each side's), whatever the machine's load.
	window := func(t *testing.T, wc windowConfig) *canary.Report {
		t.Helper()
		seed++
		wc.Rate, wc.Messages, wc.MinWarm, wc.Seed, wc.Server = 300, 300, 40, seed, srvCount
		// The fleet's declared pause: the default reconcile interval (so a
		// propagation bound of 2.2 s; the canary's 4 s is its fault) and a
		// MaxAge of 10 s, where the canary fails closed.
		wc.Bounds.InFlight, wc.Bounds.Pause = 2*fleetenv.Workers(), pause.Config{MaxAge: 10 * time.Second}
		res, err := f.window(ctx, wc)
		if err != nil {
			t.Fatal(err)
		}
		return res.Report
	}
	gate := func(t *testing.T, rep *canary.Report, name string, pass bool) {
		t.Helper()
		g, ok := rep.Gate(name)
		var out strings.Builder
		rep.Print(&out)
		if !ok || g.Pass != pass || (!pass && rep.Pass) {
			t.Errorf("gate %q: pass %v, want %v (verdict pass %v):\n%s", name, g.Pass, pass, rep.Pass, out.String())
		} else if testing.Verbose() {
			t.Logf("gate %q as expected:\n%s", name, out.String())
		}
	}

	if err := f.deploy(f.canary, 0, worker.Config{}); err != nil {
		t.Fatal(err)
	}
	rep := window(t, windowConfig{})
	for _, name := range []string{canary.GateReserve, canary.GateCmdStandard, canary.GateCmdPremium, canary.Gate429, canary.GateCmdServer} {
		gate(t, rep, name, true)
	}

	t.Run("double charge", func(t *testing.T) {
		if err := f.deploy(f.canary, 0, worker.Config{DoubleChargeShared: true}); err != nil {
			t.Fatal(err)
		}
		gate(t, window(t, windowConfig{}), canary.GateReserve, false)
	})
	t.Run("extra round trip", func(t *testing.T) {
		if err := f.deploy(f.canary, 0, worker.Config{ExtraPauseLookup: true}); err != nil {
			t.Fatal(err)
		}
		rep := window(t, windowConfig{})
		gate(t, rep, canary.GateCmdStandard, false)
		gate(t, rep, canary.GateCmdPremium, false)
	})
	t.Run("429s up", func(t *testing.T) {
		if err := f.deploy(f.canary, 0, worker.Config{}); err != nil {
			t.Fatal(err)
		}
		f.canary.fake.ThrottleEvery.Store(3)
		defer f.canary.fake.ThrottleEvery.Store(0)
		gate(t, window(t, windowConfig{}), canary.Gate429, false)
	})
	t.Run("pause propagation", func(t *testing.T) {
		if err := f.deploy(f.canary, 0, worker.Config{}); err != nil {
			t.Fatal(err)
		}
		measured := func(rep *canary.Report) {
			t.Helper()
			if g, _ := rep.Gate(canary.GatePropagation); g.CanaryN <= 0 {
				t.Errorf("the propagation gate judged %v canary observations; want the window's changes", g.CanaryN)
			}
		}
		events := func() int64 { return f.canary.pause.Stats().EventsApplied }
		n := events()
		rep := window(t, windowConfig{PauseAfter: 30})
		if events() == n {
			t.Errorf("the canary applied no pause event in a window with events; want the window's change by its event")
		}
		measured(rep)
		if testing.Verbose() {
			var out strings.Builder
			rep.Print(&out)
			t.Logf("with events (the propagation verdict is not asserted):\n%s", out.String())
		}

		f.canary.drop.Store(true)
		defer f.canary.drop.Store(false)
		n = events()
		rep = window(t, windowConfig{PauseAfter: 30, BeforePause: func() {
			// Right after a canary reconcile, so its next one is 3.2-4.8 s away.
			r := f.canary.pause.Stats().Reconciles
			for deadline := time.Now().Add(15 * time.Second); f.canary.pause.Stats().Reconciles == r && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}})
		if events() != n {
			t.Errorf("the canary applied %d pause events while dropping them", events()-n)
		}
		gate(t, rep, canary.GatePropagation, false)
		measured(rep)
	})
}

// TestMain stops the shared test server and the embedded NATS server after
// the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Stop()
	os.Exit(code)
}
