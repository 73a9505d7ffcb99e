package admit

import (
	"errors"
	"fmt"
)

// Every error AllowOrdered returns is in exactly one of two classes, tested
// with errors.Is:
//
//   - [ErrNotExecuted]: proven that no token was taken and nothing was
//     written. Retrying is safe.
//   - [ErrOutcomeUnknown]: the script may have run, so tokens may have been
//     consumed. The library never retries such a call; the caller decides
//     whether to fail open or closed.
//
// Two calls use ErrNotExecuted in a sense of their own, which their errors'
// text states: [Limiter.Peek], which writes nothing, classes every failure
// ErrNotExecuted, lost replies included; and [Limiter.Wait], which gives
// up with ErrNotExecuted meaning that no token stays taken: its attempts
// ran, as denials (which may lengthen a bucket's expiry, or store a ts
// pulled back after a server clock step), and each charge of the first
// bucket that the second bucket's refusal left was refunded, capped at its
// burst, which wrote that bucket's key.
//
// A denial is a [Decision], never an error.
var (
	ErrNotExecuted    = errors.New("admit: not executed")
	ErrOutcomeUnknown = errors.New("admit: outcome unknown")
)

// Reasons, also tested with errors.Is. Each comes with its class above.
var (
	// ErrInvalidSpec: NewSpec was given a rate or burst it cannot honour.
	// Returned by NewSpec, before any Limiter is involved.
	ErrInvalidSpec = errors.New("admit: invalid spec")

	// ErrInvalidRequest: an empty key, a zero Spec, the same key for both
	// buckets, a nil context or Limiter. Refused before anything is sent.
	// Class: not executed.
	ErrInvalidRequest = errors.New("admit: invalid request")

	// ErrCrossSlot: on a cluster client, the two keys hash to different
	// slots. Give them a common hash tag, as in "rl:{chan:42}:standard" and
	// "rl:{chan:42}:shared". It also matches ErrInvalidRequest.
	// Class: not executed.
	ErrCrossSlot = fmt.Errorf("%w: keys in different cluster hash slots", ErrInvalidRequest)

	// ErrOnceIDReused: AllowOrderedOnce was called with an id whose record
	// was made by a different request (another second key, bucket count,
	// Spec or Cost) within OnceWindow. Nothing was taken. Use an id that
	// names one unit of work. It also matches ErrInvalidRequest.
	// Class: not executed.
	ErrOnceIDReused = fmt.Errorf("%w: once id reused for a different request", ErrInvalidRequest)

	// ErrWrongType: a bucket key holds a value that is not a hash (or
	// AllowOrderedOnce's record key one that is not a string; the message
	// says which). The script read every key before writing, so no key
	// changed.
	// Class: not executed.
	ErrWrongType = errors.New("admit: bucket key holds a value that is not a hash")

	// ErrCorruptState: a bucket hash has fields that are not the decimal
	// integers of the key schema, or AllowOrderedOnce's record key holds a
	// string admit did not write. No key changed, and a corrupt record is
	// never taken for an admission. Class: not executed.
	ErrCorruptState = errors.New("admit: corrupt bucket state")

	// ErrBadReply: the server answered with something the script never
	// returns (another script under the same SHA, or a proxy in between).
	// Class: outcome unknown.
	ErrBadReply = errors.New("admit: unexpected reply")
)

// callError carries a message, its reason and class sentinels and the
// underlying cause, all visible to errors.Is and errors.As.
type callError struct {
	msg    string
	reason error // one of the reason sentinels, or nil
	class  error // ErrNotExecuted or ErrOutcomeUnknown
	cause  error // the transport, server or context error, or nil
}

func (e *callError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *callError) Unwrap() []error {
	errs := make([]error, 0, 3)
	for _, err := range []error{e.reason, e.class, e.cause} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func invalidRequest(msg string) error {
	return &callError{msg: "admit: invalid request: " + msg, reason: ErrInvalidRequest, class: ErrNotExecuted}
}
