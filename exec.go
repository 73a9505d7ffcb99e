package admit

// Sending the script and reading its reply: a call, encoded once from its
// requests (Limiter.newCall), goes out as one EVALSHA and comes back as a
// Decision or an error classed by classify (errors.go).

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// A call is one script run: the requests it was made for, as the caller
// gave them, and the script's keys and arguments, encoded once.
type call struct {
	op      Op
	start   time.Time // for the observer: the zero Time when none observes
	mode    string
	first   Request
	second  *Request
	buckets uint8
	nk, na  int // keys in buf[:nk], arguments in buf[3:3+na]
	buf     [11]string
}

func (c *call) keys() []string { return c.buf[:c.nk] }
func (c *call) args() []string { return c.buf[3 : 3+c.na] }

// send runs c's script and decodes its reply. A call whose context is
// already done is not sent.
func (l *Limiter) send(ctx context.Context, c *call) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, notSent(err)
	}
	script := l.script
	if c.mode == modePeek && !l.peekRW.Load() {
		script = l.readOnly
	}
	d, err := decode(execScript(ctx, script, l.client, c.keys(), c.args()), c.buckets)
	if err != nil && script == l.readOnly && l.readOnlyRefused(err) {
		// Nothing ran: the same script in the same read-only mode,
		// read-write (readonly.go).
		d, err = decode(execScript(ctx, l.script, l.client, c.keys(), c.args()), c.buckets)
	}
	if d.replayed && c.mode != modeOnce {
		return Decision{}, badReply("a replayed decision from a call that names no once-record")
	}
	return d, err
}

// sendLease runs a lease call's script and returns its reply, the
// lease's fields as text (decodeAcquire, Lease.release, Lease.extend). A
// call whose context is already done is not sent.
func (l *Limiter) sendLease(ctx context.Context, c *call) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", notSent(err)
	}
	s, err := execScript(ctx, l.script, l.client, c.keys(), c.args()).ToString()
	switch {
	case err == nil:
		return s, nil
	case valkey.IsParseErr(err): // a reply that is not text
		return "", badReply(err.Error())
	}
	return "", leaseError(classify(err))
}

// execScript runs script on client. When valkey-go fails the call with a
// context error although this call's own context is live (see
// ownContextEnded), the error is marked as another call's
// (foreignContextError), proven so when it is one of the bare sentinels
// context.Canceled and context.DeadlineExceeded.
//
// Why that proves nothing was sent, in valkey-go v1.0.79: a context error
// reaches a call either from that call's own context (pipe.Do checks
// ctx.Err() first and returns it when the call is abandoned; syncDo maps
// the expiry of a connection deadline set from the call's own ctx deadline
// to context.DeadlineExceeded), or from another call's context: the
// context of the call that started a connection attempt shared by every
// caller that needs the connection (mux._pipe, singleconnect), stored in
// the mux's dead wire, which returns it to every caller without writing
// anything; or the context of a synchronous command that failed while
// others were queued behind it unwritten (pipe.failSync), or of a cluster
// refresh that ended before the command was picked a node. In each case
// where the context is not this call's own, this call's command was never
// written.
func execScript(ctx context.Context, script *valkey.Lua, client valkey.Client, keys, args []string) valkey.ValkeyResult {
	resp := script.Exec(ctx, client, keys, args)
	if err := resp.Error(); (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && !ownContextEnded(ctx) {
		bare := err == context.Canceled || err == context.DeadlineExceeded
		return valkey.NewErrorResult(&foreignContextError{err: err, proven: bare})
	}
	return resp
}

// ownContextEnded reports whether ctx may be the context whose end
// valkey-go reported: it is done, or its deadline has passed. valkey-go
// sets a connection's deadline from ctx's deadline and reports its expiry
// as context.DeadlineExceeded, possibly a moment before ctx's own timer
// fires, hence the clock check. That check compares monotonic clock
// readings; a deadline without one (built from a wall-clock time rather
// than time.Now) cannot be compared reliably across a clock step, so it
// counts as ended.
func ownContextEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return false
	}
	return dl == dl.Round(0) || !time.Now().Before(dl)
}

// foreignContextError is a context error valkey-go returned for a call
// whose own context is live. When proven (a bare sentinel), another call's
// context ended a connection attempt or a command this call was waiting
// behind, and nothing was sent; otherwise (a wrapped context error, from a
// dial, an AuthCredentialsFn or a hook) its origin is not known. See
// execScript.
type foreignContextError struct {
	err    error
	proven bool
}

func (e *foreignContextError) Error() string { return e.err.Error() }
func (e *foreignContextError) Unwrap() error { return e.err }

// decode reads the script's reply. An admission that records nothing (a
// take or a peek) replies with an integer, which the server formats itself
// and valkey-go decodes without allocating: the tokens left, and for two
// buckets, when both counts are below 2^26, rem1 * 2^26 + rem2. Every
// other reply is one string, "denied retry_us rem1 rem2", so that
// valkey-go allocates one small buffer for it and decoding allocates
// nothing more. A replay (AllowOrderedOnce's recorded decision) is the
// string prefixed with "R ". Anything else is ErrBadReply, but for a
// malformed replay, which ran nothing: ErrCorruptState.
func decode(resp valkey.ValkeyResult, buckets uint8) (Decision, error) {
	if m, err := resp.ToMessage(); err == nil && m.IsInt64() {
		n, _ := m.ToInt64()
		return decodeAdmitted(n, buckets)
	}
	s, err := resp.ToString()
	if valkey.IsParseErr(err) {
		return Decision{}, badReply(err.Error())
	}
	if err != nil {
		return Decision{}, classify(err)
	}
	replayed := strings.HasPrefix(s, "R ")
	if replayed {
		s = s[2:]
	}
	d, err := decodeFields(s, buckets)
	if err != nil && replayed {
		return Decision{}, corruptReplay(err)
	}
	d.replayed = replayed
	return d, err
}

// fields parses s, len(f) space-separated decimal integers, into f: the
// one reader of every reply in text, a bucket call's or a lease's.
func fields(s string, f []int64) error {
	rest := s
	for i := range f {
		field := rest
		if i < len(f)-1 {
			sp := strings.IndexByte(rest, ' ')
			if sp < 0 {
				return badReply("want " + strconv.Itoa(len(f)) + " fields, got " + strconv.Quote(s))
			}
			field, rest = rest[:sp], rest[sp+1:]
		}
		v, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return badReply("field " + strconv.Itoa(i+1) + " of " + strconv.Quote(s) + " is not an integer")
		}
		f[i] = v
	}
	return nil
}

// decodeFields reads "denied retry_us rem1 rem2".
func decodeFields(s string, buckets uint8) (Decision, error) {
	var f [4]int64
	if err := fields(s, f[:]); err != nil {
		return Decision{}, err
	}
	denied, retry, rem1, rem2 := f[0], f[1], f[2], f[3]
	switch {
	case denied < 0 || denied > int64(buckets):
		return Decision{}, badReply("denied " + strconv.FormatInt(denied, 10) + " out of range")
	case (denied == 0) != (retry == 0) || retry < 0:
		return Decision{}, badReply("retry " + strconv.FormatInt(retry, 10) + "µs inconsistent with denied " + strconv.FormatInt(denied, 10))
	case rem1 < 0 || rem2 < -1 || (rem2 == -1) != (buckets == 1 || denied == 1):
		return Decision{}, badReply("remaining " + strconv.FormatInt(rem1, 10) + ", " + strconv.FormatInt(rem2, 10) +
			" inconsistent with " + strconv.Itoa(int(buckets)) + " buckets and denied " + strconv.FormatInt(denied, 10))
	}
	return Decision{
		Denied:     uint8(denied),
		RetryAfter: time.Duration(retry) * time.Microsecond,
		Remaining:  [2]int{int(rem1), int(rem2)},
		decided:    true,
	}, nil
}

// packShift is the bits of rem2 in a two-bucket admission's integer reply.
const packShift = 26

// decodeAdmitted reads an admission's integer reply (see decode).
func decodeAdmitted(n int64, buckets uint8) (Decision, error) {
	rem := [2]int{int(n), -1}
	if buckets == 2 {
		rem = [2]int{int(n >> packShift), int(n & (1<<packShift - 1))}
	}
	if n < 0 || n >= 1<<53 {
		return Decision{}, badReply("admission count " + strconv.FormatInt(n, 10) + " out of range")
	}
	return Decision{Remaining: rem, decided: true}, nil
}
