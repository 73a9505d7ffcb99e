package admit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Bounds of a Concurrency.
const (
	// MaxConcurrency is the largest limit a Concurrency accepts. It bounds
	// the work of every call on a lease key: an Acquire prunes at most
	// this many expired holders.
	MaxConcurrency = 10000
	// MinLease and MaxLease bound a Concurrency's lease duration.
	MinLease = time.Millisecond
	MaxLease = 24 * time.Hour
	// MaxLeaseNameLen is the longest lease name Acquire accepts, in bytes.
	MaxLeaseNameLen = 256
)

// A Concurrency describes a concurrency limit: at most Limit leases of one
// key are live at once, and each lease lasts Lease on the server's clock
// unless it is extended or released first. A holder that dies without
// releasing frees its place when its lease expires.
//
// A Concurrency is an immutable value; build it once (for example with
// [MustConcurrency] in a package-level var) and share it between
// goroutines. The zero Concurrency is invalid; [Limiter.Acquire] refuses
// it.
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
	// Key is the lease key: a sorted set of holders (docs/leases.md has
	// its schema). It must not be empty, nor be one of the buckets' keys.
	Key string
	// Spec is the limit and the lease duration. It must not be the zero
	// Concurrency.
	Spec Concurrency
	// Name names the holder, and makes Acquire retry-safe: an Acquire
	// under a name whose lease is live returns that lease, marked as a
	// replay, and takes nothing. Give the unit of work's stable id (a
	// request or message id) to retry safely after ErrOutcomeUnknown.
	// Empty means a random name, drawn by Acquire (the Lease carries it).
	// At most MaxLeaseNameLen bytes, of any value.
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

// A Lease is the outcome of an Acquire: a granted lease, which holds one
// of the key's slots until it is released or expires, or a refusal.
//
// Acquire always returns a non-nil *Lease, with an error too, so that
// "defer lease.Release(ctx)" is safe right after it. Release and Extend of
// a Lease that was refused, or never sent, send nothing. A Lease's methods
// may be called from several goroutines (a heartbeat that extends it, the
// handler that releases it).
type Lease struct {
	// Key and Name identify the lease: the lease key and the holder's
	// name, the one Acquire drew when the LeaseRequest named none.
	Key, Name string
	// Denied names the part that refused the Acquire; 0 when granted and
	// with an error.
	Denied Part
	// RetryAfter is 0 when granted. When the concurrency limit refused, it is the time
	// until the oldest live lease of the key expires on the server's
	// clock: an upper bound on the wait for a lease, unless leases are
	// extended meanwhile (a release frees one sooner). When a bucket
	// refused, it is that bucket's wait, as in [Decision.RetryAfter].
	RetryAfter time.Duration
	// Remaining is the tokens left in the first and second bucket, as in
	// [Decision.Remaining]: -1 for a bucket not evaluated (none given, a
	// refusal before it, a replay).
	Remaining [2]int
	// Holders is the number of live leases of the key after the call,
	// this one included when granted.
	Holders int
	// TTL is the time the lease had left on the server's clock when the
	// Acquire ran: the Concurrency's Lease for a new grant, less for a
	// replay; 0 when not granted. Extend does not change it; see Deadline.
	TTL time.Duration

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

// Granted reports whether the Acquire was granted: the lease is held
// until released or expired. It is false with every error.
func (x *Lease) Granted() bool { return x != nil && x.granted }

// Decision returns what the Acquire decided of its buckets, as a
// [Decision]: Allowed for a granted lease (Remaining the tokens left),
// Denied 1 or 2 with RetryAfter for a bucket's refusal. A concurrency refusal,
// which a Decision cannot name, and a Lease that comes with an error give
// the zero Decision, which is not Allowed: read Denied for those.
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

// Replayed reports whether the lease was granted by an earlier Acquire
// under the same name and returned as it was: this call took nothing.
func (x *Lease) Replayed() bool { return x != nil && x.replayed }

// Deadline returns the local moment until which the lease is surely live
// on the server, measured from before the Acquire (or the last Extend) was
// sent; the zero Time when not granted. A holder that must not run
// without its lease stops, or extends, before it. Only the server's clock
// decides: a server clock stepped forward ends the lease sooner.
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

// Acquire takes one of req's leases and, with first (and second) given,
// the buckets' Costs, all or nothing, in one script run and round trip:
// the concurrency limit, first bucket and second bucket are decided in that order, and
// when any of them refuses nothing is taken, and the Lease's Denied names
// the part that refused. Without buckets it is a plain concurrency limit.
//
// A refusal is a Lease that is not Granted, never an error; it writes
// nothing (but for a denied bucket's expiry, which a denial may lengthen,
// as [Limiter.AllowOrdered]'s does). A granted Acquire also prunes every
// expired holder of the key, so that a holder that died never costs more
// than its lease.
//
// Retry safety: an Acquire under a LeaseRequest.Name whose lease is live returns
// that lease, Replayed, and takes nothing (neither a lease nor tokens),
// whatever buckets it names. An error is [ErrNotExecuted] or
// [ErrOutcomeUnknown], as for AllowOrdered; after ErrOutcomeUnknown the
// Acquire may have been granted, and its lease (and tokens) held until the
// lease expires. Retry under the same name (the returned Lease's Name,
// which Acquire drew if the LeaseRequest named none): a lease granted by the lost
// call comes back, Replayed; or Release the returned Lease, which frees
// the lease if it was granted.
//
// Invalid input is refused with ErrInvalidRequest before anything is
// sent: an empty key, a zero Concurrency or Spec, a name over
// MaxLeaseNameLen, a second bucket without a first, a key named twice, or
// on a cluster client keys in different hash slots ([ErrCrossSlot]; give
// them a common hash tag, as in "conc:{org:7}" and "tpm:{org:7}").
//
// The ACL user needs +zscore +zcard +zcount +zrange +zadd
// +zremrangebyscore +zrem beside what AllowOrdered needs
// (docs/leases.md).
func (l *Limiter) Acquire(ctx context.Context, req LeaseRequest, first, second *Request) (*Lease, error) {
	start := l.observeStart()
	x, err := l.acquire(ctx, req, first, second)
	l.observedLease(OpAcquire, x, start, false, err)
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
	var buf [11]string // up to 3 keys, then up to 8 arguments
	nk, na := 0, 0
	for _, r := range []*Request{first, second} {
		if r == nil {
			break
		}
		buf[nk] = r.Key
		buf[3+na], buf[4+na], buf[5+na] = r.Spec.intervalArg, r.Spec.burstArg, costArg(r.cost())
		nk, na = nk+1, na+3
	}
	buckets := uint8(nk)
	buf[nk], buf[3+na], buf[4+na] = req.Key, modeLeaseAcquire, req.Spec.argPrefix+x.Name
	keys, args := buf[0:nk+1], buf[3:3+na+2]
	if err := ctx.Err(); err != nil {
		return x, notSent(err)
	}
	sent := time.Since(monoBase)
	x.sent = true
	s, err := execScript(ctx, l.script, l.client, keys, args).ToString()
	if err != nil {
		if valkey.IsParseErr(err) {
			return x, badReply(err.Error())
		}
		err = leaseError(classify(err))
		x.sent = !isNotExecuted(err)
		return x, err
	}
	if err := x.decodeAcquire(s, buckets, sent); err != nil {
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
	case req.Key == "":
		return invalidRequest("the LeaseRequest has an empty Key")
	case len(req.Key) > MaxKeyLen:
		return invalidRequest("the LeaseRequest's Key is " + strconv.Itoa(len(req.Key)) + " bytes, over MaxKeyLen (" + strconv.Itoa(MaxKeyLen) + ")")
	case req.Spec.IsZero():
		return invalidRequest("the LeaseRequest for key " + strconv.Quote(req.Key) + " has the zero Concurrency; build one with admit.NewConcurrency")
	case len(name) > MaxLeaseNameLen:
		return invalidRequest("the lease name is " + strconv.Itoa(len(name)) + " bytes, over MaxLeaseNameLen (" + strconv.Itoa(MaxLeaseNameLen) + ")")
	case first == nil && second != nil:
		return invalidRequest("a second bucket without a first; pass the one bucket as first")
	}
	if first == nil {
		return nil
	}
	if err := checkRequest("first", *first); err != nil {
		return err
	}
	if second != nil {
		if err := l.checkPair(*first, *second); err != nil {
			return err
		}
	}
	for _, r := range []*Request{first, second} {
		if r == nil {
			continue
		}
		if r.Key == req.Key {
			return invalidRequest("a bucket and the LeaseRequest name the same key " + strconv.Quote(req.Key) + "; a lease key is a sorted set of its own")
		}
		if l.client.Mode() == valkey.ClientModeCluster {
			if s1, s2 := keySlot(req.Key), keySlot(r.Key); s1 != s2 {
				return crossSlot("the LeaseRequest's key " + strconv.Quote(req.Key) + " (slot " + strconv.Itoa(int(s1)) +
					") and bucket key " + strconv.Quote(r.Key) + " (slot " + strconv.Itoa(int(s2)) +
					") are in different cluster hash slots; give them a common hash tag such as {org:7}")
			}
		}
	}
	return nil
}

// decodeAcquire reads the reply of an acquire: seven decimal integers,
// "denied retry_us rem1 rem2 holders left_us replayed".
func (x *Lease) decodeAcquire(s string, buckets uint8, sent time.Duration) error {
	f, err := leaseFields(s, 7)
	if err != nil {
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

// leaseFields parses n space-separated decimal integers.
func leaseFields(s string, n int) ([7]int64, error) {
	var f [7]int64
	rest := s
	for i := 0; i < n; i++ {
		field := rest
		if i < n-1 {
			sp := strings.IndexByte(rest, ' ')
			if sp < 0 {
				return f, badReply("lease: want " + strconv.Itoa(n) + " fields, got " + strconv.Quote(s))
			}
			field, rest = rest[:sp], rest[sp+1:]
		}
		v, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return f, badReply("lease: field " + strconv.Itoa(i+1) + " of " + strconv.Quote(s) + " is not an integer")
		}
		f[i] = v
	}
	return f, nil
}

// Release frees the lease's place, and reports whether the lease was live
// on the server: false when it had expired, had been released before, or
// was never granted. It is idempotent: releasing twice frees one place, and
// reports false the second time. After ErrOutcomeUnknown, call it again.
//
// A Lease that was refused, or whose Acquire failed with ErrNotExecuted,
// sends nothing and reports false. A Lease whose Acquire failed with
// ErrOutcomeUnknown is released on the server: its place is freed if that
// Acquire was granted.
//
// Once a Release has returned without error, Deadline is zero for good:
// an Extend that raced it does not move it again.
//
// Release with a context that is not done: a deferred Release in a request
// handler whose context is cancelled should use
// context.WithoutCancel(ctx), or its place stays taken until the lease
// expires.
func (x *Lease) Release(ctx context.Context) (bool, error) {
	if x == nil {
		return false, nil
	}
	start := x.l.observeStart()
	live, err := x.release(ctx)
	x.l.observedLease(OpRelease, x, start, live, err)
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
	f, err := leaseFields(s, 1)
	if err != nil {
		return false, err
	}
	if f[0] < 0 || f[0] > 2 {
		return false, badReply("lease: release reply " + strconv.Quote(s))
	}
	return f[0] == 1, nil
}

// Extend renews a live lease: it lasts the Concurrency's lease duration
// from now on the server's clock (never less than it had), and Deadline
// moves accordingly. It reports false, and writes nothing, when the lease
// is no longer live: it expired (the holder stalled past its lease and
// may have lost its place to another), or was released. A Lease that was
// not granted sends nothing and reports false. After ErrOutcomeUnknown,
// Extend again.
func (x *Lease) Extend(ctx context.Context) (bool, error) {
	if x == nil {
		return false, nil
	}
	start := x.l.observeStart()
	live, err := x.extend(ctx)
	x.l.observedLease(OpExtend, x, start, live, err)
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
	f, err := leaseFields(s, 2)
	if err != nil {
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

// Lease returns a handle on the lease that req.Name holds (or held) on
// req.Key, to Extend or Release it from elsewhere than its Acquire: a
// process that restarted with the unit of work's id, an operator's tool,
// a retry on another client. It sends nothing. Its Granted is false and
// its Deadline zero until an Extend succeeds; req.Spec gives the lease
// duration an Extend renews to (a Release needs none). Its Extend and
// Release refuse, as Acquire does, an empty key, one over MaxKeyLen, and a
// name that is empty or over MaxLeaseNameLen.
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
	case x.Key == "":
		return "", invalidRequest("the Lease has an empty Key")
	case len(x.Key) > MaxKeyLen:
		return "", invalidRequest("the Lease's Key is " + strconv.Itoa(len(x.Key)) + " bytes, over MaxKeyLen (" + strconv.Itoa(MaxKeyLen) + ")")
	case x.spec.IsZero() && mode != modeLeaseRelease:
		return "", invalidRequest("the Lease of key " + strconv.Quote(x.Key) + " has the zero Concurrency; an Extend needs its lease duration")
	case x.Name == "" || len(x.Name) > MaxLeaseNameLen:
		return "", invalidRequest("the Lease of key " + strconv.Quote(x.Key) + " has a name of " + strconv.Itoa(len(x.Name)) +
			" bytes; want 1 to MaxLeaseNameLen (" + strconv.Itoa(MaxLeaseNameLen) + ")")
	}
	if err := ctx.Err(); err != nil {
		return "", notSent(err)
	}
	keys := [1]string{x.Key}
	prefix := x.spec.argPrefix
	if prefix == "" {
		prefix = releasePrefix // a release reads the name alone
	}
	args := [2]string{mode, prefix + x.Name}
	s, err := execScript(ctx, x.l.script, x.l.client, keys[:], args[:]).ToString()
	if err != nil {
		if valkey.IsParseErr(err) {
			return "", badReply(err.Error())
		}
		return "", leaseError(classify(err))
	}
	return s, nil
}

// leaseError names a lease key's corrupt state as such: classify's
// message speaks of buckets.
func leaseError(err error) error {
	if ce, ok := err.(*callError); ok && ce.reason == ErrCorruptState {
		ce.msg = strings.Replace(ce.msg, "corrupt bucket state: the lease key", "corrupt lease state: the lease key", 1)
	}
	return err
}
