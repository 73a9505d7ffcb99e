package admit

// Sending a script and classing its failure: what each error proves about
// what happened on the wire (errors.go holds the classes themselves).

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

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
	return unknown("the connection failed while the command may have been in flight; tokens may have been consumed; admit does not retry")
}
