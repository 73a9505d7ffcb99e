package worker

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/pause"
)

// TestTimingRules: the defaults pass; for each rule, a configuration on
// its broken side of the boundary is refused naming that rule alone, and
// the same configuration one nanosecond (or one delivery) inside is
// accepted, so an off-by-one in the comparison fails the test. The mutant:
// with the rule switched off, its broken configuration is accepted, so the
// refusal comes from that rule and nothing else (a rule deleted or made
// always true fails the test).
func TestTimingRules(t *testing.T) {
	if err := CheckTiming(Config{}, bus.Config{}, pause.Config{}); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	type cfg struct {
		w Config
		b bus.Config
		p pause.Config
	}
	s := time.Second
	cases := []struct {
		rule       string
		broken, ok cfg
	}{
		{"lifetimes",
			cfg{w: Config{Lifetime: 5 * s}, b: bus.Config{Lifetime: 4 * s, AckWait: 6 * s}},
			cfg{w: Config{Lifetime: 4 * s}, b: bus.Config{Lifetime: 4 * s, AckWait: 6 * s}}},
		{"ack_wait",
			cfg{b: bus.Config{AckWait: 5 * s}},
			cfg{b: bus.Config{AckWait: 5*s + 1}}},
		{"paused_retry",
			cfg{w: Config{PausedRetry: 5 * s}},
			cfg{w: Config{PausedRetry: 5*s - 1}}},
		{"max_deliver",
			cfg{b: bus.Config{MaxDeliver: 10}}, // 9 redeliveries 500ms apart: 4.5s < 5s
			cfg{b: bus.Config{MaxDeliver: 11}}},
		{"error_delay",
			cfg{b: bus.Config{ErrorDelay: 5 * s}},
			cfg{b: bus.Config{ErrorDelay: 5*s - 1}}},
		{"decision_retries", // 3 attempts: 1+2+3 backoffs = 6s of a 6s lifetime
			cfg{w: Config{Lifetime: 6 * s, DecisionBackoff: s}, b: bus.Config{Lifetime: 6 * s}},
			cfg{w: Config{Lifetime: 6 * s, DecisionBackoff: s - 1}, b: bus.Config{Lifetime: 6 * s}}},
		{"reconcile", // 2.5s + 20% + 1s timeout = 4s
			cfg{p: pause.Config{ReconcileEvery: 2500 * time.Millisecond, MaxAge: 4 * s}},
			cfg{p: pause.Config{ReconcileEvery: 2500 * time.Millisecond, MaxAge: 4*s + 1}}},
		{"kill_grace", // 5s lifetime + 2s flush = 7s
			cfg{w: Config{KillGrace: 7*s - 1}},
			cfg{w: Config{KillGrace: 7 * s}}},
	}
	if len(cases) != len(timingRules) {
		t.Fatalf("%d cases for %d rules: every rule needs one", len(cases), len(timingRules))
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			err := CheckTiming(c.broken.w, c.broken.b, c.broken.p)
			if !errors.Is(err, ErrTiming) || !strings.Contains(err.Error(), ": "+c.rule+": ") || strings.Count(err.Error(), "\n") != 0 {
				t.Errorf("broken: %v; want one ErrTiming naming %s", err, c.rule)
			}
			if err := CheckTiming(c.ok.w, c.ok.b, c.ok.p); err != nil {
				t.Errorf("just inside the boundary: %v; want accepted", err)
			}
			if err := checkTiming(c.broken.w, c.broken.b, c.broken.p, map[string]bool{c.rule: true}); err != nil {
				t.Errorf("mutant (%s off): %v; want accepted, so that the refusal is this rule's alone", c.rule, err)
			}
		})
	}
}

// TestTimingRulesInREADME: the README's table of timing rules names exactly
// the rules CheckTiming applies, in its order, so the table cannot drift
// from the code.
func TestTimingRulesInREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Timing rules")
	if !ok {
		t.Fatal(`README.md has no "### Timing rules" section`)
	}
	section, _, _ = strings.Cut(section, "\n#")
	var inREADME, inCode []string
	for line := range strings.SplitSeq(section, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			inREADME = append(inREADME, name)
		}
	}
	for _, r := range timingRules {
		inCode = append(inCode, r.name)
	}
	if !slices.Equal(inREADME, inCode) {
		t.Errorf("README's timing rules %q, CheckTiming's %q; make the table list the code's rules in order", inREADME, inCode)
	}
}
