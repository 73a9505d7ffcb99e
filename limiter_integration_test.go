package admit

// The conformance suite: every invariant of the design, checked on a real
// server (standalone or cluster). Run it against your own deployment with
//
//	VALKEY_ADDR=host:port go test github.com/admitkit/admit -run Conformance -v
//
// (see internal/testserver for the other ways to name a server). Each check
// is a named rule that returns an error instead of failing, so TestMutants
// can run the same checks against deliberately broken scripts.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestConformance runs every check against the deployment that
// testserver.Deployment selects, each as a subtest named after its rule.
func TestConformance(t *testing.T) {
	d := openDeployment(t)
	mode := "the suite's alone: SCRIPT FLUSH and exact server command counts included"
	if !d.target.Destructive() {
		mode = "not started by the suite: no SCRIPT FLUSH (a never-loaded script stands in) and no server command counts " +
			"(the proxy counts what is sent); VALKEY_ALLOW_DESTRUCTIVE=1 if the server is the suite's alone"
	}
	t.Logf("target: %s; %s", d.target.Name, mode)
	e := newEnv(d, scriptSource, nil)
	start := time.Now()
	for _, c := range checks() {
		t.Run(c.rule, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
			defer cancel()
			err := c.run(ctx, e)
			if reason, ok := isSkip(err); ok {
				t.Skip(reason)
			}
			if err != nil {
				t.Errorf("rule %s broken on %s:\n%v", c.rule, d.target.Name, err)
			}
		})
	}
	t.Logf("conformance wall time on %s: %v", d.target.Name, time.Since(start).Round(time.Millisecond))
}

// checks returns the conformance rules, in the order they run.
func checks() []check {
	return []check{
		{"transitions", checkTransitions},
		{"bucket-states", checkBucketStates},
		{"first-denial-leaves-second-untouched", checkFirstDenial},
		{"second-denial-charges-first", checkSecondDenial},
		{"both-allow-consume-once", checkBothAllow},
		{"concurrency-exact-count", checkConcurrency},
		{"premium-reservation", checkPremiumReservation},
		{"host-clock-plays-no-part", checkHostClock},
		{"wrong-type-writes-nothing", checkWrongType},
		{"corrupt-state-writes-nothing", checkCorruptState},
		{"only-declared-keys", checkDeclaredKeys},
		{"one-evalsha-per-decision", checkOneEvalsha},
		{"script-flush-falls-back-once", checkScriptFlush},
		{"lost-reply-is-outcome-unknown", checkLostReply},
		{"cancel-in-flight-is-outcome-unknown", checkCancelInFlight},
		{"refused-connection-is-not-executed", checkRefused},
		{"one-state-for-both-paths", checkSharedState},
		{"key-schema", checkKeySchema},
		{"keyslot-matches-server", checkKeySlot},
		{"cluster-hash-tag", checkClusterHashTag},
		{"cluster-cross-slot-refused", checkClusterCrossSlot},
		{"cluster-shards-independent", checkClusterShards},
		{"differential-model", checkDifferential},
	}
}

var (
	hourly3    = MustSpec(Every(time.Hour), 3)
	hourly1000 = MustSpec(Every(time.Hour), 1000) // a bucket that never runs out in a check
	halfHourly = MustSpec(Every(30*time.Minute), 1000)
)

const hour = 3600 * sec

// checkTransitions walks the three rows of the design table once, on the
// server's own clock.
func checkTransitions(ctx context.Context, e *env) error {
	p := e.prefix("transitions")
	std, shared := Request{Key: p + "std", Spec: MustSpec(Every(time.Hour), 2)}, Request{Key: p + "shared", Spec: hourly3}
	step := func(name string, first Request, second *Request, want uint8) error {
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
			b, other := Request{Key: p + "bucket", Spec: hourly3}, Request{Key: p + "other", Spec: halfHourly}
			seeds := map[string]seedAt{}
			if bc.seed != nil {
				seeds[b.Key] = *bc.seed
			}
			first, second := b, (*Request)(nil)
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
// decideAndCompare compares every key the model does not write.
func checkFirstDenial(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name   string
		second *seedAt
	}{
		{"second partially full", &seedAt{1, -5 * sec}},
		{"second empty", &seedAt{0, -sec}},
		{"second full", &seedAt{3, -hour}},
		{"second absent", nil},
	} {
		p := e.prefix("first-denial")
		first, second := Request{Key: p + "std", Spec: hourly3}, Request{Key: p + "shared", Spec: hourly3}
		seeds := map[string]seedAt{first.Key: {0, -sec}}
		if tc.second != nil {
			seeds[second.Key] = *tc.second
		}
		d, err := e.decideAndCompare(ctx, e.l, first, &second, seeds)
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
// token is consumed and the second's refill state is refreshed, nothing
// else (decideAndCompare checks every field and expiry).
func checkSecondDenial(ctx context.Context, e *env) error {
	var errs []error
	for _, tc := range []struct {
		name          string
		first, second *seedAt
	}{
		{"first partially full", &seedAt{2, -sec}, &seedAt{0, -sec}},
		{"first fresh", nil, &seedAt{0, -30 * sec}},
		{"first just refilled", &seedAt{0, -hour - sec}, &seedAt{0, -sec}},
	} {
		p := e.prefix("second-denial")
		first, second := Request{Key: p + "std", Spec: hourly3}, Request{Key: p + "shared", Spec: hourly3}
		seeds := map[string]seedAt{second.Key: *tc.second}
		if tc.first != nil {
			seeds[first.Key] = *tc.first
		}
		d, err := e.decideAndCompare(ctx, e.l, first, &second, seeds)
		if err == nil && d.Denied != 2 {
			err = fmt.Errorf("decision %v, want denied by bucket 2", d)
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
		first, second := Request{Key: p + "std", Spec: hourly3}, Request{Key: p + "shared", Spec: MustSpec(Every(time.Hour), 5)}
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

// concurrent load: every check that races uses this many calls.
const goroutines, callsEach = 64, 50

// checkConcurrency: 64 goroutines × 50 calls admit exactly what burst and
// refill allow over the server-measured window, on both paths. Buckets are
// seeded half an interval past a refill boundary, with an interval of 20 s,
// so the count is exact as long as the window is under 10 s; the model is
// evaluated at the server's TIME before and after, and both must agree.
func checkConcurrency(ctx context.Context, e *env) error {
	const n = goroutines * callsEach
	every20s := func(burst int) Spec { return MustSpec(Every(20*time.Second), burst) }
	I := 20 * sec
	type bucket struct {
		r    Request
		seed seedAt
	}
	// race seeds the buckets, runs the calls, and returns the decision
	// counts, the tokens each bucket has by the model, and the window.
	race := func(name string, bs []bucket, call func(g int) (Decision, error)) (counts [3]int, avail []int64, err error) {
		t0, err := e.serverTime(ctx, bs[0].r.Key)
		if err != nil {
			return counts, nil, err
		}
		for _, b := range bs {
			if err := e.seed(ctx, b.r.Key, mstate{b.seed.tokens, t0 + b.seed.tsOffset}, t0); err != nil {
				return counts, nil, err
			}
		}
		before, err := e.serverTime(ctx, bs[0].r.Key)
		if err != nil {
			return counts, nil, err
		}
		counts, err = runConcurrently(ctx, goroutines, callsEach, call)
		if err != nil {
			return counts, nil, fmt.Errorf("%s: %w", name, err)
		}
		after, err := e.serverTime(ctx, bs[0].r.Key)
		if err != nil {
			return counts, nil, err
		}
		for _, b := range bs {
			st := mstate{b.seed.tokens, t0 + b.seed.tsOffset}
			lo, _ := modelRefill(before, b.r.Spec, st, true)
			hi, _ := modelRefill(after, b.r.Spec, st, true)
			if lo != hi {
				return counts, nil, fmt.Errorf("%s: inconclusive, the server window of %dµs crossed a refill", name, after-before)
			}
			avail = append(avail, lo)
		}
		return counts, avail, nil
	}
	// left checks a bucket's final tokens and that its ts moved by whole
	// intervals only.
	left := func(name string, b bucket, want int64) error {
		obs, err := e.readBucket(ctx, b.r.Key)
		if err != nil {
			return err
		}
		tk, _, err := obs.parse()
		if err != nil || tk != want {
			return fmt.Errorf("%s: %s has tokens %d (%v), want %d", name, strings.TrimPrefix(b.r.Key, e.base), tk, err, want)
		}
		return nil
	}
	var errs []error

	// One bucket: 20 tokens stored, 2 earned since.
	p := e.prefix("concurrency")
	one := bucket{Request{Key: p + "one", Spec: every20s(60)}, seedAt{20, -2*I - I/2}}
	counts, avail, err := race("one bucket", []bucket{one}, func(int) (Decision, error) { return e.l.AllowOrdered(ctx, one.r, nil) })
	if err != nil {
		return err
	}
	if want := [3]int{int(avail[0]), n - int(avail[0]), 0}; counts != want {
		errs = append(errs, fmt.Errorf("one bucket: admitted/denied1/denied2 = %v, want %v (burst and refill allow %d)", counts, want, avail[0]))
	}
	errs = append(errs, left("one bucket", one, 0))

	// Two buckets, the standard bucket runs out first: its denials leave
	// the shared bucket alone, so premium can still take exactly the rest.
	p = e.prefix("concurrency")
	std := bucket{Request{Key: p + "std", Spec: every20s(40)}, seedAt{8, -3*I - I/2}}
	shared := bucket{Request{Key: p + "shared", Spec: every20s(100)}, seedAt{25, -I - I/2}}
	counts, avail, err = race("standard-limited", []bucket{std, shared}, func(int) (Decision, error) {
		return e.l.AllowOrdered(ctx, std.r, &shared.r)
	})
	if err != nil {
		return err
	}
	a, h := int(avail[0]), int(avail[1]) // 11 and 26
	if want := [3]int{a, n - a, 0}; counts != want {
		errs = append(errs, fmt.Errorf("standard-limited: admitted/denied1/denied2 = %v, want %v", counts, want))
	}
	errs = append(errs, left("standard-limited", std, 0), left("standard-limited", shared, int64(h-a)))
	prem, err := runConcurrently(ctx, goroutines, callsEach, func(int) (Decision, error) { return e.l.AllowOrdered(ctx, shared.r, nil) })
	if err != nil {
		return err
	}
	if prem[0] != h-a {
		errs = append(errs, fmt.Errorf("standard-limited: premium then took %d, want exactly the %d shared tokens standard traffic left", prem[0], h-a))
	}

	// Two buckets, the shared bucket runs out first: every second-bucket
	// denial still charges the standard bucket.
	p = e.prefix("concurrency")
	std = bucket{Request{Key: p + "std", Spec: every20s(40)}, seedAt{30, -I / 2}}
	shared = bucket{Request{Key: p + "shared", Spec: every20s(100)}, seedAt{6, -2*I - I/2}}
	counts, avail, err = race("shared-limited", []bucket{std, shared}, func(int) (Decision, error) {
		return e.l.AllowOrdered(ctx, std.r, &shared.r)
	})
	if err != nil {
		return err
	}
	a, h = int(avail[0]), int(avail[1]) // 30 and 8
	if want := [3]int{h, n - a, a - h}; counts != want {
		errs = append(errs, fmt.Errorf("shared-limited: admitted/denied1/denied2 = %v, want %v", counts, want))
	}
	errs = append(errs, left("shared-limited", std, 0), left("shared-limited", shared, 0))
	return errors.Join(errs...)
}

// checkPremiumReservation: standard and premium traffic race on one shared
// bucket; premium admissions never fall below shared capacity minus
// standard capacity, and every shared token is accounted for.
func checkPremiumReservation(ctx context.Context, e *env) error {
	p := e.prefix("premium")
	std, shared := Request{Key: p + "std", Spec: MustSpec(Every(time.Hour), 30)}, Request{Key: p + "shared", Spec: MustSpec(Every(time.Hour), 100)}
	before, err := e.serverTime(ctx, p)
	if err != nil {
		return err
	}
	for _, r := range []Request{std, shared} {
		if err := e.seed(ctx, r.Key, mstate{int64(r.Spec.Burst()), before - sec}, before); err != nil {
			return err
		}
	}
	var stdAdmitted, stdDenied2, premAdmitted atomic64
	_, err = runConcurrently(ctx, goroutines, callsEach, func(g int) (Decision, error) {
		if g%2 == 0 {
			d, err := e.l.AllowOrdered(ctx, std, &shared)
			stdAdmitted.addIf(d.Allowed())
			stdDenied2.addIf(d.Denied == 2)
			return d, err
		}
		d, err := e.l.AllowOrdered(ctx, shared, nil)
		premAdmitted.addIf(d.Allowed())
		return d, err
	})
	if err != nil {
		return err
	}
	s, d2, pa := stdAdmitted.get(), stdDenied2.get(), premAdmitted.get()
	var errs []error
	if pa < 100-30 {
		errs = append(errs, fmt.Errorf("premium admitted %d, below the reserved 100 - 30 = 70", pa))
	}
	if s+pa != 100 {
		errs = append(errs, fmt.Errorf("standard %d + premium %d admissions = %d, want the 100 shared tokens", s, pa, s+pa))
	}
	obs, err := e.readBucket(ctx, std.Key)
	if err != nil {
		return err
	}
	if tk, _, err := obs.parse(); err != nil || tk != int64(30-s-d2) {
		errs = append(errs, fmt.Errorf("std tokens %d (%v), want 30 - %d admitted - %d denied by shared = %d", tk, err, s, d2, 30-s-d2))
	}
	return errors.Join(errs...)
}

// checkHostClock: the command carries no time (the exact arguments on the
// wire), and on a server whose clock is decades from the host's, refill
// follows the server clock to the microsecond.
func checkHostClock(ctx context.Context, e *env) error {
	p := e.prefix("host-clock")
	proxy, c, l, err := e.viaProxy(p, e.src)
	if err != nil {
		return err
	}
	defer proxy.close()
	defer c.Close()
	first, second := Request{Key: p + "std", Spec: MustSpec(Every(1500*time.Millisecond), 20)}, Request{Key: p + "shared", Spec: MustSpec(Every(300*time.Millisecond), 100)}
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil {
		return err
	}
	if _, err := l.AllowOrdered(ctx, first, nil); err != nil {
		return err
	}
	sum := sha1.Sum([]byte(e.src))
	wantArgs := map[string][]string{
		"2": {"2", first.Key, second.Key, "t", "1500000", "20", "30000", "1", "300000", "100", "30000", "1"},
		"1": {"1", first.Key, "t", "1500000", "20", "30000", "1"},
	}
	seen := map[string]bool{}
	for _, cmd := range proxy.commands() {
		if !isScriptCommand(cmd) || len(cmd) < 3 {
			continue
		}
		name := strings.ToUpper(cmd[0])
		if name == "EVALSHA" && cmd[1] != hex.EncodeToString(sum[:]) || name == "EVAL" && cmd[1] != e.src {
			return fmt.Errorf("%s does not name the script under test", name)
		}
		if !slices.Equal(cmd[2:], wantArgs[cmd[2]]) {
			return fmt.Errorf("%s sent arguments %q, want exactly %q (keys and Spec arguments, no time)", name, cmd[2:], wantArgs[cmd[2]])
		}
		seen[cmd[2]] = true
	}
	if !seen["1"] || !seen["2"] {
		return fmt.Errorf("script commands seen on the wire: %v, want both paths", proxy.scripts())
	}

	u, stop, err := e.mini()
	if err != nil {
		return err
	}
	defer stop()
	for _, epoch := range []time.Time{unitEpoch, time.Date(1999, 12, 31, 23, 59, 59, 999_999_000, time.UTC)} {
		u.srv.FlushAll()
		u.now = epoch
		u.srv.SetTime(epoch)
		r := Request{Key: "clock", Spec: MustSpec(Every(time.Second), 2)}
		for i, st := range []struct {
			advance time.Duration
			want    Decision
		}{
			{0, Decision{Remaining: [2]int{1, -1}, decided: true}},
			{0, Decision{Remaining: [2]int{0, -1}, decided: true}},
			{0, Decision{Denied: 1, RetryAfter: time.Second, Remaining: [2]int{0, -1}, decided: true}},
			{999_999 * time.Microsecond, Decision{Denied: 1, RetryAfter: time.Microsecond, Remaining: [2]int{0, -1}, decided: true}},
			{time.Microsecond, Decision{Remaining: [2]int{0, -1}, decided: true}},
		} {
			u.advance(st.advance)
			d, err := u.l.AllowOrdered(ctx, r, nil)
			if err != nil || d != st.want {
				return fmt.Errorf("server clock at %v, step %d: got %v, %v; want %v", epoch, i, d, err, st.want)
			}
		}
		if tk, ts := u.state(r.Key); tk != "0" || ts != strconv.FormatInt(epoch.Add(time.Second).UnixMicro(), 10) {
			return fmt.Errorf("server clock at %v: stored tokens %q ts %q, want 0 and %d (server µs)", epoch, tk, ts, epoch.Add(time.Second).UnixMicro())
		}
	}
	return nil
}

// viaProxy returns a fault proxy in front of the node that holds prefix,
// a one-connection client through it, and a Limiter running src on it.
func (e *env) viaProxy(prefix, src string) (*faultProxy, valkey.Client, *Limiter, error) {
	_, addr, err := e.node(prefix)
	if err != nil {
		return nil, nil, nil, err
	}
	proxy, err := startFaultProxy(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := e.nodeClient(prefix, proxy.addr())
	if err != nil {
		proxy.close()
		return nil, nil, nil, err
	}
	return proxy, c, e.limiterWith(c, src), nil
}

// checkWrongType: a string or list at either key fails the call with
// ErrWrongType, not executed, and no key changes.
func checkWrongType(ctx context.Context, e *env) error {
	var errs []error
	for _, kind := range []string{"string", "list"} {
		for _, at := range []string{"first", "second", "only"} {
			for _, other := range []string{"absent", "present"} {
				if at == "only" && other == "present" {
					continue
				}
				p := e.prefix("wrong-type")
				good, bad := Request{Key: p + "good", Spec: hourly3}, Request{Key: p + "bad", Spec: hourly3}
				setup := e.c.B().Set().Key(bad.Key).Value("x").Build()
				if kind == "list" {
					setup = e.c.B().Rpush().Key(bad.Key).Element("x").Build()
				}
				err := e.refusedWithoutWrites(ctx, good, bad, at, other == "present", setup, ErrWrongType)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s at the %s key, other key %s: %w", kind, at, other, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// refusedWithoutWrites puts setup at bad, calls with bad at position at
// ("first", "second" or "only"), and wants reason, ErrNotExecuted, and
// both keys byte for byte unchanged.
func (e *env) refusedWithoutWrites(ctx context.Context, good, bad Request, at string, goodPresent bool, setup valkey.Completed, reason error) error {
	now, err := e.serverTime(ctx, good.Key)
	if err != nil {
		return err
	}
	if err := e.c.Do(ctx, e.c.B().Del().Key(good.Key, bad.Key).Build()).Error(); err != nil {
		return err
	}
	if goodPresent {
		if err := e.seed(ctx, good.Key, mstate{2, now - sec}, now); err != nil {
			return err
		}
	}
	if err := e.c.Do(ctx, setup).Error(); err != nil {
		return err
	}
	before := [2]snapshot{}
	for i, k := range []string{good.Key, bad.Key} {
		if before[i], err = e.snap(ctx, k); err != nil {
			return err
		}
	}
	var d Decision
	switch at {
	case "first":
		d, err = e.l.AllowOrdered(ctx, bad, &good)
	case "second":
		d, err = e.l.AllowOrdered(ctx, good, &bad)
	default:
		d, err = e.l.AllowOrdered(ctx, bad, nil)
	}
	var errs []error
	if !errors.Is(err, reason) || !errors.Is(err, ErrNotExecuted) || errors.Is(err, ErrOutcomeUnknown) || d != (Decision{}) {
		errs = append(errs, fmt.Errorf("got %v, %v; want %v and ErrNotExecuted", d, err, reason))
	}
	for i, k := range []string{good.Key, bad.Key} {
		after, err := e.snap(ctx, k)
		if err != nil {
			return err
		}
		if after != before[i] {
			errs = append(errs, fmt.Errorf("%s changed: before %v, after %v", strings.TrimPrefix(k, e.base), before[i], after))
		}
	}
	return errors.Join(errs...)
}

// checkCorruptState: a bucket hash whose fields are not the schema's
// decimal integers fails the call with ErrCorruptState and no key changes.
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
			good, bad := Request{Key: p + "good", Spec: hourly3}, Request{Key: p + "bad", Spec: hourly3}
			b := e.c.B().Hset().Key(bad.Key).FieldValue()
			for i := 0; i < len(tc.fields); i += 2 {
				b = b.FieldValue(tc.fields[i], tc.fields[i+1])
			}
			if err := e.refusedWithoutWrites(ctx, good, bad, at, true, b.Build(), ErrCorruptState); err != nil {
				errs = append(errs, fmt.Errorf("%s, at the %s key: %w", tc.name, at, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkDeclaredKeys: the script writes only the keys it is given, on the
// real server (SCAN of the check's prefix) and on a fresh miniredis (every
// key in the database).
func checkDeclaredKeys(ctx context.Context, e *env) error {
	sequence := func(l *Limiter, p string) (map[string]bool, error) {
		a, b, c := Request{Key: p + "a", Spec: MustSpec(Every(time.Hour), 2)}, Request{Key: p + "b", Spec: MustSpec(Every(time.Hour), 1)}, Request{Key: p + "c", Spec: hourly3}
		for _, call := range []struct {
			first  Request
			second *Request
		}{{a, &b}, {a, &b}, {a, &b}, {c, nil}, {b, nil}, {c, &a}} { // allow, deny 2, deny 1, allow, deny 1, deny 2
			if _, err := l.AllowOrdered(ctx, call.first, call.second); err != nil {
				return nil, err
			}
		}
		return map[string]bool{a.Key: true, b.Key: true, c.Key: true}, nil
	}
	p := e.prefix("declared-keys")
	declared, err := sequence(e.l, p)
	if err != nil {
		return err
	}
	n, _, err := e.node(p)
	if err != nil {
		return err
	}
	var cursor uint64
	for i := 0; ; i++ {
		if i == 100_000 {
			return errors.New("SCAN did not finish in 100000 steps")
		}
		se, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match(p+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			return err
		}
		for _, k := range se.Elements {
			if !declared[k] {
				return fmt.Errorf("the script wrote %q, a key it was not given", strings.TrimPrefix(k, e.base))
			}
		}
		if cursor = se.Cursor; cursor == 0 {
			break
		}
	}
	u, stop, err := e.mini()
	if err != nil {
		return err
	}
	defer stop()
	if declared, err = sequence(u.l, "m:{x}:"); err != nil {
		return err
	}
	for _, k := range u.srv.Keys() {
		if !declared[k] {
			return fmt.Errorf("on miniredis the script wrote %q, a key it was not given", k)
		}
	}
	return nil
}

// checkOneEvalsha: in steady state each decision is exactly one EVALSHA
// on the wire (counted by a proxy) and on the server (INFO commandstats,
// where the server is the suite's alone), on both paths.
func checkOneEvalsha(ctx context.Context, e *env) error {
	p := e.prefix("one-evalsha")
	proxy, c, l, err := e.viaProxy(p, e.src)
	if err != nil {
		return err
	}
	defer proxy.close()
	defer c.Close()
	spec := MustSpec(1000, 1000)
	first, second := Request{Key: p + "a", Spec: spec}, Request{Key: p + "b", Spec: spec}
	if _, err := l.AllowOrdered(ctx, first, &second); err != nil { // loads the script if needed
		return err
	}
	const calls = 50
	for _, path := range []struct {
		name   string
		second *Request
	}{{"two buckets", &second}, {"one bucket", nil}} {
		n0 := len(proxy.commands())
		s0, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		for range calls {
			if _, err := l.AllowOrdered(ctx, first, path.second); err != nil {
				return err
			}
		}
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		sent := proxy.since(n0)
		var names []string
		for _, cmd := range sent {
			if len(cmd) > 0 && !strings.EqualFold(cmd[0], "EVALSHA") {
				names = append(names, cmd[0])
			}
		}
		if len(sent) != calls || len(names) > 0 {
			return fmt.Errorf("%s: %d decisions sent %d commands (other than EVALSHA: %v), want %d EVALSHA", path.name, calls, len(sent), names, calls)
		}
		if e.quiet() {
			if n := s1["evalsha"].Calls - s0["evalsha"].Calls; n != calls {
				return fmt.Errorf("%s: server counted %d EVALSHA for %d decisions", path.name, n, calls)
			}
			for _, cmd := range []string{"eval", "script|load", "script"} {
				if n := s1[cmd].Calls - s0[cmd].Calls; n != 0 {
					return fmt.Errorf("%s: server counted %d %s, want 0", path.name, n, cmd)
				}
			}
		}
	}
	return nil
}

// checkScriptFlush: after SCRIPT FLUSH the next call still decides
// correctly through exactly one failed EVALSHA and one EVAL, and the call
// after is one EVALSHA again. On a server the suite did not start it uses
// a script the server has never seen instead of flushing the cache.
func checkScriptFlush(ctx context.Context, e *env) error {
	p := e.prefix("script-flush")
	src := e.src
	if !e.target.Destructive() {
		src += "\n-- admit conformance " + p + "\n" // a new SHA: NOSCRIPT without SCRIPT FLUSH
	}
	proxy, c, l, err := e.viaProxy(p, src)
	if err != nil {
		return err
	}
	defer proxy.close()
	defer c.Close()
	r := Request{Key: p + "r", Spec: MustSpec(Every(time.Hour), 5)}
	if e.target.Destructive() {
		if _, err := l.AllowOrdered(ctx, Request{Key: p + "warm", Spec: hourly3}, nil); err != nil {
			return err
		}
		n, _, err := e.node(p)
		if err != nil {
			return err
		}
		if err := n.Do(ctx, n.B().ScriptFlush().Build()).Error(); err != nil {
			return err
		}
	}
	n0 := len(proxy.commands())
	var stats [3]map[string]int64
	var errs []error
	for i := range 3 {
		if e.quiet() {
			s, err := e.stats(ctx, p)
			if err != nil {
				return err
			}
			stats[i] = map[string]int64{"evalsha": s["evalsha"].Calls, "evalsha failed": s["evalsha"].Failed, "eval": s["eval"].Calls, "eval failed": s["eval"].Failed}
		}
		if i == 2 {
			break
		}
		if d, err := l.AllowOrdered(ctx, r, nil); err != nil || !d.Allowed() {
			errs = append(errs, fmt.Errorf("call %d: got %v, %v; want allowed", i+1, d, err))
		}
	}
	var got []string
	for _, cmd := range proxy.since(n0) {
		got = append(got, strings.ToUpper(cmd[0]))
	}
	if want := []string{"EVALSHA", "EVAL", "EVALSHA"}; !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("commands sent: %v, want %v", got, want))
	}
	if e.quiet() {
		delta := func(i int) map[string]int64 {
			m := map[string]int64{}
			for k, v := range stats[i+1] {
				m[k] = v - stats[i][k]
			}
			return m
		}
		want1 := map[string]int64{"evalsha": 1, "evalsha failed": 1, "eval": 1, "eval failed": 0}
		want2 := map[string]int64{"evalsha": 1, "evalsha failed": 0, "eval": 0, "eval failed": 0}
		if got := delta(0); fmt.Sprint(got) != fmt.Sprint(want1) {
			errs = append(errs, fmt.Errorf("server counts for the call after the flush: %v, want %v", got, want1))
		}
		if got := delta(1); fmt.Sprint(got) != fmt.Sprint(want2) {
			errs = append(errs, fmt.Errorf("server counts for the call after that: %v, want %v", got, want2))
		}
	}
	obs, err := e.readBucket(ctx, r.Key)
	if err != nil {
		return err
	}
	if tk, _, err := obs.parse(); err != nil || tk != 3 {
		errs = append(errs, fmt.Errorf("tokens %d (%v) after two decisions on a bucket of 5, want 3", tk, err))
	}
	return errors.Join(errs...)
}

// ambiguous runs one decision whose reply the proxy loses (mode) and
// checks the caller gets ErrOutcomeUnknown (with cause in the chain, if
// given) and the script ran exactly once: one EVALSHA on the wire and on
// the server, one token gone. during, if set, runs while the call is in
// flight.
func (e *env) ambiguous(ctx context.Context, rule string, callCtx context.Context, mode int32, cause error, during func(*faultProxy) error) error {
	p := e.prefix(rule)
	proxy, c, l, err := e.viaProxy(p, e.src)
	if err != nil {
		return err
	}
	defer proxy.close()
	defer c.Close()
	r := Request{Key: p + "r", Spec: MustSpec(Every(time.Hour), 5)}
	if _, err := l.AllowOrdered(ctx, Request{Key: p + "warm", Spec: hourly3}, nil); err != nil { // loads the script
		return err
	}
	n0 := len(proxy.commands())
	s0, err := e.stats(ctx, p)
	if err != nil {
		return err
	}
	proxy.mode.Store(mode)
	type result struct {
		d   Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := l.AllowOrdered(callCtx, r, nil)
		done <- result{d, err}
	}()
	if during != nil {
		if err := during(proxy); err != nil {
			return err
		}
	}
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		return errors.New("the call did not return")
	}
	proxy.dropHeld()
	c.Close() // nothing more can be sent: a retry would have happened by now
	var errs []error
	if !errors.Is(res.err, ErrOutcomeUnknown) || errors.Is(res.err, ErrNotExecuted) || res.d != (Decision{}) ||
		cause != nil && !errors.Is(res.err, cause) {
		errs = append(errs, fmt.Errorf("got %v, %v; want ErrOutcomeUnknown only (cause %v)", res.d, res.err, cause))
	}
	var sent []string
	for _, cmd := range proxy.since(n0) {
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
		if n := s1["evalsha"].Calls - s0["evalsha"].Calls + s1["eval"].Calls - s0["eval"].Calls; n != 1 {
			errs = append(errs, fmt.Errorf("server ran %d script commands, want exactly 1", n))
		}
	}
	obs, err := e.readBucket(ctx, r.Key)
	if err != nil {
		return err
	}
	if tk, _, err := obs.parse(); err != nil || tk != 4 {
		errs = append(errs, fmt.Errorf("tokens %d (%v), want 4: one token of 5 consumed, once", tk, err))
	}
	return errors.Join(errs...)
}

// checkLostReply: the connection drops after the server ran the script
// and before its reply reaches the client: ErrOutcomeUnknown, no retry.
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
// while its reply is held back: ErrOutcomeUnknown with the context's error
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
// fails with ErrNotExecuted, and no command reaches the server.
func checkRefused(ctx context.Context, e *env) error {
	p := e.prefix("refused")
	proxy, c, l, err := e.viaProxy(p, e.src)
	if err != nil {
		return err
	}
	defer proxy.close()
	defer c.Close()
	r := Request{Key: p + "r", Spec: hourly3}
	if _, err := l.AllowOrdered(ctx, Request{Key: p + "warm", Spec: hourly3}, nil); err != nil {
		return err
	}
	s0, err := e.stats(ctx, p)
	if err != nil {
		return err
	}
	proxy.down()
	// The client's one connection is now dead without its knowing: the
	// first command on it fails (with EOF, an ambiguous outcome), after
	// which valkey-go dials again. A PING, which cannot consume tokens,
	// takes that hit; it reaches nothing, as the proxy is down.
	var op *net.OpError
	for i := 0; ; i++ {
		err := c.Do(ctx, c.B().Ping().Build()).Error()
		if errors.As(err, &op) && op.Op == "dial" {
			break
		}
		if i == 5 {
			return fmt.Errorf("PING through a closed proxy: %v, want a refused dial", err)
		}
	}
	d, err := l.AllowOrdered(ctx, r, nil)
	var errs []error
	if !errors.Is(err, ErrNotExecuted) || errors.Is(err, ErrOutcomeUnknown) || !errors.As(err, &op) || d != (Decision{}) {
		errs = append(errs, fmt.Errorf("got %v, %v; want ErrNotExecuted with the dial error", d, err))
	}
	if e.quiet() {
		s1, err := e.stats(ctx, p)
		if err != nil {
			return err
		}
		if n := s1["evalsha"].Calls - s0["evalsha"].Calls + s1["eval"].Calls - s0["eval"].Calls; n != 0 {
			errs = append(errs, fmt.Errorf("server ran %d script commands, want 0", n))
		}
	}
	if s, err := e.snap(ctx, r.Key); err != nil || s.exists {
		errs = append(errs, fmt.Errorf("bucket %v (%v), want absent", s, err))
	}
	return errors.Join(errs...)
}

// checkSharedState: single-bucket and two-bucket calls on the same key,
// in either position, share one state: interleaved, their admissions obey
// one budget, decision by decision as the model says.
func checkSharedState(ctx context.Context, e *env) error {
	p := e.prefix("shared-state")
	a, b, c := Request{Key: p + "a", Spec: MustSpec(Every(time.Hour), 10)}, Request{Key: p + "b", Spec: MustSpec(Every(time.Hour), 6)}, Request{Key: p + "c", Spec: hourly1000}
	now, err := e.serverTime(ctx, p)
	if err != nil {
		return err
	}
	calls := []struct {
		first  Request
		second *Request
	}{{a, nil}, {a, &b}, {c, &a}, {b, &a}, {a, &c}, {b, nil}}
	states := map[string]mstate{}
	admitted := 0
	for i := range 30 {
		call := calls[i%len(calls)]
		d, err := e.l.AllowOrdered(ctx, call.first, call.second)
		if err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		// One-token-an-hour buckets: the model's clock need not move.
		want, writes := modelDecide(now, states, call.first, call.second)
		for k, w := range writes {
			states[k] = mstate{w.tokens, w.ts}
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
	for _, r := range []Request{a, b, c} {
		obs, err := e.readBucket(ctx, r.Key)
		if err != nil {
			return err
		}
		if tk, _, err := obs.parse(); err != nil || tk != states[r.Key].tokens {
			return fmt.Errorf("%s: tokens %d (%v), want %d", strings.TrimPrefix(r.Key, e.base), tk, err, states[r.Key].tokens)
		}
	}
	return nil
}

func callName(e *env, first Request, second *Request) string {
	s := strings.TrimPrefix(first.Key, e.base)
	if second != nil {
		s += " then " + strings.TrimPrefix(second.Key, e.base)
	}
	return s
}

// checkKeySchema pins the stored fields on the real server: exactly tokens
// and ts, decimal integers, ts in server µs, and an expiry of burst ×
// interval (TestKeySchema pins the same on miniredis).
func checkKeySchema(ctx context.Context, e *env) error {
	p := e.prefix("key-schema")
	r := Request{Key: p + "schema", Spec: hourly3}
	if _, err := e.decideAndCompare(ctx, e.l, r, nil, nil); err != nil {
		return err
	}
	if _, err := e.decideAndCompare(ctx, e.l, r, nil, map[string]seedAt{r.Key: {2, -sec}}); err != nil {
		return err
	}
	obs, err := e.readBucket(ctx, r.Key)
	if err != nil {
		return err
	}
	if tk, _, err := obs.parse(); err != nil || tk != 1 {
		return fmt.Errorf("HGETALL %v: tokens %d (%v), want tokens=1 and ts", obs.fields, tk, err)
	}
	return nil
}

// checkKeySlot: keySlot agrees with the server's CLUSTER KEYSLOT on
// thousands of keys, hash tags and odd bytes included.
func checkKeySlot(ctx context.Context, e *env) error {
	c, err := e.keyslotClient()
	if err != nil {
		return err
	}
	for _, n := range c.Nodes() { // any one node answers for every key
		c = n
		break
	}
	keys := []string{"", "{", "}", "{}", "{}x", "a{}{b}", "foo{{bar}}zap", "{user1000}.following", "x{y", "é{ü}"}
	for i := range 3000 {
		keys = append(keys, fmt.Sprintf("rl:{chan:%d}:standard", i), fmt.Sprintf("k%d\xff%d", i, i*7919))
	}
	cmds := make(valkey.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().Arbitrary("CLUSTER", "KEYSLOT").Args(k).Build()
	}
	for i, r := range c.DoMulti(ctx, cmds...) {
		want, err := r.AsInt64()
		if err != nil {
			return fmt.Errorf("CLUSTER KEYSLOT %q: %w", keys[i], err)
		}
		if got := keySlot(keys[i]); int64(got) != want {
			return fmt.Errorf("keySlot(%q) = %d, server says %d", keys[i], got, want)
		}
	}
	return nil
}

// checkClusterHashTag: on a cluster, two keys with a common hash tag are
// one slot and decide as on a single server.
func checkClusterHashTag(ctx context.Context, e *env) error {
	if !e.target.Cluster {
		return skipf("needs a cluster (VALKEY_CLUSTER=1 or VALKEY_CLUSTER_ADDR)")
	}
	if e.l.client.Mode() != valkey.ClientModeCluster {
		return errors.New("the Limiter did not detect the cluster client")
	}
	p := e.prefix("cluster-hash-tag")
	std, shared := Request{Key: p + "std", Spec: hourly3}, Request{Key: p + "shared", Spec: hourly3}
	if keySlot(std.Key) != keySlot(shared.Key) {
		return fmt.Errorf("test keys %q and %q in different slots", std.Key, shared.Key)
	}
	for _, tc := range []struct {
		name          string
		first, second *seedAt
		want          uint8
	}{{"both fresh", nil, nil, 0}, {"second empty", nil, &seedAt{0, -sec}, 2}, {"first empty", &seedAt{0, -sec}, nil, 1}} {
		seeds := map[string]seedAt{}
		if tc.first != nil {
			seeds[std.Key] = *tc.first
		}
		if tc.second != nil {
			seeds[shared.Key] = *tc.second
		}
		d, err := e.decideAndCompare(ctx, e.l, std, &shared, seeds)
		if err == nil && d.Denied != tc.want {
			err = fmt.Errorf("decision %v, want Denied %d", d, tc.want)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tc.name, err)
		}
	}
	return nil
}

// checkClusterCrossSlot: on a cluster, keys in different slots fail with
// ErrCrossSlot before anything is sent.
func checkClusterCrossSlot(ctx context.Context, e *env) error {
	if !e.target.Cluster {
		return skipf("needs a cluster (VALKEY_CLUSTER=1 or VALKEY_CLUSTER_ADDR)")
	}
	p := e.prefix("cross-slot")
	first, second := Request{Key: p + "std", Spec: hourly3}, Request{Key: e.base + "{other}:shared", Spec: hourly3}
	for i := 0; i < 100 && keySlot(second.Key) == keySlot(first.Key); i++ {
		second.Key = fmt.Sprintf("%s{other%d}:shared", e.base, i)
	}
	if keySlot(second.Key) == keySlot(first.Key) {
		return errors.New("found no key in another slot")
	}
	total := func() (int64, error) {
		var n int64
		for _, node := range e.c.Nodes() {
			s, err := testserver.ReadCommandStats(ctx, node)
			if err != nil {
				return 0, err
			}
			n += s["evalsha"].Calls + s["eval"].Calls
		}
		return n, nil
	}
	n0, err := total()
	if err != nil {
		return err
	}
	d, err := e.l.AllowOrdered(ctx, first, &second)
	if !errors.Is(err, ErrCrossSlot) || !errors.Is(err, ErrNotExecuted) || d != (Decision{}) {
		return fmt.Errorf("got %v, %v; want ErrCrossSlot and ErrNotExecuted", d, err)
	}
	for _, k := range []string{first.Key, second.Key} {
		if s, err := e.snap(ctx, k); err != nil || s.exists {
			return fmt.Errorf("%s: %v (%v), want absent", k, s, err)
		}
	}
	if n1, err := total(); err != nil || e.quiet() && n1 != n0 {
		return fmt.Errorf("script commands on the cluster: %d more (%v), want none", n1-n0, err)
	}
	return nil
}

// checkClusterShards: buckets on different primaries decide independently:
// draining one leaves the others as they were.
func checkClusterShards(ctx context.Context, e *env) error {
	if !e.target.Cluster {
		return skipf("needs a cluster (VALKEY_CLUSTER=1 or VALKEY_CLUSTER_ADDR)")
	}
	byNode := map[string]string{} // node address → a prefix whose slot it serves
	var prefixes []string
	for i := 0; i < 10_000 && len(byNode) < len(e.c.Nodes()); i++ {
		p := e.prefix("shards")
		_, addr, err := e.node(p)
		if err != nil {
			return err
		}
		if _, ok := byNode[addr]; !ok {
			byNode[addr] = p
			prefixes = append(prefixes, p)
		}
	}
	if len(prefixes) < 3 {
		return fmt.Errorf("found buckets on %d primaries, want at least 3", len(prefixes))
	}
	spec := MustSpec(Every(time.Hour), 2)
	drained := Request{Key: prefixes[0] + "b", Spec: spec}
	for i, want := range []uint8{0, 0, 1} {
		if d, err := e.l.AllowOrdered(ctx, drained, nil); err != nil || d.Denied != want {
			return fmt.Errorf("draining the bucket on the first primary, call %d: %v, %v; want Denied %d", i, d, err, want)
		}
	}
	for _, p := range prefixes[1:] {
		std, shared := Request{Key: p + "std", Spec: spec}, Request{Key: p + "shared", Spec: spec}
		if _, err := e.decideAndCompare(ctx, e.l, std, &shared, nil); err != nil {
			return fmt.Errorf("bucket pair on another primary: %w", err)
		}
		n, addr, err := e.node(p)
		if err != nil {
			return err
		}
		if got, err := n.Do(ctx, n.B().Exists().Key(std.Key, shared.Key).Build()).AsInt64(); err != nil || got != 2 {
			return fmt.Errorf("node %s holds %d of the pair's keys (%v), want 2", addr, got, err)
		}
	}
	return nil
}

// checkDifferential drives the script on a miniredis whose clock the check
// sets and a pure-Go model with the same seeded random schedule of calls,
// clock steps (backwards ones included) and Spec changes, and requires
// them to agree decision for decision, RetryAfter included, and on every
// stored field and TTL.
func checkDifferential(ctx context.Context, e *env) error {
	u, stop, err := e.mini()
	if err != nil {
		return err
	}
	defer stop()
	for seed := uint64(1); seed <= 3; seed++ {
		if err := differential(ctx, u, seed, 800); err != nil {
			return fmt.Errorf("seed %d: %w", seed, err)
		}
	}
	return nil
}

func differential(ctx context.Context, u *unitEnv, seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	u.srv.FlushAll()
	u.now = unitEpoch
	u.srv.SetTime(u.now)
	keys := []string{"d:{x}:a", "d:{x}:b", "d:{x}:c"}
	specs := map[string][2]Spec{}
	for _, k := range keys {
		var pair [2]Spec
		for i := range pair {
			pair[i] = MustSpec(Every(time.Duration(1000+rng.Int64N(2_000_000))*time.Microsecond), 1+rng.IntN(5))
		}
		specs[k] = pair
	}
	current := map[string]int{} // which of a key's two Specs is deployed
	states := map[string]mstate{}
	ttls := map[string]time.Duration{}
	var lastRetry time.Duration
	var history []string
	for step := range steps {
		// The clock: mostly forward by up to an interval, sometimes exactly
		// to the next token (or 1 µs short), sometimes far, sometimes back.
		iv := specs[keys[rng.IntN(3)]][0].Interval()
		var adv time.Duration
		switch x := rng.IntN(100); {
		case x < 15:
		case x < 45:
			adv = time.Duration(rng.Int64N(int64(iv)/2 + 1))
		case x < 60 && lastRetry > 0:
			adv = lastRetry - time.Duration(rng.IntN(2))*time.Microsecond
		case x < 70:
			adv = time.Duration(rng.Int64N(int64(iv) * 15))
		case x < 78:
			adv = -time.Duration(rng.Int64N(int64(2 * time.Second)))
		default:
			adv = time.Duration(rng.Int64N(int64(2 * iv)))
		}
		adv = adv.Truncate(time.Microsecond)
		u.advance(adv)
		if adv > 0 { // miniredis, like Valkey, counts TTLs down only as the clock moves on
			for k, ttl := range ttls {
				if ttls[k] = ttl - adv; ttls[k] <= 0 {
					delete(ttls, k)
					delete(states, k)
				}
			}
		}
		if rng.IntN(100) < 3 { // a deploy changes one bucket's Spec
			k := keys[rng.IntN(3)]
			current[k] = 1 - current[k]
		}
		req := func(k string) Request { return Request{Key: k, Spec: specs[k][current[k]]} }
		i, j := rng.IntN(3), rng.IntN(3)
		first, second := req(keys[i]), (*Request)(nil)
		if i != j && rng.IntN(3) > 0 {
			r := req(keys[j])
			second = &r
		}
		desc := fmt.Sprintf("step %d: clock %+v, call %s", step, adv, first.Key)
		if second != nil {
			desc += " then " + second.Key
		}
		history = append(history, desc)
		if len(history) > 6 {
			history = history[1:]
		}
		got, err := u.l.AllowOrdered(ctx, first, second)
		if err != nil {
			return fmt.Errorf("%s: %w", desc, err)
		}
		want, writes := modelDecide(u.micros(), states, first, second)
		for k, w := range writes {
			states[k] = mstate{w.tokens, w.ts}
			ttls[k] = time.Duration(w.ttlMs) * time.Millisecond
		}
		lastRetry = got.RetryAfter
		var diffs []string
		if got != want {
			diffs = append(diffs, fmt.Sprintf("decision %v, model %v", got, want))
		}
		for _, k := range keys {
			tk, ts := u.state(k)
			st, ok := states[k]
			wantTk, wantTs := "", ""
			if ok {
				wantTk, wantTs = strconv.FormatInt(st.tokens, 10), strconv.FormatInt(st.ts, 10)
			}
			if tk != wantTk || ts != wantTs || u.srv.TTL(k) != ttls[k] {
				diffs = append(diffs, fmt.Sprintf("%s: tokens %q ts %q TTL %v, model %q %q %v", k, tk, ts, u.srv.TTL(k), wantTk, wantTs, ttls[k]))
			}
		}
		if len(diffs) > 0 {
			return fmt.Errorf("the script and the model disagree after:\n\t%s\n%s", strings.Join(history, "\n\t"), strings.Join(diffs, "\n"))
		}
	}
	return nil
}
