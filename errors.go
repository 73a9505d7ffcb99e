package admit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/valkey-io/valkey-go"
)

// The two classes: every error a call returns is in exactly one, tested
// with errors.Is. A denial is a Decision, never an error (docs/errors.md).
var (
	// ErrNotExecuted: nothing was taken or written; a retry is safe.
	ErrNotExecuted = errors.New("admit: not executed")
	// ErrOutcomeUnknown: the call may have run and taken tokens.
	ErrOutcomeUnknown = errors.New("admit: outcome unknown")
)

// Reasons, also tested with errors.Is; each comes with its class.
var (
	// ErrInvalidSpec: NewSpec, NewConcurrency or Spec.Scale cannot honour its values.
	ErrInvalidSpec = errors.New("admit: invalid spec")
	// ErrInvalidRequest: bad input, refused before any write. Not executed.
	ErrInvalidRequest = errors.New("admit: invalid request")
	// ErrCrossSlot (an ErrInvalidRequest): keys in different cluster hash slots.
	ErrCrossSlot = fmt.Errorf("%w: keys in different cluster hash slots", ErrInvalidRequest)
	// ErrOnceIDReused (an ErrInvalidRequest): a once id reused for another request.
	ErrOnceIDReused = fmt.Errorf("%w: once id reused for a different request", ErrInvalidRequest)
	// ErrWrongType: a key holds a value of another type. Not executed.
	ErrWrongType = errors.New("admit: bucket key holds a value that is not a hash")
	// ErrCorruptState: a key holds what admit does not write. Not executed.
	ErrCorruptState = errors.New("admit: corrupt bucket state")
	// ErrBadReply: a reply the script never gives. Outcome unknown.
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

// The errors of a call refused before sending.

func invalidRequest(msg string) error {
	return &callError{msg: "admit: invalid request: " + msg, reason: ErrInvalidRequest, class: ErrNotExecuted}
}

func crossSlot(msg string) error {
	return &callError{msg: "admit: invalid request: " + msg, reason: ErrCrossSlot, class: ErrNotExecuted}
}

// invalidRequestCause is invalidRequest with the error that made it so.
func invalidRequestCause(msg string, cause error) error {
	return &callError{msg: "admit: invalid request: " + msg, reason: ErrInvalidRequest, class: ErrNotExecuted, cause: cause}
}

// notDecided is the error of a Local call whose context was done before
// the decision.
func notDecided(cause error) error {
	return &callError{msg: "admit: not executed, the context was done before the decision", class: ErrNotExecuted, cause: cause}
}

// notSent is the error of a call whose context was done before sending.
func notSent(cause error) error {
	return &callError{msg: "admit: not executed, the context was done before sending", class: ErrNotExecuted, cause: cause}
}

// The errors of a reply.

func badReply(detail string) error {
	return &callError{msg: "admit: unexpected reply from the server: " + detail, reason: ErrBadReply, class: ErrOutcomeUnknown}
}

// corruptReplay is the error of a replay (AllowOrderedOnce's recorded
// decision) that decodes to no decision: the record was not admit's, and
// nothing ran.
func corruptReplay(err error) error {
	return &callError{msg: "admit: corrupt once-record: it replays a decision AllowOrdered never makes: " + err.Error(),
		reason: ErrCorruptState, class: ErrNotExecuted}
}

// The re-classing rules of Peek and Wait.

// peekFailed is Peek's error for err: a Peek writes nothing, so a failure
// whose outcome would be unknown is ErrNotExecuted, with err's reason and
// cause; every other error stays as it is.
func peekFailed(err error) error {
	if !errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	e := &callError{msg: "admit: Peek failed; a Peek writes nothing, so nothing was taken and a retry is safe", class: ErrNotExecuted, cause: err}
	var ce *callError
	if errors.As(err, &ce) {
		e.reason, e.cause = ce.reason, ce.cause
		if e.cause == nil { // a bad reply: its message is the detail
			e.msg += ": " + strings.TrimPrefix(ce.msg, "admit: ")
		}
	}
	return e
}

// waitGaveUp is Wait's error when it gives up with no token taken:
// ErrNotExecuted in Wait's sense (see above). msg says why; after refunds
// attempts that the second bucket refused, the error says what they
// wrote (refunded).
func waitGaveUp(msg string, refunds int, earlier bool, cause error) error {
	return &callError{msg: "admit: Wait: " + msg + refunded(refunds, earlier), class: ErrNotExecuted, cause: cause}
}

// refunded is what Wait's error adds after n attempts that the second
// bucket refused, each of which charged the first bucket and was refunded:
// nothing when n is 0. earlier is set when the error is another attempt's,
// made after them.
func refunded(n int, earlier bool) string {
	const back = " gave it back, capped at the first bucket's burst; the first bucket's key was written, but no token stays taken, so a retry is safe"
	ran, the := "; 2 scripts ran", "the"
	if earlier {
		ran, the = "; before it, 2 scripts ran", "an"
	}
	switch n {
	case 0:
		return ""
	case 1:
		return ran + ": " + the + " attempt charged the first bucket its Cost before the second bucket refused, and a refund" + back
	}
	return ran + " for each of the " + strconv.Itoa(n) + " attempts the second bucket refused: each charged the first bucket its Cost, and a refund" + back
}

// refundFailed is Wait's error when the refund of an attempt the second
// bucket refused failed: the attempt charged the first bucket, so a token
// was taken, and ErrOutcomeUnknown is the class, with the refund's own
// cause (a context or transport error) but not its class: a refund that
// did not run (its context ended first, say) leaves the charge for
// certain, which is no proof that nothing ran.
func refundFailed(err error) error {
	msg := "admit: Wait: the second bucket refused after the first bucket was charged its Cost, and the refund of that charge "
	cause, reason := err, error(nil)
	var ce *callError
	if errors.As(err, &ce) {
		cause, reason = ce.cause, ce.reason
	}
	if errors.Is(err, ErrNotExecuted) {
		msg += "did not run, so the first bucket stays charged: " + err.Error()
	} else {
		msg += "may not have run, so the first bucket may stay charged: " + err.Error()
	}
	if ce != nil && ce.cause != nil { // the cause is in the chain: say it once
		msg = strings.TrimSuffix(msg, ": "+ce.cause.Error())
	}
	return &callError{msg: msg, reason: reason, class: ErrOutcomeUnknown, cause: cause}
}

// preExecCodes are server error codes given before a script starts: the
// command was refused whole, so nothing ran. MOVED, ASK and NOSCRIPT are
// normally resolved inside valkey-go; should one reach us, nothing ran either.
// OOM, READONLY, MISCONF and NOREPLICAS can also refuse the script's first
// write, before anything is written (the script writes only after every
// read). A permission refused inside a running script is not NOPERM but
// "ERR ACL failure in script" (Valkey 8) or "ERR The user executing the
// script can't run this command" (Redis 7.0): outcome unknown.
var preExecCodes = map[string]bool{
	"TRYAGAIN": true, "CLUSTERDOWN": true, "LOADING": true, "READONLY": true,
	"OOM": true, "NOPERM": true, "BUSY": true,
	"MASTERDOWN": true, "MISCONF": true, "NOREPLICAS": true, "CROSSSLOT": true,
	"MOVED": true, "ASK": true, "NOSCRIPT": true,
}

// noScriptingEngine is how Valkey 9.1 refuses EVAL and EVAL_RO (and
// SCRIPT LOAD) when its Lua engine module is not loaded ("ERR Could not find
// scripting engine 'lua'", 9.1.2): the engine is looked up before anything
// runs. EVALSHA gets NOSCRIPT there (unloading the engine empties the
// script cache), and valkey-go's EVAL fallback gets this.
const noScriptingEngine = "Could not find scripting engine"

// classify turns the error of a script call into a callError. Only what is
// proven not to have run is ErrNotExecuted; everything else, including a
// context that ended while the command may have been in flight, is
// ErrOutcomeUnknown. The proofs rest on valkey-go v1.0.79's source, cited
// in each case.
func classify(err error) error {
	notExecuted := func(msg string) error {
		return &callError{msg: "admit: not executed: " + msg, class: ErrNotExecuted, cause: err}
	}
	unknown := func(msg string) error {
		return &callError{msg: "admit: outcome unknown: " + msg, class: ErrOutcomeUnknown, cause: err}
	}
	if valkey.IsValkeyNil(err) {
		return badReply("nil instead of \"denied retry_us rem1 rem2\"")
	}
	if verr, ok := valkey.IsValkeyErr(err); ok {
		msg := verr.Error()
		code, _, _ := strings.Cut(msg, " ")
		switch {
		case code == "WRONGTYPE":
			return &callError{msg: "admit: " + strings.TrimPrefix(msg, "WRONGTYPE admit: "), reason: ErrWrongType, class: ErrNotExecuted}
		case code == "ADMITCORRUPT":
			detail, what := strings.TrimPrefix(msg, "ADMITCORRUPT admit: "), "admit: corrupt bucket state: "
			if strings.HasPrefix(detail, "the once-record") {
				what = "admit: corrupt once-record: "
			}
			return &callError{msg: what + detail + "; nothing was written", reason: ErrCorruptState, class: ErrNotExecuted}
		case code == "ADMITREUSE":
			return &callError{msg: "admit: invalid request: AllowOrderedOnce: this id was recorded within OnceWindow for a different request " +
				"(another bucket count, second key, Spec or Cost); nothing was taken; give each unit of work its own id",
				reason: ErrOnceIDReused, class: ErrNotExecuted}
		case code == "ADMITPARTIAL":
			// Only WithoutACLPrecheck's script replies so: a write on
			// bucket 2's key refused after bucket 1's, which stays.
			return unknown(strings.TrimPrefix(msg, "ADMITPARTIAL admit: ") +
				"; grant the permission, or build the Limiter without WithoutACLPrecheck")
		case code == "ADMITREFUSED":
			// The script replies so only before its first write: the
			// server refused a read, the ACL precheck raised an error
			// (a server that validates the check's arguments, say), or
			// the first write failed whole under pcall.
			return &callError{msg: "admit: not executed: " + strings.TrimPrefix(msg, "ADMITREFUSED admit: ") +
				"; the script stopped before its first write, so nothing was written", class: ErrNotExecuted}
		case code == "ADMITARGS":
			// admit never sends such arguments: a direct EVALSHA, or a
			// script of another release under a colliding call.
			return &callError{msg: "admit: invalid request: the script refused its arguments before reading or writing anything: " +
				strings.TrimPrefix(msg, "ADMITARGS admit: "), reason: ErrInvalidRequest, class: ErrNotExecuted}
		case code == "WRONGPASS":
			// Only AUTH and HELLO ... AUTH get WRONGPASS. admit sends
			// neither; valkey-go sends them in the setup of a new
			// connection, and returns their error before sending any
			// command on it (pipe.go _newPipe, mux.go _pipe).
			return notExecuted("the server refused the client's credentials when it opened a new connection " +
				"(password changed, or user disabled or deleted); nothing was sent; " +
				"give the client valid credentials (ClientOption Username and Password, or AuthCredentialsFn)")
		case code == "NOAUTH":
			// A reply to the connection setup's HELLO, or to the script
			// command itself on an unauthenticated connection: either
			// way the server ran nothing.
			return notExecuted("the server requires authentication and the client's connection has none; " +
				"nothing ran; give the client credentials (ClientOption Username and Password)")
		case strings.Contains(msg, noScriptingEngine):
			return notExecuted("the server has no Lua scripting engine, which admit needs; nothing ran; Valkey 9.1+ " +
				"runs Lua as a module, here unloaded (MODULE UNLOAD lua) or never loaded: restart the server, which loads " +
				"its built-in Lua engine at start, or load the engine's module (loadmodule in its configuration)")
		case preExecCodes[code]:
			return notExecuted("the server refused the command before running it; nothing was written; " +
				"a retry is safe once the condition in the server's reply clears")
		}
		return unknown("the server failed the script; tokens may have been consumed")
	}
	if errors.Is(err, valkey.ErrNoSlot) {
		// Returned by the cluster client's pick when its slot map has
		// no node for the slot, before any connection is used
		// (cluster.go pick, pickMulti).
		return notExecuted("the cluster client has no node for the key's hash slot, as during a failover " +
			"or a resharding; nothing was sent; retry once the slot has a primary")
	}
	if errors.Is(err, valkey.ErrNoCache) {
		// Returned only by the setup of a new connection, when a CLIENT
		// command of it (CLIENT TRACKING for client-side caching, among
		// others) is refused, or the server lacks RESP3 (pipe.go
		// _newPipe); the connection is dropped unused.
		return notExecuted("a new connection's setup was refused (a CLIENT command such as CLIENT TRACKING, " +
			"which valkey-go's client-side cache needs); nothing was sent; grant the user that command " +
			"(for example +client|tracking), or build the client with DisableCache: true")
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		// Dial errors come only from opening a connection (mux.go
		// wireFn), never from one that carried the command.
		return notExecuted("could not connect to the server; nothing was sent; a retry is safe")
	}
	var foreign *foreignContextError
	if errors.As(err, &foreign) {
		if !foreign.proven {
			return unknown("valkey-go reported a context error although this call's context is live, from somewhere " +
				"admit cannot place; the command may have been in flight; tokens may have been consumed")
		}
		return notExecuted("this call's context is live, but valkey-go failed it with another call's context error " +
			"before sending it: valkey-go opens a connection once for all the calls waiting for it, with the context " +
			"of the call that started the attempt, and gives that attempt's error to each of them (a closed client " +
			"repeats the last one); nothing was sent; a retry is safe")
	}
	if errors.Is(err, valkey.ErrClosing) {
		// A call made on a closed client sends nothing; but valkey-go
		// also fails a call whose command is in flight with ErrClosing
		// when Close does not see its reply within a second (pipe.go
		// Close, _background), so ErrClosing proves nothing.
		return unknown("the valkey client was closed; a call made after Close sends nothing, but one in flight " +
			"when Close ran gets the same error, so tokens may have been consumed; do not use a Limiter after closing its client")
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return unknown("this call's context ended while the command may have been in flight; tokens may have been consumed")
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		// The server's side of the connection ended: it closed it or
		// died, before the command was written or after (a write to it
		// then fails with EPIPE, a read with EOF or a reset). Nothing tells
		// the two apart. A connection read only while a call waits on it
		// (valkey-go's default for calls made one at a time: pipe.go Do,
		// syncDo) is found dead by the next command written to it, even
		// one written after the server restarted; with AlwaysPipelining
		// its background reader reads the server's FIN when it arrives
		// and the connection is replaced before a later call picks it
		// (pipe.go _backgroundRead, _exit; mux.go setCloseHookOnWire).
		// Measured by integration's TestCrashRestart (docs/errors.md).
		return unknown("the server closed the connection or died, and the command may have been in flight; tokens may have been consumed; " +
			"admit does not retry. After a server restart, each connection the client held idle fails the next command written to it " +
			"this way; build the client with AlwaysPipelining: true so that valkey-go replaces them when the server closes them")
	}
	return unknown("the connection failed while the command may have been in flight; tokens may have been consumed; admit does not retry")
}

// leaseError names a lease key's corrupt state as such: classify's
// message speaks of buckets.
func leaseError(err error) error {
	if ce, ok := err.(*callError); ok && ce.reason == ErrCorruptState {
		ce.msg = strings.Replace(ce.msg, "corrupt bucket state: the lease key", "corrupt lease state: the lease key", 1)
	}
	return err
}
