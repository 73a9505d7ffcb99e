// Package admithttp puts an [admit.Limiter] in front of any net/http
// handler: premium reservation for an HTTP service, with the IETF RateLimit
// header fields for both buckets of an ordered decision, an outage policy
// the caller chooses, and shadow rules that try a candidate Spec on
// production traffic without enforcing it.
//
// The caller maps each request to a [Rule]: the buckets it is charged to,
// checked in order. A standard lane names its own bucket first and a shared
// bucket second; a premium lane names the shared bucket alone, so refused
// standard traffic never takes from the share kept for premium; a route
// without a limit returns the zero Rule.
//
//	limit, err := admithttp.New(lim, func(r *http.Request) admithttp.Rule {
//		shared := admithttp.Bucket{Policy: "shared", Key: "rl:{api}:shared", Spec: sharedSpec}
//		if r.Header.Get("X-Plan") == "premium" {
//			return admithttp.Rule{First: shared}
//		}
//		return admithttp.Rule{First: admithttp.Bucket{Policy: "standard", Key: "rl:{api}:standard", Spec: standardSpec}, Second: &shared}
//	}, admithttp.Outage{NotExecuted: admithttp.Serve, OutcomeUnknown: admithttp.Refuse}, admithttp.WithHeaders())
//	if err != nil { ... }
//	http.ListenAndServe(addr, limit(mux))
//
// # Responses
//
// An admitted request runs the handler. A refused one gets 429 Too Many
// Requests, with Retry-After (the Decision's RetryAfter in whole seconds,
// rounded up: never short), RateLimit-Policy and RateLimit (below), and an
// application/problem+json body (RFC 9457) of the draft's quota-exceeded
// problem type, whose violated-policies member names the refusing bucket's
// policy. When the second bucket refuses, the first has been charged for a
// request that will not run: the middleware refunds that charge (one more
// round trip) before it answers, as [admit.Limiter.Wait] does.
//
// # Header fields
//
// The fields follow draft-ietf-httpapi-ratelimit-headers-11 (23 May 2026),
// the newest revision this package was checked against. Both are Structured
// Field Lists (RFC 9651) of Items whose value is the policy's name as a
// String:
//
//	RateLimit-Policy: "standard";q=6;w=12, "shared";q=10;w=3
//	RateLimit: "standard";r=5;t=2, "shared";r=9;t=1
//
// RateLimit-Policy lists every bucket of the Rule: q is the bucket's burst
// (Spec.Burst), w the seconds it takes to refill from empty (Burst ×
// Interval, rounded up; at least 1). RateLimit lists every bucket the
// decision evaluated (the second is not evaluated when the first refuses):
// r is the tokens the bucket holds after the call (Decision.Remaining), t
// the seconds until it is full again, rounded up. For the refusing bucket t
// is the Retry-After value instead, so that Retry-After never points before
// the end of the effective window (the draft's section 6). Quotas count
// tokens (Bucket.Cost per request); set Bucket.Unit to say so with the
// draft's qu parameter. Refusals always carry the fields; admitted
// responses carry them with [WithHeaders].
//
// # Outages
//
// Every failed decision is [admit.ErrNotExecuted] or
// [admit.ErrOutcomeUnknown]; [Outage] says what to do in each case, and
// [New] refuses to build a middleware without it. See [Outage] for the
// trade-off.
//
// # Shadow rules
//
// A [Shadow] is a candidate rule decided on every request, on keys of its
// own (under [ShadowPrefix]), and reported, never enforced: it cannot refuse
// a request and cannot read or write an enforced bucket.
package admithttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/admitkit/admit"
)

// A Bucket is one token bucket a request is charged to, and the name under
// which the response's header fields describe it.
type Bucket struct {
	// Policy names the bucket in RateLimit-Policy, RateLimit and the
	// problem body's violated-policies. It must be printable ASCII
	// (0x20 to 0x7E), not empty, and differ from the other bucket's.
	Policy string
	// Key is the bucket's hash key in Valkey. The two keys of a Rule must
	// share a hash tag on Valkey Cluster, as in "rl:{api}:standard" and
	// "rl:{api}:shared". Keys must not start with [ShadowPrefix].
	Key string
	// Spec is the bucket's rate and burst.
	Spec admit.Spec
	// Cost is the tokens this request takes; 0 means 1. A Cost above the
	// Spec's burst can never be admitted: the middleware answers 500, as
	// for any invalid Rule, so bound it before the middleware (with a 400
	// or 413 of your own).
	Cost int
	// Unit, when set, is the draft's qu parameter of the bucket's policy:
	// what q and r count. The draft's registry has "requests" (the
	// default, when Unit is empty), "content-bytes" and
	// "concurrent-requests". It must be printable ASCII.
	Unit string
}

// Request returns the bucket as an [admit.Request].
func (b Bucket) Request() admit.Request {
	return admit.Request{Key: b.Key, Spec: b.Spec, Cost: b.Cost}
}

// cost is the tokens the bucket's request takes, 0 meaning 1.
func (b Bucket) cost() int {
	if b.Cost == 0 {
		return 1
	}
	return b.Cost
}

// A Rule is what one request is charged: First, and only when First
// admits, Second, in one atomic decision ([admit.Limiter.AllowOrdered]).
// A nil Second is the one-bucket path. The zero Rule (First.Key empty and
// Second nil) imposes no limit: the handler runs and no header is added.
type Rule struct {
	// First is checked first: the standard lane's own bucket, or the
	// premium lane's shared one.
	First Bucket
	// Second, if not nil, is checked only when First admits: the shared
	// bucket of the standard lane.
	Second *Bucket
}

// IsZero reports whether r imposes no limit: First.Key is empty and Second
// is nil.
func (r Rule) IsZero() bool { return r.First.Key == "" && r.Second == nil }

// Requests returns the Rule as the arguments of admit's calls, for example
// to [admit.Limiter.Refund] the unused part of a reservation.
func (r Rule) Requests() (first admit.Request, second *admit.Request) {
	first = r.First.Request()
	if r.Second != nil {
		s := r.Second.Request()
		second = &s
	}
	return first, second
}

// buckets returns the Rule's buckets in order.
func (r Rule) buckets() []Bucket {
	if r.Second == nil {
		return []Bucket{r.First}
	}
	return []Bucket{r.First, *r.Second}
}

// clone returns r with its own copy of Second, so that a callee may change
// it freely.
func (r Rule) clone() Rule {
	if r.Second != nil {
		s := *r.Second
		r.Second = &s
	}
	return r
}

// An Admission is what the middleware decided for an admitted request,
// given to the handler through the request's context ([FromContext]).
type Admission struct {
	// Rule is the Rule the request was charged.
	Rule Rule
	// Decision is the limiter's Decision: Allowed, with Remaining.
	Decision admit.Decision
}

type admissionKey struct{}

// FromContext returns the Admission of the request whose context is ctx,
// and true, when the middleware admitted it. It returns false when the
// Rule was zero or the request was served by an [Outage] handler without a
// decision: a handler that settles a reservation (refunds what it did not
// use) must then refund nothing.
func FromContext(ctx context.Context) (Admission, bool) {
	a, ok := ctx.Value(admissionKey{}).(Admission)
	return a, ok
}

// An OutageHandler answers a request whose decision failed with err: next
// is the handler the middleware wraps. [Serve] and [Refuse] are the two
// usual ones; a function of your own may, for example, serve some routes
// and refuse others, or log err and then refuse.
type OutageHandler func(w http.ResponseWriter, r *http.Request, next http.Handler, err error)

// Serve is the OutageHandler that runs the handler as if the request had
// been admitted, with no rate-limit header: the service stays up and its
// traffic is unlimited while the limiter's store fails.
func Serve(w http.ResponseWriter, r *http.Request, next http.Handler, _ error) {
	next.ServeHTTP(w, r)
}

// Refuse is the OutageHandler that answers 503 Service Unavailable with an
// application/problem+json body that does not reveal err: the limited
// routes fail while the limiter's store fails.
func Refuse(w http.ResponseWriter, _ *http.Request, _ http.Handler, _ error) {
	writeProblem(w, http.StatusServiceUnavailable, unavailableBody)
}

// Outage says what the middleware does with a request whose decision
// failed, for each of admit's two error classes. Both fields are required:
// there is no default, so that no service fails open (or closed) by
// accident.
//
// The trade-off is the same for both: [Serve] turns a store outage into
// unlimited traffic to what the limiter protects (an upstream API may then
// throttle or bill you, or fall over), and [Refuse] turns it into an
// outage of every limited route. The classes differ in what the failed
// call did:
//
//   - NotExecuted ([admit.ErrNotExecuted]): nothing was taken; the store
//     was unreachable, refused the command, or holds a wrong-type or
//     corrupt key. Serve admits a request the limiter never counted.
//   - OutcomeUnknown ([admit.ErrOutcomeUnknown]): the script may have run,
//     so tokens may have been taken, and the decision may have been a
//     refusal. Serve may run a request the limiter refused; Refuse may
//     refuse one it admitted and charged (tokens come back as the bucket
//     refills; nothing is refunded, since the charge is unknown).
//
// A common choice serves on NotExecuted when the protected resource has
// limits of its own, and refuses on OutcomeUnknown, which is rare (a
// connection lost with the command in flight) and where serving could
// exceed a budget that was in fact spent. An error of the Rule itself
// (admit.ErrInvalidRequest: a Cost above the burst, keys in different
// cluster slots, a bad policy name) is not an outage: the middleware
// answers 500, whatever Outage says, since serving would bypass the limit
// for every request the faulty Rule covers.
type Outage struct {
	// NotExecuted answers a request whose decision failed with
	// admit.ErrNotExecuted: nothing was taken.
	NotExecuted OutageHandler
	// OutcomeUnknown answers a request whose decision failed with
	// admit.ErrOutcomeUnknown: tokens may have been taken.
	OutcomeUnknown OutageHandler
}

// An Option configures the middleware; pass Options to [New].
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	headers bool
	onError func(*http.Request, error)
	shadows []Shadow
}

// WithHeaders adds RateLimit-Policy and RateLimit to admitted responses
// too (refusals always carry them). The handler sees them in its
// ResponseWriter's Header and may change them. Default: off.
func WithHeaders() Option {
	return optionFunc(func(c *config) error { c.headers = true; return nil })
}

// WithErrorFunc calls f with every error the middleware meets on a request
// before it answers: a failed decision (then the Outage handler runs), a
// failed refund of a second-bucket refusal (the request is still refused),
// an invalid Rule (the middleware answers 500). The library logs nothing
// itself; f is where to log or count. f runs on the request's goroutine.
// Shadow errors go to each Shadow's Report. Default: none.
func WithErrorFunc(f func(r *http.Request, err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("admithttp: WithErrorFunc(nil): pass a function, or leave the option out")
		}
		c.onError = f
		return nil
	})
}

// New returns a middleware that charges each request the Rule classify
// returns, on lim, and answers as the package documentation describes.
// classify runs on every request, on the request's goroutine; it must not
// read the request body without restoring it.
//
// New returns an error when lim or classify is nil, when outage lacks
// either handler, or when an Option is invalid.
func New(lim *admit.Limiter, classify func(*http.Request) Rule, outage Outage, opts ...Option) (func(http.Handler) http.Handler, error) {
	switch {
	case lim == nil:
		return nil, errors.New("admithttp: New: nil *admit.Limiter; pass admit.New(client)")
	case classify == nil:
		return nil, errors.New("admithttp: New: nil classify; pass a function from the request to its Rule (the zero Rule for no limit)")
	case outage.NotExecuted == nil || outage.OutcomeUnknown == nil:
		return nil, errors.New("admithttp: New: Outage needs both NotExecuted and OutcomeUnknown " +
			"(admithttp.Serve, admithttp.Refuse or your own function): choose what a store outage does, " +
			"since either default would fail open or closed without your say")
	}
	m := &middleware{lim: lim, classify: classify, outage: outage}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&m.config); err != nil {
			return nil, err
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

type middleware struct {
	lim      *admit.Limiter
	classify func(*http.Request) Rule
	outage   Outage
	config
}

// A result is one decided Rule: the Decision and what each bucket holds
// after the call and the refund of a second-bucket refusal.
type result struct {
	d    admit.Decision
	left [2]int
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rule := m.classify(r)
	if rule.IsZero() {
		m.runShadows(r, rule, admit.Decision{})
		next.ServeHTTP(w, r)
		return
	}
	if err := checkRule(rule); err != nil {
		m.runShadows(r, rule, admit.Decision{})
		m.invalid(w, r, err)
		return
	}
	res, err := m.decide(r, rule, m.onError)
	m.runShadows(r, rule, res.d)
	switch {
	case errors.Is(err, admit.ErrInvalidRequest):
		m.invalid(w, r, err)
	case errors.Is(err, admit.ErrOutcomeUnknown):
		m.report(r, err)
		m.outage.OutcomeUnknown(w, r, next, err)
	case err != nil: // admit.ErrNotExecuted: every error is in one of the two classes
		m.report(r, err)
		m.outage.NotExecuted(w, r, next, err)
	case !res.d.Allowed():
		refuse(w, rule, res)
	default:
		if m.headers {
			setFields(w.Header(), rule, res)
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), admissionKey{}, Admission{Rule: rule, Decision: res.d})))
	}
}

// decide runs rule on the limiter and, when the second bucket refuses,
// refunds the first bucket's charge, reporting a failed refund to onError.
func (m *middleware) decide(r *http.Request, rule Rule, onError func(*http.Request, error)) (result, error) {
	first, second := rule.Requests()
	d, err := m.lim.AllowOrdered(r.Context(), first, second)
	if err != nil {
		return result{}, err
	}
	res := result{d: d, left: d.Remaining}
	if d.Denied == 2 {
		if err := m.lim.Refund(r.Context(), first, nil); err != nil {
			if onError != nil {
				onError(r, fmt.Errorf("admithttp: refund of the %q bucket's charge after the %q bucket refused: %w",
					rule.First.Policy, rule.Second.Policy, err))
			}
		} else {
			res.left[0] = min(res.left[0]+rule.First.cost(), rule.First.Spec.Burst())
		}
	}
	return res, nil
}

func (m *middleware) report(r *http.Request, err error) {
	if m.onError != nil {
		m.onError(r, err)
	}
}

// invalid answers a request whose Rule is invalid: 500, never the handler.
func (m *middleware) invalid(w http.ResponseWriter, r *http.Request, err error) {
	m.report(r, err)
	writeProblem(w, http.StatusInternalServerError, invalidBody)
}

// checkRule refuses what admit does not check: policy names and units that
// the header fields cannot carry, and enforced keys in the shadow
// namespace. admit checks the rest (keys, Specs, Costs, slots).
func checkRule(rule Rule) error {
	bs := rule.buckets()
	for i, b := range bs {
		if err := checkName("policy name", b.Policy, true); err != nil {
			return invalidRule(i, err)
		}
		if err := checkName("unit", b.Unit, false); err != nil {
			return invalidRule(i, err)
		}
		if strings.HasPrefix(b.Key, ShadowPrefix) {
			return invalidRule(i, fmt.Errorf("key %q is in the shadow rules' namespace %q; enforced keys must not start with it", b.Key, ShadowPrefix))
		}
	}
	if len(bs) == 2 && bs[0].Policy == bs[1].Policy {
		return invalidRule(1, fmt.Errorf("policy name %q is the first bucket's too; name each bucket differently", bs[1].Policy))
	}
	return nil
}

func invalidRule(i int, err error) error {
	return fmt.Errorf("admithttp: bucket %d of the Rule: %w (%w, %w)", i+1, err, admit.ErrInvalidRequest, admit.ErrNotExecuted)
}

// checkName refuses a value that a Structured Field String cannot hold:
// anything but printable ASCII.
func checkName(what, s string, required bool) error {
	if s == "" {
		if required {
			return fmt.Errorf("empty %s; every bucket needs one for the RateLimit fields", what)
		}
		return nil
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%s %q has byte %#x at %d; a Structured Field String holds printable ASCII only", what, s, c, i)
		}
	}
	return nil
}
