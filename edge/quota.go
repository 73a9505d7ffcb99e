package edge

import (
	"strconv"
	"strings"
	"time"

	"github.com/admitkit/admit"
)

// ConcurrentUnit is the unit of a concurrency part's Quota, as the HTTP
// draft's registry names it.
const ConcurrentUnit = "concurrent-requests"

// A Quota is what one decided Rule says of one of its parts: the fields
// of HTTP's RateLimit-Policy and RateLimit, and of gRPC's quota metadata.
type Quota struct {
	// Policy and Unit are the part's (ConcurrentUnit for a concurrency
	// part).
	Policy, Unit string
	// Limit is the quota: a bucket's burst, or the concurrency limit.
	Limit int
	// Window is the time a bucket takes to refill from empty (burst ×
	// interval); 0 for a concurrency part, which has none.
	Window time.Duration
	// Evaluated is false for a part the decision did not reach (a bucket
	// after a refusing part); Remaining and Reset are then meaningless.
	Evaluated bool
	// Remaining is the tokens (or places) left after the decision.
	Remaining int
	// Reset is the effective window: the time until the part holds more
	// than Remaining (see [Quotas]); 0 with HasReset false when nothing
	// more can come (a full bucket, every place free).
	Reset    time.Duration
	HasReset bool
	// Refused is true for the part that refused.
	Refused bool
}

// Quotas returns the Quota of each part of rule that res decided: the
// concurrency part first (when res has a Lease), then the buckets. A
// bucket's Reset is the time until its next token: for the refusing
// bucket, exactly its RetryAfter less the time of the tokens its cost
// needs beyond the next one (the RetryAfter is until it can afford the
// whole cost); for any other, at most one Interval, the bound a Decision
// allows (it gives the tokens left, not the accrued fraction of the next).
// A concurrency part's Reset is, on its refusal, the refusal's RetryAfter
// (see [Decide]), and otherwise the lease duration, by which this
// request's place is free at the latest.
func Quotas(rule Rule, res Result) []Quota {
	var qs []Quota
	if c := rule.Concurrent; c != nil && res.Lease != nil {
		n := c.Spec.Limit()
		q := Quota{Policy: c.Policy, Unit: ConcurrentUnit, Limit: n, Evaluated: true, Remaining: max(n-res.Lease.Holders, 0)}
		switch {
		case res.Lease.Denied == admit.PartConcurrency:
			q.Refused, q.Reset, q.HasReset = true, res.Decision.RetryAfter, true
		case q.Remaining < n:
			q.Reset, q.HasReset = c.Spec.Lease(), true
		}
		qs = append(qs, q)
	}
	for i, b := range rule.Buckets() {
		q := Quota{Policy: b.Policy, Unit: b.Unit, Limit: b.Spec.Burst(), Window: time.Duration(b.Spec.Burst()) * b.Spec.Interval()}
		if r := res.Decision.Remaining[i]; r >= 0 {
			q.Evaluated, q.Remaining = true, r
			q.Refused = int(res.Decision.Denied) == i+1
			q.Reset, q.HasReset = NextToken(b, r, q.Refused, res.Decision.RetryAfter)
		}
		qs = append(qs, q)
	}
	return qs
}

// NextToken is the time until bucket b, holding r tokens after a
// decision, holds more than r: ok is false for a full bucket. refused and
// retryAfter are the decision's for b: a refusal's RetryAfter is the time
// until b holds b.Tokens(), which is the next token's time plus one
// Interval for every further token the cost needs.
func NextToken(b Bucket, r int, refused bool, retryAfter time.Duration) (time.Duration, bool) {
	iv := b.Spec.Interval()
	switch {
	case r >= b.Spec.Burst():
		return 0, false
	case !refused:
		return iv, true
	}
	next := retryAfter - time.Duration(b.Tokens()-r-1)*iv
	return min(max(next, time.Microsecond), iv), true
}

// Fields returns the values of draft-ietf-httpapi-ratelimit-headers-11's
// RateLimit-Policy (every part: q, qu when set, w for a bucket) and
// RateLimit (every part evaluated: r, and t when HasReset) for qs, in
// whole seconds rounded up (never short; w at least 1). Both are
// Structured Field Lists whose Items are the policies' names as Strings.
func Fields(qs []Quota) (policy, limit string) {
	var p, l strings.Builder
	for _, q := range qs {
		sep(&p)
		writeString(&p, q.Policy)
		writeParam(&p, "q", int64(q.Limit))
		if q.Unit != "" {
			p.WriteString(";qu=")
			writeString(&p, q.Unit)
		}
		if q.Window > 0 {
			writeParam(&p, "w", max(CeilSeconds(q.Window), 1))
		}
		if !q.Evaluated {
			continue // an earlier part refused
		}
		sep(&l)
		writeString(&l, q.Policy)
		writeParam(&l, "r", int64(q.Remaining))
		if q.HasReset {
			writeParam(&l, "t", CeilSeconds(q.Reset))
		}
	}
	return p.String(), l.String()
}

func sep(b *strings.Builder) {
	if b.Len() > 0 {
		b.WriteString(", ")
	}
}

func writeParam(b *strings.Builder, name string, v int64) {
	b.WriteByte(';')
	b.WriteString(name)
	b.WriteByte('=')
	b.WriteString(strconv.FormatInt(v, 10))
}

// writeString writes s as a Structured Field String (RFC 9651, section
// 4.1.6); s is printable ASCII (Check).
func writeString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}

// CeilSeconds is d in whole seconds, rounded up: never short; 0 for d <= 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Scale returns rule with every bucket's Spec as d decides it while
// degraded (d.Scale), for the fields of a local decision; an error when d
// cannot decide a Spec.
func Scale(d *admit.Degraded, rule Rule) (Rule, error) {
	var err error
	if rule.First.Spec, err = d.Scale(rule.First.Spec); err != nil {
		return Rule{}, err
	}
	if rule.Second != nil {
		s := *rule.Second
		if s.Spec, err = d.Scale(s.Spec); err != nil {
			return Rule{}, err
		}
		rule.Second = &s
	}
	return rule, nil
}
