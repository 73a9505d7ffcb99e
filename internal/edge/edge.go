// Package edge is what the HTTP and gRPC edges (admithttp, admitgrpc)
// share, with neither transport in it: the shape of a Rule, its checks,
// the one all-or-nothing call that decides it, and the release of its
// concurrency slot. Each edge keeps its exported types, documented in its
// own words, and converts them to these to decide.
package edge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/admitkit/admit"
)

// ShadowPrefix starts every key a shadow rule decides on. Enforced keys
// must not start with it. Each edge exports the same value as its own
// ShadowPrefix; their tests that an enforced key under it is refused hold
// the two equal.
const ShadowPrefix = "admit-shadow:"

// A Bucket is one token bucket of a Rule: Policy names it in refusals;
// Key, Spec and Cost (0 meaning 1) make its [admit.Request]; Unit is what
// it counts, for the HTTP header fields (empty for requests, and always on
// the gRPC edge). admithttp.Bucket has the same fields, so that it
// converts to a Bucket.
type Bucket struct {
	Policy, Key string
	Spec        admit.Spec
	Cost        int
	Unit        string
}

// Request returns the bucket as an [admit.Request].
func (b Bucket) Request() admit.Request {
	return admit.Request{Key: b.Key, Spec: b.Spec, Cost: b.Cost}
}

// Tokens is what the bucket's request takes: its Cost, or 1 for a Cost
// of 0 (Check refuses a negative one).
func (b Bucket) Tokens() int { return max(b.Cost, 1) }

// A Concurrent is a concurrency limit: Policy names it in refusals, Key is
// its lease key, Spec its limit and lease duration. Both edges' Concurrent
// types have the same fields, so that they convert to one.
type Concurrent struct {
	Policy, Key string
	Spec        admit.Concurrency
}

// A Rule is what one request is charged: a slot of Concurrent, if not nil,
// then First, and only when First admits, Second, all or nothing.
type Rule struct {
	First      Bucket
	Second     *Bucket
	Concurrent *Concurrent
}

// HasBuckets reports whether r names a bucket: any Rule but one with a
// concurrency part and neither First nor Second.
func (r Rule) HasBuckets() bool {
	return r.Concurrent == nil || r.First != (Bucket{}) || r.Second != nil
}

// Buckets returns the Rule's buckets in order.
func (r Rule) Buckets() []Bucket {
	switch {
	case !r.HasBuckets():
		return nil
	case r.Second == nil:
		return []Bucket{r.First}
	}
	return []Bucket{r.First, *r.Second}
}

// Requests returns the Rule's buckets as the arguments of admit's calls;
// a Rule without a bucket returns the zero Request and nil.
func (r Rule) Requests() (first admit.Request, second *admit.Request) {
	if !r.HasBuckets() {
		return admit.Request{}, nil
	}
	first = r.First.Request()
	if r.Second != nil {
		s := r.Second.Request()
		second = &s
	}
	return first, second
}

// Copy returns a pointer to a copy of *p, or nil for nil: what a Rule's
// clone makes of its Second and Concurrent, so that a callee may change
// them freely.
func Copy[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// A Fault is what makes a Rule invalid. It wraps [admit.ErrInvalidRequest]
// and [admit.ErrNotExecuted]: nothing was sent.
type Fault struct {
	// Part is the bucket at fault, 1 or 2, or 0 for the concurrency part.
	Part int
	// Policy is the part's Policy.
	Policy string
	// InKey is true when the fault is in a key (empty, too long, in the
	// shadow namespace, another part's): what a client's value may have
	// made it. Any other fault is the server's code's.
	InKey bool
	// Err says what is wrong and how to fix it.
	Err error
}

func (f *Fault) Error() string {
	if f.Part == 0 {
		return fmt.Sprintf("concurrency part (policy %q) of the Rule: %v", f.Policy, f.Err)
	}
	return fmt.Sprintf("bucket %d (policy %q) of the Rule: %v", f.Part, f.Policy, f.Err)
}

// Unwrap returns the fault's reason and admit's classes of a refused call.
func (f *Fault) Unwrap() []error {
	return []error{f.Err, admit.ErrInvalidRequest, admit.ErrNotExecuted}
}

// Check returns the first fault of rule, nil when it may be decided. Keys
// come first: whatever else is wrong, an empty or hostile key is what a
// client's value may have made it. admit checks what is left (that the
// keys share a cluster slot).
func Check(rule Rule) *Fault {
	bs := rule.Buckets() // none only with a concurrency part
	c := rule.Concurrent
	for i, b := range bs {
		if err := checkKey(b.Key); err != nil {
			return &Fault{Part: i + 1, Policy: b.Policy, InKey: true, Err: err}
		}
	}
	if len(bs) == 2 && bs[0].Key == bs[1].Key {
		return &Fault{Part: 2, Policy: bs[1].Policy, InKey: true, Err: errors.New("the first bucket's Key too; give each bucket its own key")}
	}
	if c != nil {
		if err := checkKey(c.Key); err != nil {
			return &Fault{Policy: c.Policy, InKey: true, Err: err}
		}
		for _, b := range bs {
			if b.Key == c.Key {
				return &Fault{Policy: c.Policy, InKey: true, Err: fmt.Errorf("bucket %q's Key too; give the lease its own key", b.Policy)}
			}
		}
	}
	for i, b := range bs {
		if err := checkBucket(b); err != nil {
			return &Fault{Part: i + 1, Policy: b.Policy, Err: err}
		}
	}
	if len(bs) == 2 && bs[0].Policy == bs[1].Policy {
		return &Fault{Part: 2, Policy: bs[1].Policy, Err: errors.New("the first bucket's policy name too; name each bucket differently")}
	}
	if c != nil {
		if err := checkConcurrent(*c, bs); err != nil {
			return &Fault{Policy: c.Policy, Err: err}
		}
	}
	return nil
}

// checkConcurrent refuses a concurrency part's Spec or policy name.
func checkConcurrent(c Concurrent, bs []Bucket) error {
	if c.Spec.IsZero() {
		return errors.New("zero Spec; give it admit.NewConcurrency's or admit.MustConcurrency's")
	}
	if err := checkName("policy name", c.Policy, true); err != nil {
		return err
	}
	for _, b := range bs {
		if b.Policy == c.Policy {
			return errors.New("a bucket's policy name too; name each part differently")
		}
	}
	return nil
}

// checkKey refuses a key admit would refuse, and one in the shadow rules'
// namespace.
func checkKey(k string) error {
	switch {
	case k == "":
		return errors.New("empty Key; build keys from client values with admit.KeyPart, which never returns an empty part")
	case len(k) > admit.MaxKeyLen:
		return fmt.Errorf("a Key of %d bytes, over %d; build key parts from client values with admit.KeyPart, which bounds them", len(k), admit.MaxKeyLen)
	case strings.HasPrefix(k, ShadowPrefix):
		return fmt.Errorf("key %q is in the shadow rules' namespace %q; enforced keys must not start with it", k, ShadowPrefix)
	}
	return nil
}

// checkBucket refuses a bucket's Spec, Cost, policy name or unit.
func checkBucket(b Bucket) error {
	switch {
	case b.Spec.IsZero():
		return errors.New("zero Spec; give the bucket admit.NewSpec's or admit.MustSpec's")
	case b.Cost < 0 || b.Cost > b.Spec.Burst():
		return fmt.Errorf("a Cost of %d, outside 0 to the bucket's burst %d: it could never be admitted", b.Cost, b.Spec.Burst())
	}
	if err := checkName("policy name", b.Policy, true); err != nil {
		return err
	}
	return checkName("unit", b.Unit, false)
}

// CheckShadow refuses a shadow rule whose name checkShadowName refuses, or
// that lacks its Rule or its Report function. of is what the edge decides:
// "request" or "call".
func CheckShadow(name string, taken []string, hasRule, hasReport bool, of string) error {
	if err := checkShadowName(name, taken); err != nil {
		return err
	}
	switch {
	case !hasRule:
		return fmt.Errorf("%q: nil Rule; pass a function from the %s to the candidate Rule", name, of)
	case !hasReport:
		return fmt.Errorf("%q: nil Report; a shadow that reports nowhere only costs decisions", name)
	}
	return nil
}

// checkShadowName refuses a shadow rule's name that is empty, holds a
// brace (which would change its keys' hash tag), is not printable ASCII,
// or is one of taken.
func checkShadowName(name string, taken []string) error {
	switch {
	case name == "":
		return errors.New("empty Name; name the candidate, for example \"tight-standard\"")
	case strings.ContainsAny(name, "{}"):
		return fmt.Errorf("the Name %q holds a brace, which would change its keys' hash tag; drop it", name)
	case slices.Contains(taken, name):
		return fmt.Errorf("two shadows named %q; their keys would collide", name)
	}
	return checkName("Name", name, true)
}

// checkName refuses a name that is empty (when required) or holds
// anything but printable ASCII, which a refusal cannot carry.
func checkName(what, s string, required bool) error {
	if s == "" {
		if required {
			return fmt.Errorf("empty %s; every part needs one to be named in refusals", what)
		}
		return nil
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%s %q has byte %#x at %d; use printable ASCII only", what, s, c, i)
		}
	}
	return nil
}

// An Acquirer decides concurrency limits: *admit.Limiter.
type Acquirer interface {
	Acquire(ctx context.Context, slot admit.LeaseRequest, first, second *admit.Request) (*admit.Lease, error)
}

// A Result is one decided Rule: the Decision, whose Remaining is what each
// bucket holds after the call, and with a concurrency part the Lease.
type Result struct {
	Decision admit.Decision
	// Lease is nil without a concurrency part.
	Lease *admit.Lease
}

// Allowed reports whether the decision admitted the request.
func (res Result) Allowed() bool {
	if res.Lease != nil {
		return res.Lease.Granted()
	}
	return res.Decision.Allowed()
}

// Denied is the part that refused: 0 when admitted.
func (res Result) Denied() admit.Part {
	if res.Lease != nil {
		return res.Lease.Denied
	}
	return admit.Part(res.Decision.Denied)
}

// Decide decides rule, all or nothing, within timeout when it is above
// zero: on dec's AllowAll for buckets alone, on acq's Acquire with a
// concurrency part. With a concurrency part the Lease is never nil, error
// or not, and the Decision of a decided Acquire is the Lease's decision of
// the buckets (Allowed when granted), or, for a refusal by the slot, the
// slot's RetryAfter with the buckets' Remaining. acq may be nil only when
// rule has no concurrency part.
func Decide(ctx context.Context, dec admit.Decider, acq Acquirer, rule Rule, timeout time.Duration) (Result, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	first, second := rule.Requests()
	c := rule.Concurrent
	if c == nil {
		d, err := dec.AllowAll(ctx, first, second)
		return Result{Decision: d}, err
	}
	var fp *admit.Request
	if rule.HasBuckets() {
		fp = &first
	}
	x, err := acq.Acquire(ctx, admit.LeaseRequest{Key: c.Key, Spec: c.Spec}, fp, second)
	switch {
	case err != nil:
		return Result{Lease: x}, err
	case x.Denied == admit.PartConcurrency:
		return Result{Decision: admit.Decision{RetryAfter: x.RetryAfter, Remaining: x.Remaining}, Lease: x}, nil
	}
	return Result{Decision: x.Decision(), Lease: x}, nil
}

// releaseTimeout bounds a release when the edge has no decision timeout.
const releaseTimeout = time.Second

// Release frees the slot of x, on a context that outlives ctx's
// cancellation (a client that went away must not keep the slot), bounded
// by timeout, or releaseTimeout when it is zero. It returns the release's
// failure, or for a granted lease found expired, an error that says the
// handler outlived it and the limit stopped counting it for a while.
func Release(ctx context.Context, x *admit.Lease, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = releaseTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	live, err := x.Release(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("releasing the slot of %q: %w", x.Key, err)
	case x.Granted() && !live:
		return fmt.Errorf("the lease on %q had expired when the handler returned: the handler ran longer than the lease (%v), "+
			"and the concurrency limit stopped counting it; give a longer lease, or extend it from the handler (Admission.Lease)", x.Key, x.TTL)
	}
	return nil
}
