// Package admit decides, in one Valkey round trip, whether a unit of work may
// proceed against one or two token buckets, checked in order.
//
// Standard traffic passes its own bucket and then a shared bucket; premium
// traffic uses only the shared bucket. The shared bucket is charged only when
// the first bucket admits, so standard traffic that its own bucket refuses
// never eats into the share kept for premium traffic:
//
//	first   second   Decision.Denied   state
//	deny    (any)    1                 first's refill state refreshed; second untouched
//	allow   deny     2                 first consumed; second's refill state refreshed
//	allow   allow    0                 both consumed
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
// # Cluster
//
// On Valkey Cluster both keys of a two-bucket call must hash to one slot:
// give them a common hash tag, as in "rl:{chan:42}:standard" and
// "rl:{chan:42}:shared". AllowOrdered checks this before sending anything.
package admit

import (
	"context"
	"strconv"
	"time"

	"github.com/valkey-io/valkey-go"
)

// A Request names one bucket: the key of its hash and its shape.
type Request struct {
	// Key is the bucket's hash key. It must not be empty.
	Key string
	// Spec is the bucket's rate and burst. It must not be the zero Spec.
	Spec Spec
}

// A Decision is the outcome of one AllowOrdered call.
type Decision struct {
	// Denied is 0 when the request was admitted, 1 when the first bucket
	// refused it and 2 when the second bucket refused it.
	Denied uint8
	// RetryAfter is 0 when the request was admitted. Otherwise it is the
	// server-computed time until the refusing bucket holds one token, in
	// whole microseconds and never short: waiting RetryAfter is enough for
	// that bucket, though other callers may take the token first.
	RetryAfter time.Duration
}

// Allowed reports whether the request was admitted.
func (d Decision) Allowed() bool { return d.Denied == 0 }

// String describes the decision, for example "allowed" or
// "denied by bucket 2, retry after 1.2s".
func (d Decision) String() string {
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
	client  valkey.Client
	script  *valkey.Lua
	cluster bool
}

// New returns a Limiter that runs its decisions on client: a standalone,
// sentinel or cluster client, or a mock.
//
// Do not hand admit a client built with ClientOption.ConnLifetime > 0:
// valkey-go (v1.0.79) re-sends a command that is in flight when its
// connection expires, whatever its retry flag, so a script could run twice.
func New(client valkey.Client) *Limiter {
	return newLimiter(client, orderedScript)
}

func newLimiter(client valkey.Client, script *valkey.Lua) *Limiter {
	l := &Limiter{client: client, script: script}
	if client != nil {
		l.cluster = client.Mode() == valkey.ClientModeCluster
	}
	return l
}

// AllowOrdered takes one token from first and, only when first admits, one
// token from second, in one atomic server-side step and one round trip. A nil
// second is the single-bucket path.
//
// A denial is a Decision with Denied set, not an error. An error is either
// [ErrNotExecuted] or [ErrOutcomeUnknown]; AllowOrdered never retries.
// Invalid requests are refused before anything is sent. A context that is
// already done is refused before sending too; one that ends while the
// command is in flight gives ErrOutcomeUnknown, because the command may
// still reach the server.
func (l *Limiter) AllowOrdered(ctx context.Context, first Request, second *Request) (Decision, error) {
	switch {
	case l == nil || l.client == nil:
		return Decision{}, invalidRequest("the Limiter has no client; build it with admit.New")
	case ctx == nil:
		return Decision{}, invalidRequest("nil context")
	}
	if err := checkRequest("first", first); err != nil {
		return Decision{}, err
	}
	// Keys and arguments share one backing array: 2 keys, then 3 arguments a bucket.
	var buf [8]string
	buf[0], buf[2], buf[3], buf[4] = first.Key, first.Spec.intervalArg, first.Spec.burstArg, first.Spec.ttlArg
	keys, args := buf[0:1], buf[2:5]
	if second != nil {
		if err := l.checkPair(first, *second); err != nil {
			return Decision{}, err
		}
		buf[1], buf[5], buf[6], buf[7] = second.Key, second.Spec.intervalArg, second.Spec.burstArg, second.Spec.ttlArg
		keys, args = buf[0:2], buf[2:8]
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, &callError{msg: "admit: not executed, the context was done before sending", class: ErrNotExecuted, cause: err}
	}
	return decode(execScript(ctx, l.script, l.client, keys, args), uint8(len(keys)))
}

func checkRequest(which string, r Request) error {
	switch {
	case r.Key == "":
		return invalidRequest(which + " request has an empty Key")
	case r.Spec.IsZero():
		return invalidRequest(which + " request for key " + strconv.Quote(r.Key) + " has the zero Spec; build one with admit.NewSpec")
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
	if l.cluster {
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

// decode reads the script's reply {denied, retry_us} without allocating
// beyond valkey-go's own reply.
func decode(resp valkey.ValkeyResult, buckets uint8) (Decision, error) {
	arr, err := resp.ToArray()
	if valkey.IsParseErr(err) {
		return Decision{}, badReply(err.Error())
	}
	if err != nil {
		return Decision{}, classify(err)
	}
	if len(arr) != 2 {
		return Decision{}, badReply("want 2 elements, got " + strconv.Itoa(len(arr)))
	}
	denied, err1 := arr[0].AsInt64()
	retry, err2 := arr[1].AsInt64()
	switch {
	case err1 != nil || err2 != nil:
		return Decision{}, badReply("elements are not integers")
	case denied < 0 || denied > int64(buckets):
		return Decision{}, badReply("denied " + strconv.FormatInt(denied, 10) + " out of range")
	case (denied == 0) != (retry == 0) || retry < 0:
		return Decision{}, badReply("retry " + strconv.FormatInt(retry, 10) + "µs inconsistent with denied " + strconv.FormatInt(denied, 10))
	}
	return Decision{Denied: uint8(denied), RetryAfter: time.Duration(retry) * time.Microsecond}, nil
}

func badReply(detail string) error {
	return &callError{msg: "admit: unexpected reply from the server: " + detail, reason: ErrBadReply, class: ErrOutcomeUnknown}
}
