package worker

import (
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/channels"
	"github.com/admitkit/admit/examples/outgress/command"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// allowedLabels is every value each label of an outgress_ metric may take.
func allowedLabels() map[string][]string {
	vals := func(n int, name func(int) string) []string {
		var v []string
		for i := range n {
			v = append(v, name(i))
		}
		return v
	}
	return map[string][]string{
		"stage":        vals(int(metrics.NumStages), func(i int) string { return metrics.Stage(i).String() }),
		"lane":         vals(int(limits.NumLanes), func(i int) string { return limits.Lane(i).String() }),
		"kind":         vals(int(command.NumKinds), func(i int) string { return command.Kind(i).String() }),
		"decision":     vals(int(metrics.NumDecisions), func(i int) string { return metrics.Decision(i).String() }),
		"result":       {"hit", "miss", "joined"},
		"status_class": vals(int(helix.NumStatus), func(i int) string { return helix.StatusClass(i).String() }),
		"reused":       {"true", "false"},
		"outcome":      vals(int(bus.NumOutcomes), func(i int) string { return bus.Outcome(i).String() }),
		"reason": append(append([]string{""},
			vals(int(bus.NumNackReasons), func(i int) string { return bus.NackReason(i).String() })...),
			vals(int(bus.NumDropReasons), func(i int) string { return bus.DropReason(i).String() })...),
		"replica":     {"A"},
		"after":       {metrics.DecisionNotExecuted.String(), metrics.DecisionOutcomeUnknown.String()},
		"step":        metrics.RolloutSteps[:],
		"proto":       {"HTTP/1", "HTTP/2", "other"},
		"dropped":     {"false", "true"},
		"redelivered": {"false", "true"},
		"class":       vals(int(limits.NumClasses), func(i int) string { return limits.BucketClass(i).String() }),
		"op":          {"invalid", "take", "once", "peek", "refund", "wait-attempt"},
		"answer":      vals(int(metrics.NumCallOutcomes), func(i int) string { return metrics.CallOutcome(i).String() }),
	}
}

// TestMetricsLabelSetsFixed sends traffic on 60 channels through a worker
// and checks, on the gathered registry, that every outgress_ series' labels
// take only the fixed values and that the traffic created no series: the
// set after equals the set created up front.
func TestMetricsLabelSetsFixed(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.metrics.RegisterPause("A", e.pause); err != nil {
		t.Fatal(err)
	}
	series := func() []string {
		t.Helper()
		mfs, err := e.metrics.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		allowed := allowedLabels()
		var out []string
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "outgress_") {
				continue
			}
			for _, m := range mf.GetMetric() {
				id := mf.GetName()
				for _, lp := range m.GetLabel() {
					if !slices.Contains(allowed[lp.GetName()], lp.GetValue()) {
						t.Errorf("%s: label %s=%q is not one of the fixed values", mf.GetName(), lp.GetName(), lp.GetValue())
					}
					id += "," + lp.GetName() + "=" + lp.GetValue()
				}
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	before := series()
	for i := range 60 {
		id := strconv.Itoa(5000 + i)
		e.seed(t, id, i%5 == 0)
		for _, body := range []string{chat(id), `{"kind":"api","method":"GET","path":"/helix/users?id=` + id + `"}`, chat("999" + id)} {
			e.process(t, limits.Lane(i%2), body)
		}
	}
	if after := series(); !slices.Equal(before, after) {
		t.Errorf("traffic changed the series: %d before, %d after", len(before), len(after))
	}
	// 60 standard/premium chats, 60 API calls, 60 unknown channels.
	if got := e.metrics.Commands(limits.LaneStandard, command.KindChat) + e.metrics.Commands(limits.LanePremium, command.KindChat); got != 120 {
		t.Errorf("%d chat commands counted, want 120", got)
	}
	if got := e.metrics.CacheLookups(channels.CacheMiss); got != 120 {
		t.Errorf("%d cache misses, want 120 (60 channels, 60 unknown)", got)
	}
}
