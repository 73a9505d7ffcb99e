package admit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

func TestErrClassTable(t *testing.T) {
	mini := ecMini(t)
	type row struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		err    func(cancel context.CancelFunc) error // what valkey-go returns; may end the call's context
		class  error
		reason error
		cause  error
		says   []string
	}
	live := func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	withDeadline := func(dl time.Time) func() (context.Context, context.CancelFunc) {
		return func() (context.Context, context.CancelFunc) {
			return ecDeadlineCtx{context.Background(), dl}, func() {}
		}
	}
	fixed := func(err error) func(context.CancelFunc) error { return func(context.CancelFunc) error { return err } }
	serverErr := func(text string) func(context.CancelFunc) error {
		err := ecServerError(t, mini, text)
		return fixed(err)
	}
	noCache := fmt.Errorf("%s: %v\n%w", "NOPERM User svc has no permissions to run the 'client|tracking' command",
		[]string{"CLIENT", "TRACKING", "ON", "OPTIN"}, valkey.ErrNoCache)
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	readErr := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	resetErr := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	pipeErr := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
	rows := []row{
		{"wrongpass", live, serverErr("WRONGPASS invalid username-password pair or user is disabled."),
			ErrNotExecuted, nil, nil, []string{"credentials", "nothing was sent", "WRONGPASS"}},
		{"noauth", live, serverErr("NOAUTH HELLO must be called with the client already authenticated"),
			ErrNotExecuted, nil, nil, []string{"authentication", "nothing ran", "NOAUTH"}},
		{"noperm-for-the-script-command", live, serverErr("NOPERM User u has no permissions to run the 'evalsha' command"),
			ErrNotExecuted, nil, nil, []string{"refused the command before running it"}},
		{"busy", live, serverErr("BUSY Valkey is busy running a script."),
			ErrNotExecuted, nil, nil, []string{"refused"}},
		{"acl-failure-inside-the-script", live, serverErr("ERR ACL failure in script: User u has no permissions to run the 'pexpire' command"),
			ErrOutcomeUnknown, nil, nil, []string{"failed the script", "tokens may have been consumed"}},
		{"no-scripting-engine", live, serverErr("ERR Could not find scripting engine 'lua'"), // Valkey 9.1.2 without its Lua module
			ErrNotExecuted, nil, nil, []string{"no Lua scripting engine", "nothing ran", "MODULE UNLOAD lua", "Could not find scripting engine 'lua'"}},
		{"wrongtype", live, serverErr("WRONGTYPE admit: bucket 2 key holds a value that is not a hash"),
			ErrNotExecuted, ErrWrongType, nil, []string{"bucket 2 key holds a value that is not a hash"}},
		{"corrupt", live, serverErr("ADMITCORRUPT admit: bucket 1 field tokens is not an integer"),
			ErrNotExecuted, ErrCorruptState, nil, []string{"corrupt bucket state"}},
		{"partial-write", live, serverErr("ADMITPARTIAL admit: the server refused HSET on bucket 2's key (NOPERM x) after bucket 1 was written, which stays"),
			ErrOutcomeUnknown, nil, nil, []string{"outcome unknown", "after bucket 1 was written, which stays", "without WithoutACLPrecheck"}},
		{"no-slot", live, fixed(valkey.ErrNoSlot),
			ErrNotExecuted, nil, valkey.ErrNoSlot, []string{"no node for the key's hash slot", "nothing was sent"}},
		{"setup-refused-client-command", live, fixed(noCache),
			ErrNotExecuted, nil, valkey.ErrNoCache, []string{"CLIENT TRACKING", "DisableCache: true", "nothing was sent"}},
		{"dial", live, fixed(dialErr),
			ErrNotExecuted, nil, dialErr, []string{"could not connect", "nothing was sent"}},
		{"dial-timeout", live, fixed(&net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}),
			ErrNotExecuted, nil, context.DeadlineExceeded, []string{"could not connect", "nothing was sent"}},
		{"read-error", live, fixed(readErr),
			ErrOutcomeUnknown, nil, readErr, []string{"may have been in flight"}},
		{"reset", live, fixed(resetErr),
			ErrOutcomeUnknown, nil, resetErr, []string{"closed the connection or died", "may have been in flight", "AlwaysPipelining: true"}},
		{"broken-pipe", live, fixed(pipeErr),
			ErrOutcomeUnknown, nil, pipeErr, []string{"closed the connection or died", "may have been in flight", "AlwaysPipelining: true"}},
		{"eof", live, fixed(io.EOF),
			ErrOutcomeUnknown, nil, io.EOF, []string{"closed the connection or died", "may have been in flight", "AlwaysPipelining: true"}},
		{"closed-client", live, fixed(valkey.ErrClosing),
			ErrOutcomeUnknown, nil, valkey.ErrClosing, []string{"client was closed", "do not use a Limiter after closing"}},
		{"another-call's-deadline", live, fixed(context.DeadlineExceeded),
			ErrNotExecuted, nil, context.DeadlineExceeded, []string{"this call's context is live", "another call's context", "nothing was sent"}},
		{"another-call's-cancel", live, fixed(context.Canceled),
			ErrNotExecuted, nil, context.Canceled, []string{"another call's context"}},
		{"another-call's-deadline-own-deadline-later", withDeadline(time.Now().Add(time.Hour)), fixed(context.DeadlineExceeded),
			ErrNotExecuted, nil, context.DeadlineExceeded, []string{"another call's context"}},
		{"own-cancel-in-flight", live, func(cancel context.CancelFunc) error { cancel(); return context.Canceled },
			ErrOutcomeUnknown, nil, context.Canceled, []string{"this call's context ended", "may have been in flight"}},
		{"own-deadline-passed-timer-not-yet-fired", withDeadline(time.Now().Add(-time.Millisecond)), fixed(context.DeadlineExceeded),
			ErrOutcomeUnknown, nil, context.DeadlineExceeded, []string{"this call's context ended"}},
		{"own-deadline-without-monotonic-clock", withDeadline(time.Now().Add(time.Hour).Round(0)), fixed(context.DeadlineExceeded),
			ErrOutcomeUnknown, nil, context.DeadlineExceeded, []string{"this call's context ended"}},
		{"wrapped-context-error", live, fixed(fmt.Errorf("auth credentials: %w", context.DeadlineExceeded)),
			ErrOutcomeUnknown, nil, context.DeadlineExceeded, []string{"this call's context is live", "may have been in flight"}},
		{"nil-reply", live, fixed(valkey.Nil),
			ErrOutcomeUnknown, ErrBadReply, nil, []string{"unexpected reply", "nil"}},
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			l := newLimiter(ecStub{mini, func(context.Context) valkey.ValkeyResult { return valkey.NewErrorResult(tc.err(cancel)) }}, scripts().take)
			_, err := l.AllowOrdered(ctx, Request{Key: "k", Spec: errclassSpec}, nil)
			t.Logf("%v", err)
			other := ErrOutcomeUnknown
			if tc.class == ErrOutcomeUnknown {
				other = ErrNotExecuted
			}
			if !errors.Is(err, tc.class) || errors.Is(err, other) {
				t.Errorf("class: got %v; want %v only", err, tc.class)
			}
			if tc.reason != nil && !errors.Is(err, tc.reason) {
				t.Errorf("reason: got %v; want %v", err, tc.reason)
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Errorf("cause: got %v; want %v in the chain", err, tc.cause)
			}
			for _, reason := range []error{ErrWrongType, ErrCorruptState, ErrBadReply} {
				if reason != tc.reason && errors.Is(err, reason) {
					t.Errorf("got %v; it must not match %v", err, reason)
				}
			}
			if err == nil {
				return
			}
			if !strings.HasPrefix(err.Error(), "admit: ") {
				t.Errorf("message %q lacks the package prefix", err.Error())
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not say %q", err.Error(), s)
				}
			}
		})
	}
}

// TestErrClassValkeyGoPin: the proofs behind ErrNotExecuted in exec.go
// are read from valkey-go v1.0.79's source (mux.go, pipe.go, cluster.go,
// lua.go). Another version may return the same errors after writing a
// command, so moving to it means reading those files again, then moving
// this pin.
func TestErrClassValkeyGoPin(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/valkey-io/valkey-go (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod does not require github.com/valkey-io/valkey-go")
	}
	if got := string(m[1]); got != "v1.0.79" {
		t.Errorf("valkey-go %s; the error classes in exec.go are proven for v1.0.79: re-read its mux.go, pipe.go, "+
			"cluster.go and lua.go for what is returned before a command is written, update exec.go, then this pin", got)
	}
}
