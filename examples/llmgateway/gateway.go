package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// A lane is a class of clients. Premium clients draw on the shared bucket
// alone; standard clients also on their lane's own, smaller bucket, checked
// first, so that a refused standard request never takes from the shared
// one.
type lane string

const (
	standard lane = "standard"
	premium  lane = "premium"
)

// Tokens per minute, as a rate in tokens per second and a burst of one
// minute's worth: an idle budget may be spent at once, then refills evenly.
var (
	sharedSpec = admit.MustSpec(12000.0/60, 12000) // the model's budget
	laneSpec   = admit.MustSpec(6000.0/60, 6000)   // what standard clients may use of it
)

// A chatRequest is what a client asks of the model.
type chatRequest struct {
	ID           string
	Lane         lane
	PromptTokens int // counted by the model's tokenizer
	MaxTokens    int // the most the answer may use
}

// estimate is the most the request can cost: what the gateway reserves.
func (r chatRequest) estimate() int { return r.PromptTokens + r.MaxTokens }

// A gateway admits requests to the model against its token budgets.
type gateway struct {
	lim                *admit.Limiter
	laneKey, sharedKey string
}

// newGateway keeps its buckets under prefix. The two keys share the hash
// tag {model:fake-1}, so on Valkey Cluster one script decides both.
func newGateway(c valkey.Client, prefix string) *gateway {
	return &gateway{
		lim:       admit.New(c),
		laneKey:   prefix + "{model:fake-1}:standard",
		sharedKey: prefix + "{model:fake-1}:shared",
	}
}

// requests returns the buckets r is charged to, each for r's estimate: the
// standard lane's bucket then the shared one, or the shared one alone.
// (An estimate above a bucket's burst could never be admitted: admit
// refuses it with ErrInvalidRequest before sending anything.)
func (g *gateway) requests(r chatRequest) (admit.Request, *admit.Request) {
	shared := admit.Request{Key: g.sharedKey, Spec: sharedSpec, Cost: r.estimate()}
	if r.Lane == premium {
		return shared, nil
	}
	return admit.Request{Key: g.laneKey, Spec: laneSpec, Cost: r.estimate()}, &shared
}

// A result is what the gateway did with one request.
type result struct {
	decision admit.Decision
	outcome  string   // the HTTP status and what happened
	headers  []string // the rate-limit header fields of the response
	refunded int      // tokens given back, every bucket together
}

// handle reserves r's estimate, calls the model if admitted, and refunds
// what the answer did not use. Refunds give back only what was charged.
func (g *gateway) handle(ctx context.Context, r chatRequest) (result, error) {
	first, second := g.requests(r)
	d, err := g.lim.AllowOrdered(ctx, first, second)
	if err != nil {
		// With admit.ErrOutcomeUnknown the reservation may or may not have
		// been taken: refunding it could hand out tokens never taken, so
		// a real gateway answers 503 and lets the buckets refill.
		return result{}, err
	}
	res := result{decision: d}
	// left is what each bucket holds after the call and its refunds.
	left := d.Remaining
	refund := func(cost int, reqs ...admit.Request) error {
		for i := range reqs {
			reqs[i].Cost = cost
		}
		var second *admit.Request
		if len(reqs) == 2 {
			second = &reqs[1]
		}
		if err := g.lim.Refund(ctx, reqs[0], second); err != nil {
			return err
		}
		for i, q := range reqs {
			left[i] = min(left[i]+cost, q.Spec.Burst())
		}
		res.refunded += cost * len(reqs)
		return nil
	}

	switch d.Denied {
	case 1: // nothing was charged
		res.outcome = fmt.Sprintf("429, refused by the %s bucket", bucketName(r, 1))
	case 2:
		// The lane's bucket admitted and was charged; the shared one
		// refused. The request will not run: give the lane its tokens back.
		if err := refund(first.Cost, first); err != nil {
			return res, err
		}
		res.outcome = fmt.Sprintf("429, refused by the shared bucket; the %d tokens reserved in the lane's bucket refunded", first.Cost)
	default:
		ans := complete(r)
		res.outcome = fmt.Sprintf("200, used %d (prompt %d + answer %d)", ans.used(), ans.promptTokens, ans.answerTokens)
		if unused := r.estimate() - ans.used(); unused > 0 {
			reqs := []admit.Request{first}
			if second != nil {
				reqs = append(reqs, *second)
			}
			if err := refund(unused, reqs...); err != nil {
				return res, err
			}
			to := "the shared bucket"
			if second != nil {
				to = "the standard and shared buckets"
			}
			res.outcome += fmt.Sprintf(", %d unused refunded to %s", unused, to)
		}
	}
	res.headers = headers(r, d, left)
	return res, nil
}

// bucketName names bucket i (1 or 2) of r's call.
func bucketName(r chatRequest, i int) string {
	if r.Lane == standard && i == 1 {
		return "standard"
	}
	return "shared"
}

// headers fills the response's rate-limit fields
// (draft-ietf-httpapi-ratelimit-headers): RateLimit-Policy lists every
// bucket the lane draws on (q: its burst; w: the seconds it takes to refill
// from empty); RateLimit gives the one closest to limiting: the tokens it
// holds (r) and the seconds until it is full again (t). A refusal also gets
// Retry-After, RetryAfter rounded up to whole seconds. left holds -1 for a
// bucket the call did not evaluate.
func headers(r chatRequest, d admit.Decision, left [2]int) []string {
	specs := []admit.Spec{laneSpec, sharedSpec}
	if r.Lane == premium {
		specs = specs[1:]
	}
	var policy []string
	closest := -1
	for i, s := range specs {
		window := time.Duration(s.Burst()) * s.Interval()
		policy = append(policy, fmt.Sprintf("%q;q=%d;w=%d", bucketName(r, i+1), s.Burst(), ceilSeconds(window)))
		if left[i] >= 0 && (closest < 0 || left[i] < left[closest]) {
			closest = i
		}
	}
	if d.Denied != 0 {
		closest = int(d.Denied) - 1
	}
	s := specs[closest]
	toFull := time.Duration(s.Burst()-left[closest]) * s.Interval()
	h := []string{
		"RateLimit-Policy: " + strings.Join(policy, ", "),
		fmt.Sprintf("RateLimit: %q;r=%d;t=%d", bucketName(r, closest+1), left[closest], ceilSeconds(toFull)),
	}
	if d.Denied != 0 {
		h = append(h, fmt.Sprintf("Retry-After: %d", ceilSeconds(d.RetryAfter)))
	}
	return h
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
