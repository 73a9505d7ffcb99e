package admit

// Unit tests of error classification and reply decoding (issue 8, items 5
// and 11): every error valkey-go can hand back, through the whole of
// AllowOrdered, lands in the class its proof in exec.go gives it, with a
// message that says what happened. mutants_go_test.go mutates the code
// under test and requires these tests to notice.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/minitest"
	"github.com/valkey-io/valkey-go"
)

var errclassSpec = MustSpec(Every(time.Hour), 5)

// ecMini is a client on an in-process miniredis.
func ecMini(t *testing.T) valkey.Client {
	t.Helper()
	_, c := minitest.Start(t)
	return c
}

// ecStub answers every command with what do returns; the embedded client
// only builds commands.
type ecStub struct {
	valkey.Client
	do func(ctx context.Context) valkey.ValkeyResult
}

func (s ecStub) Do(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult { return s.do(ctx) }

// ecServerError is the error a server replies with text, as valkey-go
// gives it (a *valkey.ValkeyError).
func ecServerError(t *testing.T, c valkey.Client, text string) error {
	t.Helper()
	err := c.Do(context.Background(), c.B().Eval().Script("return redis.error_reply(ARGV[1])").Numkeys(0).Arg(text).Build()).Error()
	if _, ok := valkey.IsValkeyErr(err); !ok {
		t.Fatalf("no server error for %q: %v", text, err)
	}
	return err
}

// ecDeadlineCtx is a live context with a given deadline: its Err is nil
// even after the deadline, as a context is for a moment after valkey-go
// has seen the connection deadline set from it expire.
type ecDeadlineCtx struct {
	context.Context
	dl time.Time
}

func (c ecDeadlineCtx) Deadline() (time.Time, bool) { return c.dl, true }

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
		{"eof", live, fixed(io.EOF),
			ErrOutcomeUnknown, nil, io.EOF, []string{"may have been in flight"}},
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

// TestErrClassDecode: replies of every shape the script never returns are
// ErrBadReply (outcome unknown) with the shape in the message; replies it
// does return are decoded exactly.
func TestErrClassDecode(t *testing.T) {
	mini := ecMini(t)
	second := &Request{Key: "k2", Spec: errclassSpec}
	for _, tc := range []struct {
		src    string
		second *Request
		want   Decision // for a good reply
		says   string   // for a bad one
	}{
		{src: "return '0 0 2 -1'", want: Decision{Remaining: [2]int{2, -1}}},
		{src: "return '1 7 0 -1'", want: Decision{Denied: 1, RetryAfter: 7 * time.Microsecond, Remaining: [2]int{0, -1}}},
		{src: "return '2 9 1 0'", second: second, want: Decision{Denied: 2, RetryAfter: 9 * time.Microsecond, Remaining: [2]int{1, 0}}},
		// an admission's integer reply: the count, or two packed
		{src: "return 7", want: Decision{Remaining: [2]int{7, -1}}},
		{src: "return 0", want: Decision{Remaining: [2]int{0, -1}}},
		{src: "return 3 * 2^26 + 67108863", second: second, want: Decision{Remaining: [2]int{3, 67108863}}},
		{src: "return 2^52 - 1", second: second, want: Decision{Remaining: [2]int{1<<26 - 1, 1<<26 - 1}}},
		{src: "return -1", says: "admission count -1 out of range"},
		{src: "return 2^53", says: "out of range"},
		{src: "return -1", second: second, says: "admission count -1 out of range"},
		{src: "return nil", says: "nil"},
		{src: "return {0, 0}", says: "not a string"},
		{src: "return '0 0 2'", says: "want 4 fields"},
		{src: "return '0 0 2 -1 0'", says: "is not an integer"},
		{src: "return 'a 0 2 -1'", says: "is not an integer"},
		{src: "return '2 5 2 -1'", says: "denied 2 out of range"},
		{src: "return '3 5 2 0'", second: second, says: "denied 3 out of range"},
		{src: "return '-1 5 2 -1'", says: "denied -1 out of range"},
		{src: "return '0 5 2 -1'", says: "inconsistent"},
		{src: "return '1 0 0 -1'", says: "inconsistent"},
		{src: "return '1 -5 0 -1'", says: "inconsistent"},
		{src: "return '0 0 2 5'", says: "remaining"},
	} {
		t.Run(tc.src, func(t *testing.T) {
			l := newLimiter(mini, valkey.NewLuaScript(tc.src))
			d, err := l.AllowOrdered(context.Background(), Request{Key: "k1", Spec: errclassSpec}, tc.second)
			if tc.says == "" {
				if err != nil || d.Denied != tc.want.Denied || d.RetryAfter != tc.want.RetryAfter || d.Remaining != tc.want.Remaining {
					t.Errorf("got %v, %v; want %v", d, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrBadReply) || !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotExecuted) {
				t.Errorf("got %v, %v; want ErrBadReply, outcome unknown only", d, err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.says) {
				t.Errorf("message %q does not say %q", err.Error(), tc.says)
			}
		})
	}
}

// TestErrClassOwnContext pins ownContextEnded, which decides whether a
// context error valkey-go returns can be this call's.
func TestErrClassOwnContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"no deadline, live", context.Background(), false},
		{"cancelled", cancelled, true},
		{"deadline ahead", ecDeadlineCtx{context.Background(), time.Now().Add(time.Hour)}, false},
		{"deadline passed, Err not yet set", ecDeadlineCtx{context.Background(), time.Now().Add(-time.Nanosecond)}, true},
		{"deadline ahead by the wall clock only", ecDeadlineCtx{context.Background(), time.Now().Add(time.Hour).Round(0)}, true},
	} {
		if got := ownContextEnded(tc.ctx); got != tc.want {
			t.Errorf("%s: ownContextEnded = %v, want %v", tc.name, got, tc.want)
		}
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

// TestErrClassNilReply: a script (under admit's SHA, say) that
// returns nil is a bad reply, outcome unknown; not a connection failure.
// (miniredis answers a script's nil as a real server does: a RESP nil.)
func TestErrClassNilReply(t *testing.T) {
	l := newLimiter(ecMini(t), valkey.NewLuaScript("return nil"))
	_, err := l.AllowOrdered(context.Background(), Request{Key: "errclass:{nil}:r", Spec: errclassSpec}, nil)
	t.Logf("error: %v", err)
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrBadReply) || !strings.Contains(err.Error(), "nil") || strings.Contains(err.Error(), "connection") {
		t.Errorf("got %v; want ErrOutcomeUnknown and ErrBadReply, saying nil, not connection", err)
	}
}
