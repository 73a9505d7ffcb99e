package canary

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRoll: a roll of three replicas whose second gate fails stops there:
// the second is rolled back, the third's step never starts and it is named
// as left on the old version; a roll whose gates all pass reaches all
// three, in order; a step's error stops the roll as a failing gate does,
// and is returned.
func TestRoll(t *testing.T) {
	type call struct{ replica, what string }
	roll := func(fail string, stepErr error) (res *RollResult, calls []call, out string, err error) {
		var steps []Step
		for _, name := range []string{"A", "B", "C"} {
			steps = append(steps, Step{Replica: name,
				Run: func(context.Context) (*Report, error) {
					calls = append(calls, call{name, "run"})
					if name == fail && stepErr != nil {
						return nil, stepErr
					}
					return &Report{Pass: name != fail}, nil
				},
				Rollback: func(context.Context) error {
					calls = append(calls, call{name, "rollback"})
					return nil
				}})
		}
		var b strings.Builder
		res, err = Roll(context.Background(), steps, &b)
		return res, calls, b.String(), err
	}

	res, calls, out, err := roll("B", nil)
	want := []call{{"A", "run"}, {"B", "run"}, {"B", "rollback"}}
	if err != nil || !slices.Equal(calls, want) || res.Complete() || res.Failed != "B" || !res.RolledBack ||
		!slices.Equal(res.Rolled, []string{"A"}) || !slices.Equal(res.Left, []string{"C"}) || len(res.Reports) != 2 {
		t.Errorf("gate of step 2 fails: %+v, %v, calls %v; want calls %v, A rolled, B failed and rolled back, C left", res, err, calls, want)
	}
	if !strings.Contains(out, "Roll stopped at step 2 of 3: replica B its gates failed, rolled back to the old version; on the new version: A; left on the old version: C") ||
		strings.Contains(out, "step 3") {
		t.Errorf("the roll's lines:\n%s", out)
	}

	res, calls, out, err = roll("", nil)
	want = []call{{"A", "run"}, {"B", "run"}, {"C", "run"}}
	if err != nil || !slices.Equal(calls, want) || !res.Complete() || !slices.Equal(res.Rolled, []string{"A", "B", "C"}) || len(res.Left) != 0 || len(res.Reports) != 3 {
		t.Errorf("every gate passes: %+v, %v, calls %v; want calls %v, all three rolled", res, err, calls, want)
	}
	if !strings.Contains(out, "Roll complete: A, B, C on the new version") {
		t.Errorf("the roll's lines:\n%s", out)
	}

	boom := errors.New("deploy failed")
	res, calls, _, err = roll("B", boom)
	if !errors.Is(err, boom) || res.Failed != "B" || !slices.Equal(res.Left, []string{"C"}) || len(calls) != 3 || calls[2] != (call{"B", "rollback"}) {
		t.Errorf("step 2 errs: %+v, %v, calls %v; want the error, B failed and rolled back, C left", res, err, calls)
	}
}

// TestShellStepsRollBackFailingReplica: `canary -deploy CMD -rollback CMD`
// over three replicas whose second fails its gate. The shell commands
// (which append to a log what they did, to which replica, at which step)
// deploy the first two, roll the second back, and never touch the third.
// A roll without the failure deploys all three and rolls nothing back.
func TestShellStepsRollBackFailingReplica(t *testing.T) {
	roll := func(fail string) (lines []string, res *RollResult, err error) {
		log := filepath.Join(t.TempDir(), "log")
		deploy := `echo "deploy $OUTGRESS_ROLL_REPLICA $OUTGRESS_ROLL_STEP" >> ` + log
		rollback := `echo "rollback $OUTGRESS_ROLL_REPLICA $OUTGRESS_ROLL_STEP" >> ` + log
		steps := ShellSteps([]string{"http://a/metrics", "http://b/metrics", "http://c/metrics"}, deploy, rollback, io.Discard,
			func(_ context.Context, replica string) (*Report, error) {
				return &Report{Pass: replica != fail}, nil
			})
		res, err = Roll(context.Background(), steps, nil)
		b, rerr := os.ReadFile(log)
		if rerr != nil {
			t.Fatal(rerr)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n"), res, err
	}
	lines, res, err := roll("http://b/metrics")
	want := []string{"deploy http://a/metrics 1", "deploy http://b/metrics 2", "rollback http://b/metrics 2"}
	if err != nil || !slices.Equal(lines, want) || !res.RolledBack || res.Failed != "http://b/metrics" || !slices.Equal(res.Left, []string{"http://c/metrics"}) {
		t.Errorf("b's gate fails: commands ran %q, result %+v, %v; want %q, b rolled back, c left", lines, res, err, want)
	}
	lines, res, err = roll("")
	want = []string{"deploy http://a/metrics 1", "deploy http://b/metrics 2", "deploy http://c/metrics 3"}
	if err != nil || !slices.Equal(lines, want) || !res.Complete() || res.RolledBack {
		t.Errorf("every gate passes: commands ran %q, result %+v, %v; want %q", lines, res, err, want)
	}
}
