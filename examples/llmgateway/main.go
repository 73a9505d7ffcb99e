// Command llmgateway shows admit as a tokens-per-minute budget in front of a
// language model, with a premium lane. It runs against VALKEY_ADDR
// (host:port) when set, else against an in-process miniredis, so it needs
// nothing installed:
//
//	go run ./examples/llmgateway
//	VALKEY_ADDR=127.0.0.1:6379 go run ./examples/llmgateway
//
// The model may be sent 12,000 tokens a minute (the shared bucket).
// Standard requests pass the standard lane's own bucket of 6,000 tokens a
// minute first, then the shared one; premium requests use the shared bucket
// alone, so standard traffic can never take more than half of it.
//
// The gateway cannot know a request's cost before the model answers, so it
// reserves an estimate (the prompt's tokens plus max_tokens, the most the
// answer may use) with Request.Cost, calls the model, and refunds the part
// of the estimate the answer did not use. Every response carries the IETF
// RateLimit-Policy and RateLimit headers (draft-ietf-httpapi-ratelimit-headers),
// and every refusal a Retry-After, all filled from the Decision.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/admitkit/admit"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

func main() {
	client, where, stop, err := connect()
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmgateway:", err)
		os.Exit(1)
	}
	defer stop()
	fmt.Printf("admit LLM gateway on %s\n", where)
	if _, err := run(context.Background(), os.Stdout, client, "llmgateway:"); err != nil {
		stop()
		fmt.Fprintln(os.Stderr, "llmgateway:", err)
		os.Exit(1)
	}
}

// The workload: what clients send, in order. A tokenizer would count the
// prompt's tokens; here they are given.
var workload = []chatRequest{
	{ID: "p1", Lane: premium, PromptTokens: 1500, MaxTokens: 4000},
	{ID: "s1", Lane: standard, PromptTokens: 500, MaxTokens: 2000},
	{ID: "s2", Lane: standard, PromptTokens: 800, MaxTokens: 2000},
	{ID: "s3", Lane: standard, PromptTokens: 300, MaxTokens: 1500}, // the standard lane is spent
	{ID: "p2", Lane: premium, PromptTokens: 300, MaxTokens: 1000},
	{ID: "s4", Lane: standard, PromptTokens: 200, MaxTokens: 800}, // own bucket admits, shared refuses
	{ID: "s5", Lane: standard, PromptTokens: 100, MaxTokens: 200},
	{ID: "p3", Lane: premium, PromptTokens: 100, MaxTokens: 400}, // the shared bucket is spent
}

// summary is what a run did, for the tests.
type summary struct {
	admitted, refusedByLane, refusedByShared int
	refunded                                 int // tokens given back, every bucket together
	waitGaveUp                               bool
}

// run sends the workload through a gateway whose buckets live under
// prefix, printing what happens to w. It first deletes the gateway's own
// keys, so every run starts from full buckets.
func run(ctx context.Context, w io.Writer, client valkey.Client, prefix string) (summary, error) {
	g := newGateway(client, prefix)
	if err := client.Do(ctx, client.B().Del().Key(g.laneKey, g.sharedKey).Build()).Error(); err != nil {
		return summary{}, err
	}
	fmt.Fprintf(w, "  shared bucket (the model's budget)   %s\n", sharedSpec)
	fmt.Fprintf(w, "  standard lane's own bucket           %s\n\n", laneSpec)

	var sum summary
	for _, req := range workload {
		res, err := g.handle(ctx, req)
		if err != nil {
			return sum, fmt.Errorf("%s: %w", req.ID, err)
		}
		fmt.Fprintf(w, "%-3s %-8s reserve %4d tokens: %s\n", req.ID, req.Lane, req.estimate(), res.outcome)
		for _, h := range res.headers {
			fmt.Fprintf(w, "      %s\n", h)
		}
		sum.refunded += res.refunded
		switch res.decision.Denied {
		case 0:
			sum.admitted++
		case 1:
			if req.Lane == standard {
				sum.refusedByLane++
			} else {
				sum.refusedByShared++
			}
		case 2:
			sum.refusedByShared++
		}
	}

	// A client that would rather wait a second than get a 429: Wait
	// returns at once, without sleeping, when the tokens cannot come
	// before its deadline.
	retry := workload[len(workload)-1]
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	first, second := g.requests(retry)
	d, err := g.lim.Wait(wctx, first, second)
	switch {
	case errors.Is(err, context.DeadlineExceeded) && errors.Is(err, admit.ErrNotExecuted):
		sum.waitGaveUp = true
		fmt.Fprintf(w, "\n%s again, willing to wait 1s: Wait gave up at once, the %s bucket holds %d tokens only in %v\n",
			retry.ID, bucketName(retry, int(d.Denied)), retry.estimate(), d.RetryAfter.Round(time.Millisecond))
	case err != nil:
		return sum, err
	default:
		return sum, fmt.Errorf("%s: Wait admitted %v, but the shared bucket cannot hold %d tokens within a second", retry.ID, d, retry.estimate())
	}
	fmt.Fprintf(w, "\n%d admitted, %d refused by the standard lane's bucket, %d by the shared bucket; %d tokens refunded over all buckets\n",
		sum.admitted, sum.refusedByLane, sum.refusedByShared, sum.refunded)
	return sum, nil
}

// connect dials VALKEY_ADDR, or starts an in-process miniredis.
func connect() (valkey.Client, string, func(), error) {
	opt := valkey.ClientOption{DisableCache: true}
	where, stopServer := "", func() {}
	if addr := os.Getenv("VALKEY_ADDR"); addr != "" {
		opt.InitAddress = []string{addr}
		where = "Valkey at " + addr
	} else {
		srv, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, err
		}
		// miniredis answers CLUSTER SLOTS; without this valkey-go would treat
		// it as a cluster.
		opt.InitAddress, opt.ForceSingleClient = []string{srv.Addr()}, true
		where = "an in-process miniredis (set VALKEY_ADDR=host:port to use your Valkey)"
		stopServer = srv.Close
	}
	c, err := valkey.NewClient(opt)
	if err != nil {
		stopServer()
		return nil, "", nil, fmt.Errorf("connect: %w", err)
	}
	return c, where, func() { c.Close(); stopServer() }, nil
}
