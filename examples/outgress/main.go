// Command outgress is a runnable example of admit's first user: the hot path
// of an egress worker that takes chat and API commands off a message bus and
// sends them to a third-party HTTP API (Twitch Helix) under its rate limits,
// keeping part of every shared budget for premium traffic.
//
//	cd examples/outgress && go run .                              # in-process miniredis, embedded NATS
//	cd examples/outgress && VALKEY_ADDR=127.0.0.1:6379 go run .   # a real Valkey
//
// It starts two worker replicas, a fake Helix server and NATS JetStream,
// pushes a mix of standard and premium chat plus Helix calls through them for
// a few seconds, pauses and resumes sending mid-run (a management request
// that one replica executes), and prints the Valkey commands each message
// cost by path, the decisions by lane, the delivery outcomes and the latency
// of each stage. See README.md.
//
// Its subcommands run a fleet on a shared Valkey and NATS (VALKEY_ADDR and
// NATS_URL):
//
//	go run . worker -name A -metrics 127.0.0.1:9101   # one replica, until interrupted
//	go run . publish -rate 300 -for 1m                # the demo's traffic for it
//	go run . mgmt -version N pause|resume             # a management request against the version seen, answered by one replica
//	go run . mgmt status                              # the state in Valkey and its version
//	go run . canary -baseline URL -canary URL         # the rollout's gates over two replicas' /metrics
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/admitkit/admit/examples/outgress/canary"
	"github.com/admitkit/admit/examples/outgress/demo"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/replica"
	"github.com/admitkit/admit/examples/outgress/rollout"
	"github.com/admitkit/admit/examples/outgress/worker"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "canary":
			os.Exit(canary.Command(os.Args[2:]))
		case "worker":
			os.Exit(replica.Command(os.Args[2:]))
		case "mgmt":
			os.Exit(mgmt.Command(os.Args[2:]))
		case "publish":
			os.Exit(demo.PublishCommand(os.Args[2:]))
		}
	}
	cfg := demo.Default()
	flag.StringVar(&cfg.MetricsAddr, "metrics", "127.0.0.1:0", "serve Prometheus metrics on http://`addr`/metrics")
	flag.BoolVar(&cfg.Hold, "hold", false, "after the report, keep serving /metrics until interrupted")
	off := flag.String("off", "none", "rollout `steps` switched off in both replicas: none, all, or a comma-separated list of "+
		"metrics, transport, ordered_script, pause_snapshot, nack_suppression, precomputed (README, \"Rollout steps\")")
	window := flag.Duration("rollout", 1500*time.Millisecond, "size of each rollout step's canary window, as publishing time at "+strconv.Itoa(rolloutRate)+
		" messages/s (a window is that many messages, whatever the time they take; 0 skips the rollout)")
	flag.Parse()
	var err error
	if cfg.Off, err = worker.ParseSteps(*off); err != nil {
		fmt.Fprintln(os.Stderr, "outgress:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := demo.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress:", err)
		os.Exit(1)
	}
	if res == nil {
		return
	}
	res.Print(os.Stdout)
	if *window <= 0 {
		return
	}
	fmt.Println()
	fmt.Println("8. Rollout: a baseline replica with every step off beside a fleet of " + strconv.Itoa(rollout.DemoReplicas) + " replicas, every step off, rolled")
	messages := int(window.Seconds() * rolloutRate)
	fmt.Println("   one at a time: the canary turns the six steps on one at a time, then each other replica takes every")
	fmt.Println("   step at once, all on one Valkey and one stream (all consume it); a gate table after each window,")
	fmt.Println("   and the roll stops at the first failing gate, leaving the rest on the old version. A window is " + strconv.Itoa(messages) + " messages")
	fmt.Println("   (" + window.String() + " at " + strconv.Itoa(rolloutRate) + "/s), more until the baseline and the replica judged have 20 warm ones per lane;")
	fmt.Println("   the canary program (package canary; `go run . canary` against real replicas) scrapes both /metrics")
	fmt.Println("   over each window and prints the plan's gates. Caveats: latency here is the embedded stand-ins'")
	fmt.Println("   (miniredis, a loopback fake Helix), not representative of production, so the demo tolerates a")
	fmt.Println("   latency " + strconv.Itoa(rollout.DemoLatencyTolerance) + " buckets (about 2x) slower, which production does not; a window is a few hundred")
	fmt.Println("   messages, so rates carry a slack of three standard errors; on miniredis the server's script runs")
	fmt.Println("   cannot be read (no INFO commandstats), so the workers' counters are not checked against it.")
	if _, err := rollout.Run(ctx, rolloutRate, messages, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "outgress: rollout:", err)
		os.Exit(1)
	}
}

// rolloutRate is the rollout windows' publishing rate.
const rolloutRate = 300
