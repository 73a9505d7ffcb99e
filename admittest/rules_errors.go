package admittest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
)

// checkWrongType: a string or list at either key fails the call with
// admit.ErrWrongType, not executed, and no key changes.
func checkWrongType(ctx context.Context, e *env) error {
	var errs []error
	for _, kind := range []string{"string", "list"} {
		for _, at := range []string{"first", "second", "only"} {
			for _, other := range []string{"absent", "present"} {
				if at == "only" && other == "present" {
					continue
				}
				p := e.prefix("wrong-type")
				good, bad := req(p+"good", hourly3), req(p+"bad", hourly3)
				setup := e.admin.B().Set().Key(bad.Key).Value("x").Build()
				if kind == "list" {
					setup = e.admin.B().Rpush().Key(bad.Key).Element("x").Build()
				}
				err := e.refusedWithoutWrites(ctx, good, bad, at, other == "present", setup, admit.ErrWrongType)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s at the %s key, other key %s: %w", kind, at, other, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// refusedWithoutWrites puts setup at bad, calls with bad at position at
// ("first", "second" or "only"), and wants reason, admit.ErrNotExecuted, and
// both keys byte for byte unchanged.
func (e *env) refusedWithoutWrites(ctx context.Context, good, bad admit.Request, at string, goodPresent bool, setup valkey.Completed, reason error) error {
	now, err := e.serverTime(ctx, good.Key)
	if err != nil {
		return err
	}
	if err := e.admin.Do(ctx, e.admin.B().Del().Key(good.Key, bad.Key).Build()).Error(); err != nil {
		return err
	}
	if goodPresent {
		if err := e.seed(ctx, good.Key, model.State{Tokens: 2, TS: now - sec}, now); err != nil {
			return err
		}
	}
	if err := e.admin.Do(ctx, setup).Error(); err != nil {
		return err
	}
	before := [2]snapshot{}
	for i, k := range []string{good.Key, bad.Key} {
		if before[i], err = e.snap(ctx, k); err != nil {
			return err
		}
	}
	var d admit.Decision
	switch at {
	case "first":
		d, err = e.l.AllowOrdered(ctx, bad, &good)
	case "second":
		d, err = e.l.AllowOrdered(ctx, good, &bad)
	default:
		d, err = e.l.AllowOrdered(ctx, bad, nil)
	}
	var errs []error
	if !errors.Is(err, reason) || !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || d != (admit.Decision{}) {
		errs = append(errs, fmt.Errorf("got %v, %v; want %v and admit.ErrNotExecuted", d, err, reason))
	}
	for i, k := range []string{good.Key, bad.Key} {
		after, err := e.snap(ctx, k)
		if err != nil {
			return err
		}
		if after != before[i] {
			errs = append(errs, fmt.Errorf("%s changed: before %v, after %v", e.short(k), before[i], after))
		}
	}
	return errors.Join(errs...)
}

// checkCorruptState: a bucket hash whose fields are not the schema's
// decimal integers fails the call with admit.ErrCorruptState and no key changes.
func checkCorruptState(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name   string
		fields []string
	}{
		{"tokens not a number", []string{"tokens", "x", "ts", "1"}},
		{"tokens fractional", []string{"tokens", "1.5", "ts", "1"}},
		{"tokens negative", []string{"tokens", "-1", "ts", "1"}},
		{"tokens with a space", []string{"tokens", " 1", "ts", "1"}},
		{"tokens empty", []string{"tokens", "", "ts", "1"}},
		{"ts in hex", []string{"tokens", "1", "ts", "0x10"}},
		{"ts at 2^53", []string{"tokens", "1", "ts", "9007199254740992"}},
		{"ts missing", []string{"tokens", "1"}},
		{"tokens missing", []string{"ts", "1"}},
	} {
		for _, at := range []string{"first", "second"} {
			p := e.prefix("corrupt")
			good, bad := req(p+"good", hourly3), req(p+"bad", hourly3)
			b := e.admin.B().Hset().Key(bad.Key).FieldValue()
			for i := 0; i < len(tc.fields); i += 2 {
				b = b.FieldValue(tc.fields[i], tc.fields[i+1])
			}
			if err := e.refusedWithoutWrites(ctx, good, bad, at, true, b.Build(), admit.ErrCorruptState); err != nil {
				errs = append(errs, fmt.Errorf("%s, at the %s key: %w", tc.name, at, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ambiguous runs one decision whose reply the proxy loses (mode) and
// checks the caller gets admit.ErrOutcomeUnknown (with cause in the chain, if
// given) and the script ran exactly once: one EVALSHA on the wire and on
// the server, one token gone. during, if set, runs while the call is in
// flight.
func (e *env) ambiguous(ctx context.Context, rule string, callCtx context.Context, mode int32, cause error, during func(*faultProxy) error) error {
	p := e.prefix(rule)
	px, err := e.viaProxy(ctx, p, true)
	if err != nil {
		return err
	}
	defer px.close()
	l := px.l
	r := req(p+"r", admit.MustSpec(admit.Every(time.Hour), 5))
	n0 := len(px.commands())
	s0, err := e.stats(ctx, p)
	if err != nil {
		return err
	}
	px.mode.Store(mode)
	type result struct {
		d   admit.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := l.AllowOrdered(callCtx, r, nil)
		done <- result{d, err}
	}()
	if during != nil {
		if err := during(px.faultProxy); err != nil {
			return err
		}
	}
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		return errors.New("the call did not return")
	}
	px.dropHeld()
	px.c.Close() // nothing more can be sent: a retry would have happened by now
	var errs []error
	if !errors.Is(res.err, admit.ErrOutcomeUnknown) || errors.Is(res.err, admit.ErrNotExecuted) || res.d != (admit.Decision{}) ||
		cause != nil && !errors.Is(res.err, cause) {
		errs = append(errs, fmt.Errorf("got %v, %v; want admit.ErrOutcomeUnknown only (cause %v)", res.d, res.err, cause))
	}
	var sent []string
	for _, cmd := range px.since(n0) {
		sent = append(sent, strings.ToUpper(cmd[0]))
	}
	if !slices.Equal(sent, []string{"EVALSHA"}) {
		errs = append(errs, fmt.Errorf("commands sent: %v, want exactly one EVALSHA (no retry)", sent))
	}
	if e.quiet() {
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		if n := s1.ScriptCalls(s0); n != 1 {
			errs = append(errs, fmt.Errorf("server ran %d script commands, want exactly 1", n))
		}
	}
	if tk, err := e.tokensLeft(ctx, r.Key); err != nil || tk != 4 {
		errs = append(errs, fmt.Errorf("tokens %d (%v), want 4: one token of 5 consumed, once", tk, err))
	}
	return errors.Join(errs...)
}

// checkLostReply: the connection drops after the server ran the script
// and before its reply reaches the client: admit.ErrOutcomeUnknown, no retry.
// Both of valkey-go's paths: a context without Done (synchronous) and a
// cancellable one (pipelined).
func checkLostReply(ctx context.Context, e *env) error {
	var errs []error
	if err := e.ambiguous(ctx, "lost-reply", context.Background(), dropScriptReply, nil, nil); err != nil {
		errs = append(errs, fmt.Errorf("context without Done: %w", err))
	}
	callCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := e.ambiguous(ctx, "lost-reply", callCtx, dropScriptReply, nil, nil); err != nil {
		errs = append(errs, fmt.Errorf("cancellable context: %w", err))
	}
	return errors.Join(errs...)
}

// checkCancelInFlight: the context ends after the server ran the script,
// while its reply is held back: admit.ErrOutcomeUnknown with the context's error
// in the chain, and no retry. Cancelled, and past its deadline. (valkey-go
// watches a context with a deadline through the connection's deadline
// only: cancelling such a context does not end a call in flight.)
func checkCancelInFlight(ctx context.Context, e *env) error {
	var errs []error
	callCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := e.ambiguous(ctx, "cancel-in-flight", callCtx, holdScriptReply, context.Canceled, func(p *faultProxy) error {
		select {
		case <-p.executed:
		case <-ctx.Done():
			return errors.New("the script command never reached the server")
		}
		cancel()
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("cancelled: %w", err))
	}
	callCtx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := e.ambiguous(ctx, "deadline-in-flight", callCtx, holdScriptReply, context.DeadlineExceeded, nil); err != nil {
		errs = append(errs, fmt.Errorf("deadline passed: %w", err))
	}
	return errors.Join(errs...)
}

// checkRefused: with the server unreachable (connection refused), the call
// fails with admit.ErrNotExecuted, and no command reaches the server.
func checkRefused(ctx context.Context, e *env) error {
	p := e.prefix("refused")
	px, err := e.viaProxy(ctx, p, true)
	if err != nil {
		return err
	}
	defer px.close()
	l := px.l
	r := req(p+"r", hourly3)
	s0, err := e.stats(ctx, p)
	if err != nil {
		return err
	}
	px.down()
	// The client's one connection is now dead without its knowing: the
	// first command on it fails (with EOF, an ambiguous outcome), after
	// which valkey-go dials again. A PING, which cannot consume tokens,
	// takes that hit; it reaches nothing, as the proxy is down.
	var op *net.OpError
	for i := 0; ; i++ {
		err := px.c.Do(ctx, px.c.B().Ping().Build()).Error()
		if errors.As(err, &op) && op.Op == "dial" {
			break
		}
		if i == 5 {
			return fmt.Errorf("PING through a closed proxy: %v, want a refused dial", err)
		}
	}
	d, err := l.AllowOrdered(ctx, r, nil)
	var errs []error
	if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || !errors.As(err, &op) || d != (admit.Decision{}) {
		errs = append(errs, fmt.Errorf("got %v, %v; want admit.ErrNotExecuted with the dial error", d, err))
	}
	if e.quiet() {
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		if n := s1.ScriptCalls(s0); n != 0 {
			errs = append(errs, fmt.Errorf("server ran %d script commands, want 0", n))
		}
	}
	if s, err := e.snap(ctx, r.Key); err != nil || s.exists {
		errs = append(errs, fmt.Errorf("bucket %v (%v), want absent", s, err))
	}
	return errors.Join(errs...)
}
