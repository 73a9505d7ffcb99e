package admittest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
)

var (
	hourly3    = admit.MustSpec(admit.Every(time.Hour), 3)
	hourly1000 = admit.MustSpec(admit.Every(time.Hour), 1000) // a bucket that never runs out in a check
	halfHourly = admit.MustSpec(admit.Every(30*time.Minute), 1000)
)

const hour = 3600 * sec

// checkTransitions walks the three rows of the design table once, on the
// server's own clock.
func checkTransitions(ctx context.Context, e *env) error {
	p := e.prefix("transitions")
	std, shared := req(p+"std", admit.MustSpec(admit.Every(time.Hour), 2)), req(p+"shared", hourly3)
	step := func(name string, first admit.Request, second *admit.Request, want uint8) error {
		d, err := e.l.AllowOrdered(ctx, first, second)
		if err != nil || d.Denied != want || (want == 0) != (d.RetryAfter == 0) || d.RetryAfter > time.Hour {
			return fmt.Errorf("%s: got %v, %v; want Denied %d with 0 < RetryAfter <= 1h on a denial", name, d, err, want)
		}
		return nil
	}
	tokens := func(key string) string {
		b, err := e.readBucket(ctx, key)
		if err != nil {
			return err.Error()
		}
		return b.fields["tokens"]
	}
	if err := step("allow/allow", std, &shared, 0); err != nil {
		return err
	}
	if got := tokens(std.Key) + "," + tokens(shared.Key); got != "1,2" {
		return fmt.Errorf("allow/allow: tokens std,shared = %s, want 1,2", got)
	}
	for range 2 {
		if err := step("premium", shared, nil, 0); err != nil {
			return err
		}
	}
	if err := step("allow/deny", std, &shared, 2); err != nil {
		return err
	}
	if got := tokens(std.Key); got != "0" {
		return fmt.Errorf("allow/deny: std tokens = %s, want 0 (consumed)", got)
	}
	before, err := e.snap(ctx, shared.Key)
	if err != nil {
		return err
	}
	if err := step("deny/any", std, &shared, 1); err != nil {
		return err
	}
	if after, err := e.snap(ctx, shared.Key); err != nil || after != before {
		return fmt.Errorf("deny/any: second bucket changed: before %v, after %v (%v)", before, after, err)
	}
	return nil
}

// bucketCases are stored states of a bucket (burst 3, one token an hour),
// as tokens and ts relative to the server clock.
var bucketCases = []struct {
	name string
	seed *seedAt // nil: absent
}{
	{"fresh (absent)", nil},
	{"partially full", &seedAt{2, -sec}},
	{"last token", &seedAt{1, -sec}},
	{"empty", &seedAt{0, -sec}},
	{"empty, 30 s short of a token", &seedAt{0, -hour + 30*sec}},
	{"just refilled", &seedAt{0, -hour - sec}},
	{"two tokens earned, remainder kept", &seedAt{0, -2*hour - 5*sec}},
	{"full again after idling", &seedAt{0, -10 * hour}},
	{"above burst (burst lowered since)", &seedAt{9, -sec}},
	{"above burst, server clock behind ts", &seedAt{9, 30 * sec}},
	{"server clock behind ts", &seedAt{1, 30 * sec}},
	{"empty, server clock behind ts", &seedAt{0, 30 * sec}},
}

// checkBucketStates: fresh, partially full, empty and just-refilled
// buckets (and the edges around them) decide and store exactly what the
// model says, as the only bucket, the first of two and the second of two.
func checkBucketStates(ctx context.Context, e *env) error {
	var errs []error
	for _, bc := range bucketCases {
		for _, path := range []string{"one bucket", "first of two", "second of two"} {
			p := e.prefix("bucket-states")
			// other has another interval, so a RetryAfter computed from
			// the wrong bucket shows.
			b, other := req(p+"bucket", hourly3), req(p+"other", halfHourly)
			seeds := map[string]seedAt{}
			if bc.seed != nil {
				seeds[b.Key] = *bc.seed
			}
			first, second := b, (*admit.Request)(nil)
			switch path {
			case "first of two":
				second = &other
			case "second of two":
				first, second = other, &b
			}
			if _, err := e.decideAndCompare(ctx, e.l, first, second, seeds); err != nil {
				errs = append(errs, fmt.Errorf("%s, %s: %w", bc.name, path, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkFirstDenial: when the first bucket denies, the second key is left
// byte for byte as it was (DUMP and PEXPIRETIME), whether it exists or not.
// decideAndCompare compares every key the model does not write. The first
// keeps its fields, and its expiry, unless that is shorter than the time to
// full (as after a Spec was made slower), which the denial lengthens to
// that time.
func checkFirstDenial(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name        string
		second      *seedAt
		shortExpiry bool // the first bucket expires in 1 s
	}{
		{"second partially full", &seedAt{1, -5 * sec}, false},
		{"second empty", &seedAt{0, -sec}, false},
		{"second full", &seedAt{3, -hour}, false},
		{"second absent", nil, false},
		{"first expiring before its time to full", &seedAt{1, -5 * sec}, true},
	} {
		p := e.prefix("first-denial")
		first, second := req(p+"std", hourly3), req(p+"shared", hourly3)
		seeds := map[string]seedAt{first.Key: {0, -sec}}
		if tc.second != nil {
			seeds[second.Key] = *tc.second
		}
		short := ""
		if tc.shortExpiry {
			short = first.Key
		}
		d, err := e.decideExpiring(ctx, first, &second, seeds, short)
		if err == nil && d.Denied != 1 {
			err = fmt.Errorf("decision %v, want denied by bucket 1", d)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// checkSecondDenial: when the second bucket denies, the first bucket's
// token is consumed, and the second keeps its fields, and its expiry unless
// that is shorter than the time to full, which the denial lengthens to that
// time; nothing else (decideAndCompare checks every field and expiry).
func checkSecondDenial(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name          string
		first, second *seedAt
		shortExpiry   bool // the second bucket expires in 1 s
	}{
		{"first partially full", &seedAt{2, -sec}, &seedAt{0, -sec}, false},
		{"first fresh", nil, &seedAt{0, -30 * sec}, false},
		{"first just refilled", &seedAt{0, -hour - sec}, &seedAt{0, -sec}, false},
		{"second expiring before its time to full", &seedAt{2, -sec}, &seedAt{0, -30 * sec}, true},
	} {
		p := e.prefix("second-denial")
		first, second := req(p+"std", hourly3), req(p+"shared", hourly3)
		seeds := map[string]seedAt{second.Key: *tc.second}
		if tc.first != nil {
			seeds[first.Key] = *tc.first
		}
		short := ""
		if tc.shortExpiry {
			short = second.Key
		}
		d, err := e.decideExpiring(ctx, first, &second, seeds, short)
		if err == nil && d.Denied != 2 {
			err = fmt.Errorf("decision %v, want denied by bucket 2", d)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// decideExpiring is decideAndCompare with e.l, but the bucket at key short
// (none if "") expires in one second, before its time to full.
func (e *env) decideExpiring(ctx context.Context, first admit.Request, second *admit.Request, seeds map[string]seedAt, short string) (admit.Decision, error) {
	states, err := e.seedKeys(ctx, keysOf(first, second), seeds)
	if err != nil {
		return admit.Decision{}, err
	}
	if short != "" {
		if err := e.admin.Do(ctx, e.admin.B().Pexpire().Key(short).Milliseconds(1000).Build()).Error(); err != nil {
			return admit.Decision{}, fmt.Errorf("PEXPIRE %s: %w", e.short(short), err)
		}
	}
	return e.compareDecision(ctx, e.l, first, second, states)
}

// checkAllOrNothing: AllowAll walks the design table's rows with one
// change: when the second bucket denies, the first is not charged either,
// and both keep their fields (a denial's expiry rule applies to each). A
// first-bucket denial and an admission are AllowOrdered's rows, and a
// one-bucket call is AllowOrdered's. decideAndCompare checks every field
// and expiry against the model's all-or-nothing decision.
func checkAllOrNothing(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name          string
		first, second *seedAt
		second2       bool // a two-bucket call
		want          uint8
		shortExpiry   int // 1 or 2: that bucket expires in 1 s
	}{
		{"second denies, first partially full", &seedAt{2, -sec}, &seedAt{0, -sec}, true, 2, 0},
		{"second denies, first fresh", nil, &seedAt{0, -30 * sec}, true, 2, 0},
		{"second denies, first on its last token", &seedAt{1, -sec}, &seedAt{0, -sec}, true, 2, 0},
		{"second denies, first expiring before its time to full", &seedAt{1, -5 * sec}, &seedAt{0, -sec}, true, 2, 1},
		{"second denies, second expiring before its time to full", &seedAt{2, -sec}, &seedAt{0, -30 * sec}, true, 2, 2},
		{"second denies, first's clock behind ts", &seedAt{1, 30 * sec}, &seedAt{0, -sec}, true, 2, 0},
		{"first denies", &seedAt{0, -sec}, &seedAt{2, -sec}, true, 1, 0},
		{"both allow", &seedAt{2, -sec}, &seedAt{1, -sec}, true, 0, 0},
		{"one bucket allows", &seedAt{2, -sec}, nil, false, 0, 0},
		{"one bucket denies", &seedAt{0, -sec}, nil, false, 1, 0},
	} {
		p := e.prefix("all-or-nothing")
		first, second := req(p+"std", hourly3), req(p+"shared", halfHourly)
		second.Spec = admit.MustSpec(admit.Every(30*time.Minute), 3)
		seeds := map[string]seedAt{}
		if tc.first != nil {
			seeds[first.Key] = *tc.first
		}
		sp := (*admit.Request)(nil)
		if tc.second2 {
			sp = &second
			if tc.second != nil {
				seeds[second.Key] = *tc.second
			}
		}
		states, err := e.seedKeys(ctx, keysOf(first, sp), seeds)
		if err == nil && tc.shortExpiry > 0 {
			short := []string{first.Key, second.Key}[tc.shortExpiry-1]
			err = e.admin.Do(ctx, e.admin.B().Pexpire().Key(short).Milliseconds(1000).Build()).Error()
		}
		var d admit.Decision
		if err == nil {
			d, err = e.compareCall(ctx, e.l, true, first, sp, states)
		}
		if err == nil && (d.Denied != tc.want || d.Allowed() != (tc.want == 0)) {
			err = fmt.Errorf("decision %v, want Denied %d", d, tc.want)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// checkBothAllow: when both buckets allow, each loses exactly one token.
func checkBothAllow(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name          string
		first, second *seedAt
	}{
		{"both partially full", &seedAt{2, -sec}, &seedAt{2, -sec}},
		{"both fresh", nil, nil},
		{"both on their last token", &seedAt{1, -sec}, &seedAt{1, -sec}},
	} {
		p := e.prefix("both-allow")
		first, second := req(p+"std", hourly3), req(p+"shared", admit.MustSpec(admit.Every(time.Hour), 5))
		seeds := map[string]seedAt{}
		if tc.first != nil {
			seeds[first.Key], seeds[second.Key] = *tc.first, *tc.second
		}
		d, err := e.decideAndCompare(ctx, e.l, first, &second, seeds)
		if err == nil && !d.Allowed() {
			err = fmt.Errorf("decision %v, want allowed", d)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
		}
	}
	return errors.Join(errs...)
}

// checkSharedState: single-bucket and two-bucket calls on the same key,
// in either position, share one state: interleaved, their admissions obey
// one budget, decision by decision as the model says.
func checkSharedState(ctx context.Context, e *env) error {
	p := e.prefix("shared-state")
	a, b, c := req(p+"a", admit.MustSpec(admit.Every(time.Hour), 10)), req(p+"b", admit.MustSpec(admit.Every(time.Hour), 6)), req(p+"c", hourly1000)
	now, err := e.serverTime(ctx, p)
	if err != nil {
		return err
	}
	calls := []struct {
		first  admit.Request
		second *admit.Request
	}{{a, nil}, {a, &b}, {c, &a}, {b, &a}, {a, &c}, {b, nil}}
	states := map[string]model.State{}
	admitted := 0
	for i := range 30 {
		call := calls[i%len(calls)]
		d, err := e.l.AllowOrdered(ctx, call.first, call.second)
		if err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		// One-token-an-hour buckets: the model's clock need not move.
		want, writes := model.Decide(now, states, call.first, call.second)
		for k, w := range writes {
			states[k] = model.State{Tokens: w.Tokens, TS: w.TS}
		}
		if d.Denied != want.Denied {
			return fmt.Errorf("call %d (%s): %v, want %v", i, callName(e, call.first, call.second), d, want)
		}
		if d.Allowed() && (call.first.Key == a.Key || call.second != nil && call.second.Key == a.Key) {
			admitted++
		}
	}
	if admitted != 10 {
		return fmt.Errorf("admissions through a: %d, want its burst of 10", admitted)
	}
	for _, r := range []admit.Request{a, b, c} {
		if tk, err := e.tokensLeft(ctx, r.Key); err != nil || tk != states[r.Key].Tokens {
			return fmt.Errorf("%s: tokens %d (%v), want %d", e.short(r.Key), tk, err, states[r.Key].Tokens)
		}
	}
	return nil
}

func callName(e *env, first admit.Request, second *admit.Request) string {
	s := e.short(first.Key)
	if second != nil {
		s += " then " + e.short(second.Key)
	}
	return s
}

// checkKeySchema pins the stored fields on the real server: exactly tokens
// and ts, decimal integers, ts in server µs, and an expiry of burst ×
// interval (admit's unit tests pin the same on miniredis).
func checkKeySchema(ctx context.Context, e *env) error {
	p := e.prefix("key-schema")
	r := req(p+"schema", hourly3)
	if _, err := e.decideAndCompare(ctx, e.l, r, nil, nil); err != nil {
		return err
	}
	if _, err := e.decideAndCompare(ctx, e.l, r, nil, map[string]seedAt{r.Key: {2, -sec}}); err != nil {
		return err
	}
	if tk, err := e.tokensLeft(ctx, r.Key); err != nil || tk != 1 {
		return fmt.Errorf("tokens %d (%v), want tokens=1 and ts", tk, err)
	}
	return nil
}
