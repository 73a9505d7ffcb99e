package canary

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/valkey-io/valkey-go"
)

// Command is `outgress canary`: the gates over a window of two running
// replicas' /metrics, or a roll: several canary replicas in order, each
// deployed by the -deploy command, then gated against the baseline, the
// roll stopping at the first failing gate. It returns the exit code: 1
// when a gate fails, 2 on bad usage or an error.
func Command(args []string) int {
	fs := fleetenv.NewCommand("canary")
	base := fs.String("baseline", "", "the baseline replica's metrics `URL` (http://host:port/metrics), on the old version")
	can := fs.String("canary", "", "the canary replica's metrics `URLs`, comma-separated: a roll, in that order")
	deploy := fs.String("deploy", "", "a shell `command` that puts the new version on one replica, run before each step's window "+
		"with OUTGRESS_ROLL_REPLICA (its metrics URL) and OUTGRESS_ROLL_STEP (1, 2, ...) set; required for more than one canary")
	rollback := fs.String("rollback", "", "a shell `command` that puts one replica back on the old version, run when its gate fails "+
		"(or its -deploy fails), with the same variables as -deploy; without it a failing replica is left as it is")
	window := fs.Duration("window", time.Minute, "how long to observe both")
	othersFlag := fs.String("others", "", "the metrics `URLs`, comma-separated, of the fleet's other replicas on the -valkey server (their script runs are the server's too)")
	addr := fs.String("valkey", "", "the Valkey `host:port` both replicas use, to check the workers' script runs against its INFO commandstats (optional)")
	inFlight := fs.Int("in-flight", 64, "script runs the workers' and the server's counts may differ by (calls in flight at the window's edges)")
	confidence := fs.Float64("latency-confidence", 0.99, "the latency gate fails when its one-sided rank test finds the canary slower at this `confidence`")
	tolerance := fs.Int("latency-tolerance", 0, "histogram `buckets` (about 41% each) the canary's pre-HTTP latency may be slower by; production: 0")
	minSamples := fs.Int("latency-min-samples", 30, "the fewest pre-HTTP observations a side the latency gate judges (fewer: no data)")
	err := fs.Parse(args)
	canaries := strings.Split(*can, ",")
	if err != nil || *base == "" || *can == "" || slices.Contains(canaries, "") || len(canaries) > 1 && *deploy == "" || *rollback != "" && *deploy == "" ||
		*confidence <= 0 || *confidence >= 1 || *tolerance < 0 || *minSamples < 2 {
		return fs.Usage("outgress canary -baseline URL -canary URL[,URL...] [-deploy CMD [-rollback CMD]] [-window 1m] [-valkey host:port]")
	}
	ctx, stop := fs.Context()
	defer stop()
	var srv Server
	if *addr != "" {
		c, err := fleetenv.DialAddr(*addr)()
		if err != nil {
			return fs.Fail(2, err)
		}
		defer c.Close()
		srv = ValkeyScriptRuns(c)
	}
	bounds := Bounds{InFlight: *inFlight, LatencyConfidence: *confidence, LatencyTolerance: *tolerance, LatencyMinSamples: *minSamples}
	steps := ShellSteps(canaries, *deploy, *rollback, os.Stderr, func(ctx context.Context, url string) (*Report, error) {
		var others []string // every replica on the server but the two judged
		for _, o := range append(slices.Clone(canaries), strings.Split(*othersFlag, ",")...) {
			if o != url && o != "" {
				others = append(others, o)
			}
		}
		wa, err := Begin(ctx, *base, url, srv, others...)
		if err != nil {
			return nil, err
		}
		w, err := wa.Until(ctx, *window, time.Second, nil, 0)
		if err != nil {
			return nil, err
		}
		rep := Evaluate(w, bounds)
		fmt.Printf("Canary gates over %v (baseline %s, canary %s)\n", w.Duration.Round(time.Millisecond), *base, url)
		rep.Print(os.Stdout)
		return rep, nil
	})
	var out io.Writer
	if len(steps) > 1 {
		out = os.Stdout
	}
	res, err := Roll(ctx, steps, out)
	switch {
	case err != nil:
		return fs.Fail(2, err)
	case !res.Complete():
		return 1
	}
	return 0
}

// ShellSteps are a roll's steps over the replicas named by their metrics
// URLs: each runs the shell command deploy (none when "") and then judge;
// a step whose gate fails (or whose deploy fails) runs the shell command
// rollback, when not "". Both commands run under sh -c with
// OUTGRESS_ROLL_REPLICA (the URL) and OUTGRESS_ROLL_STEP (1, 2, ...) set,
// their output to log.
func ShellSteps(replicas []string, deploy, rollback string, log io.Writer, judge func(ctx context.Context, replica string) (*Report, error)) []Step {
	steps := make([]Step, len(replicas))
	for i, url := range replicas {
		shell := func(ctx context.Context, flag, command string) error {
			cmd := exec.CommandContext(ctx, "sh", "-c", command)
			cmd.Env = append(os.Environ(), "OUTGRESS_ROLL_REPLICA="+url, "OUTGRESS_ROLL_STEP="+strconv.Itoa(i+1))
			cmd.Stdout, cmd.Stderr = log, log
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s for replica %s: %w", flag, url, err)
			}
			return nil
		}
		steps[i] = Step{Replica: url, Run: func(ctx context.Context) (*Report, error) {
			if deploy != "" {
				if err := shell(ctx, "-deploy", deploy); err != nil {
					return nil, err
				}
			}
			return judge(ctx, url)
		}}
		if rollback != "" {
			steps[i].Rollback = func(ctx context.Context) error { return shell(ctx, "-rollback", rollback) }
		}
	}
	return steps
}

// ValkeyScriptRuns counts script runs from INFO commandstats of c's server.
func ValkeyScriptRuns(c valkey.Client) Server {
	return CommandStats(func(ctx context.Context) (string, error) {
		info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil || !strings.Contains(info, "cmdstat_") {
			return "", fmt.Errorf("no INFO commandstats (miniredis)")
		}
		return info, nil
	})
}
