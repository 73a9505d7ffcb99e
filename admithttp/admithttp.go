// Package admithttp puts an [admit.Limiter] (or any [admit.Decider]) in
// front of any net/http handler: premium reservation for an HTTP service, with the IETF RateLimit
// header fields for both buckets of an ordered decision, an outage policy
// the caller chooses, shadow rules that try a candidate Spec on production
// traffic without enforcing it, and a per-request outcome hook.
//
// The caller maps each request to a [Rule]: the buckets it is charged to,
// checked in order. A standard lane names its own bucket first and a shared
// bucket second; a premium lane names the shared bucket alone, so refused
// standard traffic never takes from the share kept for premium. A route
// without a limit returns the zero Rule, Rule{}, and only it: a Rule with
// any field set and another missing (an empty Key from a header the request
// lacks, an empty Policy, a zero Spec) is an invalid Rule, answered 500,
// never served unlimited. Build keys from client input with [admit.KeyPart],
// which turns any value (empty, huge, full of braces) into a bounded part
// that keeps a key in its hash slot:
//
//	limit, err := admithttp.New(lim, func(r *http.Request) admithttp.Rule {
//		shared := admithttp.Bucket{Policy: "shared", Key: "rl:{api}:shared", Spec: sharedSpec}
//		if r.Header.Get("X-Plan") == "premium" {
//			return admithttp.Rule{First: shared}
//		}
//		user := admit.KeyPart(r.Header.Get("X-User"))
//		return admithttp.Rule{First: admithttp.Bucket{Policy: "standard", Key: "rl:{api}:standard:" + user, Spec: standardSpec}, Second: &shared}
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
// policy; [WithRefusal] replaces the body and keeps the fields. The
// decision is all or nothing ([admit.Limiter.AllowAll]): when the second
// bucket refuses, the first is not charged either, in the same round trip,
// so a refusal never drains the bucket it does not name.
//
// # Header fields
//
// The fields follow draft-ietf-httpapi-ratelimit-headers-11 (23 May 2026),
// the newest revision this package was checked against. Both are Structured
// Field Lists (RFC 9651) of Items whose value is the policy's name as a
// String:
//
//	RateLimit-Policy: "standard";q=6;w=12, "shared";q=10;w=3
//	RateLimit: "standard";r=5;t=2, "shared";r=0;t=1
//
// RateLimit-Policy lists every bucket of the Rule (after its concurrency
// part, if any; see Concurrency below): q is the bucket's burst
// (Spec.Burst), w the seconds it takes to refill from empty (Burst ×
// Interval, rounded up; at least 1). RateLimit lists every bucket the
// decision evaluated (the second is not evaluated when the first refuses):
// r is the tokens the bucket holds after the call (Decision.Remaining), and
// t the effective window, the seconds until the bucket holds more than r:
// until its next token, whatever the cost. For the refusing bucket t is
// exact: its RetryAfter (until it holds the whole cost, the Retry-After
// value) less one Interval for each further token the cost needs, rounded
// up; Retry-After is never earlier than the t of the policy it names as
// violated. For a bucket that did not refuse, t is its
// Interval rounded up: a Decision gives the tokens left but not how much of
// the next one has accrued, so t is the longest the next token can take
// (exact for a bucket that was full before the call, when the server's
// clock does not go back). A full bucket (r = q) gains nothing more and
// carries no t. Quotas count tokens (Bucket.Cost per request); when a token
// is not a request, set Bucket.Unit, the draft's qu parameter, so that
// clients do not read q and r as requests. Refusals always carry the
// fields; admitted responses carry them with [WithHeaders].
// [WithXRateLimit] adds X-RateLimit-Limit, -Remaining and -Reset.
//
// # Concurrency
//
// A Rule's [Concurrent] part bounds the requests of a key in flight: an
// admitted request holds one of its leases (an [admit.Lease]) while the
// handler runs, decided with the Rule's buckets in one
// [admit.Limiter.Acquire], all or nothing: a refusal by the concurrency limit, or by a
// bucket, takes nothing from the other parts. The middleware releases the
// lease when the handler returns, and when it panics (the panic then goes
// on up); the release runs on a context that outlives the request's
// cancellation (a client that goes away does not keep its lease), bounded
// by [WithDecisionTimeout] or, without it, one second. A release that
// fails, or finds the lease expired (the handler outlived it), goes to
// [WithErrorFunc]; the place is then freed when its lease expires. A
// process that dies mid-request frees its leases the same way.
//
// RateLimit-Policy lists the part first, with q the limit and
// qu="concurrent-requests", and no w (it has no window); RateLimit gives r,
// the leases left after the decision, and t: for a refusal by the concurrency limit, the
// Concurrent's RetryAfter (one second when zero: about how long a handler
// holds its place), but never more than the time until the oldest lease of
// the key expires, which Retry-After repeats; otherwise the lease
// duration, by which this request's lease is free at the latest. A refusal
// by the concurrency limit is a 429 whose violated-policies names the part. While
// degraded ([Degrade]) a Rule with a concurrency part is refused (503).
//
// # Outages
//
// Every failed decision is [admit.ErrNotExecuted] or
// [admit.ErrOutcomeUnknown]; [Outage] says what to do in each case, and
// [New] refuses to build a middleware without it. [WithDecisionTimeout]
// bounds how long a decision may take; its expiry is an error of its class
// like any other. A request whose own context ended before the decision
// came back, whatever the store's error (its client went away, or a
// deadline a server above set on it passed), is not an outage: no Outage
// handler runs, and the middleware writes only the status
// [StatusClientClosedRequest]; admitgrpc applies the same rule
// ([edge.Judge]). See [Outage] for the trade-off.
//
// # Shadow rules
//
// A [Shadow] is a candidate rule decided on every request, on keys of its
// own (under [ShadowPrefix]), and reported, never enforced: it cannot refuse
// a request and cannot read or write an enforced bucket.
//
// # Outcomes
//
// [WithOutcome] sees one [Event] per request, naming what happened to it
// ([Outcome]): admitted, refused, served or refused in an outage, client
// gone, no limit, invalid Rule; and one more for each shadow rule that would
// have refused it.
package admithttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
)

// A Bucket is one token bucket a request is charged to: [edge.Bucket],
// the same type at both edges. Its Policy names it in RateLimit-Policy,
// RateLimit and the problem body's violated-policies; its Unit is the
// draft's qu parameter.
type Bucket = edge.Bucket

// A Concurrent is a concurrency limit: [edge.Concurrent], the same type at
// both edges. Its Policy names it with qu="concurrent-requests"; its
// RetryAfter is the wait a refusal by it says (see Concurrency in the
// package documentation).
type Concurrent = edge.Concurrent

// A Rule is what one request is charged: [edge.Rule], the same type at
// both edges. The zero Rule, Rule{}, means no limit.
type Rule = edge.Rule

// An Admission is what the middleware decided for an admitted request,
// given to the handler through the request's context ([FromContext]).
type Admission struct {
	// Rule is the Rule the request was charged.
	Rule Rule
	// Decision is the limiter's Decision: Allowed, with Remaining. With
	// a concurrency part it is the Acquire's decision of the buckets
	// (admit.Lease.Decision), Allowed too.
	Decision admit.Decision
	// Lease is the granted lease when the Rule has a concurrency part,
	// nil otherwise. The middleware releases it when the handler returns
	// or panics; a handler that may outlive the lease's duration extends
	// it (Lease.Extend) before Lease.Deadline. Do not release it: the
	// lease would be free while the handler still runs.
	Lease *admit.Lease
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
// is the handler the middleware wraps. [Serve], [Refuse] and [Degrade] are
// the usual ones; a function of your own may, for example, serve some routes
// and refuse others, or log err and then refuse. Whether it runs next
// decides the request's [Outcome]: OutageServed or OutageRefused.
type OutageHandler func(w http.ResponseWriter, r *http.Request, next http.Handler, err error)

// Serve is the OutageHandler that runs the handler as if the request had
// been admitted, with no rate-limit header: the service stays up and its
// traffic is unlimited while the limiter's store fails.
func Serve(w http.ResponseWriter, r *http.Request, next http.Handler, _ error) {
	next.ServeHTTP(w, r)
}

// StatusClientClosedRequest is the status the middleware writes, without
// a body, for a request whose client went away before its decision
// ([ClientGone]): the client reads nothing, and access logs show 499, as
// nginx logs a client that closed its request. A server above that cancels
// the context of a request whose client is still there, or sets a
// deadline on it that passes, gets this status rather than an empty 200.
const StatusClientClosedRequest = 499

// OutageRetryAfter is the Retry-After that [Refuse] sends: long enough
// that refused clients do not turn a store outage into a storm of retries,
// short enough to notice a quick recovery. [RefuseAfter] sends another.
const OutageRetryAfter = 5 * time.Second

// Refuse is the OutageHandler that answers 503 Service Unavailable with
// Retry-After: 5 ([OutageRetryAfter]) and an application/problem+json body
// that does not reveal err: the limited routes fail while the limiter's
// store fails.
func Refuse(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	refuseOutage(w, outageRetryAfter)
}

// RefuseAfter returns an OutageHandler that answers as [Refuse] does, with
// Retry-After set to d in whole seconds, rounded up (at least 1). It
// panics if d is not positive.
func RefuseAfter(d time.Duration) OutageHandler {
	if d <= 0 {
		panic(fmt.Sprintf("admithttp: RefuseAfter(%v): want a positive duration", d))
	}
	v := formatSeconds(ceilSeconds(d))
	return func(w http.ResponseWriter, _ *http.Request, _ http.Handler, _ error) { refuseOutage(w, v) }
}

var outageRetryAfter = formatSeconds(ceilSeconds(OutageRetryAfter))

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
//     corrupt key, or [WithDecisionTimeout] expired before sending. Serve
//     admits a request the limiter never counted.
//   - OutcomeUnknown ([admit.ErrOutcomeUnknown]): the script may have run,
//     so tokens may have been taken, and the decision may have been a
//     refusal (a connection lost, or [WithDecisionTimeout] expired, with
//     the command in flight). Serve may run a request the limiter refused;
//     Refuse may refuse one it admitted and charged (tokens come back as
//     the bucket refills; nothing is refunded, since the charge is
//     unknown).
//
// A common choice serves on NotExecuted when the protected resource has
// limits of its own, and refuses on OutcomeUnknown, which is rare and where
// serving could exceed a budget that was in fact spent. Two failures are
// not outages and never reach Outage: an error of the Rule itself
// (admit.ErrInvalidRequest: an empty Key, a Cost above the burst, keys in
// different cluster slots, a bad policy name) is answered 500, whatever
// Outage says, since serving would lift the limit for every request the
// faulty Rule covers; and a request whose own context ended before the
// decision came back (its client went away, or a deadline set above
// passed), whatever the store's error, gets only the status
// [StatusClientClosedRequest] ([ClientGone]).
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
	timeout time.Duration
	onError func(*http.Request, error)
	outcome func(Event)
	refusal func(http.ResponseWriter, *http.Request, Refusal)
	// xRateLimit is WithXRateLimit's.
	xRateLimit bool
	shadows    []Shadow
	// shadowNames are the shadows' names, which a new one must not take.
	shadowNames []string
}

// WithXRateLimit adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset, the fields that users of httprate, ulule/limiter and
// GitHub's API read, beside the IETF ones, to refusals and admitted
// responses alike. They describe one part of the Rule: the one that
// refused, or else the one with the fewest tokens left (the first of
// equals): Limit its quota (q), Remaining what it holds (r), Reset the
// Unix time, in whole seconds rounded up, by which it holds more (now + t;
// now for a full bucket). Default: off.
func WithXRateLimit() Option {
	return optionFunc(func(c *config) error { c.xRateLimit = true; return nil })
}

// WithHeaders adds RateLimit-Policy and RateLimit to admitted responses
// too (refusals always carry them). The handler sees them in its
// ResponseWriter's Header and may change them. Default: off.
func WithHeaders() Option {
	return optionFunc(func(c *config) error { c.headers = true; return nil })
}

// WithDecisionTimeout bounds each decision (the enforced one, and each
// shadow's) to d. A decision that takes longer fails with the context's
// deadline in its error, classed as admit classes it: not executed when it
// expired before the command was sent, outcome unknown when the command
// was in flight; the [Outage] handler of that class answers. Default: no
// bound but the request's own context, so a store that stops answering
// holds each request until the client gives up.
func WithDecisionTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("admithttp: WithDecisionTimeout(%v): want a positive duration, such as 100*time.Millisecond", d)
		}
		c.timeout = d
		return nil
	})
}

// WithErrorFunc calls f with every error the middleware meets on a request
// before it answers: a failed decision (then the Outage handler runs) or
// an invalid Rule (the middleware answers 500). A request whose client went
// away is not reported here (see [ClientGone]). The library logs nothing
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
// returns, on dec, and answers as the package documentation describes. dec
// is an [admit.Limiter] on a shared store (the only decider of a Rule with
// a concurrency part), or an [admit.Local] or [admit.Degraded] for one
// process. classify runs on every request, on the request's goroutine; it
// must not read the request body without restoring it.
//
// New returns an error when dec is nil or a Limiter without a client (the
// zero admit.Limiter, or admit.New(nil)), when classify is nil, when
// outage lacks either handler, or when an Option is invalid. It sends
// nothing to the store.
func New(dec admit.Decider, classify func(*http.Request) Rule, outage Outage, opts ...Option) (func(http.Handler) http.Handler, error) {
	if err := edge.CheckDecider(dec); err != nil {
		return nil, fmt.Errorf("admithttp: New: %w", err)
	}
	switch {
	case classify == nil:
		return nil, errors.New("admithttp: New: nil classify; pass a function from the request to its Rule (the zero Rule for no limit)")
	case outage.NotExecuted == nil || outage.OutcomeUnknown == nil:
		return nil, errors.New("admithttp: New: Outage needs both NotExecuted and OutcomeUnknown " +
			"(admithttp.Serve, admithttp.Refuse, admithttp.Degrade or your own function): choose what a store outage does, " +
			"since either default would fail open or closed without your say")
	}
	m := &middleware{dec: dec, classify: classify, outage: outage}
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
	dec      admit.Decider
	classify func(*http.Request) Rule
	outage   Outage
	config
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rule := m.classify(r)
	if rule.IsZero() {
		m.runShadows(r, rule, edge.Result{})
		m.emit(r, Unlimited, rule, edge.Result{}, nil)
		next.ServeHTTP(w, r)
		return
	}
	if err := checkRule(rule); err != nil {
		m.runShadows(r, rule, edge.Result{})
		m.invalid(w, r, rule, err)
		return
	}
	res, err := edge.Decide(r.Context(), m.dec, rule, m.timeout)
	if res.Lease != nil {
		// Whatever happens next, the handler returning or panicking
		// included: a granted lease is freed, and so is one that an
		// Acquire whose outcome is unknown may have taken. A lease that
		// was refused, or never sent, sends nothing.
		defer m.release(r, res.Lease)
	}
	verdict := edge.Judge(r.Context(), res, err)
	if verdict == edge.Gone {
		// The request's context ended (its client went away, or a
		// deadline set above passed): nobody reads an answer, and the
		// store is not known to be failing.
		m.emit(r, ClientGone, rule, edge.Result{}, err)
		w.WriteHeader(StatusClientClosedRequest)
		return
	}
	m.runShadows(r, rule, res)
	switch verdict {
	case edge.Invalid:
		m.invalid(w, r, rule, err)
	case edge.NotExecuted, edge.OutcomeUnknown:
		m.report(r, err)
		handler := m.outage.NotExecuted
		if verdict == edge.OutcomeUnknown {
			handler = m.outage.OutcomeUnknown
		}
		r = r.WithContext(context.WithValue(r.Context(), outageKey{}, &outageCall{m: m, rule: rule})) // for Degrade
		if m.outcome == nil {
			handler(w, r, next, err)
			return
		}
		ran := &ranHandler{next: next}
		handler(w, r, ran, err)
		outcome := OutageRefused
		if ran.ran {
			outcome = OutageServed
		}
		m.emit(r, outcome, rule, edge.Result{}, err)
	case edge.Refuse:
		m.emit(r, Refused, rule, res, nil)
		m.refuse(w, r, rule, res)
	default:
		m.emit(r, Admitted, rule, res, nil)
		m.setFields(w.Header(), rule, res, false)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), admissionKey{}, Admission{Rule: rule, Decision: res.Decision, Lease: res.Lease})))
	}
}

// release frees x's place (see [edge.Release]); a failure, or a
// granted lease found expired, goes to the error hook.
func (m *middleware) release(r *http.Request, x *admit.Lease) {
	if err := edge.Release(r.Context(), x, m.timeout); err != nil {
		m.report(r, fmt.Errorf("admithttp: %w", err))
	}
}

// ranHandler records whether an Outage handler ran the wrapped handler.
type ranHandler struct {
	next http.Handler
	ran  bool
}

func (h *ranHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.ran = true
	h.next.ServeHTTP(w, r)
}

func (m *middleware) report(r *http.Request, err error) {
	if m.onError != nil {
		m.onError(r, err)
	}
}

// invalid answers a request whose Rule is invalid: 500, never the handler.
func (m *middleware) invalid(w http.ResponseWriter, r *http.Request, rule Rule, err error) {
	m.report(r, err)
	m.emit(r, RuleError, rule, edge.Result{}, err)
	writeProblem(w, http.StatusInternalServerError, invalidBody)
}

// checkRule refuses a Rule with a missing field or a key admit would
// refuse (see [edge.Check]), before anything is sent; admit checks the
// rest (that the keys share a cluster slot).
func checkRule(rule Rule) error {
	if f := edge.Check(rule); f != nil {
		return fmt.Errorf("admithttp: %w", f)
	}
	return nil
}
