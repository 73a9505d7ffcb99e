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
// a few seconds, pauses and resumes sending mid-run, and prints the Valkey
// commands each message cost by path, the decisions by lane, the delivery
// outcomes and the latency of each stage. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/admitkit/admit/examples/outgress/worker"
)

func main() {
	cfg := defaultDemo()
	flag.StringVar(&cfg.MetricsAddr, "metrics", "127.0.0.1:0", "serve Prometheus metrics on http://`addr`/metrics")
	flag.BoolVar(&cfg.Hold, "hold", false, "after the report, keep serving /metrics until interrupted")
	off := flag.String("off", "none", "rollout `steps` switched off in both replicas: none, all, or a comma-separated list of "+
		"metrics, transport, ordered_script, pause_snapshot, nack_suppression, precomputed (README, \"Rollout steps\")")
	flag.Parse()
	var err error
	if cfg.Off, err = worker.ParseSteps(*off); err != nil {
		fmt.Fprintln(os.Stderr, "outgress:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := runDemo(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outgress:", err)
		os.Exit(1)
	}
	if res != nil {
		res.Print(os.Stdout)
	}
}
