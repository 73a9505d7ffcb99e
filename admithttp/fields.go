package admithttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
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

// refuse answers 429 for a Rule the limiter refused.
func refuse(w http.ResponseWriter, rule Rule, res result) {
	h := w.Header()
	setFields(h, rule, res)
	h.Set("Retry-After", strconv.FormatInt(ceilSeconds(res.d.RetryAfter), 10))
	violated := rule.First
	if res.d.Denied == 2 {
		violated = *rule.Second
	}
	writeProblem(w, http.StatusTooManyRequests, mustJSON(problem{
		Type:   QuotaExceeded,
		Title:  "Request cannot be satisfied as assigned quota has been exceeded",
		Status: http.StatusTooManyRequests,
		Detail: "policy " + strconv.Quote(violated.Policy) + " holds " + strconv.Itoa(max(res.left[res.d.Denied-1], 0)) +
			" of the " + strconv.Itoa(violated.cost()) + " this request needs; retry after " +
			strconv.FormatInt(ceilSeconds(res.d.RetryAfter), 10) + " s",
		ViolatedPolicies: []string{violated.Policy},
	}))
}

// setFields sets RateLimit-Policy for every bucket of rule and RateLimit
// for every bucket the decision evaluated.
func setFields(h http.Header, rule Rule, res result) {
	var policy, limit strings.Builder
	for i, b := range rule.buckets() {
		if i > 0 {
			policy.WriteString(", ")
		}
		writeString(&policy, b.Policy)
		policy.WriteString(";q=")
		policy.WriteString(strconv.Itoa(b.Spec.Burst()))
		if b.Unit != "" {
			policy.WriteString(";qu=")
			writeString(&policy, b.Unit)
		}
		policy.WriteString(";w=")
		policy.WriteString(strconv.FormatInt(max(ceilSeconds(time.Duration(b.Spec.Burst())*b.Spec.Interval()), 1), 10))

		r := res.left[i]
		if r < 0 {
			continue // not evaluated: the first bucket refused
		}
		t := ceilSeconds(time.Duration(b.Spec.Burst()-r) * b.Spec.Interval())
		if int(res.d.Denied) == i+1 {
			t = ceilSeconds(res.d.RetryAfter)
		}
		if limit.Len() > 0 {
			limit.WriteString(", ")
		}
		writeString(&limit, b.Policy)
		limit.WriteString(";r=")
		limit.WriteString(strconv.Itoa(r))
		limit.WriteString(";t=")
		limit.WriteString(strconv.FormatInt(t, 10))
	}
	h.Set("RateLimit-Policy", policy.String())
	h.Set("RateLimit", limit.String())
}

// writeString writes s as a Structured Field String (RFC 9651, section
// 4.1.6); s is printable ASCII (checkRule).
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

// ceilSeconds is d in whole seconds, rounded up: never short.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
