package admit

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// MaxKeyLen is the longest bucket key a Request may name, in bytes. A
// longer key is refused with ErrInvalidRequest before anything is sent, so
// that input a client controls (a header, a path) can never make the
// server store a key of that client's choosing size. Build key parts from
// such input with [KeyPart].
const MaxKeyLen = 1024

// A Request names one bucket: the key of its hash, its shape, and what this
// call takes from it.
type Request struct {
	// Key is the bucket's hash key. It must not be empty nor longer than
	// MaxKeyLen bytes.
	Key string
	// Spec is the bucket's rate and burst. It must not be the zero Spec.
	Spec Spec
	// Cost is the number of tokens this call takes from this bucket (or, for
	// Refund, gives back). 0 means 1. A negative Cost, or one above the
	// Spec's burst (a bucket could never hold it), is refused with
	// ErrInvalidRequest before anything is sent.
	Cost int
}

// cost returns the Request's cost, 0 meaning 1.
func (r Request) cost() int {
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}

// A Decision is the outcome of one AllowOrdered (or Peek, or Wait) call.
//
// The zero Decision is not an admission: every call that returns an error
// returns a Decision whose Allowed reports false, so a caller that looks at
// the Decision before the error fails closed. Test admission with Allowed,
// not with Denied == 0.
type Decision struct {
	// Denied is 1 when the first bucket refused the request and 2 when the
	// second bucket refused it. It is 0 both when the request was admitted
	// and in the zero Decision that comes with an error; Allowed tells them
	// apart.
	Denied uint8
	// RetryAfter is 0 when the request was admitted. Otherwise it is the
	// server-computed time until the refusing bucket holds the request's
	// Cost, in whole microseconds and never short: waiting RetryAfter is
	// enough for that bucket, though other callers may take the tokens
	// first.
	RetryAfter time.Duration
	// Remaining is the number of tokens the first and second bucket hold
	// after the call, or -1 for a bucket the call did not evaluate: the
	// second bucket of a one-bucket call, or after the first bucket
	// refused. It fills the IETF RateLimit header's "r" parameter.
	Remaining [2]int

	// decided is set on every Decision the server made, so that the zero
	// Decision is not an admission.
	decided bool
	// replayed is set on a Decision that AllowOrderedOnce read back from
	// its id's record: this call charged nothing.
	replayed bool
}

// Replayed reports whether the Decision was made by an earlier call with
// the same id and read back by [Limiter.AllowOrderedOnce]: this call
// charged nothing. A caller that settles a reservation (Refund of the
// unused part) settles only a Decision that is not Replayed, so that a
// retry never refunds twice. It is false for every other call.
func (d Decision) Replayed() bool { return d.replayed }

// Allowed reports whether the request was admitted. It is false for the
// zero Decision, which every error comes with.
func (d Decision) Allowed() bool { return d.decided && d.Denied == 0 }

// String describes the decision, for example "allowed",
// "denied by bucket 2, retry after 1.2s" or, for the zero Decision,
// "no decision".
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
// bucket state of its own: any number of Limiters, in any number of
// processes, share the buckets of the keys they name. A Limiter is safe for
// simultaneous use by multiple goroutines.
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

// New returns a Limiter that runs its decisions on client: a standalone,
// sentinel or cluster client, or a mock, configured by opts (by default,
// none: every call goes to the server). New only stores the client: it
// calls no method on it and sends nothing. Each two-bucket call asks the
// client for its Mode, to check cluster hash slots before sending.
//
// Do not hand admit a client built with ClientOption.ConnLifetime > 0:
// valkey-go (v1.0.79) re-sends a command that is in flight when its
// connection expires, whatever its retry flag, so a script could run twice.
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

// AllowOrdered takes first's Cost from first and, only when first admits,
// second's Cost from second, in one atomic server-side step and one round
// trip. A nil second is the single-bucket path.
//
// A denial is a Decision with Denied set, not an error. An error is either
// [ErrNotExecuted] or [ErrOutcomeUnknown]; AllowOrdered never retries.
// Invalid requests are refused before anything is sent. A context that is
// already done is refused before sending too; one that ends while the
// command is in flight gives ErrOutcomeUnknown, because the command may
// still reach the server.
func (l *Limiter) AllowOrdered(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.take(ctx, OpTake, modeTake, first, second)
}

// AllowAll is AllowOrdered, all or nothing: when the second bucket
// refuses, the first is not charged either. Both buckets are then left as
// a denial leaves a bucket, Denied is 2, RetryAfter is the second bucket's
// wait, and Remaining reports the first bucket's tokens uncharged. It is
// decided in the same single script run and round trip as AllowOrdered.
//
// Use AllowAll where a refusal must cost nothing: an edge that answers
// 429 to a request its shared bucket refuses should not also spend the
// caller's own bucket. AllowOrdered keeps the first bucket's charge,
// which is what a worker wants when it will retry the same unit of work
// later through the second bucket alone. With a nil second the two calls
// are the same. Errors are as AllowOrdered's.
func (l *Limiter) AllowAll(ctx context.Context, first Request, second *Request) (Decision, error) {
	mode := modeTake
	if second != nil {
		mode = modeAll
	}
	return l.take(ctx, OpAll, mode, first, second)
}

// AllowOrderedOnce is AllowOrdered made retry-safe by id. A call decides
// and, when its decision charged something (an admission, or a denial by
// the second bucket, which charged the first), records it in the same
// script run and round trip; a later call with the same id and the same
// request within [OnceWindow] returns the recorded Decision (Remaining and
// RetryAfter as they were then) with [Decision.Replayed] true, and takes
// nothing. A denial by the first bucket charged nothing and is not
// recorded: it writes nothing, and the same id simply decides again. So
// after ErrOutcomeUnknown, call again with the same id: if the first call
// ran, its Decision comes back and nothing is charged twice; if it did
// not, this call decides. Settle a reservation (Refund the unused part)
// only for a Decision that is not Replayed. Use an id that names the unit
// of work, such as a message id, never reused for other work within the
// window.
//
// The record is one string key in the first bucket's cluster slot, named
// by [OnceRecordKey]; it expires after OnceWindow and holds the decision
// and the request it was made for. The same id with another request
// (bucket count, second key, Spec or Cost) is refused with
// [ErrOnceIDReused]; a record holding a value admit did not write is
// [ErrCorruptState]; both are not executed and write nothing. An empty id,
// an id over MaxOnceIDLen bytes, and a first key without a hash tag that
// holds a "}" (its record could not share its slot) are refused with
// ErrInvalidRequest before sending. The local denial cache
// ([WithDenialCache]) is not used: every call goes to the server.
//
// The ACL user needs +get and +set beside what AllowOrdered needs.
func (l *Limiter) AllowOrderedOnce(ctx context.Context, id string, first Request, second *Request) (Decision, error) {
	return l.once(ctx, id, first, second)
}

// Peek returns the Decision that AllowOrdered would return now for the same
// requests, Remaining included, and takes nothing: it writes no key and
// refreshes no expiry. It runs the same script read-only (EVALSHA_RO), so it
// works for an ACL user without write permissions and may be served by a
// replica (valkey-go's ClientOption.SendToReplicas), where the answer is as
// fresh as the replica.
//
// A Peek is advice, not a reservation: another caller may take the tokens
// before a following AllowOrdered. Since a Peek writes nothing, every error
// it returns is [ErrNotExecuted], even one whose reason is a lost reply or
// [ErrBadReply]: nothing was taken, and a retry is safe.
//
// On a server that refuses TIME in a read-only script (miniredis, the
// embedded server of unit tests), Peek runs the same script through
// EVALSHA instead, in the same read-only mode, which writes nothing; the
// Limiter remembers that and goes straight there afterwards.
func (l *Limiter) Peek(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.peek(ctx, first, second)
}

// Refund gives each Request's Cost back to its bucket, capped at the
// Spec's burst: a refund never creates a token above it, and a bucket
// whose key has expired (a full bucket) is left alone. Refund with a nil
// second gives back to first only.
//
// It is meant for reserve-then-settle: take an estimate with AllowOrdered,
// do the work, then Refund the unused part with Cost set to it. Refund only
// what was charged: after a Decision with Denied 2 only the first bucket
// was charged, so refund first alone; after Denied 1 nothing was charged.
// After ErrOutcomeUnknown from AllowOrdered, the charge may or may not have
// happened: refunding could hand out tokens that were never taken, so do
// not refund (let the bucket refill on its own). Refund is not idempotent:
// after ErrOutcomeUnknown from Refund itself, do not repeat it.
//
// With [WithDenialCache], once the refund has returned, whatever its outcome
// (one whose outcome is unknown may have run), the Limiter holds no cached
// denial of either key, and does not cache the denial of a call sent before
// that: the next call on either key goes to the server.
func (l *Limiter) Refund(ctx context.Context, first Request, second *Request) error {
	return l.refund(ctx, first, second)
}

// Wait blocks until AllowOrdered admits the requests, and returns that
// Decision. Between attempts it sleeps the denial's RetryAfter plus up to
// 10% of jitter, so that waiters in other processes do not wake in
// lockstep; with a deadline, the jitter takes at most a quarter of the time
// between the token and the deadline, so a token that comes before the
// deadline is tried for.
//
// The Waits of one Limiter on the same keys (first and second Key) form a
// line: only the Wait at its head sends attempts, and the others queue
// behind it, in about the order they came, each sending nothing until it
// is the head. So with any number of waiters on one bucket a Limiter sends
// about two scripts per admission (the new head's first attempt, denied,
// and the one after its sleep), three when the second bucket refuses (the
// refund too). Waits with different Specs or Costs on the same keys share
// the line. Waits of different Limiters, or of other processes, do not:
// only the jitter spreads them.
//
// It honours ctx: it returns ctx's error when ctx is done while it sleeps
// or is queued, and, like golang.org/x/time/rate, it returns at once,
// without sleeping, when the refusing bucket cannot hold the Cost before
// ctx's deadline. A queued Wait knows this from the last denial the head of
// its line got for the same requests, and returns at once, having sent
// nothing, when its deadline comes before that denial's token. Those errors
// wrap ErrNotExecuted and context.DeadlineExceeded (or ctx's error) and
// come with the denial: nothing was taken.
//
// An attempt that the second bucket refuses has charged the first bucket
// (the ordered transitions); Wait refunds that charge (one more round trip)
// before it sleeps or gives up, so only the admitted attempt costs
// anything. Should that refund fail, Wait returns ErrOutcomeUnknown with the
// refund's error: the first bucket may stay charged. When it succeeds and
// Wait then gives up (the deadline, ctx ended, or a later attempt did not
// run), the error is still ErrNotExecuted, because no token stays taken and
// a retry is safe, but it is not proof that nothing was written: each such
// attempt and its refund ran two scripts, which wrote the first bucket's
// key (its tokens back, capped at its burst, and its expiry), and the
// error's text says so. The Decision that comes with a deadline error is
// the last attempt's, whose Remaining for the first bucket is from before
// the refund.
//
// An attempt that fails is never repeated: Wait returns its error as
// AllowOrdered gave it (a not-executed one after refunded attempts says
// what those wrote, as above), so an attempt whose outcome is unknown
// (ErrOutcomeUnknown) is not sent twice. A Wait without a deadline waits as
// long as the buckets keep refusing.
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
		return l.observed(c.op, c.first.Key, c.start, Decision{}, false, err)
	}
	if d, ok := l.denials.lookup(c.first); ok {
		return l.observed(c.op, c.first.Key, c.start, d, true, nil)
	}
	sent := l.denials.clock()
	d, err := l.send(ctx, &c)
	if err == nil && d.Denied == 1 {
		l.denials.add(c.first, sent, d)
	}
	return l.observed(c.op, c.first.Key, c.start, d, false, err)
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
	return l.observed(c.op, c.first.Key, c.start, d, false, err)
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
	return l.observed(c.op, c.first.Key, c.start, d, false, err)
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
	_, err = l.observed(c.op, c.first.Key, c.start, Decision{}, false, err)
	return err
}

// newCall encodes first and second as the script's keys and arguments for
// op in mode (with record, the key of AllowOrderedOnce's record, for
// modeOnce), and checks them: what can be known client-side is refused
// before anything is sent. The call it returns names first even with an
// error, for the observer.
func (l *Limiter) newCall(ctx context.Context, op Op, mode string, first Request, second *Request, record string) (call, error) {
	c := call{op: op, start: l.observeStart(), mode: mode, first: first, second: second, buckets: 1}
	// Keys and arguments share one backing array: up to 3 keys (the
	// buckets, then a record), then 3 arguments a bucket, the mode (none
	// for a take) and, for AllowOrderedOnce, the record's window.
	c.buf[0] = first.Key
	c.buf[3], c.buf[4], c.buf[5] = first.Spec.intervalArg, first.Spec.burstArg, costArg(first.Cost)
	c.nk, c.na = 1, 3
	if second != nil {
		c.buf[1] = second.Key
		c.buf[6], c.buf[7], c.buf[8] = second.Spec.intervalArg, second.Spec.burstArg, costArg(second.Cost)
		c.nk, c.na, c.buckets = 2, 6, 2
	}
	if mode != modeTake {
		c.buf[3+c.na] = mode
		c.na++
	}
	if record != "" {
		c.buf[c.nk], c.buf[3+c.na] = record, onceWindowArg
		c.nk, c.na = c.nk+1, c.na+1
	}
	return c, l.check(ctx, first, second)
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
	if err := checkRequest("first", first); err != nil {
		return err
	}
	if second != nil {
		return l.checkPair(first, *second)
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

func (l *Limiter) checkPair(first, second Request) error {
	if err := checkRequest("second", second); err != nil {
		return err
	}
	if first.Key == second.Key {
		return invalidRequest("first and second name the same key " + strconv.Quote(first.Key) + "; use a nil second for one bucket")
	}
	if l.client.Mode() == valkey.ClientModeCluster {
		if s1, s2 := keySlot(first.Key), keySlot(second.Key); s1 != s2 {
			return crossSlot("keys " + strconv.Quote(first.Key) + " (slot " + strconv.Itoa(int(s1)) +
				") and " + strconv.Quote(second.Key) + " (slot " + strconv.Itoa(int(s2)) +
				") are in different cluster hash slots; give them a common hash tag such as {chan:42}")
		}
	}
	return nil
}
