// Package edge is what the HTTP and gRPC edges (admithttp, admitgrpc)
// share, with neither transport in it: the Rule a request or call is
// charged, its checks, the one all-or-nothing call that decides it, the
// reading of that call's outcome, and the release of its concurrency
// lease. admithttp and admitgrpc alias its types (admithttp.Rule is
// edge.Rule), so that one Rule means the same at both edges.
package edge

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/deciderhook"
)

// ShadowPrefix starts every key a shadow rule decides on. Enforced keys
// must not start with it.
const ShadowPrefix = "admit-shadow:"

// A Bucket is one token bucket a request (or call) is charged to, and the
// name under which a refusal names it.
type Bucket struct {
	// Policy names the bucket in refusals (HTTP's RateLimit fields and
	// problem body, gRPC's QuotaFailure). It must be printable ASCII
	// (0x20 to 0x7E), not empty, and differ from the Rule's other parts'.
	Policy string
	// Key is the bucket's key; it must not be empty, nor over
	// admit.MaxKeyLen, nor start with [ShadowPrefix]. The keys of a Rule
	// must share a hash tag on Valkey Cluster, as in "rl:{api}:standard"
	// and "rl:{api}:shared". Build the part that comes from the client
	// with [admit.KeyPart].
	Key string
	// Spec is the bucket's rate and burst; it must not be the zero Spec.
	Spec admit.Spec
	// Cost is the tokens the request takes; 0 means 1. A Cost above the
	// Spec's burst could never be admitted: the Rule is refused as the
	// server's error, so bound it before the edge.
	Cost int
	// Unit, when set, is what the bucket counts, printable ASCII: the
	// HTTP draft's qu parameter ("requests" when empty,
	// "content-bytes", or your own, such as "llm-tokens"). gRPC names it
	// in the QuotaFailure's description.
	Unit string
}

// Request returns the bucket as an [admit.Request].
func (b Bucket) Request() admit.Request {
	return admit.Request{Key: b.Key, Spec: b.Spec, Cost: b.Cost}
}

// Tokens is what the bucket's request takes: its Cost, or 1 for a Cost
// of 0.
func (b Bucket) Tokens() int { return max(b.Cost, 1) }

// DefaultConcurrencyRetryAfter is the wait a concurrency refusal tells
// the client when the Concurrent's RetryAfter is zero.
const DefaultConcurrencyRetryAfter = time.Second

// A Concurrent is a concurrency limit: a request holds one of its places
// (an [admit.Lease]) from its admission until its handler returns or
// panics, so that at most Spec.Limit() requests of its Key run at once.
type Concurrent struct {
	// Policy names the limit in refusals. It must be printable ASCII
	// (0x20 to 0x7E), not empty, and differ from the buckets' policies.
	Policy string
	// Key is the lease key (a sorted set of holders); it must not be
	// empty, must differ from the buckets' keys, and must share their
	// hash tag on Valkey Cluster, as in "conc:{org:7}" beside
	// "tpm:{org:7}".
	Key string
	// Spec is the limit and the lease duration; it must not be the zero
	// Concurrency. Give a lease longer than the slowest handler.
	Spec admit.Concurrency
	// RetryAfter is the wait a refusal by this limit tells the client:
	// about how long a handler holds its place. Holders release at
	// their end, long before their leases expire, so the refusal says
	// the smaller of RetryAfter and the time until the key's oldest
	// lease expires (after which a place is surely free). Zero means
	// DefaultConcurrencyRetryAfter (one second); it must not be
	// negative.
	RetryAfter time.Duration
}

// A Rule is what one request is charged: a place of Concurrent, if not
// nil, then First, and only when First admits, Second, all or nothing. A
// nil Second is the one-bucket path; a Rule with a concurrency part may
// have no bucket (First zero and Second nil). The zero Rule means no
// limit: the handler runs undecided, at both edges.
type Rule struct {
	// First is checked first: the standard lane's own bucket, or the
	// premium lane's shared one.
	First Bucket
	// Second, if not nil, is checked only when First admits: the shared
	// bucket of the standard lane.
	Second *Bucket
	// Concurrent, if not nil, is a concurrency limit whose place the
	// request holds while its handler runs; it is decided before the
	// buckets, in the same script run.
	Concurrent *Concurrent
}

// IsZero reports whether r is the zero Rule: no limit.
func (r Rule) IsZero() bool { return r.First == (Bucket{}) && r.Second == nil && r.Concurrent == nil }

// PolicyOf returns the policy name and key of r's part p (a bucket, or
// the concurrency part): the part that refused a request, say. For 0, or
// a part r lacks, it returns r's first part's: the first bucket's, or
// without buckets the concurrency part's.
func (r Rule) PolicyOf(p admit.Part) (policy, key string) {
	switch {
	case p == admit.PartConcurrency && r.Concurrent != nil:
		return r.Concurrent.Policy, r.Concurrent.Key
	case p == admit.PartSecond && r.Second != nil:
		return r.Second.Policy, r.Second.Key
	case !r.HasBuckets():
		return r.Concurrent.Policy, r.Concurrent.Key
	}
	return r.First.Policy, r.First.Key
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

// Requests returns the Rule's buckets as the arguments of admit's calls,
// for example to Refund the unused part of a reservation; a Rule without
// a bucket returns the zero Request and nil: there is nothing to refund.
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

// Clone returns r with its own copies of Second and Concurrent, so that a
// callee may change them freely.
func (r Rule) Clone() Rule {
	r.Second, r.Concurrent = clonePtr(r.Second), clonePtr(r.Concurrent)
	return r
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// CheckDecider returns an error, naming what to pass instead, for a
// decider that can decide nothing: nil, or an *admit.Limiter built
// without a client. It sends nothing.
func CheckDecider(dec admit.Decider) error {
	if dec == nil {
		return errors.New("nil decider; pass admit.New(client), or an admit.Local for one process")
	}
	if deciderhook.Check != nil {
		return deciderhook.Check(dec)
	}
	return nil
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
	switch {
	case c.Spec.IsZero():
		return errors.New("zero Spec; give it admit.NewConcurrency's or admit.MustConcurrency's")
	case c.RetryAfter < 0:
		return fmt.Errorf("a negative RetryAfter (%v); give about how long a handler holds its place, or 0 for one second", c.RetryAfter)
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
