package canary

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// A Step is one step of a roll: one replica put on the new version, then
// judged by the gates.
type Step struct {
	// Replica names the replica the step deploys.
	Replica string
	// Run deploys the new version to the replica and returns the gates'
	// report over a window after it (a step may judge several windows, the
	// canary's rollout steps say; it returns the first failing report, or
	// the last).
	Run func(ctx context.Context) (*Report, error)
	// Rollback, when set, puts the replica back on the old version after
	// its gate failed.
	Rollback func(ctx context.Context) error
}

// RollResult is what a roll did.
type RollResult struct {
	// Rolled names the replicas on the new version whose gates passed, in
	// order.
	Rolled []string
	// Reports is each step's report, one per step that ran.
	Reports []*Report
	// Failed names the replica whose gate failed (or whose step returned
	// an error) and stopped the roll; "" when the roll completed.
	Failed string
	// RolledBack reports whether Failed was put back on the old version.
	RolledBack bool
	// Left names the replicas whose steps never started: still on the old
	// version.
	Left []string
}

// Complete reports whether every step ran and passed its gates.
func (r *RollResult) Complete() bool { return r.Failed == "" }

// Roll runs the steps in order, one replica at a time (the plan's "canary
// one replica, then roll the fleet"), with the gates between each: it
// stops at the first step whose gate fails or whose Run fails, rolls that
// replica back when the step has a Rollback, and starts no later step, so
// the rest stay on the old version. It writes one line per step to out
// (which may be nil) and a last line that says where the roll ended. The
// error is a step's or a rollback's; a failing gate is not an error.
func Roll(ctx context.Context, steps []Step, out io.Writer) (*RollResult, error) {
	if out == nil {
		out = io.Discard
	}
	res := &RollResult{}
	for i, s := range steps {
		fmt.Fprintf(out, "Roll step %d of %d: replica %s to the new version\n", i+1, len(steps), s.Replica)
		rep, err := s.Run(ctx)
		if err == nil && rep == nil {
			err = fmt.Errorf("replica %s's step returned no report", s.Replica)
		}
		if rep != nil {
			res.Reports = append(res.Reports, rep)
		}
		if err == nil && rep.Pass {
			res.Rolled = append(res.Rolled, s.Replica)
			continue
		}
		res.Failed = s.Replica
		for _, rest := range steps[i+1:] {
			res.Left = append(res.Left, rest.Replica)
		}
		why := "its gates failed"
		if err != nil {
			why = "its step failed: " + err.Error()
		}
		back := "left as it is"
		if s.Rollback != nil {
			if rerr := s.Rollback(ctx); rerr != nil {
				back = "its rollback failed: " + rerr.Error()
				err = fmt.Errorf("rolling back replica %s: %w", s.Replica, rerr)
			} else {
				res.RolledBack, back = true, "rolled back to the old version"
			}
		}
		fmt.Fprintf(out, "Roll stopped at step %d of %d: replica %s %s, %s; on the new version: %s; left on the old version: %s\n",
			i+1, len(steps), s.Replica, why, back, list(res.Rolled), list(res.Left))
		return res, err
	}
	fmt.Fprintf(out, "Roll complete: %s on the new version, every gate passed at every step\n", list(res.Rolled))
	return res, nil
}

func list(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
