package worker

import (
	"fmt"
	"strings"

	"github.com/admitkit/admit/examples/outgress/metrics"
)

// Steps is a set of the rollout's six steps (the plan's "six independently
// reversible changes"). Each step switched off runs the shape the step
// replaced, so that a replica can be rolled forward or back one step at a
// time while replicas of either shape share one Valkey and one bus.
type Steps uint8

// The six steps, in the plan's order.
const (
	// StepMetrics: the per-stage timing (decode, pause, channel, channel_load
	// and build histograms). Off, those are not recorded; what the canary's
	// gates read (pre_http and http latency, limiter decisions, deliveries,
	// Helix responses, sampled connection reuse) is recorded either way: a
	// baseline is compared on it.
	StepMetrics Steps = 1 << iota
	// StepTransport: the Helix transport keeps one idle connection per
	// worker, and every response body is drained (bounded) before it is
	// closed. Off: the default transport's two idle connections per host,
	// and bodies closed unread, so connections churn. The transport half is
	// helix.Config.LegacyTransport, set from the same Steps (HelixLegacy).
	StepTransport
	// StepOrderedScript: one AllowOrderedOnce charges both buckets in order
	// (one round trip), with admit's error contract. Off: AllowOrdered on
	// each bucket in sequence, the second only when the first admitted (two
	// round trips on the standard and system lanes), no retries, on the
	// same keys and Specs.
	StepOrderedScript
	// StepPauseSnapshot: the versioned pause snapshot, one atomic load per
	// message. Off: a GET of the pause flag per message (pause.Lookup), one
	// more round trip.
	StepPauseSnapshot
	// StepNackSuppression: a denial, a pause and a 429 are expected nacks,
	// redelivered after their own delay and never reported as errors. Off:
	// they are returned as plain errors: reported, and redelivered after the
	// bus's error delay.
	StepNackSuppression
	// StepPrecomputed: the allocation-only work: a channel's keys and the
	// Helix plans built once. Off: built again for every message.
	StepPrecomputed

	// AllSteps is every step on: the default.
	AllSteps = StepMetrics | StepTransport | StepOrderedScript | StepPauseSnapshot | StepNackSuppression | StepPrecomputed
	// NumSteps is the number of steps.
	NumSteps = 6
)

var stepNames = metrics.RolloutSteps

// StepList is the six steps in order.
var StepList = [NumSteps]Steps{StepMetrics, StepTransport, StepOrderedScript, StepPauseSnapshot, StepNackSuppression, StepPrecomputed}

// Has reports whether every step of x is in s.
func (s Steps) Has(x Steps) bool { return s&x == x }

// String lists the steps in s by name, comma-separated: "all", "none", or
// for example "metrics,transport".
func (s Steps) String() string {
	switch s & AllSteps {
	case AllSteps:
		return "all"
	case 0:
		return "none"
	}
	var names []string
	for i, x := range StepList {
		if s.Has(x) {
			names = append(names, stepNames[i])
		}
	}
	return strings.Join(names, ",")
}

// HelixLegacy reports whether the Helix client of a worker running s must
// use the legacy transport (helix.Config.LegacyTransport).
func (s Steps) HelixLegacy() bool { return !s.Has(StepTransport) }

// ParseSteps reads a set of steps: "all", "none", or step names separated
// by commas (metrics, transport, ordered_script, pause_snapshot,
// nack_suppression, precomputed).
func ParseSteps(v string) (Steps, error) {
	switch v = strings.TrimSpace(v); v {
	case "all":
		return AllSteps, nil
	case "none", "":
		return 0, nil
	}
	var s Steps
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		i := -1
		for j, n := range stepNames {
			if n == name {
				i = j
			}
		}
		if i < 0 {
			return 0, fmt.Errorf("outgress: unknown rollout step %q; the steps are %s (or all, none)", name, strings.Join(stepNames[:], ", "))
		}
		s |= StepList[i]
	}
	return s, nil
}
