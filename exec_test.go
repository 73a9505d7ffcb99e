package admit

// Unit tests of sending and decoding (exec.go), and with errors_test.go of
// classification: every error valkey-go can hand back, through the whole
// of AllowOrdered, lands in the class its proof in errors.go gives it, with
// a message that says what happened. mutants_test.go mutates the code
// under test and requires these tests to notice.

import (
	"context"
	"errors"
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
