package admit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/valkey-io/valkey-go"
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

	// ErrWrongType: a bucket key holds a value that is not a hash. The
	// script read every key before writing, so no key changed.
	// Class: not executed.
	ErrWrongType = errors.New("admit: bucket key holds a value that is not a hash")

	// ErrCorruptState: a bucket hash has fields that are not the decimal
	// integers of the key schema. No key changed. Class: not executed.
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

// preExecCodes are server error codes given before a script starts: the
// command was refused whole, so nothing ran. MOVED, ASK and NOSCRIPT are
// normally resolved inside valkey-go; should one reach us, nothing ran either.
var preExecCodes = map[string]bool{
	"TRYAGAIN": true, "CLUSTERDOWN": true, "LOADING": true, "READONLY": true,
	"OOM": true, "NOPERM": true, "NOAUTH": true, "BUSY": true,
	"MASTERDOWN": true, "MISCONF": true, "NOREPLICAS": true, "CROSSSLOT": true,
	"MOVED": true, "ASK": true, "NOSCRIPT": true,
}

// classify turns the error of a script call into a callError. Only what is
// proven not to have run is ErrNotExecuted; everything else, including a
// context cancelled while the command was in flight, is ErrOutcomeUnknown.
func classify(err error) error {
	if verr, ok := valkey.IsValkeyErr(err); ok {
		msg := verr.Error()
		code, _, _ := strings.Cut(msg, " ")
		switch {
		case code == "WRONGTYPE":
			return &callError{msg: "admit: " + strings.TrimPrefix(msg, "WRONGTYPE admit: "), reason: ErrWrongType, class: ErrNotExecuted}
		case code == "ADMITCORRUPT":
			return &callError{msg: "admit: corrupt bucket state: " + strings.TrimPrefix(msg, "ADMITCORRUPT admit: "), reason: ErrCorruptState, class: ErrNotExecuted}
		case preExecCodes[code]:
			return &callError{msg: "admit: not executed, the server refused the command", class: ErrNotExecuted, cause: err}
		}
		return &callError{msg: "admit: outcome unknown, the server failed the script", class: ErrOutcomeUnknown, cause: err}
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return &callError{msg: "admit: not executed, no connection to the server", class: ErrNotExecuted, cause: err}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &callError{msg: "admit: outcome unknown, the context ended while the command was in flight", class: ErrOutcomeUnknown, cause: err}
	}
	return &callError{msg: "admit: outcome unknown, the connection failed with the command in flight", class: ErrOutcomeUnknown, cause: err}
}
