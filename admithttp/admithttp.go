// Package admithttp puts an [admit.Limiter] in front of any net/http
// handler: premium reservation for an HTTP service, with the IETF RateLimit
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
// t the effective window, the seconds until the bucket holds more than r.
// For the refusing bucket t is its RetryAfter rounded up, which is also
// the Retry-After value: Retry-After is never earlier than the t of the
// policy it names as violated. For a bucket that did not refuse, t is its
// Interval rounded up: a Decision gives the tokens left but not how much of
// the next one has accrued, so t is the longest the next token can take
// (exact for a bucket that was full before the call, when the server's
// clock does not go back). A full bucket (r = q) gains nothing more and
// carries no t. Quotas count tokens (Bucket.Cost per request); when a token
// is not a request, set Bucket.Unit, the draft's qu parameter, so that
// clients do not read q and r as requests. Refusals always carry the
// fields; admitted responses carry them with [WithHeaders].
//
// # Concurrency
//
// A Rule's [Concurrent] part bounds the requests of a key in flight: an
// admitted request holds one of its slots (an [admit.Lease]) while the
// handler runs, decided with the Rule's buckets in one
// [admit.Limiter.Acquire], all or nothing: a refusal by the slot, or by a
// bucket, takes nothing from the other parts. The middleware releases the
// slot when the handler returns, and when it panics (the panic then goes
// on up); the release runs on a context that outlives the request's
// cancellation (a client that goes away does not keep its slot), bounded
// by [WithDecisionTimeout] or, without it, one second. A release that
// fails, or finds the lease expired (the handler outlived it), goes to
// [WithErrorFunc]; the slot is then freed when its lease expires. A
// process that dies mid-request frees its slots the same way.
//
// RateLimit-Policy lists the part first, with q the limit and
// qu="concurrent-requests", and no w (it has no window); RateLimit gives r,
// the slots left after the decision, and t: for a refusal by the slot, the
// time until the oldest lease of the key expires, which Retry-After
// repeats; otherwise the lease duration, by which this request's slot is
// free at the latest. A release frees a slot sooner: t is an upper bound.
// A refusal by the slot is a 429 whose violated-policies names the part.
// While degraded ([Degrade]) the part is not enforced.
//
// # Outages
//
// Every failed decision is [admit.ErrNotExecuted] or
// [admit.ErrOutcomeUnknown]; [Outage] says what to do in each case, and
// [New] refuses to build a middleware without it. [WithDecisionTimeout]
// bounds how long a decision may take; its expiry is an error of its class
// like any other, and so is the expiry of a deadline that a server above
// set on the request's context. A request whose own context is canceled
// before the decision (its client went away) is not an outage: no Outage
// handler runs, and the middleware writes only the status
// [StatusClientClosedRequest]. See [Outage] for the trade-off.
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
	"github.com/admitkit/admit/internal/edge"
)

// A Bucket is one token bucket a request is charged to, and the name under
// which the response's header fields describe it.
type Bucket struct {
	// Policy names the bucket in RateLimit-Policy, RateLimit and the
	// problem body's violated-policies. It must be printable ASCII
	// (0x20 to 0x7E), not empty, and differ from the other bucket's.
	Policy string
	// Key is the bucket's hash key in Valkey; it must not be empty. The
	// two keys of a Rule must share a hash tag on Valkey Cluster, as in
	// "rl:{api}:standard" and "rl:{api}:shared". Build the part that
	// comes from the request with [admit.KeyPart]. Keys must not start
	// with [ShadowPrefix].
	Key string
	// Spec is the bucket's rate and burst; it must not be the zero Spec.
	Spec admit.Spec
	// Cost is the tokens this request takes; 0 means 1. A Cost above the
	// Spec's burst can never be admitted: the middleware answers 500, as
	// for any invalid Rule, so bound it before the middleware (with a 400
	// or 413 of your own).
	Cost int
	// Unit, when set, is the draft's qu parameter of the bucket's policy:
	// what q and r count. The draft's registry has "requests" (the
	// default, when Unit is empty), "content-bytes" and
	// "concurrent-requests". A bucket that counts something else (tokens
	// of a language model, say) should name it here rather than let
	// clients read its quota as requests. It must be printable ASCII.
	Unit string
}

// Request returns the bucket as an [admit.Request].
func (b Bucket) Request() admit.Request {
	return admit.Request{Key: b.Key, Spec: b.Spec, Cost: b.Cost}
}

// A Concurrent is a concurrency limit: a request holds one of its slots
// (an [admit.Lease]) from its admission until its handler returns or
// panics, so that at most Spec.Limit() requests of its Key run at once.
type Concurrent struct {
	// Policy names the limit in RateLimit-Policy, RateLimit and the
	// problem body's violated-policies, with qu="concurrent-requests".
	// It must be printable ASCII (0x20 to 0x7E), not empty, and differ
	// from the buckets' policies.
	Policy string
	// Key is the lease key in Valkey (a sorted set of holders); it must
	// not be empty, must differ from the buckets' keys, and must share
	// their hash tag on Valkey Cluster, as in "conc:{org:7}" beside
	// "tpm:{org:7}". Build the part that comes from the request with
	// [admit.KeyPart]. Keys must not start with [ShadowPrefix].
	Key string
	// Spec is the limit and the lease duration; it must not be the zero
	// Concurrency. Give a lease longer than the slowest handler: a
	// handler that outlives its lease loses its slot to another request
	// (the middleware reports it to [WithErrorFunc] when it releases),
	// unless it extends the lease ([Admission].Lease).
	Spec admit.Concurrency
}

// A Rule is what one request is charged: a slot of Concurrent, if not nil,
// then First, and only when First admits, Second, in one atomic,
// all-or-nothing decision ([admit.Limiter.AllowAll], or
// [admit.Limiter.Acquire] with a concurrency part): when any part refuses,
// nothing is taken. A nil Second is the one-bucket path.
//
// The zero Rule, Rule{}, imposes no limit: the handler runs and no header
// is added. It is the only Rule that does: any other Rule needs a Policy, a
// Key and a Spec in First, and in Second when Second is not nil, or it is
// invalid and answered 500. A Rule with a concurrency part may have no
// bucket: First zero and Second nil is a plain concurrency limit.
type Rule struct {
	// First is checked first: the standard lane's own bucket, or the
	// premium lane's shared one.
	First Bucket
	// Second, if not nil, is checked only when First admits: the shared
	// bucket of the standard lane.
	Second *Bucket
	// Concurrent, if not nil, is a concurrency limit whose slot the
	// request holds while its handler runs; it is decided before the
	// buckets, in the same script run.
	Concurrent *Concurrent
}

// IsZero reports whether r is the zero Rule, which imposes no limit:
// every field of First is zero and Second and Concurrent are nil.
func (r Rule) IsZero() bool { return r.First == (Bucket{}) && r.Second == nil && r.Concurrent == nil }

// Requests returns the Rule's buckets as the arguments of admit's calls,
// for example to [admit.Limiter.Refund] the unused part of a reservation.
// A Rule without a bucket (a concurrency limit alone) returns the zero
// Request and nil: there is nothing to refund.
func (r Rule) Requests() (first admit.Request, second *admit.Request) {
	return r.edge().Requests()
}

// edge returns r as the edges' shared Rule, which shares its pointers.
func (r Rule) edge() edge.Rule {
	return edge.Rule{First: edge.Bucket(r.First), Second: (*edge.Bucket)(r.Second), Concurrent: (*edge.Concurrent)(r.Concurrent)}
}

// clone returns r with its own copies of Second and Concurrent, so that a
// callee may change them freely.
func (r Rule) clone() Rule {
	r.Second, r.Concurrent = edge.Copy(r.Second), edge.Copy(r.Concurrent)
	return r
}

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
	// slot would be free while the handler still runs.
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
// the context of a request whose client is still there gets this status
// rather than an empty 200.
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
// faulty Rule covers; and a request whose own context was canceled before
// the decision (its client went away) gets only the status
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
	shadows []Shadow
	// shadowNames are the shadows' names, which a new one must not take.
	shadowNames []string
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
// returns, on lim, and answers as the package documentation describes.
// classify runs on every request, on the request's goroutine; it must not
// read the request body without restoring it.
//
// New returns an error when lim is nil or has no client (the zero
// admit.Limiter, or admit.New(nil)), when classify is nil, when outage
// lacks either handler, or when an Option is invalid. It sends nothing to
// the store: it tells a Limiter without a client by one Peek on a context
// that is already done, which admit refuses before sending (an observer
// set with admit.WithObserver sees that Peek, not executed).
func New(lim *admit.Limiter, classify func(*http.Request) Rule, outage Outage, opts ...Option) (func(http.Handler) http.Handler, error) {
	switch {
	case lim == nil:
		return nil, errors.New("admithttp: New: nil *admit.Limiter; pass admit.New(client)")
	case !hasClient(lim):
		return nil, errors.New("admithttp: New: the admit.Limiter has no client; build it with admit.New(client) and a non-nil valkey.Client")
	case classify == nil:
		return nil, errors.New("admithttp: New: nil classify; pass a function from the request to its Rule (the zero Rule for no limit)")
	case outage.NotExecuted == nil || outage.OutcomeUnknown == nil:
		return nil, errors.New("admithttp: New: Outage needs both NotExecuted and OutcomeUnknown " +
			"(admithttp.Serve, admithttp.Refuse, admithttp.Degrade or your own function): choose what a store outage does, " +
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

// hasClient reports whether lim was built with a client. admit tells it
// only through a call: a Peek of a valid request on a context that is
// already done is refused before anything is sent, as an invalid request
// when the Limiter has no client and as not executed otherwise.
func hasClient(lim *admit.Limiter) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := lim.Peek(ctx, admit.Request{Key: "admithttp:new", Spec: probeSpec}, nil)
	return !errors.Is(err, admit.ErrInvalidRequest)
}

var probeSpec = admit.MustSpec(1, 1)

type middleware struct {
	lim      *admit.Limiter
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
	res, err := m.decide(r, rule)
	if res.Lease != nil {
		// Whatever happens next, the handler returning or panicking
		// included: a granted slot is freed, and so is one that an
		// Acquire whose outcome is unknown may have taken. A lease that
		// was refused, or never sent, sends nothing.
		defer m.release(r, res.Lease)
	}
	if err != nil && !errors.Is(err, admit.ErrInvalidRequest) && errors.Is(r.Context().Err(), context.Canceled) {
		// The request's own context was canceled, as net/http does when
		// the client goes away: nobody reads an answer, and the store is
		// not known to be failing. (A deadline on the request's context,
		// set by a server above, is a time bound like
		// WithDecisionTimeout's: an outage.)
		m.emit(r, ClientGone, rule, edge.Result{}, err)
		w.WriteHeader(StatusClientClosedRequest)
		return
	}
	m.runShadows(r, rule, res)
	switch {
	case errors.Is(err, admit.ErrInvalidRequest):
		m.invalid(w, r, rule, err)
	case err != nil:
		m.report(r, err)
		handler := m.outage.NotExecuted
		if errors.Is(err, admit.ErrOutcomeUnknown) { // every error is in one of the two classes
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
	case !res.Allowed():
		m.emit(r, Refused, rule, res, nil)
		m.refuse(w, r, rule, res)
	default:
		m.emit(r, Admitted, rule, res, nil)
		if m.headers {
			setFields(w.Header(), rule, res)
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), admissionKey{}, Admission{Rule: rule, Decision: res.Decision, Lease: res.Lease})))
	}
}

// release frees the slot of x (see [edge.Release]); a failure, or a
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

// decide runs rule on the limiter, all or nothing, within the decision
// timeout if one is set (see [edge.Decide]).
func (m *middleware) decide(r *http.Request, rule Rule) (edge.Result, error) {
	return edge.Decide(r.Context(), m.lim, m.lim, rule.edge(), m.timeout)
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
	if f := edge.Check(rule.edge()); f != nil {
		return fmt.Errorf("admithttp: %w", f)
	}
	return nil
}
