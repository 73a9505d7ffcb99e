package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/valkey-io/valkey-go"
)

// Tokens per minute, as a rate in tokens per second and a burst of one
// minute's worth: an idle budget may be spent at once, then refills evenly.
var (
	sharedSpec    = admit.MustSpec(12000.0/60, 12000) // the model's budget
	laneSpec      = admit.MustSpec(6000.0/60, 6000)   // what standard clients may use of it
	candidateSpec = admit.MustSpec(4500.0/60, 4500)   // a tighter lane, tried in shadow
)

// inflightSpec is the concurrency limit of each organisation: at most 4 of
// its requests with the model at once, whatever its token budget. A lease
// lasts 2 minutes, longer than the model's slowest answer, so a gateway
// that dies mid-request holds its slot no longer than that; the middleware
// releases the lease as soon as the answer (or a panic) is done.
var inflightSpec = admit.MustConcurrency(4, 2*time.Minute)

// tokenUnit is the quota unit of every bucket: what the RateLimit fields'
// q and r count. Without it, they would say "requests" (the draft's
// default), and a client would read a budget of 6,000 model tokens as 6,000
// requests. The draft's registry has no unit for a language model's tokens,
// so this one is the gateway's own: a client that does not know it knows
// at least that q and r are not requests, and the gateway's API
// documentation says what they are.
const tokenUnit = "llm-tokens"

// A client is who an API key belongs to: its organisation and its lane.
type client struct{ org, lane string }

// apiKeys gives each client its organisation and lane. Premium clients draw
// on the shared bucket alone; standard clients first on the lane's own,
// smaller bucket, so that a refused standard request never takes from the
// shared one. Every organisation has its own concurrency limit.
var apiKeys = map[string]client{
	"key-premium":    {org: "acme", lane: "premium"},
	"key-standard":   {org: "globex", lane: "standard"},
	"key-standard-2": {org: "initech", lane: "standard"},
}

// A chatRequest is what a client asks of the model.
type chatRequest struct {
	Org          string `json:"-"`
	Lane         string `json:"-"`
	PromptTokens int    `json:"prompt_tokens"` // counted by the model's tokenizer
	MaxTokens    int    `json:"max_tokens"`    // the most the answer may use
}

// estimate is the most the request can cost: what the gateway reserves.
func (r chatRequest) estimate() int { return r.PromptTokens + r.MaxTokens }

type chatKey struct{}

// A gateway admits requests to the model against its token budgets.
type gateway struct {
	http.Handler
	lim                *admit.Limiter
	laneKey, sharedKey string
	inflightKey        string // + the organisation's KeyPart: its lease key
	model              func(chatRequest) answer
	refunded           atomic.Int64 // unused tokens given back, every bucket together
	// What the candidate lane would have refused, of the standard
	// requests it saw, and of those the enforced lane admitted.
	candidateSaw, candidateRefused, candidateRefusedAdmitted atomic.Int64
}

// newGateway keeps its buckets under prefix. The two keys share the hash
// tag {model:fake-1}, so on Valkey Cluster one script decides both.
func newGateway(c valkey.Client, prefix string) (*gateway, error) {
	g := &gateway{lim: admit.New(c), laneKey: prefix + "{model:fake-1}:standard", sharedKey: prefix + "{model:fake-1}:shared",
		inflightKey: prefix + "{model:fake-1}:inflight:", model: complete}
	// With the store down, serving unlimited traffic would overrun the
	// model's budget (its provider answers 429 and bills): refuse.
	limit, err := admithttp.New(g.lim, g.rule, admithttp.Outage{NotExecuted: admithttp.Refuse, OutcomeUnknown: admithttp.Refuse},
		admithttp.WithHeaders(), admithttp.WithShadow(admithttp.Shadow{Name: "lane-4500", Rule: candidate, Report: g.count}))
	if err != nil {
		return nil, err
	}
	g.Handler = parse(limit(http.HandlerFunc(g.complete)))
	return g, nil
}

// parse reads the client's lane and its request into the context, and
// refuses what the limiter should never see: an estimate no bucket of the
// lane can ever hold.
func parse(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req chatRequest
		who, ok := apiKeys[r.Header.Get("X-API-Key")]
		budget := sharedSpec.Burst()
		if who.lane == "standard" {
			budget = laneSpec.Burst()
		}
		switch {
		case !ok:
			http.Error(w, "unknown X-API-Key", http.StatusUnauthorized)
		case r.Method != http.MethodPost || json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req) != nil ||
			req.PromptTokens < 0 || req.MaxTokens < 0:
			http.Error(w, `POST {"prompt_tokens": n, "max_tokens": m}`, http.StatusBadRequest)
		case max(req.PromptTokens, req.MaxTokens) > budget || req.estimate() > budget: // each first: no overflow
			http.Error(w, fmt.Sprintf("prompt_tokens + max_tokens = %d exceeds your lane's budget", req.estimate()), http.StatusRequestEntityTooLarge)
		default:
			req.Org, req.Lane = who.org, who.lane
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), chatKey{}, req)))
		}
	})
}

// rule takes one of the organisation's slots and charges the request its
// estimate: to the standard lane's bucket then the shared one, or to the
// shared one alone; all in one decision, and nothing taken when any part
// refuses. The lease key shares the buckets' hash tag, so on Valkey
// Cluster one script decides them all.
func (g *gateway) rule(r *http.Request) admithttp.Rule {
	req := r.Context().Value(chatKey{}).(chatRequest)
	inflight := &admithttp.Concurrent{Policy: "inflight", Key: g.inflightKey + admit.KeyPart(req.Org), Spec: inflightSpec}
	shared := admithttp.Bucket{Policy: "shared", Key: g.sharedKey, Spec: sharedSpec, Cost: req.estimate(), Unit: tokenUnit}
	if req.Lane == "premium" {
		return admithttp.Rule{First: shared, Concurrent: inflight}
	}
	return admithttp.Rule{First: admithttp.Bucket{Policy: "standard", Key: g.laneKey, Spec: laneSpec, Cost: req.estimate(), Unit: tokenUnit},
		Second: &shared, Concurrent: inflight}
}

// candidate is the standard lane with candidateSpec; premium is left out.
func candidate(_ *http.Request, enforced admithttp.Rule) admithttp.Rule {
	if enforced.Second == nil {
		return admithttp.Rule{}
	}
	enforced.First.Spec = candidateSpec
	return enforced
}

func (g *gateway) count(r admithttp.ShadowReport) {
	g.candidateSaw.Add(1)
	if r.Err == nil && !r.Decision.Allowed() {
		g.candidateRefused.Add(1)
		if r.EnforcedAdmitted() {
			g.candidateRefusedAdmitted.Add(1)
		}
	}
}

// complete calls the model for an admitted request, refunds what the
// answer did not use of the reservation to the buckets it was taken from,
// reports the buckets' fields after that refund, and says so.
func (g *gateway) complete(w http.ResponseWriter, r *http.Request) {
	req := r.Context().Value(chatKey{}).(chatRequest)
	ans := g.model(req)
	refund := 0
	// No Admission: served on an outage, nothing reserved, nothing to give back.
	if a, ok := admithttp.FromContext(r.Context()); ok && ans.used() < req.estimate() {
		first, second := a.Rule.Requests()
		first.Cost = req.estimate() - ans.used()
		n := 1
		if second != nil {
			second.Cost, n = first.Cost, 2
		}
		// ErrOutcomeUnknown: the refund may have happened; never repeat it.
		if g.lim.Refund(r.Context(), first, second) == nil {
			refund = first.Cost
			g.refunded.Add(int64(refund * n))
			// The fields were set before the handler ran: say what the
			// buckets hold after the refund, before the status is written.
			for i, b := range a.Rule.Buckets() {
				if a.Decision.Remaining[i] >= 0 {
					a.Decision.Remaining[i] = min(a.Decision.Remaining[i]+refund, b.Spec.Burst())
				}
			}
			a.SetFields(w.Header())
		}
	}
	fmt.Fprintf(w, "used %d (prompt %d + answer %d)", ans.used(), ans.promptTokens, ans.answerTokens)
	if refund > 0 {
		fmt.Fprintf(w, ", %d unused refunded", refund)
	}
	fmt.Fprintln(w)
}
