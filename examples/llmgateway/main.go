// Command llmgateway is an HTTP gateway that keeps a tokens-per-minute
// budget in front of a language model, with a premium lane, on
// admithttp. It runs against VALKEY_ADDR (host:port) when set, else against
// an in-process miniredis, so it needs nothing installed:
//
//	go run ./examples/llmgateway                      # replay a demo workload over HTTP
//	go run ./examples/llmgateway -addr 127.0.0.1:8080 # serve until interrupted
//	curl -i -H 'X-API-Key: key-standard' -d '{"prompt_tokens":500,"max_tokens":2000}' 127.0.0.1:8080/v1/chat
//
// The model may be sent 12,000 tokens a minute (the shared bucket).
// Standard requests pass the standard lane's own bucket of 6,000 tokens a
// minute first, then the shared one; premium requests use the shared bucket
// alone, so standard traffic can never take more than half of it.
//
// Beside its tokens per minute, each organisation may have at most 4
// requests with the model at once: a slot of its own concurrency limit,
// taken in the same decision as the tokens (nothing is taken when either
// refuses) and freed when the answer is done, or at the latest when its
// 2-minute lease expires if the gateway dies. The fields report it as the
// "inflight" policy, qu="concurrent-requests"; a fifth request in flight
// is a 429 naming it, and takes no tokens.
//
// The gateway cannot know a request's cost before the model answers, so it
// reserves an estimate (the prompt's tokens plus max_tokens, the most the
// answer may use) as the buckets' Cost, calls the model, and refunds the
// part of the estimate the answer did not use. admithttp answers refusals
// (429, Retry-After, the IETF RateLimit-Policy and RateLimit fields, a
// problem+json body) and puts the fields on admitted responses too. The
// fields count model tokens, not requests: every policy carries
// qu="llm-tokens", the gateway's own unit (the draft's registry has none
// for them), so that no client reads q=6000 as six thousand requests. A
// refusal by the shared bucket charges the standard lane nothing. A
// tighter standard lane (4,500 tokens a minute) runs in shadow, and the
// demo reports what it would have refused.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/admitkit/admit/examples/internal/demostore"
	"github.com/valkey-io/valkey-go"
)

func main() {
	addr := flag.String("addr", "", "serve on host:port until interrupted, instead of replaying the demo workload")
	flag.Parse()
	if err := start(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "llmgateway:", err)
		os.Exit(1)
	}
}

func start(addr string) error {
	client, where, stop, err := demostore.Connect(time.Time{}) // the machine's clock
	if err != nil {
		return err
	}
	defer stop()
	g, err := newGateway(client, "llmgateway:")
	if err != nil {
		return err
	}
	if addr == "" {
		fmt.Printf("admit LLM gateway on %s\n", where)
		_, err = run(context.Background(), os.Stdout, client, g)
		return err
	}
	fmt.Printf("admit LLM gateway on %s, serving POST http://%s/v1/chat\n", where, addr)
	return (&http.Server{Addr: addr, Handler: g, ReadHeaderTimeout: 10 * time.Second}).ListenAndServe()
}

// The workload: what clients send, in order. A tokenizer would count the
// prompt's tokens; here they are given.
var workload = []struct {
	ID string
	chatRequest
}{
	{"p1", chatRequest{Lane: "premium", PromptTokens: 1500, MaxTokens: 4000}},
	{"s1", chatRequest{Lane: "standard", PromptTokens: 500, MaxTokens: 2000}},
	{"s2", chatRequest{Lane: "standard", PromptTokens: 800, MaxTokens: 2000}},
	{"s3", chatRequest{Lane: "standard", PromptTokens: 300, MaxTokens: 1500}}, // the standard lane is spent
	{"p2", chatRequest{Lane: "premium", PromptTokens: 300, MaxTokens: 1000}},
	{"s4", chatRequest{Lane: "standard", PromptTokens: 200, MaxTokens: 800}}, // own bucket admits, shared refuses
	{"s5", chatRequest{Lane: "standard", PromptTokens: 100, MaxTokens: 200}},
	{"p3", chatRequest{Lane: "premium", PromptTokens: 100, MaxTokens: 400}}, // the shared bucket is spent
}

// summary is what a run did, for the tests.
type summary struct {
	admitted, refusedByLane, refusedByShared      int
	refunded, candidateRefused, candidateAdmitted int64
}

// run serves g on a loopback port and sends it the workload, printing what
// happens to w. It first deletes the gateway's own keys, so every run
// starts from full buckets.
func run(ctx context.Context, w io.Writer, client valkey.Client, g *gateway) (summary, error) {
	if err := client.Do(ctx, client.B().Del().Key(g.laneKey, g.sharedKey).Build()).Error(); err != nil {
		return summary{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return summary{}, err
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(w, "  shared bucket (the model's budget)   %s\n  standard lane's own bucket           %s\n", sharedSpec, laneSpec)
	fmt.Fprintf(w, "  candidate lane, in shadow            %s\n\n", candidateSpec)

	var sum summary
	for _, c := range workload {
		body, _ := json.Marshal(c.chatRequest)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat", bytes.NewReader(body))
		req.Header.Set("X-API-Key", "key-"+c.Lane)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return sum, fmt.Errorf("%s: %w", c.ID, err)
		}
		text, _ := io.ReadAll(resp.Body)
		text = bytes.TrimSpace(text)
		resp.Body.Close()
		var problem struct {
			Violated []string `json:"violated-policies"`
		}
		switch {
		case resp.StatusCode == http.StatusOK:
			sum.admitted++
		case resp.StatusCode == http.StatusTooManyRequests && json.Unmarshal(text, &problem) == nil && len(problem.Violated) == 1:
			text = []byte("refused by the " + problem.Violated[0] + " bucket")
			if problem.Violated[0] == "standard" {
				sum.refusedByLane++
			} else {
				sum.refusedByShared++
			}
		default:
			return sum, fmt.Errorf("%s: unexpected %s: %s", c.ID, resp.Status, text)
		}
		fmt.Fprintf(w, "%-3s %-8s reserve %4d tokens: %d, %s\n", c.ID, c.Lane, c.estimate(), resp.StatusCode, text)
		for _, f := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if v := resp.Header.Get(f); v != "" {
				fmt.Fprintf(w, "      %s: %s\n", f, v)
			}
		}
	}
	sum.refunded, sum.candidateRefused, sum.candidateAdmitted = g.refunded.Load(), g.candidateRefused.Load(), g.candidateRefusedAdmitted.Load()
	fmt.Fprintf(w, "\n%d admitted, %d refused by the standard lane's bucket, %d by the shared bucket; %d unused tokens refunded over all buckets\n",
		sum.admitted, sum.refusedByLane, sum.refusedByShared, sum.refunded)
	fmt.Fprintf(w, "the candidate lane would have refused %d of the %d standard requests, %d of them admitted today\n",
		sum.candidateRefused, g.candidateSaw.Load(), sum.candidateAdmitted)
	return sum, nil
}
