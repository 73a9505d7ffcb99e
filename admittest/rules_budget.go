package admittest

// The rules of the Budget API: Request.Cost, Decision.Remaining,
// Limiter.Peek, Limiter.Refund and Limiter.Wait.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
)

// costCall is a row of a rule's table of calls on a std and a shared
// bucket: its name, each bucket's seed (nil: absent), each Request's Cost,
// and whether the call has no second bucket.
type costCall struct {
	name          string
	first, second *seedAt
	c1, c2        int
	oneBucket     bool
}

// requests builds the call's Requests under prefix p, and the seeds of the
// buckets present.
func (c costCall) requests(p string, spec1, spec2 admit.Spec) (admit.Request, *admit.Request, map[string]seedAt) {
	first := admit.Request{Key: p + "std", Spec: spec1, Cost: c.c1}
	second := &admit.Request{Key: p + "shared", Spec: spec2, Cost: c.c2}
	if c.oneBucket {
		second = nil
	}
	seeds := map[string]seedAt{}
	if c.first != nil {
		seeds[first.Key] = *c.first
	}
	if c.second != nil && second != nil {
		seeds[second.Key] = *c.second
	}
	return first, second, seeds
}

// remainingBetween checks d.Remaining against the model's at both ends of
// the server window of the call.
func remainingBetween(d, lo, hi admit.Decision) error {
	for i := range d.Remaining {
		if !between(int64(lo.Remaining[i]), int64(hi.Remaining[i]), int64(d.Remaining[i])) {
			return fmt.Errorf("Remaining %v, want %v..%v by the model", d.Remaining, lo.Remaining, hi.Remaining)
		}
	}
	return nil
}

// matchesModel compares a decision made between server times tBefore and
// tAfter with the model's at both ends: Denied exactly, RetryAfter and
// Remaining within the window.
func matchesModel(d admit.Decision, tBefore, tAfter int64, states map[string]model.State, first admit.Request, second *admit.Request) error {
	lo, _ := model.Decide(tBefore, states, first, second)
	hi, _ := model.Decide(tAfter, states, first, second)
	if lo.Denied != hi.Denied {
		return fmt.Errorf("inconclusive: the model's decision changes within the server window of %dµs", tAfter-tBefore)
	}
	if d.Denied != lo.Denied || !between(lo.RetryAfter.Microseconds(), hi.RetryAfter.Microseconds(), d.RetryAfter.Microseconds()) {
		return fmt.Errorf("decision %v, want %v (RetryAfter %v..%v by the server clock)", d, lo, lo.RetryAfter, hi.RetryAfter)
	}
	return remainingBetween(d, lo, hi)
}

// snaps returns the snapshot of every key.
func (e *env) snaps(ctx context.Context, keys []string) (map[string]snapshot, error) {
	m := map[string]snapshot{}
	for _, k := range keys {
		s, err := e.snap(ctx, k)
		if err != nil {
			return nil, err
		}
		m[k] = s
	}
	return m, nil
}

// unchanged reports every key whose snapshot differs from before.
func (e *env) unchanged(ctx context.Context, keys []string, before map[string]snapshot) error {
	after, err := e.snaps(ctx, keys)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		if after[k] != before[k] {
			errs = append(errs, fmt.Errorf("%s changed: before %v, after %v", e.short(k), before[k], after[k]))
		}
	}
	return errors.Join(errs...)
}

// checkCostTransitions: the three rows of the design table with costs
// above one: a bucket admits when it holds its Request's Cost and is then
// charged exactly that Cost; RetryAfter is the time until the refusing
// bucket holds its Cost; Remaining is what each bucket holds after the
// call. Every field, expiry and untouched key is compared with the model
// (decideAndCompare), and Denied and Remaining with the values worked out
// by hand below.
func checkCostTransitions(ctx context.Context, e *env) error {
	// Different intervals and bursts, so that a cost, a burst or a
	// RetryAfter taken from the wrong bucket shows.
	firstSpec := admit.MustSpec(admit.Every(time.Hour), 10)
	secondSpec := admit.MustSpec(admit.Every(30*time.Minute), 8)
	var errs []error
	for _, tc := range []struct {
		costCall
		denied    uint8
		remaining [2]int
	}{
		{costCall{"allow/allow", &seedAt{7, -sec}, &seedAt{6, -sec}, 3, 4, false}, 0, [2]int{4, 2}},
		{costCall{"allow/allow, each holding exactly its cost", &seedAt{5, -sec}, &seedAt{4, -sec}, 5, 4, false}, 0, [2]int{0, 0}},
		{costCall{"allow/allow, fresh buckets, cost = burst", nil, nil, 10, 8, false}, 0, [2]int{0, 0}},
		{costCall{"allow/deny", &seedAt{7, -sec}, &seedAt{3, -sec}, 3, 4, false}, 2, [2]int{4, 3}},
		{costCall{"allow/deny, second four tokens short", nil, &seedAt{1, -5 * sec}, 2, 5, false}, 2, [2]int{8, 1}},
		{costCall{"deny/any", &seedAt{2, -sec}, &seedAt{8, -sec}, 3, 2, false}, 1, [2]int{2, -1}},
		{costCall{"deny/any, first four tokens short, second absent", &seedAt{0, -sec}, nil, 4, 1, false}, 1, [2]int{0, -1}},
		{costCall{"one bucket, two tokens earned, remainder kept", &seedAt{5, -2*hour - 5*sec}, nil, 7, 0, true}, 0, [2]int{0, -1}},
		{costCall{"one bucket, one token short", &seedAt{5, -sec}, nil, 6, 0, true}, 1, [2]int{5, -1}},
		{costCall{"cost 0 means 1", &seedAt{1, -sec}, &seedAt{1, -sec}, 0, 0, false}, 0, [2]int{0, 0}},
	} {
		first, second, seeds := tc.requests(e.prefix("cost-transitions"), firstSpec, secondSpec)
		d, err := e.decideAndCompare(ctx, e.l, first, second, seeds)
		if err == nil && (d.Denied != tc.denied || d.Remaining != tc.remaining) {
			err = fmt.Errorf("decision %v with Remaining %v, want Denied %d and Remaining %v", d, d.Remaining, tc.denied, tc.remaining)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (costs %d, %d): %w", tc.name, tc.c1, tc.c2, err))
		}
	}
	return errors.Join(errs...)
}

// checkRemainingReported: Remaining after an admission, a second-bucket
// denial, a first-bucket denial and one-bucket calls, on the server's own
// clock: the tokens each evaluated bucket holds after the call (what its
// hash then stores), and -1 for a bucket the call did not evaluate.
func checkRemainingReported(ctx context.Context, e *env) error {
	p := e.prefix("remaining")
	a := admit.Request{Key: p + "a", Spec: admit.MustSpec(admit.Every(time.Hour), 5), Cost: 2}
	b := admit.Request{Key: p + "b", Spec: admit.MustSpec(admit.Every(time.Hour), 4), Cost: 3}
	bOne, aOne := b, a
	bOne.Cost, aOne.Cost = 1, 1
	var errs []error
	for i, step := range []struct {
		name      string
		first     admit.Request
		second    *admit.Request
		denied    uint8
		remaining [2]int
	}{
		{"allowed, two buckets", a, &b, 0, [2]int{3, 1}},
		{"denied by the second bucket", a, &b, 2, [2]int{1, 1}},
		{"denied by the first bucket", a, &b, 1, [2]int{1, -1}},
		{"allowed, one bucket", bOne, nil, 0, [2]int{0, -1}},
		{"allowed, one bucket, its last token", aOne, nil, 0, [2]int{0, -1}},
		{"denied, one bucket", aOne, nil, 1, [2]int{0, -1}},
		{"denied by the first bucket, second empty too", a, &b, 1, [2]int{0, -1}},
	} {
		d, err := e.l.AllowOrdered(ctx, step.first, step.second)
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", i, step.name, err)
		}
		if d.Denied != step.denied || d.Remaining != step.remaining {
			errs = append(errs, fmt.Errorf("step %d (%s): %v with Remaining %v, want Denied %d and Remaining %v",
				i, step.name, d, d.Remaining, step.denied, step.remaining))
			continue
		}
		for j, k := range keysOf(step.first, step.second) {
			if d.Remaining[j] < 0 {
				continue
			}
			if tk, err := e.tokensLeft(ctx, k); err != nil || tk != int64(d.Remaining[j]) {
				errs = append(errs, fmt.Errorf("step %d (%s): %s holds %d tokens (%v), Remaining[%d] says %d", i, step.name, e.short(k), tk, err, j, d.Remaining[j]))
			}
		}
	}
	// Remaining is exact for every burst a Spec allows, small or large:
	// fresh buckets are full, so an admission leaves burst - 1 in each.
	// (The script packs an admission's counts into one integer when both
	// are below 2^26; these bursts sit on either side of that bound.)
	for i, bursts := range [][2]int{{7, 1<<26 + 9}, {1<<26 + 9, 7}, {1 << 26, 1 << 26}, {1<<26 + 1, 1<<26 + 1}, {1 << 40, 3}} {
		first := admit.Request{Key: p + "large:" + strconv.Itoa(i) + ":a", Spec: admit.MustSpec(admit.MaxLimit, bursts[0])}
		second := admit.Request{Key: p + "large:" + strconv.Itoa(i) + ":b", Spec: admit.MustSpec(admit.MaxLimit, bursts[1])}
		want := [2]int{bursts[0] - 1, bursts[1] - 1}
		if d, err := e.l.AllowOrdered(ctx, first, &second); err != nil || !d.Allowed() || d.Remaining != want {
			errs = append(errs, fmt.Errorf("bursts %v, fresh buckets: %v, %v with Remaining %v; want admitted with Remaining %v", bursts, d, err, d.Remaining, want))
		}
		alone := second
		alone.Key = p + "large:" + strconv.Itoa(i) + ":c"
		if d, err := e.l.AllowOrdered(ctx, alone, nil); err != nil || !d.Allowed() || d.Remaining != [2]int{bursts[1] - 1, -1} {
			errs = append(errs, fmt.Errorf("burst %d, a fresh bucket alone: %v, %v with Remaining %v; want admitted with Remaining [%d -1]", bursts[1], d, err, d.Remaining, bursts[1]-1))
		}
	}
	return errors.Join(errs...)
}

// checkPeekWritesNothing: Peek returns the Decision the model gives (and
// AllowOrdered then returns), and leaves every key byte for byte as it was
// (DUMP and PEXPIRETIME): no charge, no refill write, no expiry refresh, and
// no key created for an absent bucket.
func checkPeekWritesNothing(ctx context.Context, e *env) error {
	spec1 := admit.MustSpec(admit.Every(time.Hour), 5)
	spec2 := admit.MustSpec(admit.Every(30*time.Minute), 4)
	var errs []error
	for _, tc := range []costCall{
		{"both absent", nil, nil, 2, 3, false},
		{"allow/allow", &seedAt{4, -sec}, &seedAt{3, -sec}, 2, 3, false},
		{"allow/deny", &seedAt{4, -sec}, &seedAt{1, -sec}, 2, 3, false},
		{"deny/any", &seedAt{1, -sec}, &seedAt{3, -sec}, 2, 1, false},
		{"refill due (a write would move ts)", &seedAt{0, -2*hour - 5*sec}, &seedAt{0, -hour - sec}, 1, 1, false},
		{"one bucket", &seedAt{3, -sec}, nil, 3, 0, true},
		{"one bucket, absent", nil, nil, 1, 0, true},
	} {
		first, second, seeds := tc.requests(e.prefix("peek-writes-nothing"), spec1, spec2)
		if err := e.peekThenTake(ctx, e.l, first, second, seeds); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// peekThenTake seeds the buckets (absent without a seed), peeks with l, requires the
// model's decision and no change to any key, then runs AllowOrdered with
// e.l and requires the same decision: Denied and Remaining equal, and
// RetryAfter shorter by no more than the server time between the two.
func (e *env) peekThenTake(ctx context.Context, l *admit.Limiter, first admit.Request, second *admit.Request, seeds map[string]seedAt) error {
	keys := keysOf(first, second)
	states, err := e.seedKeys(ctx, keys, seeds)
	if err != nil {
		return err
	}
	before, err := e.snaps(ctx, keys)
	if err != nil {
		return err
	}
	tBefore, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return err
	}
	peeked, err := l.Peek(ctx, first, second)
	if err != nil {
		return fmt.Errorf("Peek: %w", err)
	}
	tAfter, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return err
	}
	var errs []error
	if err := e.unchanged(ctx, keys, before); err != nil {
		errs = append(errs, fmt.Errorf("Peek wrote: %w", err))
	}
	if err := matchesModel(peeked, tBefore, tAfter, states, first, second); err != nil {
		errs = append(errs, fmt.Errorf("Peek: %w", err))
	}
	if l != e.l {
		return errors.Join(errs...)
	}
	d, err := e.l.AllowOrdered(ctx, first, second)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("AllowOrdered after Peek: %w", err))...)
	}
	tTaken, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return err
	}
	if gap := peeked.RetryAfter - d.RetryAfter; d.Denied != peeked.Denied || d.Remaining != peeked.Remaining ||
		gap < 0 || gap.Microseconds() > tTaken-tBefore {
		errs = append(errs, fmt.Errorf("Peek said %v with Remaining %v; AllowOrdered then said %v with Remaining %v (server window %dµs)",
			peeked, peeked.Remaining, d, d.Remaining, tTaken-tBefore))
	}
	return errors.Join(errs...)
}

// checkPeekReadOnlyUser: an ACL user allowed only the commands of a peek
// (EVALSHA_RO, EVAL_RO, TIME, HMGET, EXISTS) on the rule's keys can Peek,
// and gets the model's decision without any key changing; its AllowOrdered
// and Refund are refused by the server (NOPERM), classed
// admit.ErrNotExecuted, and write nothing. It creates the user with ACL
// SETUSER on the node that holds the keys and deletes it at the end, so it
// runs only on a server the suite owns ([Owned]) or with an admin client
// ([WithAdmin]).
func checkPeekReadOnlyUser(ctx context.Context, e *env) error {
	if !e.owned && e.admin == e.client {
		return skipf("creates an ACL user: needs a server that is the suite's alone (Owned) or an admin client (WithAdmin)")
	}
	p := e.prefix("peek-read-only")
	n, addr, err := e.node(ctx, p)
	if err != nil {
		return err
	}
	var random [8]byte
	rand.Read(random[:])
	name, pass := "admittest-peek-"+hex.EncodeToString(random[:4]), hex.EncodeToString(random[4:])
	rules := []string{"reset", "on", ">" + pass, "-@all", "+evalsha_ro", "+eval_ro", "+time", "+hmget", "+exists", "~" + p + "*"}
	if e.opt.SelectDB != 0 {
		rules = append(rules, "+select") // the client selects its database on connect
	}
	if err := n.Do(ctx, n.B().AclSetuser().Username(name).Rule(rules...).Build()).Error(); err != nil {
		if isRefusal(err) && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			return skipf("the server has no ACL command: %v", err)
		}
		if !e.owned {
			return skipf("the admin client may not create ACL users: %v", err)
		}
		return fmt.Errorf("ACL SETUSER %s %s: %w", name, strings.Join(rules[3:], " "), err)
	}
	defer n.Do(context.WithoutCancel(ctx), n.B().AclDeluser().Username(name).Build())
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{addr}, Username: name, Password: pass, DisableCache: true, ForceSingleClient: true,
		TLSConfig: e.opt.TLSConfig, Dialer: e.opt.Dialer, SelectDB: e.opt.SelectDB,
	})
	if err != nil {
		return fmt.Errorf("connect as the read-only user %s: %w", name, err)
	}
	defer c.Close()
	l := e.newLimiter(c)
	spec1, spec2 := admit.MustSpec(admit.Every(time.Hour), 5), admit.MustSpec(admit.Every(30*time.Minute), 4)
	first, second, _ := costCall{c1: 2, c2: 3}.requests(p, spec1, spec2)
	keys := keysOf(first, second)

	var errs []error
	// Absent buckets: the peek creates nothing; then seeded ones, with a
	// refill due, admitted and refused by the second bucket.
	for _, tc := range []struct {
		name   string
		s1, s2 *seedAt
	}{
		{"absent buckets", nil, nil},
		{"refill due", &seedAt{0, -2*hour - 5*sec}, &seedAt{3, -sec}},
		{"second refuses", &seedAt{4, -sec}, &seedAt{1, -sec}},
	} {
		_, _, seeds := costCall{first: tc.s1, second: tc.s2, c1: 2, c2: 3}.requests(p, spec1, spec2)
		if err := e.peekThenTake(ctx, l, first, second, seeds); err != nil {
			errs = append(errs, fmt.Errorf("Peek as %s, %s: %w", name, tc.name, err))
		}
	}
	before, err := e.snaps(ctx, keys)
	if err != nil {
		return err
	}
	d, err := l.AllowOrdered(ctx, first, second)
	if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || d.Allowed() || !strings.Contains(fmt.Sprint(err), "NOPERM") {
		errs = append(errs, fmt.Errorf("AllowOrdered as %s: got %v, %v; want a NOPERM refusal classed admit.ErrNotExecuted", name, d, err))
	}
	err = l.Refund(ctx, first, second)
	if !errors.Is(err, admit.ErrNotExecuted) || errors.Is(err, admit.ErrOutcomeUnknown) || !strings.Contains(fmt.Sprint(err), "NOPERM") {
		errs = append(errs, fmt.Errorf("Refund as %s: got %v; want a NOPERM refusal classed admit.ErrNotExecuted", name, err))
	}
	if err := e.unchanged(ctx, keys, before); err != nil {
		errs = append(errs, fmt.Errorf("refused calls wrote: %w", err))
	}
	return errors.Join(errs...)
}

// refundAndCompare seeds buckets, refunds them with e.l and compares every
// bucket with the model at both ends of the server window: the fields and
// expiry of every bucket the model writes, and, byte for byte, every key
// it does not write (an absent key stays absent).
func (e *env) refundAndCompare(ctx context.Context, first admit.Request, second *admit.Request, seeds map[string]seedAt) error {
	keys := keysOf(first, second)
	states, err := e.seedKeys(ctx, keys, seeds)
	if err != nil {
		return err
	}
	before, err := e.snaps(ctx, keys)
	if err != nil {
		return err
	}
	reqs := []admit.Request{first}
	if second != nil {
		reqs = append(reqs, *second)
	}
	tBefore, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return err
	}
	callErr := e.l.Refund(ctx, first, second)
	tAfter, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return err
	}
	if callErr != nil {
		return fmt.Errorf("Refund: %w", callErr)
	}
	wLo, wHi := model.Refund(tBefore, states, reqs...), model.Refund(tAfter, states, reqs...)
	diffs, err := e.compareWrites(ctx, keys, before, wLo, wHi, tAfter-tBefore)
	if err != nil {
		return err
	}
	return errors.Join(diffs...)
}

// checkRefundCapped: a refund after a charge gives back exactly the Cost
// and keeps the part-token in ts (the bucket is as it was before the
// charge, field for field); a refund never raises a bucket above its burst;
// a refund to an absent key (a full bucket) creates nothing. Every case is
// compared with the model, fields and expiry.
func checkRefundCapped(ctx context.Context, e *env) error {
	spec1 := admit.MustSpec(admit.Every(time.Hour), 10)
	spec2 := admit.MustSpec(admit.Every(30*time.Minute), 4)
	var errs []error

	// Charge, then refund the same Costs: both buckets hold again exactly
	// the fields they held before the charge.
	p := e.prefix("refund")
	first, second := admit.Request{Key: p + "std", Spec: spec1, Cost: 4}, admit.Request{Key: p + "shared", Spec: spec2, Cost: 2}
	states, err := e.seedKeys(ctx, keysOf(first, &second), map[string]seedAt{first.Key: {6, -hour / 2}, second.Key: {3, -10 * 60 * sec}})
	if err != nil {
		return err
	}
	if d, err := e.l.AllowOrdered(ctx, first, &second); err != nil || !d.Allowed() || d.Remaining != [2]int{2, 1} {
		return fmt.Errorf("charge: got %v, %v, Remaining %v; want allowed with Remaining [2 1]", d, err, d.Remaining)
	}
	if err := e.l.Refund(ctx, first, &second); err != nil {
		return fmt.Errorf("Refund: %w", err)
	}
	for _, k := range keysOf(first, &second) {
		obs, err := e.readBucket(ctx, k)
		if err != nil {
			return err
		}
		tk, ts, err := obs.parse()
		if want := states[k]; err != nil || tk != want.Tokens || ts != want.TS {
			errs = append(errs, fmt.Errorf("charge then refund: %s holds tokens %d ts %d (%v), want tokens %d ts %d as before the charge (part-token kept)",
				e.short(k), tk, ts, err, want.Tokens, want.TS))
		}
	}

	for _, tc := range []costCall{
		{"within burst, part-token kept", &seedAt{2, -hour / 2}, nil, 3, 0, true},
		{"above what was taken: capped at burst", &seedAt{8, -sec}, nil, 5, 0, true},
		{"refilled to full meanwhile", &seedAt{0, -20 * hour}, nil, 3, 0, true},
		{"stored above burst (burst lowered since)", &seedAt{15, -sec}, nil, 1, 0, true},
		{"server clock behind ts", &seedAt{1, 30 * sec}, nil, 2, 0, true},
		{"absent key: not created", nil, nil, 3, 0, true},
		{"cost 0 means 1", &seedAt{1, -sec}, nil, 0, 0, true},
		{"two buckets", &seedAt{1, -sec}, &seedAt{0, -10 * 60 * sec}, 2, 3, false},
		{"two buckets, second capped at its burst", &seedAt{1, -sec}, &seedAt{3, -sec}, 2, 4, false},
		{"two buckets, second absent: not created", &seedAt{1, -sec}, nil, 2, 3, false},
		{"two buckets, both absent: nothing created", nil, nil, 2, 3, false},
	} {
		first, second, seeds := tc.requests(e.prefix("refund"), spec1, spec2)
		if err := e.refundAndCompare(ctx, first, second, seeds); err != nil {
			errs = append(errs, fmt.Errorf("%s (costs %d, %d): %w", tc.name, tc.c1, tc.c2, err))
		}
	}
	return errors.Join(errs...)
}

// checkWaitDeadline: Wait makes one attempt and returns at once, with the
// denial and an error wrapping admit.ErrNotExecuted and
// context.DeadlineExceeded, when the refusing bucket cannot hold the Cost
// before the context's deadline; and when the token is due in a few
// milliseconds it sleeps until then and is admitted by exactly its second
// attempt. Attempts are counted on the wire (a proxy) and, on a server that
// is the suite's alone, in INFO commandstats; no duration is asserted.
func checkWaitDeadline(ctx context.Context, e *env) error {
	p := e.prefix("wait")
	px, err := e.viaProxy(ctx, p, true)
	if err != nil {
		return err
	}
	defer px.close()
	l := px.l
	hourly1 := admit.MustSpec(admit.Every(time.Hour), 1)
	// attempts runs Wait and returns its result and the number of script
	// commands it sent, counted by the proxy and (on a quiet server) by
	// the server.
	type waited struct {
		d        admit.Decision
		err      error
		attempts int
	}
	attempts := func(wctx context.Context, first admit.Request, second *admit.Request) (waited, error) {
		n0 := len(px.commands())
		s0, err := e.stats(ctx, p)
		if err != nil {
			return waited{}, err
		}
		d, werr := l.Wait(wctx, first, second)
		s1, err := e.stats(ctx, p)
		if err != nil {
			return waited{}, err
		}
		w := waited{d: d, err: werr}
		for _, cmd := range px.since(n0) {
			if !isScriptCommand(cmd) {
				return w, fmt.Errorf("Wait sent %q, want only script commands", cmd[0])
			}
			w.attempts++
		}
		if e.quiet() {
			if n := s1.ScriptCalls(s0); n != int64(w.attempts) {
				return w, fmt.Errorf("the proxy saw %d script commands, the server counted %d", w.attempts, n)
			}
		}
		return w, nil
	}
	var errs []error

	// The token is an hour away and the deadline 10 s: one attempt, then
	// an error wrapping context.DeadlineExceeded that comes with the
	// denial, while the context still runs, and nothing taken
	// (admit.ErrNotExecuted): after Denied 2 the attempt charged the first
	// bucket, and Wait refunded it (a second script command).
	std, shared := req(p+"std", hourly1), req(p+"shared", hourly1)
	for _, tc := range []struct {
		name   string
		second *admit.Request
		seeds  map[string]seedAt
		denied uint8
		sent   int   // script commands: the attempt, and after Denied 2 its refund
		left   int64 // tokens in the first bucket afterwards
	}{
		{"one bucket, empty", nil, map[string]seedAt{std.Key: {0, -sec}}, 1, 1, 0},
		{"second bucket empty", &shared, map[string]seedAt{std.Key: {1, -sec}, shared.Key: {0, -sec}}, 2, 2, 1},
	} {
		if _, err := e.seedKeys(ctx, keysOf(std, tc.second), tc.seeds); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		w, err := attempts(wctx, std, tc.second)
		stillRunning := wctx.Err() == nil
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", tc.name, err)
		}
		if w.attempts != tc.sent || !stillRunning || w.d.Allowed() || w.d.Denied != tc.denied || w.d.RetryAfter <= 10*time.Second ||
			!errors.Is(w.err, context.DeadlineExceeded) || errors.Is(w.err, admit.ErrOutcomeUnknown) || !errors.Is(w.err, admit.ErrNotExecuted) {
			errs = append(errs, fmt.Errorf("%s, deadline in 10s, token in 1h: %d script commands, returned before the deadline %v, got %v, %v; "+
				"want %d, returned at once, Denied %d, and an error wrapping context.DeadlineExceeded and admit.ErrNotExecuted",
				tc.name, w.attempts, stillRunning, w.d, w.err, tc.sent, tc.denied))
		}
		if tk, err := e.tokensLeft(ctx, std.Key); err != nil || tk != tc.left {
			errs = append(errs, fmt.Errorf("%s: the first bucket holds %d tokens (%v), want %d", tc.name, tk, err, tc.left))
		}
	}

	// The token is due a few ms after seeding: the first attempt is
	// refused, Wait sleeps RetryAfter (plus jitter) and the second attempt
	// is admitted. If the first attempt came after the token was due (a
	// slow machine) it is admitted at once; try again with more lead time.
	r := req(p+"soon", hourly1)
	for lead := 20 * time.Millisecond; ; lead *= 2 {
		if lead > 640*time.Millisecond {
			errs = append(errs, errors.New("token due soon: every first attempt came after the token was due; inconclusive"))
			break
		}
		if _, err := e.seedKeys(ctx, []string{r.Key}, map[string]seedAt{r.Key: {0, -hour + lead.Microseconds()}}); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		w, err := attempts(wctx, r, nil)
		cancel()
		if err != nil {
			return fmt.Errorf("token due soon: %w", err)
		}
		if w.err == nil && w.d.Allowed() && w.attempts == 1 {
			continue
		}
		if w.err != nil || !w.d.Allowed() || w.attempts != 2 || w.d.Remaining != [2]int{0, -1} {
			errs = append(errs, fmt.Errorf("token due %v after seeding: %d attempts, got %v, %v, Remaining %v; want admitted, Remaining [0 -1], by the second attempt",
				lead, w.attempts, w.d, w.err, w.d.Remaining))
		}
		break
	}
	return errors.Join(errs...)
}
