package admit

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// MaxKeyLen is the longest bucket key a Request may name, in bytes; a longer
// key is [ErrInvalidRequest]. Build key parts from client input with [KeyPart].
const MaxKeyLen = 1024

// A Request names one bucket and what a call takes from it.
type Request struct {
	Key  string // the bucket's hash key: not empty, at most MaxKeyLen bytes
	Spec Spec   // the bucket's rate and burst: not the zero Spec
	// Cost is the tokens the call takes (Refund: gives back), from 0,
	// meaning 1, to the Spec's burst.
	Cost int
}

// cost returns the Request's cost, 0 meaning 1.
func (r Request) cost() int {
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}

// A Decision is the outcome of a call. The zero Decision, which comes with
// every error, is not an admission: test with Allowed, not Denied == 0.
type Decision struct {
	Denied     uint8         // the bucket that refused, 1 or 2; 0 if admitted or with an error
	RetryAfter time.Duration // 0 if admitted; else when the refusing bucket holds its Cost
	Remaining  [2]int        // each bucket's tokens after the call; -1 if not evaluated

	// decided is set on every Decision the server made, so that the zero
	// Decision is not an admission.
	decided bool
	// replayed is set on a Decision that AllowOrderedOnce read back from
	// its id's record: this call charged nothing.
	replayed bool
}

// Replayed reports whether [Limiter.AllowOrderedOnce] returned an earlier
// call's Decision for the same id: this call charged nothing.
func (d Decision) Replayed() bool { return d.replayed }

// Allowed reports whether the request was admitted (never the zero Decision).
func (d Decision) Allowed() bool { return d.decided && d.Denied == 0 }

// String describes d: "allowed", "denied by bucket 2, retry after 1.2s",
// or "no decision" for the zero Decision.
func (d Decision) String() string {
	if !d.decided {
		return "no decision"
	}
	if d.Allowed() {
		return "allowed"
	}
	return "denied by bucket " + strconv.Itoa(int(d.Denied)) + ", retry after " + d.RetryAfter.String()
}

// A Limiter decides requests against buckets stored in Valkey. It holds no
// bucket state, so Limiters in any number of processes share the buckets they
// name. A Limiter is safe for simultaneous use by multiple goroutines.
type Limiter struct {
	client   valkey.Client
	script   *valkey.Lua // EVALSHA: take and refund
	source   string      // script's source (internal/scriptsource)
	readOnly *valkey.Lua // EVALSHA_RO: the same script, read-only
	// peekRW is set once the server refused TIME in a read-only script
	// (miniredis does): peeks then run through script (readonly.go).
	peekRW  atomic.Bool
	denials *denialCache      // nil unless WithDenialCache
	observe func(Observation) // nil unless WithObserver
	waits   waitLines         // Wait's lines, one a pair of keys waited on
}

// New returns a Limiter that decides on client, configured by opts; it sends
// nothing. Do not pass a client with ClientOption.ConnLifetime set: it may
// run a script twice (docs/errors.md).
func New(client valkey.Client, opts ...Option) *Limiter {
	s := scripts()
	l := &Limiter{client: client, script: s.take, source: scriptSource, readOnly: s.peek}
	for _, o := range opts {
		if o != nil {
			o.apply(l)
		}
	}
	return l
}

// Script modes, sent after the buckets' arguments; a take sends none.
const (
	modeTake   = ""  // the script's default: nothing sent
	modeAll    = "a" // take, all or nothing
	modePeek   = "p"
	modeRefund = "r"
	modeOnce   = "o" // take, recorded under an id
)

// AllowOrdered takes first's Cost and, only if first admits, second's, in one
// atomic round trip; a nil second decides first alone. A denial is not an
// error; an error is [ErrNotExecuted] or [ErrOutcomeUnknown] (docs/errors.md).
func (l *Limiter) AllowOrdered(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.take(ctx, OpTake, modeTake, first, second)
}

// AllowAll is AllowOrdered, all or nothing: when the second bucket refuses
// (Denied 2), the first is not charged either (docs/semantics.md).
func (l *Limiter) AllowAll(ctx context.Context, first Request, second *Request) (Decision, error) {
	mode := modeTake
	if second != nil {
		mode = modeAll
	}
	return l.take(ctx, OpAll, mode, first, second)
}

// AllowOrderedOnce is AllowOrdered made retry-safe by id, which names the unit
// of work: within [OnceWindow], a call with the same id and request returns
// the recorded Decision, Replayed, and takes nothing; one with another request
// is [ErrOnceIDReused]. After ErrOutcomeUnknown, call again (docs/errors.md).
func (l *Limiter) AllowOrderedOnce(ctx context.Context, id string, first Request, second *Request) (Decision, error) {
	return l.once(ctx, id, first, second)
}

// Peek returns the Decision AllowOrdered would return now, and takes nothing:
// it writes nothing, so every error it returns is [ErrNotExecuted]
// (docs/budgets.md).
func (l *Limiter) Peek(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.peek(ctx, first, second)
}

// Refund gives each Request's Cost back to its bucket, capped at its burst;
// a nil second refunds first alone. Refund only what was charged: nothing
// after ErrOutcomeUnknown, from the charge or a Refund (docs/budgets.md).
func (l *Limiter) Refund(ctx context.Context, first Request, second *Request) error {
	return l.refund(ctx, first, second)
}

// Wait calls AllowOrdered until it admits, sleeping each RetryAfter plus
// jitter and refunding the first bucket after a second-bucket denial. When
// ctx ends, or its deadline comes before the token, it returns an error
// wrapping [ErrNotExecuted] and ctx's error (docs/budgets.md).
func (l *Limiter) Wait(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.wait(ctx, first, second)
}

// The decisions, one function a mode. Each checks and encodes its
// requests once, as a call (newCall), and from there works on the call
// alone: the denial cache, the server (send) and the observer see the
// same call.

// take is AllowOrdered (mode modeTake) or AllowAll (modeAll), observed as
// op (OpTake, OpAll, or OpWaitAttempt for Wait). A first-bucket denial is
// the same in both modes, so the denial cache serves both. Bad input is
// refused whether a denial is cached or not.
func (l *Limiter) take(ctx context.Context, op Op, mode string, first Request, second *Request) (Decision, error) {
	c, err := l.newCall(ctx, op, mode, first, second, "")
	if err != nil {
		return l.observed(ctx, &c, Decision{}, false, err)
	}
	if d, ok := l.denials.lookup(c.first); ok {
		return l.observed(ctx, &c, d, true, nil)
	}
	sent := l.denials.clock()
	d, err := l.send(ctx, &c)
	if err == nil && d.Denied == 1 {
		l.denials.add(c.first, sent, d)
	}
	return l.observed(ctx, &c, d, false, err)
}

// once is AllowOrderedOnce: a take recorded under id, never served from
// the denial cache.
func (l *Limiter) once(ctx context.Context, id string, first Request, second *Request) (Decision, error) {
	record, bad := onceKey(first.Key, id)
	c, err := l.newCall(ctx, OpOnce, modeOnce, first, second, record)
	if bad != nil { // the id's refusal comes first
		err = bad
	}
	d := Decision{}
	if err == nil {
		d, err = l.send(ctx, &c)
	}
	return l.observed(ctx, &c, d, false, err)
}

// peek is Peek: the script read-only, its failures reclassed (peekFailed).
func (l *Limiter) peek(ctx context.Context, first Request, second *Request) (Decision, error) {
	c, err := l.newCall(ctx, OpPeek, modePeek, first, second, "")
	d := Decision{}
	if err == nil {
		d, err = l.send(ctx, &c)
	}
	if err != nil {
		d, err = Decision{}, peekFailed(err)
	}
	return l.observed(ctx, &c, d, false, err)
}

// refund is Refund: it drops the cached denials of both keys once the
// reply is in, whatever it says (a denial sent meanwhile may predate the
// refund).
func (l *Limiter) refund(ctx context.Context, first Request, second *Request) error {
	c, err := l.newCall(ctx, OpRefund, modeRefund, first, second, "")
	if err == nil {
		_, err = l.send(ctx, &c)
	}
	if l != nil {
		l.denials.refunded(c.first, c.second)
	}
	_, err = l.observed(ctx, &c, Decision{}, false, err)
	return err
}

// newCall encodes first and second as the script's keys and arguments for
// op in mode (with record, the key of AllowOrderedOnce's record, for
// modeOnce), and checks them: what can be known client-side is refused
// before anything is sent. The call it returns names first even with an
// error, for the observer.
func (l *Limiter) newCall(ctx context.Context, op Op, mode string, first Request, second *Request, record string) (call, error) {
	c := call{op: op, start: l.observeStart(), mode: mode, first: first, second: second}
	window := ""
	if record != "" {
		window = onceWindowArg
	}
	c.encode(&first, second, mode, record, window)
	return c, l.check(ctx, first, second)
}

// encode writes the script's keys and arguments: each bucket's key and
// its interval, burst and cost; the mode (none for a take); then one more
// key with its argument, if any: a once-record and its window, or a lease
// key and its holder. Every call, bucket or lease, is encoded here.
func (c *call) encode(first, second *Request, mode, key, arg string) {
	c.nk, c.na, c.buckets = 0, 0, 0
	for _, r := range [2]*Request{first, second} {
		if r == nil {
			break
		}
		c.buf[c.nk] = r.Key
		c.buf[3+c.na], c.buf[4+c.na], c.buf[5+c.na] = r.Spec.intervalArg, r.Spec.burstArg, costArg(r.Cost)
		c.nk, c.na, c.buckets = c.nk+1, c.na+3, c.buckets+1
	}
	if mode != modeTake {
		c.buf[3+c.na] = mode
		c.na++
	}
	if key != "" {
		c.buf[c.nk], c.buf[3+c.na] = key, arg
		c.nk, c.na = c.nk+1, c.na+1
	}
}

// costArg encodes a Request's Cost, 0 meaning 1; strconv.Itoa does not
// allocate below 100.
func costArg(cost int) string {
	if cost == 0 || cost == 1 {
		return "1"
	}
	return strconv.Itoa(cost)
}

// check refuses what can be known client-side, before anything is sent.
func (l *Limiter) check(ctx context.Context, first Request, second *Request) error {
	switch {
	case l == nil || l.client == nil:
		return invalidRequest("the Limiter has no client; build it with admit.New")
	case ctx == nil:
		return invalidRequest("nil context")
	}
	// Mode only for two keys: a one-bucket call asks nothing of the client.
	return checkBuckets(first, second, second != nil && l.client.Mode() == valkey.ClientModeCluster)
}

// checkBuckets refuses buckets that can never be sent: a bad Request, one
// key named twice, or on a cluster keys in different hash slots. It is
// the one check of a Limiter's calls, an Acquire's buckets and a Local's.
func checkBuckets(first Request, second *Request, cluster bool) error {
	if err := checkRequest("first", first); err != nil {
		return err
	}
	if second == nil {
		return nil
	}
	if err := checkRequest("second", *second); err != nil {
		return err
	}
	if first.Key == second.Key {
		return invalidRequest("first and second name the same key " + strconv.Quote(first.Key) + "; use a nil second for one bucket")
	}
	if cluster {
		return checkSameSlot("keys", first.Key, second.Key, "{chan:42}")
	}
	return nil
}

// checkRequest refuses a Request that can never be sent: which names it
// ("first" or "second") in the error.
func checkRequest(which string, r Request) error {
	switch {
	case r.Key == "":
		return invalidRequest(which + " request has an empty Key")
	case len(r.Key) > MaxKeyLen:
		return invalidRequest(which + " request has a Key of " + strconv.Itoa(len(r.Key)) + " bytes, over MaxKeyLen (" +
			strconv.Itoa(MaxKeyLen) + "); build key parts from client input with admit.KeyPart")
	case r.Spec.IsZero():
		return invalidRequest(which + " request for key " + strconv.Quote(r.Key) + " has the zero Spec; build one with admit.NewSpec")
	case r.Cost < 0:
		return invalidRequest(which + " request for key " + strconv.Quote(r.Key) + " has a negative Cost " + strconv.Itoa(r.Cost))
	case r.Cost > r.Spec.burst:
		return invalidRequest(which + " request for key " + strconv.Quote(r.Key) + " has Cost " + strconv.Itoa(r.Cost) +
			" above its Spec's burst " + strconv.Itoa(r.Spec.burst) + ": the bucket could never hold it")
	}
	return nil
}
