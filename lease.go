package admit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Bounds of a Concurrency.
const (
	// MaxConcurrency is the largest limit, and the most expired holders
	// an Acquire prunes.
	MaxConcurrency = 10000
	// MinLease and MaxLease bound a Concurrency's lease duration.
	MinLease = time.Millisecond
	MaxLease = 24 * time.Hour
	// MaxLeaseNameLen is the longest lease name Acquire accepts, in bytes.
	MaxLeaseNameLen = 256
)

// A Concurrency allows at most Limit live leases of one key, each lasting
// Lease on the server's clock unless extended or released. It is an
// immutable value; the zero Concurrency is invalid.
type Concurrency struct {
	limit int
	lease time.Duration
	// Pre-encoded: "limit lease_µs " the start of the script's lease
	// argument, to which Acquire appends the holder's name.
	argPrefix string
}

// NewConcurrency returns a Concurrency of at most limit live leases per
// key, each lasting lease. It returns an error wrapping [ErrInvalidSpec]
// when limit is outside [1, MaxConcurrency], or lease is outside
// [MinLease, MaxLease] or not a whole number of microseconds.
func NewConcurrency(limit int, lease time.Duration) (Concurrency, error) {
	switch {
	case limit < 1 || limit > MaxConcurrency:
		return Concurrency{}, fmt.Errorf("%w: concurrency limit %d must be between 1 and MaxConcurrency (%d)", ErrInvalidSpec, limit, MaxConcurrency)
	case lease < MinLease || lease > MaxLease:
		return Concurrency{}, fmt.Errorf("%w: lease %v must be between MinLease (%v) and MaxLease (%v)", ErrInvalidSpec, lease, MinLease, MaxLease)
	case lease%time.Microsecond != 0:
		return Concurrency{}, fmt.Errorf("%w: lease %v is not a whole number of microseconds, the server clock's unit", ErrInvalidSpec, lease)
	}
	return Concurrency{
		limit: limit, lease: lease,
		argPrefix: strconv.Itoa(limit) + " " + strconv.FormatInt(lease.Microseconds(), 10) + " ",
	}, nil
}

// MustConcurrency is like [NewConcurrency] but panics if the arguments are
// invalid. It is meant for package-level values built from constants.
func MustConcurrency(limit int, lease time.Duration) Concurrency {
	c, err := NewConcurrency(limit, lease)
	if err != nil {
		panic(err)
	}
	return c
}

// Limit returns the most leases of one key live at once.
func (c Concurrency) Limit() int { return c.limit }

// Lease returns how long a lease lasts on the server's clock, from its
// grant or its last Extend.
func (c Concurrency) Lease() time.Duration { return c.lease }

// IsZero reports whether c is the zero Concurrency, which is invalid.
func (c Concurrency) IsZero() bool { return c.limit == 0 }

// String describes c, for example "10 at once, lease 30s".
func (c Concurrency) String() string {
	if c.IsZero() {
		return "invalid zero Concurrency"
	}
	return strconv.Itoa(c.limit) + " at once, lease " + c.lease.String()
}

// A LeaseRequest names the concurrency part of an [Limiter.Acquire]: the lease
// key, its limit, and the holder's name.
type LeaseRequest struct {
	Key  string      // the lease key, a sorted set of holders; not a bucket's key
	Spec Concurrency // the limit and the lease duration
	// Name names the holder (at most MaxLeaseNameLen bytes; empty draws a
	// random one): an Acquire under a live lease's name replays it, so give
	// the unit of work's id to retry safely.
	Name string
}

// A Part is a part of an Acquire, the one that refused it.
type Part uint8

// The parts of an Acquire, decided in the order concurrency, first, second. The
// buckets' values are those of [Decision.Denied].
const (
	PartFirst       Part = 1 // the first bucket
	PartSecond      Part = 2 // the second bucket
	PartConcurrency Part = 3 // the concurrency limit: every lease is held
)

// String names the part: "first bucket", "second bucket" or "concurrency".
func (p Part) String() string {
	switch p {
	case 0:
		return "none"
	case PartFirst:
		return "first bucket"
	case PartSecond:
		return "second bucket"
	case PartConcurrency:
		return "concurrency"
	}
	return "part " + strconv.Itoa(int(p))
}

// A Lease is an Acquire's outcome: a granted lease, or a refusal. Acquire
// always returns one, so "defer lease.Release(ctx)" is safe right after
// it; its methods are safe for concurrent use.
type Lease struct {
	Key, Name string // the lease key; the holder's name (drawn when none was given)
	Denied    Part   // the part that refused; 0 when granted or with an error
	// RetryAfter is 0 when granted; else the refusing bucket's wait, or
	// for the concurrency limit the time until its oldest lease expires.
	RetryAfter time.Duration
	Remaining  [2]int        // as in Decision: -1 for a bucket not evaluated
	Holders    int           // live leases of the key after the call
	TTL        time.Duration // the lease's time left when granted; see Deadline

	l        *Limiter
	spec     Concurrency
	granted  bool
	replayed bool
	// sent is set when an acquire was sent and may have been granted: a
	// granted Lease, or one whose Acquire's outcome is unknown.
	sent bool
	// deadline is the local monotonic moment (since monoBase) before which
	// the lease is live on the server; 0 when not granted, released when
	// a Release has freed it (an Extend's late reply must not revive it).
	deadline atomic.Int64
}

// monoBase anchors Lease deadlines on the monotonic clock.
var monoBase = time.Now()

// released is the deadline of a Lease whose Release freed it: final.
const released = -1

// setDeadline stores d unless a Release has freed the lease: an Extend
// that ran on the server before a Release may reply after it.
func (x *Lease) setDeadline(d int64) {
	for {
		old := x.deadline.Load()
		if old == released || x.deadline.CompareAndSwap(old, d) {
			return
		}
	}
}

// Granted reports whether the Acquire was granted; false with every error.
func (x *Lease) Granted() bool { return x != nil && x.granted }

// Decision returns what the Acquire decided of its buckets; a concurrency
// refusal, which a Decision cannot name, gives the zero Decision.
func (x *Lease) Decision() Decision {
	switch {
	case x == nil:
		return Decision{}
	case x.granted:
		return Decision{Remaining: x.Remaining, decided: true}
	case x.Denied == PartFirst || x.Denied == PartSecond:
		return Decision{Denied: uint8(x.Denied), RetryAfter: x.RetryAfter, Remaining: x.Remaining, decided: true}
	}
	return Decision{}
}

// Replayed reports whether an earlier Acquire under the same name granted
// the lease: this call took nothing.
func (x *Lease) Replayed() bool { return x != nil && x.replayed }

// Deadline returns the local moment until which the lease is surely live
// on the server (measured from before the call was sent), or the zero Time
// when it is not held: stop, or Extend, before it (docs/leases.md).
func (x *Lease) Deadline() time.Time {
	if x == nil {
		return time.Time{}
	}
	d := x.deadline.Load()
	if d <= 0 {
		return time.Time{}
	}
	return monoBase.Add(time.Duration(d))
}

// String describes the lease, for example
// `granted "job-42" on "conc:{org:7}" (3 holders)` or
// "refused by concurrency, retry after 2.5s".
func (x *Lease) String() string {
	switch {
	case x == nil:
		return "no lease"
	case x.granted:
		s := "granted " + strconv.Quote(x.Name) + " on " + strconv.Quote(x.Key) + " (" + strconv.Itoa(x.Holders) + " holders)"
		if x.replayed {
			s += ", replayed"
		}
		return s
	case x.Denied != 0:
		return "refused by " + x.Denied.String() + ", retry after " + x.RetryAfter.String()
	}
	return "no lease"
}

// Script modes of lease calls, sent after the buckets' arguments (if
// any), then one argument: "limit lease_µs name".
const (
	modeLeaseAcquire = "l"
	modeLeaseExtend  = "e"
	modeLeaseRelease = "f"
	// releasePrefix stands for a zero Concurrency's "limit lease_µs " in
	// a release, which the script checks but does not use.
	releasePrefix = "1 1000 "
)

// Acquire takes one of req's leases and, if given, first's and second's
// Costs, all or nothing, in one round trip. A refusal is a Lease that is
// not Granted, whose Denied names the part that refused; an Acquire under
// a live lease's name returns that lease, Replayed (docs/leases.md).
// Errors are [ErrInvalidRequest] (nothing sent), [ErrNotExecuted] or
// [ErrOutcomeUnknown].
func (l *Limiter) Acquire(ctx context.Context, req LeaseRequest, first, second *Request) (*Lease, error) {
	start := l.observeStart()
	x, err := l.acquire(ctx, req, first, second)
	l.observedLease(ctx, OpAcquire, x, x.Decision(), start, false, err)
	return x, err
}

// acquire is Acquire, unobserved: it returns a non-nil *Lease always.
func (l *Limiter) acquire(ctx context.Context, req LeaseRequest, first, second *Request) (*Lease, error) {
	x := &Lease{Key: req.Key, Name: req.Name, Remaining: [2]int{-1, -1}, l: l, spec: req.Spec}
	if x.Name == "" {
		var b [12]byte
		rand.Read(b[:]) // never fails (crypto/rand)
		x.Name = base64.RawURLEncoding.EncodeToString(b[:])
	}
	if err := l.checkAcquire(ctx, x.Name, req, first, second); err != nil {
		return x, err
	}
	c := call{op: OpAcquire, mode: modeLeaseAcquire}
	c.encode(first, second, modeLeaseAcquire, req.Key, req.Spec.argPrefix+x.Name)
	sent := time.Since(monoBase)
	s, err := l.sendLease(ctx, &c)
	if err != nil {
		x.sent = !isNotExecuted(err)
		return x, err
	}
	x.sent = true
	if err := x.decodeAcquire(s, c.buckets, sent); err != nil {
		return x, err
	}
	x.sent = x.granted
	return x, nil
}

// isNotExecuted reports whether err is classed ErrNotExecuted.
func isNotExecuted(err error) bool {
	ce, ok := err.(*callError)
	return ok && ce.class == ErrNotExecuted
}

// checkAcquire refuses what can be known client-side, before anything is
// sent.
func (l *Limiter) checkAcquire(ctx context.Context, name string, req LeaseRequest, first, second *Request) error {
	switch {
	case l == nil || l.client == nil:
		return invalidRequest("the Limiter has no client; build it with admit.New")
	case ctx == nil:
		return invalidRequest("nil context")
	}
	if err := checkLease(req.Key, name, req.Spec, true); err != nil {
		return err
	}
	switch {
	case first == nil && second != nil:
		return invalidRequest("a second bucket without a first; pass the one bucket as first")
	case first == nil:
		return nil
	}
	cluster := l.client.Mode() == valkey.ClientModeCluster
	if err := checkBuckets(*first, second, cluster); err != nil {
		return err
	}
	for _, r := range [2]*Request{first, second} {
		if r == nil {
			continue
		}
		if r.Key == req.Key {
			return invalidRequest("a bucket and the LeaseRequest name the same key " + strconv.Quote(req.Key) + "; a lease key is a sorted set of its own")
		}
		if cluster {
			if err := checkSameSlot("the lease key and bucket key", req.Key, r.Key, "{org:7}"); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkLease refuses a lease key, holder name or Concurrency that can
// never be sent: the one check of Acquire and of a Lease's Release and
// Extend (needSpec: all but Release, which reads the name alone).
func checkLease(key, name string, spec Concurrency, needSpec bool) error {
	switch {
	case key == "":
		return invalidRequest("the lease has an empty Key")
	case len(key) > MaxKeyLen:
		return invalidRequest("the lease's Key is " + strconv.Itoa(len(key)) + " bytes, over MaxKeyLen (" + strconv.Itoa(MaxKeyLen) + ")")
	case needSpec && spec.IsZero():
		return invalidRequest("the lease of key " + strconv.Quote(key) + " has the zero Concurrency; build one with admit.NewConcurrency")
	case name == "" || len(name) > MaxLeaseNameLen:
		return invalidRequest("the lease of key " + strconv.Quote(key) + " has a name of " + strconv.Itoa(len(name)) +
			" bytes; want 1 to MaxLeaseNameLen (" + strconv.Itoa(MaxLeaseNameLen) + ")")
	}
	return nil
}

// decodeAcquire reads the reply of an acquire: seven decimal integers,
// "denied retry_us rem1 rem2 holders left_us replayed".
func (x *Lease) decodeAcquire(s string, buckets uint8, sent time.Duration) error {
	var f [7]int64
	if err := fields(s, f[:]); err != nil {
		return err
	}
	denied, retry, rem1, rem2, holders, left, replayed := f[0], f[1], f[2], f[3], f[4], f[5], f[6]
	switch {
	case denied < 0 || denied > 3 || (denied != 3 && denied > int64(buckets)):
		return badReply("lease: denied " + strconv.FormatInt(denied, 10) + " out of range in " + strconv.Quote(s))
	case (denied == 0) != (retry == 0) || retry < 0 || (denied == 0) != (left > 0) || left < 0:
		return badReply("lease: retry and time left inconsistent with denied in " + strconv.Quote(s))
	case replayed < 0 || replayed > 1 || (replayed == 1 && denied != 0):
		return badReply("lease: replayed flag out of range in " + strconv.Quote(s))
	case holders < 0 || holders > MaxConcurrency || (denied == 0 && holders < 1):
		return badReply("lease: holders " + strconv.FormatInt(holders, 10) + " out of range in " + strconv.Quote(s))
	case rem1 < -1 || rem2 < -1 || (buckets < 2 && rem2 != -1) || (buckets == 0 && rem1 != -1):
		return badReply("lease: remaining inconsistent with " + strconv.Itoa(int(buckets)) + " buckets in " + strconv.Quote(s))
	}
	x.Denied, x.RetryAfter = Part(denied), time.Duration(retry)*time.Microsecond
	x.Remaining, x.Holders = [2]int{int(rem1), int(rem2)}, int(holders)
	if denied == 0 {
		x.granted, x.replayed, x.TTL = true, replayed == 1, time.Duration(left)*time.Microsecond
		x.deadline.Store(int64(sent + time.Duration(left)*time.Microsecond))
	}
	return nil
}

// Release frees the lease and reports whether it was live on the server.
// It is idempotent, sends nothing for a Lease never sent, and leaves
// Deadline zero once it returns without error. Give it a context that is
// not done: context.WithoutCancel(ctx) in a deferred Release.
func (x *Lease) Release(ctx context.Context) (bool, error) {
	if x == nil {
		return false, nil
	}
	start := x.l.observeStart()
	live, err := x.release(ctx)
	x.l.observedLease(ctx, OpRelease, x, Decision{}, start, live, err)
	return live, err
}

// release is Release, unobserved.
func (x *Lease) release(ctx context.Context) (bool, error) {
	if !x.sent {
		return false, nil
	}
	s, err := x.lone(ctx, modeLeaseRelease)
	if err != nil {
		if !isNotExecuted(err) {
			x.setDeadline(0) // the release may have run: no longer sure
		}
		return false, err
	}
	// Whatever the reply, the lease is not held on the server now.
	x.deadline.Store(released)
	var f [1]int64
	if err := fields(s, f[:]); err != nil {
		return false, err
	}
	if f[0] < 0 || f[0] > 2 {
		return false, badReply("lease: release reply " + strconv.Quote(s))
	}
	return f[0] == 1, nil
}

// Extend renews a live lease to its Concurrency's lease duration from now
// and moves Deadline; it reports false, and writes nothing, when the lease
// expired or was released.
func (x *Lease) Extend(ctx context.Context) (bool, error) {
	if x == nil {
		return false, nil
	}
	start := x.l.observeStart()
	live, err := x.extend(ctx)
	x.l.observedLease(ctx, OpExtend, x, Decision{}, start, live, err)
	return live, err
}

// extend is Extend, unobserved.
func (x *Lease) extend(ctx context.Context) (bool, error) {
	if !x.sent {
		return false, nil
	}
	sent := time.Since(monoBase)
	s, err := x.lone(ctx, modeLeaseExtend)
	if err != nil {
		return false, err
	}
	var f [2]int64
	if err := fields(s, f[:]); err != nil {
		return false, err
	}
	switch {
	case f[0] == 1 && f[1] > 0:
		x.setDeadline(int64(sent + time.Duration(f[1])*time.Microsecond))
		return true, nil
	case f[0] == 0 && f[1] == 0:
		x.setDeadline(0)
		return false, nil
	}
	return false, badReply("lease: extend reply " + strconv.Quote(s))
}

// Lease returns a handle on the lease req.Name holds on req.Key, to Extend
// or Release it from elsewhere than its Acquire (a restarted process, an
// operator's tool). It sends nothing.
func (l *Limiter) Lease(req LeaseRequest) *Lease {
	x := &Lease{Key: req.Key, Name: req.Name, Remaining: [2]int{-1, -1}, l: l, spec: req.Spec, sent: true}
	return x
}

// lone sends a lease call without buckets in mode.
func (x *Lease) lone(ctx context.Context, mode string) (string, error) {
	switch {
	case x.l == nil || x.l.client == nil:
		return "", invalidRequest("the Lease has no Limiter; get one from Limiter.Acquire or Limiter.Lease")
	case ctx == nil:
		return "", invalidRequest("nil context")
	}
	if err := checkLease(x.Key, x.Name, x.spec, mode != modeLeaseRelease); err != nil {
		return "", err
	}
	prefix := x.spec.argPrefix
	if prefix == "" {
		prefix = releasePrefix // a release reads the name alone
	}
	c := call{mode: mode}
	c.encode(nil, nil, mode, x.Key, prefix+x.Name)
	return x.l.sendLease(ctx, &c)
}
