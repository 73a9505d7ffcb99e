package admit_test

// Concurrency leases: unit tests on miniredis; the property test, on
// miniredis (TestLeaseProperty) and on a real server whose clock the test
// steps (TestIntegrationLeaseProperty), against internal/model. Holders
// killed with SIGKILL are in integration (TestIntegrationLeaseKill9); the
// server's time per call beside the sorted-set semaphore recipe is in the
// benchmarks module (BenchmarkLeaseServerTime).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/minitest"
	"github.com/admitkit/admit/internal/model"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// twoAtOnce and aBucket are the Concurrency and the bucket of the lease
// unit tests.
var (
	twoAtOnce = admit.MustConcurrency(2, time.Second)
	aBucket   = admit.Request{Key: "b", Spec: admit.MustSpec(admit.Every(time.Second), 2)}
)

func TestConcurrencySpec(t *testing.T) {
	for _, tc := range []struct {
		limit int
		lease time.Duration
		ok    bool
	}{
		{1, time.Millisecond, true},
		{admit.MaxConcurrency, admit.MaxLease, true},
		{0, time.Second, false},
		{-1, time.Second, false},
		{admit.MaxConcurrency + 1, time.Second, false},
		{1, time.Millisecond - time.Microsecond, false},
		{1, admit.MaxLease + time.Microsecond, false},
		{1, time.Second + time.Nanosecond, false},
		{1, -time.Second, false},
	} {
		c, err := admit.NewConcurrency(tc.limit, tc.lease)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, admit.ErrInvalidSpec)) {
			t.Errorf("NewConcurrency(%d, %v) = %v, %v; want ok %v", tc.limit, tc.lease, c, err, tc.ok)
		}
		if tc.ok && (c.Limit() != tc.limit || c.Lease() != tc.lease || c.IsZero()) {
			t.Errorf("NewConcurrency(%d, %v) = %v", tc.limit, tc.lease, c)
		}
	}
	if s := admit.MustConcurrency(10, 30*time.Second).String(); s != "10 at once, lease 30s" {
		t.Errorf("String() = %q", s)
	}
}

// TestLeaseInvalid: bad input is refused before anything is sent, with
// ErrInvalidRequest and ErrNotExecuted, and a Release of the Lease sends
// nothing.
func TestLeaseInvalid(t *testing.T) {
	srv, c := minitest.Start(t)
	l, spec, b := admit.New(c), twoAtOnce, aBucket
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		slot          admit.LeaseRequest
		first, second *admit.Request
		want          string
	}{
		{"empty key", admit.LeaseRequest{Spec: spec}, nil, nil, "empty Key"},
		{"long key", admit.LeaseRequest{Key: strings.Repeat("k", admit.MaxKeyLen+1), Spec: spec}, nil, nil, "MaxKeyLen"},
		{"zero spec", admit.LeaseRequest{Key: "c"}, nil, nil, "zero Concurrency"},
		{"long name", admit.LeaseRequest{Key: "c", Spec: spec, Name: strings.Repeat("x", admit.MaxLeaseNameLen+1)}, nil, nil, "MaxLeaseNameLen"},
		{"second alone", admit.LeaseRequest{Key: "c", Spec: spec}, nil, &b, "second bucket without a first"},
		{"slot key is a bucket's", admit.LeaseRequest{Key: "b", Spec: spec}, &b, nil, "same key"},
		{"bad bucket", admit.LeaseRequest{Key: "c", Spec: spec}, &admit.Request{Key: "b"}, nil, "zero Spec"},
	} {
		x, err := l.Acquire(ctx, tc.slot, tc.first, tc.second)
		if !errors.Is(err, admit.ErrInvalidRequest) || !errors.Is(err, admit.ErrNotExecuted) || !strings.Contains(err.Error(), tc.want) || x.Granted() {
			t.Errorf("%s: %v, %v; want ErrInvalidRequest naming %q", tc.name, x, err, tc.want)
		}
		if held, err := x.Release(ctx); held || err != nil {
			t.Errorf("%s: Release of a refused input: %v, %v", tc.name, held, err)
		}
	}
	if keys := srv.Keys(); len(keys) != 0 {
		t.Errorf("invalid input wrote %v", keys)
	}
	var nilLease *admit.Lease
	if held, err := nilLease.Release(ctx); held || err != nil || nilLease.Granted() {
		t.Errorf("nil Lease: %v %v", held, err)
	}
}

// TestLeaseSteps: a table of calls on miniredis, each compared with the
// model, state included, on a clock that moves only when the test moves
// it.
func TestLeaseSteps(t *testing.T) {
	srv, c := minitest.Start(t)
	l := admit.New(c)
	ctx := context.Background()
	m := model.NewLeaseServer(minitest.Epoch.UnixMicro(), model.Countdown)
	spec := admit.MustConcurrency(2, 10*time.Second)
	b1 := admit.Request{Key: "b1", Spec: admit.MustSpec(admit.Every(time.Hour), 3)}
	b2 := admit.Request{Key: "b2", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}
	held := map[string]*admit.Lease{}
	type step struct {
		op            string // acquire, extend, release, advance
		name          string
		first, second *admit.Request
		d             time.Duration
	}
	steps := []step{
		{op: "acquire", name: "a", first: &b1},
		{op: "advance", d: 3 * time.Second},
		{op: "acquire", name: "b"},
		{op: "acquire", name: "c", first: &b1, second: &b2}, // slot full: nothing taken
		{op: "acquire", name: "a", first: &b1},              // replay
		{op: "advance", d: 7 * time.Second},                 // a's lease expires
		{op: "extend", name: "a"},                           // refused
		{op: "acquire", name: "c", first: &b1, second: &b2}, // granted; prunes a
		{op: "acquire", name: "d", first: &b1, second: &b2},
		{op: "release", name: "b"},
		{op: "acquire", name: "d", first: &b1, second: &b2}, // b2 empty: all or nothing
		{op: "acquire", name: "d", first: &b1},
		{op: "acquire", name: "e", first: &b1}, // b1 empty
		{op: "extend", name: "c"},
		{op: "advance", d: -5 * time.Second}, // a step back
		{op: "extend", name: "d"},
		{op: "release", name: "c"},
		{op: "release", name: "c"}, // idempotent
		{op: "release", name: "d"},
	}
	for i, st := range steps {
		switch st.op {
		case "advance":
			m.Advance(st.d)
			srv.SetTime(time.UnixMicro(m.Now))
		case "acquire":
			x, err := l.Acquire(ctx, admit.LeaseRequest{Key: "c", Spec: spec, Name: st.name}, st.first, st.second)
			want, werr := m.Acquire(model.LeaseRequest{Key: "c", Spec: spec, Name: st.name}, st.first, st.second)
			if got := leaseOutcomeOf(x); err != nil || werr != nil || got != want {
				t.Errorf("step %d acquire %s: %v (%v), %v; want %v, %v", i, st.name, got, x, err, want, werr)
			}
			if x.Granted() {
				held[st.name] = x
			}
		case "extend":
			x := held[st.name]
			ok, err := x.Extend(ctx)
			wok, _, werr := m.Extend("c", st.name, spec)
			if ok != wok || err != nil || werr != nil {
				t.Errorf("step %d extend %s: %v, %v; want %v", i, st.name, ok, err, wok)
			}
		case "release":
			ok, err := held[st.name].Release(ctx)
			wok, werr := m.Release("c", st.name)
			if ok != wok || err != nil || werr != nil {
				t.Errorf("step %d release %s: %v, %v; want %v", i, st.name, ok, err, wok)
			}
		}
		if d := leaseMiniDiff(srv, m); d != "" {
			t.Errorf("step %d (%s %s): the server's keys differ from the model's:\n%s", i, st.op, st.name, d)
		}
	}
}

// leaseOutcomeOf is what x carries, as the model predicts it.
func leaseOutcomeOf(x *admit.Lease) model.LeaseOutcome {
	return model.LeaseOutcome{Granted: x.Granted(), Replayed: x.Replayed(), Denied: x.Denied, RetryAfter: x.RetryAfter,
		Remaining: x.Remaining, Holders: x.Holders, Left: x.TTL}
}

// leaseMiniDiff compares every key of a miniredis with the model: lease
// keys' holders and TTL, buckets' fields and TTL, and no other key.
func leaseMiniDiff(srv *miniredis.Miniredis, m *model.LeaseServer) string {
	var diffs []string
	want := map[string]bool{}
	ttl := func(key string, at int64) {
		got := srv.TTL(key)
		if w := time.Duration(at-m.Now) * time.Microsecond; got != w && (got-w > time.Millisecond || w-got > time.Millisecond) {
			diffs = append(diffs, fmt.Sprintf("%q: TTL %v, want %v", key, got, w))
		}
	}
	for k, set := range m.Sets {
		want[k] = true
		members, err := srv.ZMembers(k)
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("%q: %v", k, err))
			continue
		}
		if len(members) != len(set.Holders) {
			diffs = append(diffs, fmt.Sprintf("%q: holders %q, want %v", k, members, set.Holders))
		}
		for _, name := range members {
			score, _ := srv.ZScore(k, name)
			if w, ok := set.Holders[name]; !ok || float64(w) != score {
				diffs = append(diffs, fmt.Sprintf("%q: holder %q expires at %.0f, want %d (held %v)", k, name, score, w, ok))
			}
		}
		ttl(k, set.ExpireAt)
	}
	for k, bk := range m.Buckets {
		want[k] = true
		if tk, ts := srv.HGet(k, "tokens"), srv.HGet(k, "ts"); tk != strconv.FormatInt(bk.Tokens, 10) || ts != strconv.FormatInt(bk.TS, 10) {
			diffs = append(diffs, fmt.Sprintf("%q: tokens %s ts %s, want %d %d", k, tk, ts, bk.Tokens, bk.TS))
		}
		ttl(k, bk.ExpireAt)
	}
	for _, k := range srv.Keys() {
		if !want[k] {
			diffs = append(diffs, fmt.Sprintf("%q: on the server, not in the model", k))
		}
	}
	for k := range want {
		if !srv.Exists(k) {
			diffs = append(diffs, fmt.Sprintf("%q: in the model, not on the server", k))
		}
	}
	return strings.Join(diffs, "\n")
}

// TestLeaseWrongTypeAndCorrupt: a lease key of another type, or a sorted
// set admit did not write, fails the call with nothing written; a lease
// call on a bucket's key, and a bucket call on a lease key, are
// ErrWrongType.
func TestLeaseWrongTypeAndCorrupt(t *testing.T) {
	srv, c := minitest.Start(t)
	l, spec, b := admit.New(c), twoAtOnce, aBucket
	ctx := context.Background()
	srv.Set("str", "x")
	srv.ZAdd("foreign", 1.5, "m")
	if _, err := l.AllowOrdered(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	x, err := l.Acquire(ctx, admit.LeaseRequest{Key: "held", Spec: spec, Name: "h"}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatal(x, err)
	}
	before := srv.Dump()
	for _, tc := range []struct {
		name   string
		slot   string
		first  *admit.Request
		reason error
	}{
		{"string at the lease key", "str", nil, admit.ErrWrongType},
		{"string at the lease key, with a bucket", "str", &b, admit.ErrWrongType},
		{"a bucket at the lease key", "b", nil, admit.ErrWrongType},
		{"a lease key at the bucket", "c", &admit.Request{Key: "held", Spec: b.Spec}, admit.ErrWrongType},
		{"a fractional score", "foreign", nil, admit.ErrCorruptState},
		{"a fractional score, with a bucket", "foreign", &b, admit.ErrCorruptState},
	} {
		x, err := l.Acquire(ctx, admit.LeaseRequest{Key: tc.slot, Spec: spec}, tc.first, nil)
		if !errors.Is(err, tc.reason) || !errors.Is(err, admit.ErrNotExecuted) || x.Granted() {
			t.Errorf("%s: %v, %v; want %v, not executed", tc.name, x, err, tc.reason)
		}
	}
	if _, err := l.AllowOrdered(ctx, admit.Request{Key: "held", Spec: b.Spec}, nil); !errors.Is(err, admit.ErrWrongType) {
		t.Errorf("AllowOrdered on a lease key: %v", err)
	}
	if after := srv.Dump(); after != before {
		t.Errorf("a refused call wrote:\nbefore %s\nafter %s", before, after)
	}
}

// TestLeaseBinaryNames: a name may hold any bytes, spaces, braces and NUL
// included, up to MaxLeaseNameLen; each is its own holder.
func TestLeaseBinaryNames(t *testing.T) {
	srv, c := minitest.Start(t)
	l := admit.New(c)
	ctx := context.Background()
	spec := admit.MustConcurrency(admit.MaxConcurrency, time.Minute)
	names := []string{"a b c", "{x}", "\x00\xff", strings.Repeat("n", admit.MaxLeaseNameLen), "1 2 3", " "}
	for _, n := range names {
		if x, err := l.Acquire(ctx, admit.LeaseRequest{Key: "k", Spec: spec, Name: n}, nil, nil); err != nil || !x.Granted() || x.Replayed() || x.Name != n {
			t.Errorf("%q: %v %v", n, x, err)
		}
	}
	members, _ := srv.ZMembers("k")
	if len(members) != len(names) {
		t.Errorf("holders %q, want %q", members, names)
	}
	x, _ := l.Acquire(ctx, admit.LeaseRequest{Key: "k", Spec: spec, Name: "\x00\xff"}, nil, nil)
	if !x.Replayed() {
		t.Errorf("the binary name again: %v", x)
	}
	// A random name is drawn when none is given, and differs each time.
	x1, _ := l.Acquire(ctx, admit.LeaseRequest{Key: "k", Spec: spec}, nil, nil)
	x2, _ := l.Acquire(ctx, admit.LeaseRequest{Key: "k", Spec: spec}, nil, nil)
	if x1.Name == "" || x1.Name == x2.Name || !x1.Granted() || !x2.Granted() || x2.Replayed() {
		t.Errorf("random names: %v %q, %v %q", x1, x1.Name, x2, x2.Name)
	}
}

// TestLeaseScriptRefusesBadArgs: the script checks a lease call's
// arguments itself, before reading anything.
func TestLeaseScriptRefusesBadArgs(t *testing.T) {
	srv, c := minitest.Start(t)
	ctx := context.Background()
	for _, args := range [][]string{
		{"l", "0 1000 n"}, {"l", "10001 1000 n"}, {"l", "1 999 n"}, {"l", "1 86400000001 n"},
		{"l", "1 1000 "}, {"l", "1 1000"}, {"l", "x 1000 n"}, {"e", "1 1000 " + strings.Repeat("n", 257)},
	} {
		cmd := c.B().Eval().Script(admit.ScriptSource).Numkeys(1).Key("k").Arg(args...).Build()
		if err := c.Do(ctx, cmd).Error(); err == nil || !strings.Contains(err.Error(), "ADMITARGS") {
			t.Errorf("%q: %v, want ADMITARGS", args, err)
		}
	}
	// With a bucket, only an acquire.
	cmd := c.B().Eval().Script(admit.ScriptSource).Numkeys(2).Key("b", "k").Arg("1000", "2", "1", "f", "1 1000 n").Build()
	if err := c.Do(ctx, cmd).Error(); err == nil || !strings.Contains(err.Error(), "ADMITARGS") {
		t.Errorf("a release with a bucket: %v, want ADMITARGS", err)
	}
	if keys := srv.Keys(); len(keys) != 0 {
		t.Errorf("refused arguments wrote %v", keys)
	}
}

// ---- The property test ----

// leaseBackend is a server the lease property test runs on: a plain
// Limiter, and one behind a proxy that can lose a reply.
type leaseBackend struct {
	c      valkey.Client // the plain Limiter's, and the test's own
	pl, lo *admit.Limiter
	lc     valkey.Client
	px     *delayproxy.Proxy
	mini   *miniredis.Miniredis // nil on a real server
	now    time.Time            // miniredis's clock
	clk    *testserver.Clock    // a real server's
	offset time.Duration
	expiry model.Expiry
}

func newLeaseBackend(tb testing.TB, addr string, mini *miniredis.Miniredis, clk *testserver.Clock) *leaseBackend {
	tb.Helper()
	dial := func(addr string) valkey.Client {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(c.Close)
		return c
	}
	b := &leaseBackend{c: dial(addr), mini: mini, clk: clk, expiry: model.Absolute, now: minitest.Epoch}
	if mini != nil {
		b.expiry = model.Countdown
	}
	// The script is loaded, so that the reply the proxy loses is the
	// script's, not a NOSCRIPT.
	if err := b.c.Do(context.Background(), b.c.B().ScriptLoad().Script(admit.ScriptSource).Build()).Error(); err != nil {
		tb.Fatal(err)
	}
	px, err := delayproxy.Start(addr, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { px.Close() })
	b.px, b.lc = px, dial(px.Addr())
	b.pl, b.lo = admit.New(b.c), admit.New(b.lc)
	return b
}

// clock reads the server's TIME, in µs.
func (b *leaseBackend) clock(ctx context.Context) (int64, error) {
	t, err := b.c.Do(ctx, b.c.B().Time().Build()).AsIntSlice()
	if err != nil || len(t) != 2 {
		return 0, fmt.Errorf("TIME: %v %v", t, err)
	}
	return t[0]*1_000_000 + t[1], nil
}

// step moves the server's clock by d (a real server's also runs on).
func (b *leaseBackend) step(tb testing.TB, d time.Duration) {
	if b.mini != nil {
		b.now = b.now.Add(d)
		b.mini.SetTime(b.now)
		// miniredis counts TTLs down when a command touches the database,
		// and forgets a forward step that a backward one undoes before
		// that: touch it, so that every step counts.
		b.mini.Keys()
		return
	}
	b.offset += d
	b.clk.Set(tb, b.offset)
}

// leaseWorld is what a run names: lease keys with their Concurrency,
// holders' names, and two buckets.
type leaseWorld struct {
	keys   []string
	specs  []admit.Concurrency
	names  []string
	b1, b2 admit.Request
}

func newLeaseWorld(real bool) leaseWorld {
	lease := []time.Duration{40 * time.Millisecond, 15 * time.Millisecond, 100 * time.Millisecond}
	if real {
		// An operation on a real server takes about ten times as long
		// (TIME before and after, the live counts): leases as many
		// operations long as on miniredis, so that a run fills every key
		// to its limit as often.
		for i := range lease {
			lease[i] *= 4
		}
	}
	return leaseWorld{
		// Hostile keys: braces, spaces, binary bytes.
		keys:  []string{"lease{a}", "lease: {\x00b}\xff", "l"},
		specs: []admit.Concurrency{admit.MustConcurrency(3, lease[0]), admit.MustConcurrency(1, lease[1]), admit.MustConcurrency(5, lease[2])},
		names: []string{"h0", "{h1}", "h 2 3", "\x00\xff", strings.Repeat("n", admit.MaxLeaseNameLen), "h5", "h6", "lease{a}"},
		b1:    admit.Request{Key: "bucket{a}1", Spec: admit.MustSpec(admit.Every(2*time.Millisecond), 6)},
		b2:    admit.Request{Key: "bucket{a}2", Spec: admit.MustSpec(admit.Every(5*time.Millisecond), 3), Cost: 2},
	}
}

// leaseRun is one property run's state.
type leaseRun struct {
	tb      testing.TB
	b       *leaseBackend
	w       leaseWorld
	m       *model.LeaseServer
	held    map[[2]int]*admit.Lease // (key, name) → the holder's lease
	peak    []int                   // the most live holders seen per key
	checks  int                     // live counts taken
	granted int
	lost    int
	log     []string
}

// TestLeaseProperty runs the lease property test on miniredis.
func TestLeaseProperty(t *testing.T) {
	mini, _ := minitest.Start(t)
	b := newLeaseBackend(t, mini.Addr(), mini, nil)
	leaseProperty(t, b, leaseSteps(t, 3000))
}

// TestIntegrationLeaseProperty runs it on a real server whose clock the
// test steps. ADMIT_LEASE_STEPS sets the number of operations.
func TestIntegrationLeaseProperty(t *testing.T) {
	srv, clk := testserver.StartClockShifted(t)
	t.Logf("server %s", srv.Version)
	b := newLeaseBackend(t, srv.Addr, nil, clk)
	leaseProperty(t, b, leaseSteps(t, 1500))
}

func leaseSteps(tb testing.TB, n int) int {
	if s := os.Getenv("ADMIT_LEASE_STEPS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			tb.Fatalf("ADMIT_LEASE_STEPS=%q: %v", s, err)
		}
		return v
	}
	if testing.Short() {
		return n / 10
	}
	return n
}

// leaseProperty drives steps random operations: acquires (alone, with one
// bucket or the ordered pair; under a holder's name or a random one),
// retries, extends, releases, holders that vanish without releasing, lost
// replies, and clock steps forward and back. After every operation it
// checks the outcome and every key against the model, and that no key
// has more live holders than its limit.
func leaseProperty(t *testing.T, b *leaseBackend, steps int) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ADMIT_LEASE_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	ctx := context.Background()
	now, err := b.clock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &leaseRun{tb: t, b: b, w: newLeaseWorld(b.mini == nil), m: model.NewLeaseServer(now, b.expiry),
		held: map[[2]int]*admit.Lease{}}
	r.peak = make([]int, len(r.w.keys))
	start := time.Now()
	// A random run may not fill every key to its limit in steps
	// operations: it goes on, up to four times as long, until it has, so
	// that the bound is always tested.
	peaked := func() bool {
		for i, p := range r.peak {
			if p != r.w.specs[i].Limit() {
				return false
			}
		}
		return true
	}
	ran := 0
	for i := 0; i < steps || (!peaked() && i < 4*steps); i++ {
		ran++
		desc, err := r.op(ctx, rng)
		r.log = append(r.log, desc)
		if len(r.log) > 30 {
			r.log = r.log[1:]
		}
		if err == nil {
			err = r.checkLive(ctx)
		}
		if err != nil {
			t.Fatalf("seed %d (ADMIT_LEASE_SEED), operation %d: %v\nthe last operations:\n  %s", seed, i, err, strings.Join(r.log, "\n  "))
		}
	}
	t.Logf("%d operations in %v (seed %d): %d grants, %d lost replies, %d live counts taken; never more live than the limit: peak per key %v, limits %v",
		ran, time.Since(start).Round(time.Millisecond), seed, r.granted, r.lost, r.checks, r.peak, leaseLimits(r.w))
	for i, p := range r.peak {
		if p != r.w.specs[i].Limit() {
			t.Errorf("key %d never reached its limit %d (peak %d): the run did not test the bound", i, r.w.specs[i].Limit(), p)
		}
	}
}

func leaseLimits(w leaseWorld) []int {
	var l []int
	for _, s := range w.specs {
		l = append(l, s.Limit())
	}
	return l
}

// allKeys is every key a run may write.
func (r *leaseRun) allKeys() []string {
	return append(append([]string(nil), r.w.keys...), r.w.b1.Key, r.w.b2.Key)
}

// expiresNear reports whether a key's time comes within 10 ms of t or of
// t + d, or a holder's lease ends there: a clock step there would race
// the server's expiry.
func (r *leaseRun) expiresNear(t int64, d time.Duration) bool {
	near := func(at int64) bool {
		for _, x := range []int64{t, t + d.Microseconds()} {
			if at > x-10_000 && at < x+10_000 {
				return true
			}
		}
		return false
	}
	for _, s := range r.m.Sets {
		if near(s.ExpireAt) {
			return true
		}
		for _, at := range s.Holders {
			if near(at) {
				return true
			}
		}
	}
	for _, b := range r.m.Buckets {
		if near(b.ExpireAt) {
			return true
		}
	}
	return false
}

// checkLive counts each key's live holders by the server's clock: the
// members scored after a TIME read just before (the test is the only
// client, so that counts every holder live at that moment).
func (r *leaseRun) checkLive(ctx context.Context) error {
	now, err := r.b.clock(ctx)
	if err != nil {
		return err
	}
	c := r.b.c
	cmds := make(valkey.Commands, 0, len(r.w.keys))
	for _, k := range r.w.keys {
		cmds = append(cmds, c.B().Zcount().Key(k).Min("("+strconv.FormatInt(now, 10)).Max("+inf").Build())
	}
	for i, res := range c.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil {
			return err
		}
		r.checks++
		if int(n) > r.w.specs[i].Limit() {
			return fmt.Errorf("key %q: %d live holders, limit %d", r.w.keys[i], n, r.w.specs[i].Limit())
		}
		r.peak[i] = max(r.peak[i], int(n))
	}
	return nil
}

// op runs one random operation and checks it.
func (r *leaseRun) op(ctx context.Context, rng *rand.Rand) (string, error) {
	ki, ni := rng.IntN(len(r.w.keys)), rng.IntN(len(r.w.names))
	key, spec, name := r.w.keys[ki], r.w.specs[ki], r.w.names[ni]
	hk := [2]int{ki, ni}
	switch p := rng.IntN(100); {
	case p < 10: // the clock moves
		d := time.Duration(rng.IntN(int(2*spec.Lease()/time.Microsecond))) * time.Microsecond
		if rng.IntN(10) == 0 {
			d = -d
		}
		if r.b.mini != nil {
			r.b.step(r.tb, d)
			r.m.Advance(d)
			return fmt.Sprintf("step the clock %v", d), nil
		}
		// A real server's clock runs on; step it only now and then, and
		// only when no key's time comes near: its keys are touched (so
		// that those whose time has come are gone) and the model moved
		// to the server's clock before the step.
		t0, err := r.b.clock(ctx)
		if err != nil {
			return "", err
		}
		if rng.IntN(8) != 0 || r.expiresNear(t0, d) {
			time.Sleep(d.Abs() / 4)
			return fmt.Sprintf("sleep %v", d.Abs()/4), nil
		}
		for _, k := range r.allKeys() {
			if err := r.b.c.Do(ctx, r.b.c.B().Exists().Key(k).Build()).Error(); err != nil {
				return "", err
			}
		}
		r.m.SetNow(t0)
		r.b.step(r.tb, d)
		t1, err := r.b.clock(ctx)
		if err != nil {
			return "", err
		}
		r.m.SetNow(t1)
		return fmt.Sprintf("step the clock %v", d), nil
	case p < 15: // the holder vanishes: it never calls again
		delete(r.held, hk)
		return fmt.Sprintf("holder %q of %q vanishes", name, key), nil
	case p < 30:
		x := r.held[hk]
		if x == nil {
			return "extend: nothing held", nil
		}
		lossy := rng.IntN(10) == 0
		return r.call(ctx, fmt.Sprintf("extend %q on %q (lossy %v)", name, key, lossy), lossy, func(l *admit.Limiter) (any, error) {
			if lossy {
				return l.Lease(admit.LeaseRequest{Key: key, Spec: spec, Name: x.Name}).Extend(ctx)
			}
			return x.Extend(ctx)
		}, func(m *model.LeaseServer) (any, error) {
			ok, _, err := m.Extend(key, name, spec)
			return ok, err
		})
	case p < 50:
		x := r.held[hk]
		if x == nil {
			return "release: nothing held", nil
		}
		lossy := rng.IntN(10) == 0
		desc, err := r.call(ctx, fmt.Sprintf("release %q on %q (lossy %v)", name, key, lossy), lossy, func(l *admit.Limiter) (any, error) {
			if lossy {
				return l.Lease(admit.LeaseRequest{Key: key, Spec: spec, Name: x.Name}).Release(ctx)
			}
			return x.Release(ctx)
		}, func(m *model.LeaseServer) (any, error) {
			return m.Release(key, x.Name)
		})
		if rng.IntN(2) == 0 {
			delete(r.held, hk)
		}
		return desc, err
	default:
		var first, second *admit.Request
		switch rng.IntN(3) {
		case 1:
			first = &r.w.b1
		case 2:
			first, second = &r.w.b1, &r.w.b2
		}
		slot := admit.LeaseRequest{Key: key, Spec: spec, Name: name}
		if rng.IntN(8) == 0 {
			slot.Name = "" // a random name: a holder that cannot retry
		}
		lossy := rng.IntN(12) == 0
		var got *admit.Lease
		desc, err := r.call(ctx, fmt.Sprintf("acquire %q on %q with %d buckets (lossy %v)", slot.Name, key, leaseBuckets(first, second), lossy), lossy,
			func(l *admit.Limiter) (any, error) {
				x, err := l.Acquire(ctx, slot, first, second)
				got = x
				if err != nil {
					return nil, err
				}
				return leaseOutcomeOf(x), nil
			}, func(m *model.LeaseServer) (any, error) {
				s := model.LeaseRequest{Key: key, Spec: spec, Name: got.Name}
				o, err := m.Acquire(s, first, second)
				return o, err
			})
		if err == nil && (got.Granted() || lossy) && slot.Name != "" {
			r.held[hk] = got
		}
		if got.Granted() && !got.Replayed() {
			r.granted++
		}
		return desc, err
	}
}

func leaseBuckets(first, second *admit.Request) int {
	switch {
	case second != nil:
		return 2
	case first != nil:
		return 1
	}
	return 0
}

// call runs send on the plain Limiter (or the lossy one, whose reply the
// proxy loses), and compares its result and every key with the model's
// answer, want, at the clock the script read: on miniredis the test's
// clock; on a real server some moment between two readings of TIME
// around the call, each candidate tried.
func (r *leaseRun) call(ctx context.Context, desc string, lossy bool, send func(*admit.Limiter) (any, error), want func(*model.LeaseServer) (any, error)) (string, error) {
	l := r.b.pl
	if lossy {
		if err := r.b.lc.Do(ctx, r.b.lc.B().Ping().Build()).Error(); err != nil {
			return desc, err
		}
		r.b.px.LoseReply([]byte("EVALSHA"))
		l = r.b.lo
	}
	t0, err := r.b.clock(ctx)
	if err != nil {
		return desc, err
	}
	got, gerr := send(l)
	t1, err := r.b.clock(ctx)
	if err != nil {
		return desc, err
	}
	if lossy {
		r.lost++
		if !errors.Is(gerr, admit.ErrOutcomeUnknown) || errors.Is(gerr, admit.ErrNotExecuted) {
			return desc, fmt.Errorf("%s: a lost reply gave %v, %v; want ErrOutcomeUnknown", desc, got, gerr)
		}
	}
	candidates := []int64{t0}
	if r.b.mini == nil {
		candidates = r.candidates(t0, t1, got, want)
	}
	var misses []string
	for _, c := range candidates {
		m := r.m.Clone()
		m.SetNow(c)
		w, werr := want(m)
		if !lossy && (fmt.Sprint(w) != fmt.Sprint(got) || !sameErr(werr, gerr)) {
			misses = append(misses, fmt.Sprintf("at %d: got %v, %v; model %v, %v", c-t0, got, gerr, w, werr))
			continue
		}
		if d, err := r.diff(ctx, m); err != nil {
			return desc, err
		} else if d != "" {
			misses = append(misses, fmt.Sprintf("at %d: %v; keys:\n%s", c-t0, got, d))
			continue
		}
		r.m = m
		return fmt.Sprintf("%s: %v, %v", desc, got, gerr), nil
	}
	return desc, fmt.Errorf("%s: no server clock in [%d, %d] µs makes the model agree:\n%s", desc, t0, t1, strings.Join(misses, "\n"))
}

func sameErr(want, got error) bool {
	if want == nil || got == nil {
		return want == nil && got == nil
	}
	for _, reason := range []error{admit.ErrWrongType, admit.ErrCorruptState, admit.ErrInvalidRequest} {
		if errors.Is(want, reason) {
			return errors.Is(got, reason) && errors.Is(got, admit.ErrNotExecuted)
		}
	}
	return false
}

// candidates are the server clocks at which the call may have run: both
// ends of [t0, t1] and, inside it, the clock each time in the reply and
// each score on the server implies.
func (r *leaseRun) candidates(t0, t1 int64, got any, want func(*model.LeaseServer) (any, error)) []int64 {
	c := []int64{t0, t1}
	m := r.m.Clone()
	m.SetNow(t0)
	w, _ := want(m)
	if o, ok := got.(model.LeaseOutcome); ok {
		if wo, ok := w.(model.LeaseOutcome); ok {
			c = append(c, t0+(wo.RetryAfter-o.RetryAfter).Microseconds(), t0+(wo.Left-o.Left).Microseconds())
		}
	}
	// A new or extended score is the script's now plus the lease.
	ctx := context.Background()
	for i, k := range r.w.keys {
		scores, err := r.b.c.Do(ctx, r.b.c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			continue
		}
		for _, s := range scores {
			c = append(c, int64(s.Score)-r.w.specs[i].Lease().Microseconds())
		}
	}
	for _, rq := range []admit.Request{r.w.b1, r.w.b2} {
		if ts, err := r.b.c.Do(ctx, r.b.c.B().Hget().Key(rq.Key).Field("ts").Build()).AsInt64(); err == nil {
			c = append(c, ts)
		}
	}
	out := c[:0]
	for _, v := range c {
		if v >= t0 && v <= t1 {
			out = append(out, v)
		}
	}
	return out
}

// diff compares every key with m, at the server's clock when it reads
// them (m is moved on to it: keys expire meanwhile); "" when they agree.
func (r *leaseRun) diff(ctx context.Context, m *model.LeaseServer) (string, error) {
	if r.b.mini != nil {
		return leaseMiniDiff(r.b.mini, m), nil
	}
	var last string
	for try := 0; try < 3; try++ {
		s0, err := r.b.clock(ctx)
		if err != nil {
			return "", err
		}
		snap, err := r.snapshot(ctx)
		if err != nil {
			return "", err
		}
		s1, err := r.b.clock(ctx)
		if err != nil {
			return "", err
		}
		for _, at := range []int64{s0, s1} {
			mm := m.Clone()
			mm.SetNow(max(at, m.Now))
			if last = snap.diff(mm, r.w); last == "" {
				return "", nil
			}
		}
	}
	return last, nil
}

// leaseSnap is the keys of a run on a real server.
type leaseSnap struct {
	sets    map[string]map[string]int64 // lease key → holder → score
	buckets map[string][2]int64
	expire  map[string]int64 // PEXPIRETIME, ms
}

func (r *leaseRun) snapshot(ctx context.Context) (leaseSnap, error) {
	c := r.b.c
	s := leaseSnap{sets: map[string]map[string]int64{}, buckets: map[string][2]int64{}, expire: map[string]int64{}}
	for _, k := range r.w.keys {
		scores, err := c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			return s, err
		}
		if len(scores) > 0 {
			s.sets[k] = map[string]int64{}
			for _, z := range scores {
				s.sets[k][z.Member] = int64(z.Score)
			}
		}
	}
	for _, rq := range []admit.Request{r.w.b1, r.w.b2} {
		m, err := c.Do(ctx, c.B().Hgetall().Key(rq.Key).Build()).AsIntMap()
		if err != nil {
			return s, err
		}
		if len(m) > 0 {
			s.buckets[rq.Key] = [2]int64{m["tokens"], m["ts"]}
		}
	}
	for _, k := range append(append([]string(nil), r.w.keys...), r.w.b1.Key, r.w.b2.Key) {
		at, err := c.Do(ctx, c.B().Pexpiretime().Key(k).Build()).AsInt64()
		if err != nil {
			return s, err
		}
		s.expire[k] = at
	}
	return s, nil
}

func (s leaseSnap) diff(m *model.LeaseServer, w leaseWorld) string {
	var d []string
	for _, k := range w.keys {
		set, ok := m.Sets[k]
		if got := s.sets[k]; len(got) != len(set.Holders) {
			d = append(d, fmt.Sprintf("%q: holders %v, want %v", k, got, set.Holders))
		} else {
			for n, at := range set.Holders {
				if got[n] != at {
					d = append(d, fmt.Sprintf("%q: holder %q at %d, want %d", k, n, got[n], at))
				}
			}
		}
		if want := set.ExpireAt / 1000; ok && s.expire[k] != want {
			d = append(d, fmt.Sprintf("%q: PEXPIRETIME %d, want %d", k, s.expire[k], want))
		}
	}
	for _, rq := range []admit.Request{w.b1, w.b2} {
		bk, ok := m.Buckets[rq.Key]
		got, has := s.buckets[rq.Key]
		switch {
		case ok != has:
			d = append(d, fmt.Sprintf("%q: present %v, want %v", rq.Key, has, ok))
		case ok && (got != [2]int64{bk.Tokens, bk.TS} || s.expire[rq.Key] != bk.ExpireAt/1000):
			d = append(d, fmt.Sprintf("%q: %v PEXPIRETIME %d, want %d %d %d", rq.Key, got, s.expire[rq.Key], bk.Tokens, bk.TS, bk.ExpireAt/1000))
		}
	}
	return strings.Join(d, "\n")
}

// ---- Holders killed with SIGKILL ----

// TestLeaseBadReply: a reply the script never gives is ErrBadReply,
// classed outcome unknown, and never a grant.
func TestLeaseBadReply(t *testing.T) {
	_, c := minitest.Start(t)
	ctx := context.Background()
	spec := twoAtOnce
	for _, reply := range []string{
		"return 1", "return 'x'", "return '0 0 -1 -1 1 1000'", "return '0 0 -1 -1 0 1000 0'", "return '0 5 -1 -1 1 1000 0'",
		"return '4 5 -1 -1 1 0 0'", "return '1 5 -1 -1 1 0 0'", "return '0 0 -1 -1 1 0 0'", "return '3 5 -1 -1 1 0 1'",
		"return '0 0 3 -1 1 1000 0'",
	} {
		l := admit.NewLimiterWithScript(c, reply)
		x, err := l.Acquire(ctx, admit.LeaseRequest{Key: "k", Spec: spec, Name: "n"}, nil, nil)
		if !errors.Is(err, admit.ErrBadReply) || !errors.Is(err, admit.ErrOutcomeUnknown) || x.Granted() {
			t.Errorf("acquire replied by %q: %v, %v; want ErrBadReply, outcome unknown", reply, x, err)
		}
	}
	for _, reply := range []string{"return '3'", "return 'x'", "return {1}"} {
		l := admit.NewLimiterWithScript(c, reply)
		if held, err := l.Lease(admit.LeaseRequest{Key: "k", Spec: spec, Name: "n"}).Release(ctx); held || !errors.Is(err, admit.ErrBadReply) {
			t.Errorf("release replied by %q: %v, %v; want ErrBadReply", reply, held, err)
		}
	}
	for _, reply := range []string{"return '1 0'", "return '0 5'", "return '2 5'", "return '1'"} {
		l := admit.NewLimiterWithScript(c, reply)
		if ok, err := l.Lease(admit.LeaseRequest{Key: "k", Spec: spec, Name: "n"}).Extend(ctx); ok || !errors.Is(err, admit.ErrBadReply) {
			t.Errorf("extend replied by %q: %v, %v; want ErrBadReply", reply, ok, err)
		}
	}
}

// TestLeaseHandleChecks: a handle from Limiter.Lease refuses what Acquire
// refuses before sending anything, and releases without a Concurrency.
func TestLeaseHandleChecks(t *testing.T) {
	srv, c := minitest.Start(t)
	l := admit.New(c)
	ctx := context.Background()
	long := l.Lease(admit.LeaseRequest{Key: strings.Repeat("k", admit.MaxKeyLen+1), Spec: twoAtOnce, Name: "n"})
	for op, f := range map[string]func(context.Context) (bool, error){"Extend": long.Extend, "Release": long.Release} {
		if live, err := f(ctx); live || !errors.Is(err, admit.ErrInvalidRequest) || !strings.Contains(err.Error(), "MaxKeyLen") {
			t.Errorf("%s of a handle on a key over MaxKeyLen: %v, %v; want ErrInvalidRequest naming MaxKeyLen", op, live, err)
		}
	}
	if keys := srv.Keys(); len(keys) != 0 {
		t.Fatalf("refused handles wrote %v", keys)
	}
	x, err := l.Acquire(ctx, admit.LeaseRequest{Key: "c", Spec: twoAtOnce, Name: "job"}, nil, nil)
	if err != nil || !x.Granted() {
		t.Fatalf("Acquire: %v, %v", x, err)
	}
	h := l.Lease(admit.LeaseRequest{Key: "c", Name: "job"}) // no Concurrency
	if live, err := h.Release(ctx); !live || err != nil {
		t.Fatalf("Release of a handle without a Concurrency: %v, %v; want true, nil", live, err)
	}
	if live, err := h.Extend(ctx); live || !errors.Is(err, admit.ErrInvalidRequest) {
		t.Errorf("Extend of a handle without a Concurrency: %v, %v; want ErrInvalidRequest", live, err)
	}
}
