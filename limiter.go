// Package admit decides, in one Valkey round trip, whether a unit of work may
// proceed against one or two token buckets, checked in order.
//
// Standard traffic passes its own bucket and then a shared bucket; premium
// traffic uses only the shared bucket. The shared bucket is charged only when
// the first bucket admits, so standard traffic that its own bucket refuses
// never eats into the share kept for premium traffic:
//
//	first   second   Decision.Denied   state
//	deny    (any)    1                 nothing written; second untouched
//	allow   deny     2                 first charged its Cost; second not written
//	allow   allow    0                 both charged their Cost
//
// The decision is one Lua script (EVALSHA, falling back to EVAL once after a
// SCRIPT FLUSH) that reads the server clock with TIME once: the clocks of
// application hosts play no part. The script reads and validates every bucket
// before its first write, so a wrong-type key or corrupt state fails the call
// with no write anywhere.
//
// A pipeline of two scripts (valkey.Lua.ExecMulti) is not an alternative: it
// always runs the second script, even after a denial, and it sends SCRIPT
// LOAD before the pipeline. MULTI/EXEC cannot branch on the first bucket's
// answer, and WATCH costs extra round trips and retries under contention.
//
// # Errors
//
// A failed call is either [ErrNotExecuted] (nothing ran; a retry is safe) or
// [ErrOutcomeUnknown] (tokens may have been consumed). The library never
// retries a script on its own. See the reason sentinels ([ErrInvalidRequest],
// [ErrCrossSlot], [ErrWrongType], [ErrCorruptState], [ErrBadReply]) for what
// went wrong; transport and context errors stay in the chain.
//
// # Budgets
//
// A Request may cost more than one token ([Request.Cost]), and every Decision
// reports the tokens left in each bucket ([Decision.Remaining]).
// [Limiter.Peek] tells what AllowOrdered would decide without taking
// anything, [Limiter.Refund] gives tokens back (reserve an estimate, refund
// the unused part), and [Limiter.Wait] blocks until admitted. All of them run
// the same embedded script, each in one round trip.
//
// # Cluster
//
// On Valkey Cluster both keys of a two-bucket call must hash to one slot:
// give them a common hash tag, as in "rl:{chan:42}:standard" and
// "rl:{chan:42}:shared". AllowOrdered checks this before sending anything.
package admit

import (
	"context"
	"strconv"
	"strings"
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
	client valkey.Client
	script *valkey.Lua // EVALSHA: take and refund
	peek   *valkey.Lua // EVALSHA_RO: the same script, read-only
	// peekRW is set once the server refused TIME in a read-only script
	// (miniredis does): peeks then run through script, in mode p.
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
	l := &Limiter{client: client, script: s.take, peek: s.peek}
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

// take is AllowOrdered (mode modeTake) or AllowAll (modeAll), observed as
// op (OpTake, OpAll, or OpWaitAttempt for Wait). A first-bucket denial is
// the same in both modes, so the denial cache serves both.
func (l *Limiter) take(ctx context.Context, op Op, mode string, first Request, second *Request) (Decision, error) {
	start := l.observeStart()
	if l == nil || l.denials == nil {
		d, err := l.run(ctx, mode, first, second)
		l.observed(op, first, start, false, d, err)
		return d, err
	}
	if d, ok := l.denials.lookup(first); ok {
		if err := l.check(ctx, first, second); err != nil { // bad input is refused, cached or not
			l.observed(op, first, start, false, Decision{}, err)
			return Decision{}, err
		}
		l.observed(op, first, start, true, d, nil)
		return d, nil
	}
	sent := l.denials.now()
	d, err := l.run(ctx, mode, first, second)
	if err == nil && d.Denied == 1 {
		l.denials.add(first, sent, d)
	}
	l.observed(op, first, start, false, d, err)
	return d, err
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

// run checks the call, sends the script in mode and decodes its reply.
func (l *Limiter) run(ctx context.Context, mode string, first Request, second *Request) (Decision, error) {
	return l.runRecorded(ctx, mode, first, second, "")
}

// runRecorded is run with, for AllowOrderedOnce, the key of the record
// that makes the decision once: the last key, with the window the last
// argument.
func (l *Limiter) runRecorded(ctx context.Context, mode string, first Request, second *Request, record string) (Decision, error) {
	if err := l.check(ctx, first, second); err != nil {
		return Decision{}, err
	}
	// Keys and arguments share one backing array: up to 3 keys (the
	// buckets, then a record), then 3 arguments a bucket, the mode (none
	// for a take) and, for AllowOrderedOnce, the record's window.
	var buf [11]string
	buf[0] = first.Key
	buf[3], buf[4], buf[5] = first.Spec.intervalArg, first.Spec.burstArg, costArg(first.cost())
	nk, na := 1, 3
	if second != nil {
		buf[1] = second.Key
		buf[6], buf[7], buf[8] = second.Spec.intervalArg, second.Spec.burstArg, costArg(second.cost())
		nk, na = 2, 6
	}
	buckets := uint8(nk)
	if mode != modeTake {
		buf[3+na] = mode
		na++
	}
	if record != "" {
		buf[nk], buf[3+na] = record, onceWindowArg
		nk, na = nk+1, na+1
	}
	keys, args := buf[0:nk], buf[3:3+na]
	if err := ctx.Err(); err != nil {
		return Decision{}, &callError{msg: "admit: not executed, the context was done before sending", class: ErrNotExecuted, cause: err}
	}
	script := l.script
	if mode == modePeek && !l.peekRW.Load() {
		script = l.peek
	}
	d, err := decode(execScript(ctx, script, l.client, keys, args), buckets)
	if mode == modePeek && script == l.peek && err != nil && strings.Contains(err.Error(), readOnlyTimeRefused) {
		// Nothing ran: the server refused the script's first command.
		l.peekRW.Store(true)
		d, err = decode(execScript(ctx, l.script, l.client, keys, args), buckets)
	}
	if d.replayed && record == "" {
		return Decision{}, badReply("a replayed decision from a call that names no once-record")
	}
	return d, err
}

// readOnlyTimeRefused is what miniredis answers when a read-only script
// calls TIME, which it does not count as a read-only command. Real
// servers run TIME in read-only scripts.
const readOnlyTimeRefused = "Write commands are not allowed in read-only scripts"

// costArg encodes a cost; strconv.Itoa does not allocate below 100.
func costArg(cost int) string {
	if cost == 1 {
		return "1"
	}
	return strconv.Itoa(cost)
}

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
			return &callError{
				msg: "admit: invalid request: keys " + strconv.Quote(first.Key) + " (slot " + strconv.Itoa(int(s1)) +
					") and " + strconv.Quote(second.Key) + " (slot " + strconv.Itoa(int(s2)) +
					") are in different cluster hash slots; give them a common hash tag such as {chan:42}",
				reason: ErrCrossSlot, class: ErrNotExecuted,
			}
		}
	}
	return nil
}
