package admittest

// The rules of AllowOrderedOnce: one decision per id, proven through a lost
// reply.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/admitkit/admit"
)

var onceRules = []rule{
	{"once-survives-a-lost-reply", checkOnceLostReply},
}

func init() { allRules = append(allRules, onceRules...) }

// checkOnceLostReply: the reply of an AllowOrderedOnce is lost after the
// script ran (admit.ErrOutcomeUnknown); the retry with the same id returns
// the Decision the lost run made, and the buckets were charged once. Another
// id decides anew. The record expires after admit.OnceWindow, and once it is
// gone the same id decides anew. Script runs are counted on the proxy and,
// when the suite owns the server, in INFO commandstats.
func checkOnceLostReply(ctx context.Context, e *env) error {
	p := e.prefix("once")
	proxy, c, lp, err := e.viaProxy(ctx, p)
	if err != nil {
		return err
	}
	defer proxy.close()
	defer c.Close()
	std := req(p+"std", admit.MustSpec(admit.Every(time.Hour), 5))
	shared := req(p+"shared", admit.MustSpec(admit.Every(time.Hour), 10))
	shared.Cost = 3
	if _, err := lp.AllowOrdered(ctx, req(p+"warm", hourly3), nil); err != nil { // loads the script
		return err
	}
	s0, err := e.stats(ctx, p)
	if err != nil {
		return err
	}
	n0 := len(proxy.commands())
	proxy.mode.Store(dropScriptReply)
	_, lost := lp.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	proxy.dropHeld()
	if !errors.Is(lost, admit.ErrOutcomeUnknown) {
		return fmt.Errorf("the call whose reply was dropped: %v, want admit.ErrOutcomeUnknown", lost)
	}
	var errs []error
	if sent := len(proxy.since(n0)); sent != 1 {
		errs = append(errs, fmt.Errorf("the proxy saw %d commands for the lost call, want 1 (no retry inside admit)", sent))
	}

	// The retry, on the client under test, with the same id.
	retry, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil {
		return fmt.Errorf("the retry with the same id: %w", err)
	}
	want := [2]int{4, 7}
	if !retry.Allowed() || retry.Remaining != want {
		errs = append(errs, fmt.Errorf("the retry returned %v %v, want the lost run's admission with Remaining %v", retry, retry.Remaining, want))
	}
	for i, key := range []string{std.Key, shared.Key} {
		if tk, err := e.tokensLeft(ctx, key); err != nil || tk != int64(want[i]) {
			errs = append(errs, fmt.Errorf("%s holds %d tokens (%v), want %d: charged once, not twice", e.short(key), tk, err, want[i]))
		}
	}
	again, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil || again != retry {
		errs = append(errs, fmt.Errorf("a third call with the same id: %v, %v; want the recorded %v", again, err, retry))
	}

	// Another id decides.
	other, err := e.l.AllowOrderedOnce(ctx, "msg-2", std, &shared)
	if err != nil || !other.Allowed() || other.Remaining != [2]int{3, 4} {
		errs = append(errs, fmt.Errorf("another id: %v %v, %v; want a new admission with Remaining [3 4]", other, other.Remaining, err))
	}
	if e.quiet() {
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		// The lost run, the retry, the third call, the other id.
		if n := s1["evalsha"].calls - s0["evalsha"].calls + s1["eval"].calls - s0["eval"].calls; n != 4 {
			errs = append(errs, fmt.Errorf("the server ran %d script commands, want 4", n))
		}
	}

	// The record: one string key in the first bucket's slot, expiring after
	// the window; once it has expired, the id decides anew.
	record := std.Key + ":once:msg-1"
	n, _, err := e.node(ctx, record)
	if err != nil {
		return err
	}
	pttl, err := n.Do(ctx, n.B().Pttl().Key(record).Build()).AsInt64()
	if err != nil || pttl <= 0 || pttl > admit.OnceWindow.Milliseconds() || pttl < admit.OnceWindow.Milliseconds()-60_000 {
		errs = append(errs, fmt.Errorf("record %s PTTL %d ms (%v), want within a minute under admit.OnceWindow (%v)", e.short(record), pttl, err, admit.OnceWindow))
	}
	if err := n.Do(ctx, n.B().Pexpire().Key(record).Milliseconds(1).Build()).Error(); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if gone, err := n.Do(ctx, n.B().Exists().Key(record).Build()).AsInt64(); err != nil || gone == 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the record did not expire within 5 s of PEXPIRE 1")
		}
	}
	anew, err := e.l.AllowOrderedOnce(ctx, "msg-1", std, &shared)
	if err != nil || !anew.Allowed() || anew.Remaining != [2]int{2, 1} {
		errs = append(errs, fmt.Errorf("the same id after its record expired: %v %v, %v; want a new admission with Remaining [2 1]", anew, anew.Remaining, err))
	}
	return errors.Join(errs...)
}
