// Package admitgrpc puts admit's ordered token buckets in front of a gRPC
// server: unary and stream server interceptors, with premium reservation
// (a standard lane charged its own bucket and then a shared one, a premium
// lane the shared one alone), refusals that carry google.rpc.RetryInfo and
// google.rpc.QuotaFailure, an outage policy the caller chooses, shadow
// rules, and a per-call outcome hook.
//
// The caller maps each call to a [Rule] with a classify function that sees
// the full method name, the incoming metadata and the peer:
//
//	ic, err := admitgrpc.New(lim, func(c *admitgrpc.Call) admitgrpc.Rule {
//		shared := admitgrpc.Bucket{Policy: "shared", Key: "rl:{api}:shared", Spec: sharedSpec}
//		if first(c.Metadata, "x-plan") == "premium" {
//			return admitgrpc.Rule{First: shared}
//		}
//		return admitgrpc.Rule{First: admitgrpc.Bucket{Policy: "standard", Key: "rl:{api}:standard", Spec: standardSpec}, Second: &shared}
//	}, admitgrpc.Outage{NotExecuted: admitgrpc.Degrade(degraded), OutcomeUnknown: admitgrpc.Unavailable(time.Second)})
//	if err != nil { ... }
//	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
//
// # Decisions
//
// Each call is decided once, before its handler runs (a stream at its
// start), with the decider's AllowAll: all or nothing, so a refusal by the
// second bucket charges neither and names the bucket that is empty. The
// decider is an [admit.Limiter] on a shared store, or an [admit.Local] or
// [admit.Degraded] for a single process; [New] refuses a Limiter built
// without a client, without sending anything. The Rule types are package
// edge's, shared with admithttp: one Rule means the same at both edges.
//
// # Refusals
//
// A refused call ends with codes.ResourceExhausted, a message naming the
// refusing bucket's policy and the wait, and two details:
// google.rpc.RetryInfo, whose retry_delay is the Decision's RetryAfter
// rounded up to a whole millisecond (never short), and
// google.rpc.QuotaFailure, with one violation whose subject is the
// refusing bucket's Policy. A client reads them through status.FromError
// and Status.Details. The refusal also sets the trailer
// [PushbackTrailer] (grpc-retry-pushback-ms, gRPC's retry design A6) to
// the same delay in milliseconds, so that a grpc-go client whose service
// config retries RESOURCE_EXHAUSTED waits that long. [WithQuotaMetadata]
// adds the HTTP draft's quota fields as metadata, on admitted calls too.
//
// A call whose context ends (the client went away, or its deadline
// passed) before its decision comes back is ClientGone, whatever the
// store's error, with or without [WithTimeout]: never an outage. Only the
// decision timeout of WithTimeout, firing first, is an outage.
//
// # No limit only by choice
//
// A call goes unlimited only when classify returns the zero Rule, which
// [NoLimit] is (as admithttp's zero Rule). Every other Rule is checked: a
// Rule whose keys are empty, identical, longer than [admit.MaxKeyLen] or
// on different cluster slots (what a missing, empty or hostile metadata
// value makes of a key) is refused with codes.InvalidArgument, never
// served; a Rule the server's code got wrong (a zero Spec, a Cost above
// the burst, a bad policy name, a negative RetryAfter, a concurrency part
// on a decider that cannot Acquire) with codes.Internal. No metadata a client sends lifts a limit or yields
// codes.Internal, provided keys are built from it (as admit.KeyPart
// builds them, or as any string) and not its Spec or Policy.
//
// # Concurrency
//
// A Rule's [Concurrent] part bounds the calls of a key in flight: an
// admitted call holds one of its leases (an [admit.Lease]) while its
// handler runs, decided with the Rule's buckets in one
// [admit.Limiter.Acquire], all or nothing: a refusal by the concurrency limit, or by a
// bucket, takes nothing from the other parts. The interceptors release
// the lease when the handler returns (a stream's, when the stream ends),
// and when it panics (the panic then goes on up); the release runs on a
// context that outlives the call's cancellation (a client that goes away
// does not keep its lease), bounded by [WithTimeout] or, without it, one
// second. A release that fails, or finds the lease expired (the handler
// outlived it), goes to [WithErrorFunc]; the place is then freed when its
// lease expires, as is the place of a process that dies mid-call. After a
// decision whose outcome is unknown the interceptors release too: the
// lost Acquire may hold a lease.
//
// A refusal by the concurrency part is codes.ResourceExhausted with a
// RetryInfo (and pushback) of the Concurrent's RetryAfter, one second when
// it is zero, but never more than the time until the key's oldest lease
// expires (a place is surely free then; holders that release at their end
// free one sooner), and a QuotaFailure violation whose subject is the
// part's Policy. A concurrency part needs a decider that can Acquire, an
// [admit.Limiter]: on another decider the Rule is refused with
// codes.Internal. While degraded ([Degrade]) a Rule with a concurrency
// part is refused (codes.Unavailable, RetryInfo one second).
//
// # Outages
//
// Every failed decision is [admit.ErrNotExecuted] or
// [admit.ErrOutcomeUnknown]; [Outage] says what to do in each case, and
// [New] refuses to build without it. See docs/outages.md.
package admitgrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/edge"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A Bucket is one token bucket a call is charged to: [edge.Bucket], the
// same type at both edges. Its Policy is the subject of a refusal's
// QuotaFailure violation.
type Bucket = edge.Bucket

// A Concurrent is a concurrency limit: [edge.Concurrent], the same type at
// both edges. A call holds one of its places (an [admit.Lease]) from its
// admission until its handler returns or panics; its RetryAfter is the
// wait a refusal by it says.
type Concurrent = edge.Concurrent

// A Rule is what one call is charged: [edge.Rule], the same type at both
// edges. The zero Rule, which [NoLimit] is, means no limit.
type Rule = edge.Rule

// NoLimit is the Rule of a call that has no limit: the zero Rule. Its
// handler runs, with no decision.
var NoLimit = Rule{}

// A Call is what classify sees of one call.
type Call struct {
	// Context is the call's context.
	Context context.Context
	// FullMethod is the method's full name, "/package.Service/Method".
	FullMethod string
	// Metadata is the call's incoming metadata; never nil, possibly empty.
	// A client sets every value in it: build keys from it, never Specs.
	Metadata metadata.MD
	// Peer is the client's address, nil when gRPC gives none.
	Peer *peer.Peer
	// Stream is true for a streaming call, decided once at its start.
	Stream bool
}

// An Admission is what the interceptor decided for an admitted call,
// given to the handler through the call's context ([FromContext]).
type Admission struct {
	// Rule is the Rule the call was charged.
	Rule Rule
	// Decision is the Decision that admitted it.
	Decision admit.Decision
	// Decider is what decided it: the interceptor's decider, or the
	// Degraded of a Degrade outage policy. Refund on it, and only there.
	Decider admit.Decider
	// Lease is the granted lease when the Rule has a concurrency part
	// (and the store decided it), nil otherwise. The interceptors release
	// it when the handler returns or panics; a handler that may outlive
	// the lease's duration extends it (Lease.Extend) before
	// Lease.Deadline. Do not release it: the lease would be free while the
	// handler still runs.
	Lease *admit.Lease
}

type admissionKey struct{}

// FromContext returns the Admission of the call whose context is ctx, and
// true, when the interceptor (or its Degrade policy) admitted it. It
// returns false for NoLimit and for a call served by an outage policy
// without a decision: a handler that settles a reservation must then
// refund nothing.
func FromContext(ctx context.Context) (Admission, bool) {
	a, ok := ctx.Value(admissionKey{}).(Admission)
	return a, ok
}

// An OutagePolicy says what happens to a call whose decision failed: see
// [Serve], [Unavailable], [Degrade] and [OutageFunc]. The zero
// OutagePolicy is no choice, which [New] refuses.
type OutagePolicy struct {
	kind     outageKind
	retry    time.Duration
	degraded *admit.Degraded
	fn       func(c *Call, rule Rule, err error) error
}

type outageKind uint8

const (
	outageUnset outageKind = iota
	outageServe
	outageUnavailable
	outageDegrade
	outageFunc
)

// Serve runs the handler as if the call had been admitted: the service
// stays up and its traffic is unlimited while the store fails.
func Serve() OutagePolicy { return OutagePolicy{kind: outageServe} }

// Unavailable ends the call with codes.Unavailable and a RetryInfo of
// retryAfter (at least a millisecond): the limited methods fail while the
// store fails. gRPC clients with a retry policy for UNAVAILABLE retry it.
func Unavailable(retryAfter time.Duration) OutagePolicy {
	return OutagePolicy{kind: outageUnavailable, retry: max(retryAfter, time.Millisecond)}
}

// Degrade decides the call on d, at d's fraction of every Spec, all or
// nothing: a fleet of N processes admits at most N × fraction × the limit
// while the store fails, and the first call the store answers goes back to
// it. A refusal is the same ResourceExhausted as the store's, from the
// local decision. A call d cannot decide (a Cost above its scaled burst)
// ends with codes.Unavailable and a RetryInfo of one second.
//
// A Rule with a concurrency part is refused while degraded, with
// codes.Unavailable and a RetryInfo of one second, its handler not run: a
// Degraded holds no leases, and a limit counted in each process would not
// bound the fleet. So no more calls of a key run at once than its limit,
// outage or not.
func Degrade(d *admit.Degraded) OutagePolicy {
	return OutagePolicy{kind: outageDegrade, degraded: d}
}

// OutageFunc has f decide: a nil error runs the handler, any other error
// ends the call (a status error keeps its code; others become
// codes.Unknown, as gRPC makes them). f may, for example, serve some
// methods and refuse others. It runs on the call's goroutine.
func OutageFunc(f func(c *Call, rule Rule, err error) error) OutagePolicy {
	return OutagePolicy{kind: outageFunc, fn: f}
}

// Outage says what the interceptor does with a call whose decision failed,
// for each of admit's two error classes. Both are required: there is no
// default, so that no service fails open (or closed) by accident.
//
//   - NotExecuted ([admit.ErrNotExecuted]): nothing was taken; the store
//     was unreachable or refused the command.
//   - OutcomeUnknown ([admit.ErrOutcomeUnknown]): the decision may have
//     run and taken tokens; Serve may run a call the store refused. An
//     error in neither class (from a Decider of your own) is taken as
//     this one: it may have taken tokens.
type Outage struct {
	// NotExecuted answers a call whose decision failed with
	// admit.ErrNotExecuted: nothing was taken.
	NotExecuted OutagePolicy
	// OutcomeUnknown answers a call whose decision failed with
	// admit.ErrOutcomeUnknown: tokens may have been taken.
	OutcomeUnknown OutagePolicy
}

// An Outcome is what the interceptor did with one call.
type Outcome uint8

const (
	// Admitted: the decider admitted the call; its handler ran.
	Admitted Outcome = iota + 1
	// Refused: the decider refused it: ResourceExhausted.
	Refused
	// Unlimited: classify returned NoLimit; the handler ran undecided.
	Unlimited
	// OutageServed: the decision failed and the outage policy ran the
	// handler (Serve, or an OutageFunc that returned nil).
	OutageServed
	// OutageRefused: the decision failed and the outage policy ended the
	// call (Unavailable, or an OutageFunc's error).
	OutageRefused
	// DegradedAdmitted: the decision failed and Degrade admitted the call.
	DegradedAdmitted
	// DegradedRefused: the decision failed and Degrade refused the call,
	// or could not decide it.
	DegradedRefused
	// ClientGone: the client cancelled or its deadline passed before the
	// decision: the call ends with its context's code, no outage policy
	// runs.
	ClientGone
	// InvalidRule: the Rule was refused: InvalidArgument for its keys,
	// Internal for the rest.
	InvalidRule
)

var outcomeNames = [...]string{"", "admitted", "refused", "unlimited", "outage-served", "outage-refused",
	"degraded-admitted", "degraded-refused", "client-gone", "invalid-rule"}

// String returns the Outcome's name, such as "admitted" or
// "degraded-refused".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o != 0 {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// A Report is one call's outcome, for [WithOutcomeFunc].
type Report struct {
	// Call is the call classify saw.
	Call *Call
	// Rule is the Rule classify returned.
	Rule Rule
	// Outcome is what the interceptor did.
	Outcome Outcome
	// Decision is the deciding Decision (the store's, or Degrade's); the
	// zero Decision when there was none.
	Decision admit.Decision
	// Err is the decision's error, for the outage and ClientGone outcomes,
	// and the Rule's, for InvalidRule.
	Err error
	// Lease is the Acquire's outcome for Admitted and Refused when the
	// Rule has a concurrency part, nil otherwise: Lease.Denied names the
	// part that refused (admit.PartConcurrency when every lease was held), and
	// Lease.Holders the calls of the key in flight. For a concurrency refusal,
	// Decision carries the refusal's RetryAfter (the Concurrent's hint, capped
	// by Lease.RetryAfter) with Denied 0: read Lease.
	Lease *admit.Lease
}

// An Option configures the interceptors; pass Options to [New].
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	outcome func(Report)
	onError func(c *Call, err error)
	timeout time.Duration
	// quotaMetadata is WithQuotaMetadata's.
	quotaMetadata bool
	shadows       []Shadow
	// shadowNames are the shadows' names, which a new one must not take.
	shadowNames []string
}

// WithOutcomeFunc calls f with every call's [Report], on the call's
// goroutine, before its handler runs (or its refusal is returned). The
// library logs nothing itself; f is where to log or count. Default: none,
// and then no Report is built.
func WithOutcomeFunc(f func(Report)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("admitgrpc: WithOutcomeFunc(nil): pass a function, or leave the option out")
		}
		c.outcome = f
		return nil
	})
}

// WithErrorFunc calls f with every error that happens after a call's
// decision: a lease's release that failed, or that found the lease
// expired because the handler outlived it. It runs on the call's
// goroutine, after its handler. The library logs nothing itself; f is
// where to log or count. Default: none.
func WithErrorFunc(f func(c *Call, err error)) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return errors.New("admitgrpc: WithErrorFunc(nil): pass a function, or leave the option out")
		}
		c.onError = f
		return nil
	})
}

// WithTimeout bounds each decision's time to d: a store that does not
// answer within d fails the decision (as admit classes it: not executed
// when nothing was sent, outcome unknown otherwise), and the Outage policy
// answers. It also bounds a lease's release. Default: none, the call's own
// deadline alone (and one second for a release).
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("admitgrpc: WithTimeout(%v): want a duration above zero, or leave the option out", d)
		}
		c.timeout = d
		return nil
	})
}

// Interceptors decides calls: [Interceptors.Unary] and
// [Interceptors.Stream] return the interceptors to install.
type Interceptors struct {
	dec      admit.Decider
	classify func(*Call) Rule
	outage   Outage
	config
}

// New returns the interceptors that charge each call the Rule classify
// returns, on dec, and answer as the package documentation describes.
// classify runs on every call, on its goroutine.
//
// New returns an error when dec or classify is nil, when outage lacks
// either policy (or a Degrade policy its Degraded, an OutageFunc its
// function), or when an Option is invalid.
func New(dec admit.Decider, classify func(*Call) Rule, outage Outage, opts ...Option) (*Interceptors, error) {
	if err := edge.CheckDecider(dec); err != nil {
		return nil, fmt.Errorf("admitgrpc: New: %w", err)
	}
	switch {
	case classify == nil:
		return nil, errors.New("admitgrpc: New: nil classify; pass a function from the call to its Rule (the zero Rule, admitgrpc.NoLimit, for no limit)")
	}
	for _, p := range []struct {
		name string
		p    OutagePolicy
	}{{"NotExecuted", outage.NotExecuted}, {"OutcomeUnknown", outage.OutcomeUnknown}} {
		switch {
		case p.p.kind == outageUnset:
			return nil, fmt.Errorf("admitgrpc: New: Outage.%s is not set: choose admitgrpc.Serve(), Unavailable(d), Degrade(d) "+
				"or OutageFunc(f), since either default would fail open or closed without your say", p.name)
		case p.p.kind == outageDegrade && p.p.degraded == nil:
			return nil, fmt.Errorf("admitgrpc: New: Outage.%s is Degrade(nil); pass admit.NewDegraded(fraction, maxKeys)", p.name)
		case p.p.kind == outageFunc && p.p.fn == nil:
			return nil, fmt.Errorf("admitgrpc: New: Outage.%s is OutageFunc(nil); pass a function", p.name)
		}
	}
	ic := &Interceptors{dec: dec, classify: classify, outage: outage}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&ic.config); err != nil {
			return nil, err
		}
	}
	return ic, nil
}

// Unary returns the unary server interceptor.
func (ic *Interceptors) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, release, err := ic.admit(ctx, info.FullMethod, false)
		if release != nil {
			defer release() // on return and on panic, which then goes on up
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor. A stream is decided once,
// at its start, before the handler reads or writes a message.
func (ic *Interceptors) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, release, err := ic.admit(ss.Context(), info.FullMethod, true)
		if release != nil {
			defer release() // when the stream ends, or its handler panics
		}
		if err != nil {
			return err
		}
		if ctx != ss.Context() {
			ss = &admittedStream{ServerStream: ss, ctx: ctx}
		}
		return handler(srv, ss)
	}
}

type admittedStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the stream's context, which carries its Admission.
func (s *admittedStream) Context() context.Context { return s.ctx }

// admit decides one call: the context for its handler, or the error that
// ends it, and with a concurrency part the function that releases its
// lease, which the caller defers whatever the error.
func (ic *Interceptors) admit(ctx context.Context, method string, stream bool) (context.Context, func(), error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if md == nil {
		md = metadata.MD{}
	}
	p, _ := peer.FromContext(ctx)
	call := &Call{Context: ctx, FullMethod: method, Metadata: md, Peer: p, Stream: stream}
	rule := ic.classify(call)
	if rule.IsZero() {
		ic.runShadows(call, rule, admit.Decision{})
		ic.report(call, rule, Unlimited, admit.Decision{}, nil)
		return ctx, nil, nil
	}
	if code, err := checkRule(rule); err != nil {
		ic.runShadows(call, rule, admit.Decision{})
		ic.report(call, rule, InvalidRule, admit.Decision{}, err)
		return nil, nil, invalidStatus(code)
	}
	res, err := edge.Decide(ctx, ic.dec, rule, ic.timeout)
	var release func()
	if x := res.Lease; x != nil {
		// Whatever happens next, the handler returning or panicking
		// included: a granted lease is freed, and so is one that an
		// Acquire whose outcome is unknown may have taken. A lease that
		// was refused, or never sent, sends nothing.
		release = func() { ic.release(call, x) }
	}
	d := res.Decision
	verdict := edge.Judge(ctx, res, err)
	if verdict == edge.Gone {
		// The client went away (or its deadline passed): not an outage.
		ic.report(call, rule, ClientGone, admit.Decision{}, err)
		cerr := ctx.Err()
		if cerr == nil {
			cerr = context.DeadlineExceeded // passed, its timer not yet fired
		}
		return nil, release, status.FromContextError(cerr).Err()
	}
	ic.runShadows(call, rule, d)
	switch verdict {
	case edge.Admit:
		ic.reportLease(call, rule, Admitted, d, res.Lease, nil)
		if ic.quotaMetadata {
			setQuotaMetadata(ctx, rule, res)
		}
		return context.WithValue(ctx, admissionKey{}, Admission{Rule: rule, Decision: d, Decider: ic.dec, Lease: res.Lease}), release, nil
	case edge.Refuse:
		ic.reportLease(call, rule, Refused, d, res.Lease, nil)
		return nil, release, ic.refusal(ctx, rule, res, false)
	case edge.Invalid:
		code := codes.Internal
		if errors.Is(err, admit.ErrCrossSlot) {
			code = codes.InvalidArgument // keys from client input on different slots
		}
		ic.report(call, rule, InvalidRule, admit.Decision{}, err)
		return nil, release, invalidStatus(code)
	case edge.NotExecuted:
		ctx, err := ic.outageRun(ctx, call, rule, ic.outage.NotExecuted, err)
		return ctx, release, err
	default: // edge.OutcomeUnknown
		ctx, err := ic.outageRun(ctx, call, rule, ic.outage.OutcomeUnknown, err)
		return ctx, release, err
	}
}

// release frees x's place (see [edge.Release]); a failure, or a
// granted lease found expired, goes to the error hook. It never panics.
func (ic *Interceptors) release(call *Call, x *admit.Lease) {
	if err := edge.Release(call.Context, x, ic.timeout); err != nil {
		ic.fail(call, fmt.Errorf("admitgrpc: %w", err))
	}
}

func (ic *Interceptors) fail(call *Call, err error) {
	if ic.onError != nil {
		ic.onError(call, err)
	}
}

// outageRun answers a call whose decision failed with err, as p says.
func (ic *Interceptors) outageRun(ctx context.Context, call *Call, rule Rule, p OutagePolicy, err error) (context.Context, error) {
	switch p.kind {
	case outageServe:
		ic.report(call, rule, OutageServed, admit.Decision{}, err)
		return ctx, nil
	case outageUnavailable:
		ic.report(call, rule, OutageRefused, admit.Decision{}, err)
		return nil, unavailable(p.retry)
	case outageDegrade:
		if rule.Concurrent != nil {
			// A Degraded holds no leases: refused, so that no more calls
			// of a key run at once than its limit, outage or not.
			ic.report(call, rule, OutageRefused, admit.Decision{}, err)
			return nil, unavailable(time.Second)
		}
		first, second := rule.Requests()
		d, derr := p.degraded.AllowAll(ctx, first, second)
		switch {
		case derr != nil:
			ic.report(call, rule, DegradedRefused, admit.Decision{}, errors.Join(err, derr))
			return nil, unavailable(time.Second)
		case d.Allowed():
			ic.report(call, rule, DegradedAdmitted, d, err)
			if scaled, serr := edge.Scale(p.degraded, rule); serr == nil && ic.quotaMetadata {
				setQuotaMetadata(ctx, scaled, edge.Result{Decision: d})
			}
			return context.WithValue(ctx, admissionKey{}, Admission{Rule: rule, Decision: d, Decider: p.degraded}), nil
		default:
			ic.report(call, rule, DegradedRefused, d, err)
			scaled, serr := edge.Scale(p.degraded, rule) // the quota that refused
			if serr != nil {
				scaled = rule
			}
			return nil, ic.refusal(ctx, scaled, edge.Result{Decision: d}, true)
		}
	default: // outageFunc
		ferr := p.fn(call, rule, err)
		if ferr == nil {
			ic.report(call, rule, OutageServed, admit.Decision{}, err)
			return ctx, nil
		}
		ic.report(call, rule, OutageRefused, admit.Decision{}, err)
		return nil, ferr
	}
}

func (ic *Interceptors) report(call *Call, rule Rule, o Outcome, d admit.Decision, err error) {
	ic.reportLease(call, rule, o, d, nil, err)
}

func (ic *Interceptors) reportLease(call *Call, rule Rule, o Outcome, d admit.Decision, x *admit.Lease, err error) {
	if ic.outcome != nil {
		ic.outcome(Report{Call: call, Rule: rule, Outcome: o, Decision: d, Lease: x, Err: err})
	}
}

// PushbackTrailer is the trailer of gRPC's retry design (A6) that a
// refusal sets to its RetryInfo delay in milliseconds: a grpc-go client
// whose service config retries RESOURCE_EXHAUSTED waits that long before
// its retry, instead of its own backoff.
const PushbackTrailer = "grpc-retry-pushback-ms"

// refusal is the ResourceExhausted status of a refused decision, by the
// concurrency part when res's Lease says so, by a bucket otherwise; it
// sets the pushback trailer (and with WithQuotaMetadata the quota
// fields) on ctx's call.
func (ic *Interceptors) refusal(ctx context.Context, rule Rule, res edge.Result, degraded bool) error {
	d := res.Decision
	delay := roundUpMs(d.RetryAfter)
	md := metadata.Pairs(PushbackTrailer, strconv.FormatInt(delay.Milliseconds(), 10))
	if ic.quotaMetadata {
		policy, limit := edge.Fields(edge.Quotas(rule, res))
		md.Append(PolicyMetadata, policy)
		md.Append(LimitMetadata, limit)
	}
	grpc.SetTrailer(ctx, md) //nolint:errcheck // fails only outside a call, where there is nothing to set
	var policy, desc, msg string
	if x := res.Lease; x != nil && x.Denied == admit.PartConcurrency && rule.Concurrent != nil {
		c := rule.Concurrent
		policy, desc = c.Policy, fmt.Sprintf("%d calls in flight, limit %d", x.Holders, c.Spec.Limit())
		msg = fmt.Sprintf("admit: concurrency limit %q reached; retry after %v", c.Policy, delay)
	} else {
		b := rule.First
		if d.Denied == 2 && rule.Second != nil {
			b = *rule.Second
		}
		unit := b.Unit
		if unit == "" {
			unit = "tokens"
		}
		policy = b.Policy
		desc = fmt.Sprintf("the %q bucket holds %d %s; this call costs %d", b.Policy, d.Remaining[d.Denied-1], unit, b.Tokens())
		msg = fmt.Sprintf("admit: rate limit %q exceeded; retry after %v", b.Policy, delay)
	}
	if degraded {
		msg += " (degraded: the shared limiter is unavailable)"
	}
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: policy, Description: desc}}},
	)
	if err != nil { // policies are checked ASCII: unreachable
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// unavailable is the Unavailable status of an outage refusal.
func unavailable(retry time.Duration) error {
	delay := roundUpMs(retry)
	st, err := status.New(codes.Unavailable, fmt.Sprintf("admit: the rate limiter is unavailable; retry after %v", delay)).
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	if err != nil {
		return status.Error(codes.Unavailable, "admit: the rate limiter is unavailable")
	}
	return st.Err()
}

// invalidStatus is the status of a refused Rule; it does not reveal the
// Rule's error (which the outcome hook gets).
func invalidStatus(code codes.Code) error {
	if code == codes.InvalidArgument {
		return status.Error(code, "admit: this call lacks a valid value for what its rate limit is keyed on")
	}
	return status.Error(code, "admit: the server's rate-limit rule for this call is invalid")
}

// roundUpMs rounds d up to a whole millisecond, at least one: never short.
func roundUpMs(d time.Duration) time.Duration {
	r := (d + time.Millisecond - 1).Truncate(time.Millisecond)
	return max(r, time.Millisecond)
}

// checkRule refuses a Rule that must not be decided (see [edge.Check]):
// InvalidArgument for keys, which a client's metadata may have made what
// they are; Internal for the rest, which the server's code chose.
func checkRule(rule Rule) (codes.Code, error) {
	f := edge.Check(rule)
	switch {
	case f == nil:
		return codes.OK, nil
	case f.InKey:
		return codes.InvalidArgument, fmt.Errorf("admitgrpc: %w", f)
	}
	return codes.Internal, fmt.Errorf("admitgrpc: %w", f)
}

// The metadata keys of [WithQuotaMetadata]: the values of HTTP's
// RateLimit-Policy and RateLimit fields (draft-ietf-httpapi-ratelimit-
// headers-11), as admithttp sends them.
const (
	PolicyMetadata = "ratelimit-policy"
	LimitMetadata  = "ratelimit"
)

// WithQuotaMetadata sends the quota of every decided call as metadata:
// [PolicyMetadata] (every part of the Rule: q, qu, w) and [LimitMetadata]
// (every part decided: r, and t, the seconds until more than r), in
// response headers on an admitted call (set before its handler runs) and
// in trailers on a refusal; while degraded ([Degrade]) they give the
// scaled quota that decided. Default: refusals carry RetryInfo,
// QuotaFailure and the pushback trailer alone.
func WithQuotaMetadata() Option {
	return optionFunc(func(c *config) error { c.quotaMetadata = true; return nil })
}

// setQuotaMetadata sends the quota fields of an admitted call as header
// metadata.
func setQuotaMetadata(ctx context.Context, rule Rule, res edge.Result) {
	policy, limit := edge.Fields(edge.Quotas(rule, res))
	grpc.SetHeader(ctx, metadata.Pairs(PolicyMetadata, policy, LimitMetadata, limit)) //nolint:errcheck // fails only outside a call
}
