package admithttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
	"github.com/google/go-cmp/cmp"
	"github.com/valkey-io/valkey-go"
)

// failingClient answers every command with err; the embedded client only
// builds commands.
type failingClient struct {
	valkey.Client
	err   error
	calls int
}

func (c *failingClient) Do(context.Context, valkey.Completed) valkey.ValkeyResult {
	c.calls++
	return valkey.NewErrorResult(c.err)
}

// classOf names err's admit class: "not-executed", "outcome-unknown", or
// "none" when it is in neither (or both, which admit never returns).
func classOf(err error) string {
	ne, ou := errors.Is(err, admit.ErrNotExecuted), errors.Is(err, admit.ErrOutcomeUnknown)
	switch {
	case ne && !ou:
		return "not-executed"
	case ou && !ne:
		return "outcome-unknown"
	}
	return "none"
}

// outageLog records which Outage handler ran, with what error.
type outageLog struct {
	ran []string // "NotExecuted" or "OutcomeUnknown", one per call
	err error
}

// outage returns an Outage whose handlers record their call and answer
// 418, so that the test sees which one answered.
func (o *outageLog) outage() admithttp.Outage {
	rec := func(name string) admithttp.OutageHandler {
		return func(w http.ResponseWriter, _ *http.Request, _ http.Handler, err error) {
			o.ran, o.err = append(o.ran, name), err
			w.WriteHeader(http.StatusTeapot)
		}
	}
	return admithttp.Outage{NotExecuted: rec("NotExecuted"), OutcomeUnknown: rec("OutcomeUnknown")}
}

// TestOutagePolicyPerClass: each class goes to its own handler, and Serve,
// Refuse and a function of the caller's do what they say, for both.
func TestOutagePolicyPerClass(t *testing.T) {
	_, mini := newMini(t)
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, class := range []struct {
		name  string
		cause error
		field func(*admithttp.Outage) *admithttp.OutageHandler
	}{
		{"not-executed", dialErr, func(o *admithttp.Outage) *admithttp.OutageHandler { return &o.NotExecuted }},
		{"outcome-unknown", io.EOF, func(o *admithttp.Outage) *admithttp.OutageHandler { return &o.OutcomeUnknown }},
	} {
		for _, policy := range []struct {
			name    string
			handler admithttp.OutageHandler
			status  int
			ran     bool // the wrapped handler
		}{
			{"serve", admithttp.Serve, 200, true},
			{"refuse", admithttp.Refuse, 503, false},
			{"own", func(w http.ResponseWriter, _ *http.Request, _ http.Handler, err error) {
				if classOf(err) == class.name {
					w.WriteHeader(http.StatusTeapot)
				}
			}, 418, false},
		} {
			t.Run(class.name+"/"+policy.name, func(t *testing.T) {
				client := &failingClient{Client: mini, err: class.cause}
				var log outageLog
				outage := log.outage() // the other class's handler records, and must not run
				*class.field(&outage) = policy.handler
				var reported []error
				next := &recordingHandler{}
				h := mustNew(t, admit.New(client), lanes("t:"), outage, admithttp.WithHeaders(),
					admithttp.WithErrorFunc(func(_ *http.Request, err error) { reported = append(reported, err) }))(next)
				rec := send(h, "standard", "u1")
				if rec.Code != policy.status || (next.calls == 1) != policy.ran {
					t.Fatalf("status %d, handler ran %d times; want %d, ran %v", rec.Code, next.calls, policy.status, policy.ran)
				}
				if len(log.ran) != 0 {
					t.Errorf("the other class's handler ran: %v", log.ran)
				}
				if client.calls != 1 {
					t.Errorf("%d commands sent; want 1 (no retry, no refund)", client.calls)
				}
				if len(reported) != 1 || classOf(reported[0]) != class.name || !errors.Is(reported[0], class.cause) {
					t.Errorf("WithErrorFunc got %v; want one %s error wrapping %v", reported, class.name, class.cause)
				}
				if next.admitted {
					t.Errorf("served on an outage with an Admission in the context: a handler would settle a reservation never made")
				}
				if f := rec.Header().Get("RateLimit") + rec.Header().Get("RateLimit-Policy"); f != "" {
					t.Errorf("rate-limit fields on an outage response: %q", f)
				}
				wantRetry := map[int]string{503: "5"}[policy.status]
				if got := rec.Header().Get("Retry-After"); got != wantRetry {
					t.Errorf("Retry-After %q; want %q", got, wantRetry)
				}
				if policy.status == 503 {
					want := map[string]any{"type": "about:blank", "title": "Service Unavailable", "status": float64(503),
						"detail": "the rate limiter is unavailable; retry later"}
					if diff := cmp.Diff(want, problemOf(t, rec)); diff != "" {
						t.Errorf("503 body (-want +got):\n%s", diff)
					}
				}
			})
		}
	}
}

// TestOutageRealClientErrors drives each class through valkey-go itself,
// without a stub: a client whose server port is closed fails to dial
// (nothing sent: NotExecuted), and a closed client gives
// valkey.ErrClosing (OutcomeUnknown, as admit classes it).
func TestOutageRealClientErrors(t *testing.T) {
	closedPort := func(t *testing.T) valkey.Client {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		// ForceSingleClient returns the client even though its first dial fails.
		c, _ := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if c == nil {
			t.Fatal("no client")
		}
		t.Cleanup(c.Close)
		return c
	}
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) valkey.Client
		ctx    func() context.Context
		want   string
		cause  error
	}{
		{"closed-port", closedPort, context.Background, "NotExecuted", nil},
		{"closed-client", func(t *testing.T) valkey.Client { _, c := newMini(t); c.Close(); return c }, context.Background,
			"OutcomeUnknown", valkey.ErrClosing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log outageLog
			next := &recordingHandler{}
			h := mustNew(t, admit.New(tc.client(t)), lanes("t:"), log.outage())(next)
			rec := sendCtx(tc.ctx(), h, "standard", "u1")
			if rec.Code != 418 || next.calls != 0 || len(log.ran) != 1 || log.ran[0] != tc.want {
				t.Fatalf("status %d, handler ran %d, outage handlers %v; want 418 from %s alone", rec.Code, next.calls, log.ran, tc.want)
			}
			if tc.cause != nil && !errors.Is(log.err, tc.cause) {
				t.Errorf("error %v; want %v in its chain", log.err, tc.cause)
			}
			t.Logf("%s: %v", tc.want, log.err)
		})
	}
}
