package canary

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/valkey-io/valkey-go"
)

// Command is `outgress canary`: the gates over a window of two running
// replicas' /metrics. It returns the exit code: 1 when a gate fails, 2 on
// bad usage.
func Command(args []string) int {
	fs := flag.NewFlagSet("canary", flag.ContinueOnError)
	base := fs.String("baseline", "", "the baseline replica's metrics `URL` (http://host:port/metrics)")
	can := fs.String("canary", "", "the canary replica's metrics `URL`")
	window := fs.Duration("window", time.Minute, "how long to observe both")
	addr := fs.String("valkey", "", "the Valkey `host:port` both replicas use, to check the workers' script runs against its INFO commandstats (optional)")
	inFlight := fs.Int("in-flight", 64, "script runs the workers' and the server's counts may differ by (calls in flight at the window's edges)")
	confidence := fs.Float64("latency-confidence", 0.99, "the latency gate fails when its one-sided rank test finds the canary slower at this `confidence`")
	tolerance := fs.Int("latency-tolerance", 0, "histogram `buckets` (about 41% each) the canary's pre-HTTP latency may be slower by; production: 0")
	minSamples := fs.Int("latency-min-samples", 30, "the fewest pre-HTTP observations a side the latency gate judges (fewer: no data)")
	if err := fs.Parse(args); err != nil || *base == "" || *can == "" || *confidence <= 0 || *confidence >= 1 || *tolerance < 0 || *minSamples < 2 {
		fmt.Fprintln(os.Stderr, "usage: outgress canary -baseline URL -canary URL [-window 1m] [-valkey host:port]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var srv Server
	if *addr != "" {
		c, err := fleetenv.DialAddr(*addr)()
		if err != nil {
			fmt.Fprintln(os.Stderr, "outgress canary:", err)
			return 2
		}
		defer c.Close()
		srv = ValkeyScriptRuns(c)
	}
	w, err := Watch(ctx, *base, *can, *window, time.Second, srv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress canary:", err)
		return 2
	}
	rep := Evaluate(w, Bounds{InFlight: *inFlight, LatencyConfidence: *confidence, LatencyTolerance: *tolerance, LatencyMinSamples: *minSamples})
	fmt.Printf("Canary gates over %v (baseline %s, canary %s)\n", w.Duration.Round(time.Millisecond), *base, *can)
	rep.Print(os.Stdout)
	if !rep.Pass {
		return 1
	}
	return 0
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
