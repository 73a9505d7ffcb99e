package canary

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/pause"
)

// counts are a replica's counters at one scrape, by series in the exposition
// format ("name{labels}" -> value), plus the pre_http and propagation
// histograms as cumulative counts for their bucket bounds.
type counts map[string]float64

// healthy is what a replica with every step on adds in a healthy window:
// 1,000 messages, 10 dropped, 50 redelivered, one Valkey round trip per
// warm message, no 429s or auth failures, ordered charging, 1,000 script
// runs, fast pre-HTTP, reused connections, one pause change propagated in a
// millisecond.
func healthy() counts {
	c := counts{
		`outgress_helix_responses_total{status_class="2xx"}`:                        1000,
		`outgress_helix_responses_total{status_class="429"}`:                        0,
		`outgress_helix_responses_total{status_class="auth"}`:                       0,
		`outgress_limiter_tokens_total{lane="standard",class="standard"}`:           500,
		`outgress_limiter_tokens_total{lane="standard",class="shared"}`:             480,
		`outgress_limiter_tokens_total{lane="premium",class="shared"}`:              200,
		`outgress_limiter_decisions_total{lane="premium",decision="denied_shared"}`: 0,
		`outgress_messages_finished_total{dropped="false",redelivered="false"}`:     940,
		`outgress_messages_finished_total{dropped="false",redelivered="true"}`:      50,
		`outgress_messages_finished_total{dropped="true",redelivered="false"}`:      10,
		`outgress_warm_messages_total{lane="standard"}`:                             600,
		`outgress_warm_valkey_calls_total{lane="standard"}`:                         600,
		`outgress_warm_messages_total{lane="premium"}`:                              200,
		`outgress_warm_valkey_calls_total{lane="premium"}`:                          200,
		`outgress_limiter_calls_total{op="once",answer="allowed"}`:                  800,
		`outgress_limiter_calls_total{op="once",answer="denied"}`:                   200,
		`outgress_helix_sampled_connections_total{reused="true"}`:                   990,
		`outgress_helix_sampled_connections_total{reused="false"}`:                  10,
		`outgress_pause_snapshot_age_seconds{replica="x"}`:                          0.8,
	}
	for _, s := range []string{"metrics", "transport", "ordered_script", "pause_snapshot", "nack_suppression", "precomputed"} {
		c[`outgress_rollout_step{step="`+s+`"}`] = 1
	}
	return c
}

// text renders c, with the pre_http histogram holding 1,000 observations in
// the bucket with upper bound preHTTP and the propagation histogram one in
// the bucket with bound propag (0: none).
func (c counts) text(preHTTP, propag float64) string { return c.textTail(preHTTP, 0, propag) }

// textTail is text with 2% of the pre_http observations (20 of 1,000) in
// the bucket with bound tail instead (0: none): a p99 that moves while the
// p95 does not.
func (c counts) textTail(preHTTP, tail, propag float64) string {
	pre := map[float64]int{}
	if preHTTP > 0 {
		pre[preHTTP] = 1000
		if tail > 0 {
			pre[preHTTP], pre[tail] = 980, 20
		}
	}
	return c.textHist(pre, propag)
}

// textHist is text with the pre_http histogram holding pre[bound]
// observations in the bucket with upper bound bound.
func (c counts) textHist(pre map[float64]int, propag float64) string {
	var b strings.Builder
	kinds := map[string]string{}
	for k := range c {
		name := k[:strings.IndexByte(k, '{')]
		kinds[name] = "counter"
		if strings.HasSuffix(name, "_seconds") || name == "outgress_rollout_step" {
			kinds[name] = "gauge"
		}
	}
	for name, kind := range kinds {
		fmt.Fprintf(&b, "# TYPE %s %s\n", name, kind)
		for k, v := range c {
			if strings.HasPrefix(k, name+"{") {
				fmt.Fprintf(&b, "%s %g\n", k, v)
			}
		}
	}
	// hist writes a histogram holding obs[bound] observations in the
	// bucket with upper bound bound.
	hist := func(name, labels string, obs map[float64]int) {
		fmt.Fprintf(&b, "# TYPE %s histogram\n", name)
		total, n := 0, 0
		for _, k := range obs {
			n += k
		}
		for _, le := range []float64{0.001, 0.002, 0.004, 0.008, 0.5, 1, 2, 4} {
			for bound, k := range obs {
				if bound > le/2 && bound <= le { // each bound is one of the les
					total += k
				}
			}
			fmt.Fprintf(&b, "%s_bucket{%sle=\"%g\"} %d\n", name, labels, le, total)
		}
		fmt.Fprintf(&b, "%s_bucket{%sle=\"+Inf\"} %d\n%s_sum{%s} 0\n%s_count{%s} %d\n", name, labels, n, name, strings.TrimSuffix(labels, ","), name, strings.TrimSuffix(labels, ","), n)
	}
	hist("outgress_stage_duration_seconds", `stage="pre_http",`, pre)
	prop := map[float64]int{}
	if propag > 0 {
		prop[propag] = 1
	}
	hist("outgress_pause_propagation_seconds", "", prop)
	return b.String()
}

func sample(t *testing.T, text string) Sample {
	t.Helper()
	s, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	return s
}

// window builds a window whose start is empty and whose end is the given
// replicas' counts: what the window added. The canary's pre_http
// observations are in the bucket canPreHTTP, 2% of them in canTail when it
// is not 0; its pause propagation is one change in the bucket canPropag (0:
// none). Each replica's age was read 10 times.
func window(t *testing.T, base, can counts, canPreHTTP, canTail, canPropag float64, server int64) *Window {
	t.Helper()
	empty := sample(t, counts{}.text(0, 0))
	return &Window{
		Baseline: Replica{Start: empty, End: sample(t, base.text(0.002, 0.001)), MaxAge: base[`outgress_pause_snapshot_age_seconds{replica="x"}`], AgeSamples: 10},
		Canary: Replica{Start: empty, End: sample(t, can.textTail(canPreHTTP, canTail, canPropag)),
			MaxAge: can[`outgress_pause_snapshot_age_seconds{replica="x"}`], AgeSamples: 10},
		ServerScripts: server, ServerScriptsMax: server,
	}
}

// TestEvaluateEachGateFails: a healthy canary passes every gate; each
// fault below fails exactly its gates (its own, and for a latency fault
// the tail gates its quantiles move) and the verdict.
func TestEvaluateEachGateFails(t *testing.T) {
	rep := Evaluate(window(t, healthy(), healthy(), 0.002, 0, 0.001, 2000), Bounds{})
	if !rep.Pass {
		var b strings.Builder
		rep.Print(&b)
		t.Fatalf("a healthy canary failed:\n%s", b.String())
	}
	for _, c := range []struct {
		gate    string
		also    []string // other gates the fault fails
		fault   func(counts)
		preHTTP float64
		tail    float64
		propag  float64
		server  int64
	}{
		{gate: Gate429, fault: func(c counts) { c[`outgress_helix_responses_total{status_class="429"}`] = 100 }},
		{gate: GateAuth, fault: func(c counts) { c[`outgress_helix_responses_total{status_class="auth"}`] = 100 }},
		{gate: GateReserve, fault: func(c counts) { c[`outgress_limiter_tokens_total{lane="standard",class="shared"}`] = 960 }}, // double charge
		{gate: GateDropped, fault: func(c counts) {
			c[`outgress_messages_finished_total{dropped="true",redelivered="false"}`] = 80
			c[`outgress_messages_finished_total{dropped="false",redelivered="false"}`] = 870
		}},
		{gate: GateRedelivered, fault: func(c counts) {
			c[`outgress_messages_finished_total{dropped="false",redelivered="true"}`] = 150
			c[`outgress_messages_finished_total{dropped="false",redelivered="false"}`] = 840
		}},
		{gate: GateCmdStandard, fault: func(c counts) { c[`outgress_warm_valkey_calls_total{lane="standard"}`] = 1200 }}, // a round trip added
		{gate: GateCmdPremium, fault: func(c counts) { c[`outgress_warm_valkey_calls_total{lane="premium"}`] = 400 }},
		{gate: GateCmdServer, server: 2500},                                 // the server ran 500 scripts the workers do not count
		{gate: GateLatency, also: []string{GateP95, GateP99}, preHTTP: 0.5}, // every message 3 buckets slower
		{gate: GateLatency, also: []string{GateP99}, tail: 0.5},             // 2% of them 3 buckets slower: the p99 moves, the p95 does not
		{gate: GateChurn, fault: func(c counts) {
			c[`outgress_helix_sampled_connections_total{reused="false"}`] = 300
			c[`outgress_helix_sampled_connections_total{reused="true"}`] = 700
		}},
		{gate: GatePropagation, propag: 4}, // past the 2.2 s the pause defaults imply
		{gate: GatePauseAge, fault: func(c counts) { c[`outgress_pause_snapshot_age_seconds{replica="x"}`] = 6 }},
	} {
		t.Run(c.gate, func(t *testing.T) {
			can := healthy()
			if c.fault != nil {
				c.fault(can)
			}
			pre, prop, server := 0.002, 0.001, int64(2000)
			if c.preHTTP > 0 {
				pre = c.preHTTP
			}
			if c.propag > 0 {
				prop = c.propag
			}
			if c.server > 0 {
				server = c.server
			}
			rep := Evaluate(window(t, healthy(), can, pre, c.tail, prop, server), Bounds{})
			var b strings.Builder
			rep.Print(&b)
			if rep.Pass {
				t.Fatalf("verdict pass, want FAIL:\n%s", b.String())
			}
			for _, g := range rep.Gates {
				want := g.Name != c.gate && !slices.Contains(c.also, g.Name)
				if g.Pass != want {
					t.Errorf("gate %q pass %v, want %v:\n%s", g.Name, g.Pass, want, b.String())
				}
			}
			if !strings.Contains(b.String(), "verdict: FAIL ("+c.gate) {
				t.Errorf("the verdict does not name %q:\n%s", c.gate, b.String())
			}
		})
	}
}

// TestCommandsFollowSteps: the expected commands per warm message follow
// the canary's steps: 3 and 2 with every step off, as the old shape.
func TestCommandsFollowSteps(t *testing.T) {
	can := healthy()
	for _, s := range []string{"ordered_script", "pause_snapshot"} {
		can[`outgress_rollout_step{step="`+s+`"}`] = 0
	}
	can[`outgress_warm_valkey_calls_total{lane="standard"}`] = 1800
	can[`outgress_warm_valkey_calls_total{lane="premium"}`] = 400
	rep := Evaluate(window(t, healthy(), can, 0.002, 0, 0.001, 2000), Bounds{})
	for _, name := range []string{GateCmdStandard, GateCmdPremium} {
		if g, _ := rep.Gate(name); !g.Pass {
			t.Errorf("%s: %+v, want pass (3 and 2 round trips without those steps)", name, g)
		}
	}
}

func TestCommandStats(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=1,usec_per_call=0.01,rejected_calls=0,failed_calls=3\r\ncmdstat_eval:calls=4,usec=1\r\ncmdstat_get:calls=9\r\n"
	n, err := CommandStats(func(context.Context) (string, error) { return info, nil }).ScriptRuns(context.Background())
	if err != nil || n != 121 {
		t.Errorf("ScriptRuns = %d, %v; want 121 (120 - 3 failed + 4)", n, err)
	}
}

// TestEvaluateSampleCounts: each gate says how many observations each
// side's figure was computed from, exactly; and a canary window with no
// pause change passes the propagation gate on no data, which the table and
// the verdict say instead of a bare pass.
func TestEvaluateSampleCounts(t *testing.T) {
	rep := Evaluate(window(t, healthy(), healthy(), 0.002, 0, 0.001, 2000), Bounds{})
	want := map[string]float64{ // the same on both sides
		Gate429: 1000, GateAuth: 1000, // responses
		GateReserve:     480,  // shared and general tokens the standard and system lanes took
		GateDropped:     1000, // messages finished
		GateRedelivered: 1000,
		GateCmdStandard: 600, GateCmdPremium: 200, // warm messages
		GateCmdServer:   2000, // both replicas' script runs
		GateLatency:     1000, // pre_http observations
		GateP95:         1000,
		GateP99:         1000,
		GateChurn:       1000, // sampled requests
		GatePropagation: 1,    // pause changes
		GatePauseAge:    10,   // age readings
	}
	if len(rep.Gates) != len(want) || len(rep.NoData) != 0 {
		t.Errorf("%d gates, no data for %q; want %d gates, each with data", len(rep.Gates), rep.NoData, len(want))
	}
	for _, g := range rep.Gates {
		if n, ok := want[g.Name]; !ok || g.BaselineN != n || g.CanaryN != n {
			t.Errorf("gate %q: %v baseline and %v canary observations, want %v each", g.Name, g.BaselineN, g.CanaryN, n)
		}
	}

	rep = Evaluate(window(t, healthy(), healthy(), 0.002, 0, 0, 2000), Bounds{})
	var b strings.Builder
	rep.Print(&b)
	g, _ := rep.Gate(GatePropagation)
	if !rep.Pass || !g.Pass || g.CanaryN != 0 || len(rep.NoData) != 1 || rep.NoData[0] != GatePropagation {
		t.Errorf("no pause change in the canary's window: gate %+v, verdict pass %v, no data for %q; want a pass on no data for %q alone", g, rep.Pass, rep.NoData, GatePropagation)
	}
	for _, line := range []string{"no data  \n", "verdict: PASS (canary steps: metrics,transport,ordered_script,pause_snapshot,nack_suppression,precomputed; no data for pause propagation p99)"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("the table lacks %q:\n%s", line, b.String())
		}
	}
}

// TestPauseBoundsFromPauseConfig: the propagation and age bounds derive
// from the fleet's pause.Config: its longest reconcile gap and its MaxAge,
// with the pause defaults (2.2 s and 5 s) when it is zero.
func TestPauseBoundsFromPauseConfig(t *testing.T) {
	for _, c := range []struct {
		p           pause.Config
		propag, age string
	}{
		{pause.Config{}, "canary <= 2.2s", "canary <= 5s"},
		{pause.Config{ReconcileEvery: 2 * time.Second, Timeout: 500 * time.Millisecond, MaxAge: 9 * time.Second}, "canary <= 2.9s", "canary <= 9s"},
	} {
		rep := Evaluate(window(t, healthy(), healthy(), 0.002, 0, 0.001, 2000), Bounds{Pause: c.p})
		g, _ := rep.Gate(GatePropagation)
		a, _ := rep.Gate(GatePauseAge)
		if g.Rule != c.propag || a.Rule != c.age {
			t.Errorf("pause %+v: rules %q and %q; want %q and %q", c.p, g.Rule, a.Rule, c.propag, c.age)
		}
	}
}
