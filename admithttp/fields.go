package admithttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
)

// The names of draft-ietf-httpapi-ratelimit-headers-11: the fields, and
// the parameters of each, which edge.Fields writes (a revision that
// renames a parameter is an edit there, and here for the tests).
const (
	policyField = "RateLimit-Policy" // the quota policies of the Rule
	limitField  = "RateLimit"        // the state of the buckets decided

	quotaParam     = "q"  // RateLimit-Policy: the quota (Spec.Burst)
	unitParam      = "qu" // RateLimit-Policy: the quota unit (Bucket.Unit)
	windowParam    = "w"  // RateLimit-Policy: the window, seconds (Burst × Interval)
	remainingParam = "r"  // RateLimit: the quota left (Decision.Remaining)
	resetParam     = "t"  // RateLimit: the effective window, seconds until more than r

)

// QuotaExceeded is the problem type of a 429 body: the quota-exceeded type
// of draft-ietf-httpapi-ratelimit-headers-11, section 5.1.
const QuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// A problem is an application/problem+json body (RFC 9457), with the
// draft's violated-policies extension member.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

func mustJSON(p problem) []byte {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a constant struct of strings and an int always marshals
	}
	return append(b, '\n')
}

// The bodies that never change.
var (
	unavailableBody = mustJSON(problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable,
		Detail: "the rate limiter is unavailable; retry later"})
	invalidBody = mustJSON(problem{Type: "about:blank", Title: "Internal Server Error", Status: http.StatusInternalServerError,
		Detail: "the rate-limit rule for this request is invalid"})
)

func writeProblem(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone; nothing to do about it
}

func refuseOutage(w http.ResponseWriter, retryAfter string) {
	w.Header().Set("Retry-After", retryAfter)
	writeProblem(w, http.StatusServiceUnavailable, unavailableBody)
}

// A Refusal is what the limiter refused: the Rule, the Decision, and the
// part that refused.
type Refusal struct {
	// Rule is the Rule the request was decided on.
	Rule Rule
	// Decision is the refusing Decision: Denied names the bucket,
	// RetryAfter and Remaining say how long and how much. When the
	// concurrency part refused, Denied is 0, RetryAfter the wait the
	// refusal says (see [Refusal.RetryAfter]) and Remaining the Lease's.
	Decision admit.Decision
	// Violated is the bucket that refused: Rule.First or *Rule.Second; the
	// zero Bucket when the concurrency part refused.
	Violated Bucket
	// ViolatedConcurrent is Rule.Concurrent when its leases were all held
	// (the concurrency part refused), nil otherwise.
	ViolatedConcurrent *Concurrent
	// Lease is the refused Acquire when the Rule has a concurrency part,
	// nil otherwise; Lease.Denied names the part that refused.
	Lease *admit.Lease
}

// RetryAfter is the Retry-After value of the refusal: the Decision's
// RetryAfter in whole seconds, rounded up. For the concurrency part it is
// the Concurrent's RetryAfter (one second when zero), never more than the
// time until the oldest lease of the key expires.
func (f Refusal) RetryAfter() int64 { return ceilSeconds(f.Decision.RetryAfter) }

// Policy is the name of the refusing part's policy, the one that
// violated-policies names.
func (f Refusal) Policy() string {
	if f.ViolatedConcurrent != nil {
		return f.ViolatedConcurrent.Policy
	}
	return f.Violated.Policy
}

// WithRefusal answers refused requests with f instead of [TooManyRequests].
// Before f runs, the middleware has set Retry-After, RateLimit-Policy and
// RateLimit on w's Header, so f keeps them unless it deletes them; f writes
// the status and body (429 is what clients and the draft expect). If f
// writes nothing, the middleware writes TooManyRequests's answer. f runs
// on the request's goroutine. Default: TooManyRequests.
func WithRefusal(f func(w http.ResponseWriter, r *http.Request, ref Refusal)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("admithttp: WithRefusal(nil): pass a function, or leave the option out")
		}
		c.refusal = f
		return nil
	})
}

// TooManyRequests is the middleware's own answer to a refusal: 429 Too Many
// Requests with an application/problem+json body of the draft's
// quota-exceeded type, whose violated-policies member names the refusing
// bucket's policy. It writes the body only: the middleware sets the
// fields. A [WithRefusal] function may call it after logging, say.
func TooManyRequests(w http.ResponseWriter, _ *http.Request, ref Refusal) {
	var detail string
	if c := ref.ViolatedConcurrent; c != nil {
		detail = "policy " + strconv.Quote(c.Policy) + " allows " + strconv.Itoa(c.Spec.Limit()) +
			" requests in flight at once, and that many are; retry after " + formatSeconds(ref.RetryAfter()) + " s at the latest"
	} else {
		left := 0
		if i := int(ref.Decision.Denied) - 1; i >= 0 && i < len(ref.Decision.Remaining) {
			left = max(ref.Decision.Remaining[i], 0)
		}
		detail = "policy " + strconv.Quote(ref.Violated.Policy) + " holds " + strconv.Itoa(left) +
			" of the " + strconv.Itoa(ref.Violated.Tokens()) + " this request needs; retry after " +
			formatSeconds(ref.RetryAfter()) + " s"
	}
	writeProblem(w, http.StatusTooManyRequests, mustJSON(problem{
		Type:             QuotaExceeded,
		Title:            "Request cannot be satisfied as assigned quota has been exceeded",
		Status:           http.StatusTooManyRequests,
		Detail:           detail,
		ViolatedPolicies: []string{ref.Policy()},
	}))
}

// refuse answers a request the limiter refused.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, rule Rule, res edge.Result) {
	ref := Refusal{Rule: rule, Decision: res.Decision, Lease: res.Lease}
	switch res.Denied() {
	case admit.PartConcurrency:
		ref.ViolatedConcurrent = rule.Concurrent
	case admit.PartSecond:
		ref.Violated = *rule.Second
	default:
		ref.Violated = rule.First
	}
	h := w.Header()
	m.setFields(h, rule, res, true)
	h.Set("Retry-After", formatSeconds(ref.RetryAfter()))
	if m.refusal == nil {
		TooManyRequests(w, r, ref)
		return
	}
	tw := &trackingWriter{ResponseWriter: w}
	m.refusal(tw, r, ref)
	if !tw.wrote {
		TooManyRequests(w, r, ref)
	}
}

// trackingWriter records whether a status or a body was written.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackingWriter) WriteHeader(code int) { w.wrote = true; w.ResponseWriter.WriteHeader(code) }
func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the writer beneath.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// setFields sets RateLimit-Policy for every part of rule and RateLimit
// for every part the decision evaluated (see [edge.Fields]), on refusals
// and with WithHeaders; and with WithXRateLimit the X-RateLimit fields.
func (m *middleware) setFields(h http.Header, rule Rule, res edge.Result, refused bool) {
	if !refused && !m.headers && !m.xRateLimit {
		return
	}
	qs := edge.Quotas(rule, res)
	if refused || m.headers {
		policy, limit := edge.Fields(qs)
		h.Set(policyField, policy)
		h.Set(limitField, limit)
	}
	if m.xRateLimit {
		setXRateLimit(h, qs, time.Now())
	}
}

// setXRateLimit sets X-RateLimit-Limit, -Remaining and -Reset of the part
// of qs that refused, or else of the evaluated one with the fewest left.
func setXRateLimit(h http.Header, qs []edge.Quota, now time.Time) {
	var pick *edge.Quota
	for i := range qs {
		q := &qs[i]
		switch {
		case !q.Evaluated:
			continue
		case q.Refused:
			pick = q
		case pick == nil || (!pick.Refused && q.Remaining < pick.Remaining):
			pick = q
		}
	}
	if pick == nil {
		return
	}
	reset := now.Unix()
	if pick.HasReset {
		reset = ceilSeconds(time.Duration(now.UnixNano()) + pick.Reset)
	}
	h.Set("X-RateLimit-Limit", strconv.Itoa(pick.Limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(pick.Remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
}

// ceilSeconds is d in whole seconds, rounded up: never short.
func ceilSeconds(d time.Duration) int64 { return edge.CeilSeconds(d) }

func formatSeconds(n int64) string { return strconv.FormatInt(n, 10) }

// SetFields sets RateLimit-Policy and RateLimit on h for a's Rule as the
// handler now knows it: after a Refund of the unused part of a
// reservation, say, pass the Admission with Decision.Remaining raised by
// what was refunded (capped at each bucket's burst), before the handler
// writes its status, so that the response reports what its client may
// still use rather than what the reservation left.
func (a Admission) SetFields(h http.Header) {
	policy, limit := edge.Fields(edge.Quotas(a.Rule, edge.Result{Decision: a.Decision, Lease: a.Lease}))
	h.Set(policyField, policy)
	h.Set(limitField, limit)
}
