package admit_test

// The stateful property test: seeded random sequences of every call
// (AllowOrdered, AllowAll, AllowOrderedOnce with new and repeated ids,
// Peek, Refund, reserve-then-settle, Wait, a Limiter WithDenialCache beside
// a plain one, lost replies and retries, ids reused for other requests,
// foreign values at admit's keys, invalid requests, a key deployed with
// another Spec) and clock steps (back ones included), run
// against a server and against the model (internal/model), with hostile
// keys and ids: braces, the once-record separator, binary bytes, lengths at
// the bounds.
//
// After every call it checks:
//   - the Decision (Denied, RetryAfter, Remaining, Allowed, Replayed) or
//     the error equals the model's;
//   - every key on the server equals the model's: each bucket's fields and
//     expiry byte for byte, each once-record where admit names it, with its
//     expiry, and no other key;
//   - every key has an expiry;
//   - every error has one class, and one classed ErrNotExecuted changed
//     nothing (every key's value and expiry as before), but for Wait's,
//     which means that no token stays taken (ErrNotExecuted's doc);
//   - a call the denial cache answered without the server keeps the
//     cache's promise (model.Cache);
//   - per bucket, the tokens charged minus those refunded never exceed
//     burst + the server time elapsed / interval;
//   - no id is charged twice within admit.OnceWindow.
//
// TestProperty runs it on miniredis, whose clock the test sets (the fast
// tier); TestIntegrationProperty and TestIntegrationPropertyConcurrent, at
// the end of this file, on a real server. The real-server tier stays here
// with its harness, behind internal/testserver's switch like every other
// real-server test (it skips without a server unless
// ADMIT_REQUIRE_SERVER=1). Environment:
//
//	ADMIT_PROPERTY_SEED=n     replay seed n (the seed is logged on every run)
//	ADMIT_PROPERTY_STEPS=n    operations a run (default: propSteps, or
//	                          propIntegrationSteps on a real server, which
//	                          stops when propIntegrationBudget is spent; a
//	                          quarter under -race, a tenth with -short); n
//	                          set here runs every operation, whatever the time
//	ADMIT_PROPERTY_SKIP=a,b   leave these operation kinds out (propKinds), and
//	                          with "cache", the Limiter WithDenialCache
//
// On a failure it logs the operations that led to it, then shrinks them
// (delta debugging, bounded in tries and time) and logs the shortest
// failing sequence it found.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// propSteps is the default number of operations of a run on miniredis:
// about 7 s on 2 CPUs; a quarter under the race detector (about 5 s), a
// tenth with -short.
const propSteps = 20000

// propScaled scales a default number of steps for the race detector and
// -short.
func propScaled(n int) int {
	if admit.RaceEnabled {
		n /= 4
	}
	if testing.Short() {
		n /= 10
	}
	return max(n, 1)
}

// propKinds are the operation kinds and their weights.
var propKinds = []struct {
	name   string
	weight int
}{
	{"advance", 18}, {"allow", 16}, {"all", 10}, {"once", 18}, {"settle", 8}, {"lost", 4}, {"reuse", 4},
	{"peek", 8}, {"refund", 10}, {"wait", 3}, {"foreign", 2}, {"invalid", 4}, {"deploy", 2},
}

// TestProperty is the property test's fast tier: miniredis, whose clock
// moves only when the test moves it.
func TestProperty(t *testing.T) {
	cfg := propConfigFromEnv(t, propScaled(propSteps), 0)
	propCheck(t, cfg, func(tb testing.TB) propBackend { return newMiniBackend(tb) })
}

// propConfig is one run's parameters.
type propConfig struct {
	seed  uint64
	steps int
	// budget, when not 0, stops a run after that much time, at the
	// operation it is at; ADMIT_PROPERTY_STEPS lifts it.
	budget time.Duration
	skip   map[string]bool
}

func propConfigFromEnv(tb testing.TB, steps int, budget time.Duration) propConfig {
	tb.Helper()
	cfg := propConfig{seed: rand.Uint64(), steps: steps, budget: budget, skip: map[string]bool{}}
	if s := os.Getenv("ADMIT_PROPERTY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("ADMIT_PROPERTY_SEED=%q: %v", s, err)
		}
		cfg.seed = n
	}
	if s := os.Getenv("ADMIT_PROPERTY_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			tb.Fatalf("ADMIT_PROPERTY_STEPS=%q: want a positive number", s)
		}
		cfg.steps, cfg.budget = n, 0
	}
	for _, k := range strings.Split(os.Getenv("ADMIT_PROPERTY_SKIP"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			if k != "cache" && !slices.ContainsFunc(propKinds, func(p struct {
				name   string
				weight int
			}) bool {
				return p.name == k
			}) {
				tb.Fatalf("ADMIT_PROPERTY_SKIP: unknown operation kind %q", k)
			}
			cfg.skip[k] = true
		}
	}
	return cfg
}

// propCheck generates cfg's run, executes it on a fresh backend and, on a
// failure, shrinks it.
func propCheck(t *testing.T, cfg propConfig, open func(testing.TB) propBackend) {
	t.Logf("seed %d (replay: ADMIT_PROPERTY_SEED=%d), %d operations", cfg.seed, cfg.seed, cfg.steps)
	rng := rand.New(rand.NewPCG(cfg.seed, 0x9e3779b97f4a7c15))
	w := newPropWorld(rng)
	ops := genPropOps(rng, w, cfg.steps, cfg.skip)
	start := time.Now()
	var deadline time.Time
	if cfg.budget > 0 {
		deadline = start.Add(cfg.budget)
	}
	fail, ran := propExec(t, open(t), w, ops, deadline)
	if fail == nil {
		if ran < len(ops) {
			t.Logf("the time budget (%v) ran out: %d of %d operations ran", cfg.budget, ran, len(ops))
		}
		t.Logf("%d operations passed in %v", ran, time.Since(start).Round(time.Millisecond))
		return
	}
	t.Errorf("seed %d, operation %d of %d: %v", cfg.seed, fail.step+1, len(ops), fail)
	min := propShrink(t, open, w, ops[:fail.step+1], fail)
	var b strings.Builder
	for i, op := range min {
		fmt.Fprintf(&b, "\n\t%d. %s", i+1, op.describe(w))
	}
	t.Errorf("shortest failing sequence found (%d operations; world: %s):%s", len(min), w, b.String())
}

// propShrink removes operations from ops while the run still fails the
// same way (delta debugging), bounded in tries and time, and returns what
// is left.
func propShrink(t *testing.T, open func(testing.TB) propBackend, w propWorld, ops []propOp, fail *propFailure) []propOp {
	deadline := time.Now().Add(30 * time.Second)
	tries := 0
	fails := func(cand []propOp) ([]propOp, bool) {
		tries++
		var f *propFailure
		t.Run("shrink", func(t *testing.T) {
			f, _ = propExec(t, open(t), w, cand, time.Time{})
		})
		if f == nil || f.category != fail.category {
			return nil, false
		}
		return cand[:f.step+1], true
	}
	n := 2
	for len(ops) >= 2 && tries < 400 && time.Now().Before(deadline) {
		chunk := (len(ops) + n - 1) / n
		reduced := false
		for i := 0; i < len(ops) && tries < 400 && time.Now().Before(deadline); i += chunk {
			cand := append(slices.Clone(ops[:i]), ops[min(i+chunk, len(ops)):]...)
			if len(cand) == 0 {
				continue
			}
			if got, ok := fails(cand); ok {
				ops, reduced = got, true
				n = max(n-1, 2)
				break
			}
		}
		if !reduced {
			if n >= len(ops) {
				break
			}
			n = min(2*n, len(ops))
		}
	}
	t.Logf("shrinking: %d tries", tries)
	return ops
}

// propWorld is what a run's operations name: keys, their Specs, ids.
type propWorld struct {
	keys  []string
	specs []admit.Spec // each key's Spec
	alts  []admit.Spec // another Spec for each key, for ids reused with another request
	ids   []string
}

// The hostile keys and ids the pools draw from. The first five keys and
// three ids hold the once-record names that would collide were a record
// named without its key's length: key k and {k}
// with one id; a{t} with id x:once:y and a{t}:once:x with id y; {k}:once:x
// with id y and {k} with id x:once:y.
var (
	propCollisionKeys = []string{"k", "{k}", "a{t}", "a{t}:once:x", "{k}:once:x"}
	propHostileKeys   = []string{"{}", "{}x", "a{b}c", "a{b}c\x00", "{{a}}", "{{a}", "b}", "\x00", "\xff\xfe", "x\r\ny", "{t}:{u}", ":once:", "once:{k}", "}{"}
	propCollisionIDs  = []string{"x", "y", "x:once:y"}
	propHostileIDs    = []string{"{", "}", "{x}", "\x00", "\xff", "\r\n", ":once:", "once", "x:once:", ":"}
)

// propDraw adds to vals, until it holds 7, values drawn from hostile or,
// one time in three, random strings of 1 to maxLen bytes, none twice.
func propDraw(rng *rand.Rand, vals, hostile []string, maxLen int) []string {
	for len(vals) < 7 {
		v := hostile[rng.IntN(len(hostile))]
		if rng.IntN(3) == 0 {
			v = propRandomString(rng, 1+rng.IntN(maxLen))
		}
		if !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	return vals
}

func newPropWorld(rng *rand.Rand) propWorld {
	var w propWorld
	for _, k := range propCollisionKeys {
		if rng.IntN(10) < 8 {
			w.keys = append(w.keys, k)
		}
	}
	w.keys = propDraw(rng, w.keys, propHostileKeys, 12)
	// A long key: its record's name is longer still.
	w.keys = append(w.keys, "{L}"+propRandomString(rng, 300+rng.IntN(700)))
	for range w.keys {
		w.specs = append(w.specs, propSpec(rng))
		w.alts = append(w.alts, propSpec(rng))
	}
	w.ids = append(w.ids, propCollisionIDs...)
	w.ids = propDraw(rng, w.ids, propHostileIDs, 10)
	w.ids = append(w.ids, propRandomString(rng, admit.MaxOnceIDLen)) // at the bound
	return w
}

// propRandomString draws n bytes, mostly from an alphabet of braces, the
// record separator's letters and binary bytes.
func propRandomString(rng *rand.Rand, n int) string {
	const alphabet = "ak{}:once\x00\xff\r\n "
	b := make([]byte, n)
	for i := range b {
		if rng.IntN(20) == 0 {
			b[i] = byte(rng.IntN(256))
		} else {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
	}
	return string(b)
}

func propSpec(rng *rand.Rand) admit.Spec {
	intervals := []time.Duration{time.Millisecond, 7 * time.Millisecond, 50 * time.Millisecond, 333 * time.Millisecond, time.Second, 2 * time.Second}
	iv := intervals[rng.IntN(len(intervals))]
	if rng.IntN(3) == 0 {
		iv = time.Duration(1000+rng.Int64N(2_000_000)) * time.Microsecond
	}
	return admit.MustSpec(admit.Every(iv), 1+rng.IntN(9))
}

func (w propWorld) String() string {
	short := func(ss []string) []string {
		var out []string
		for _, s := range ss {
			out = append(out, propShort(s))
		}
		return out
	}
	return fmt.Sprintf("keys %q, Specs %v, ids %q", short(w.keys), w.specs, short(w.ids))
}

// propOp is one operation, drawn in advance so that a run can be replayed
// and shrunk: every choice is made here, and the few that depend on the
// state (which live record to reuse) are resolved at run time from pick.
type propOp struct {
	kind   string
	i, j   int // first and second key; j < 0: one bucket
	c1, c2 int // Costs (0 means 1)
	id     int
	cached bool          // on the Limiter WithDenialCache
	adv    time.Duration // advance: the clock step; see advKind
	advTo  int           // advance: 1 to the last RetryAfter, 2 to 1µs short of it
	part   int           // settle: the unused part refunded
	wait   time.Duration // Wait's deadline
	pick   int           // reuse, foreign, invalid: which variant
}

func genPropOps(rng *rand.Rand, w propWorld, n int, skip map[string]bool) []propOp {
	total := 0
	for _, k := range propKinds {
		if !skip[k.name] {
			total += k.weight
		}
	}
	if total == 0 {
		return nil
	}
	ops := make([]propOp, 0, n)
	for len(ops) < n {
		x := rng.IntN(total)
		var kind string
		for _, k := range propKinds {
			if skip[k.name] {
				continue
			}
			if x < k.weight {
				kind = k.name
				break
			}
			x -= k.weight
		}
		op := propOp{kind: kind, i: rng.IntN(len(w.keys)), j: -1, id: rng.IntN(len(w.ids)), cached: rng.IntN(2) == 0 && !skip["cache"], pick: rng.IntN(1 << 20)}
		if rng.IntN(3) > 0 {
			if j := rng.IntN(len(w.keys)); j != op.i {
				op.j = j
			}
		}
		cost := func(k int) int {
			if rng.IntN(2) == 0 { // the cache matches on Cost: keep 1 common
				return rng.IntN(2)
			}
			return rng.IntN(w.specs[k].Burst() + 1)
		}
		op.c1 = cost(op.i)
		if op.j >= 0 {
			op.c2 = cost(op.j)
		}
		switch kind {
		case "advance":
			iv := w.specs[rng.IntN(len(w.specs))].Interval()
			switch x := rng.IntN(100); {
			case x < 10:
			case x < 40:
				op.adv = time.Duration(rng.Int64N(int64(iv) + 1))
			case x < 55:
				op.advTo = 1 + rng.IntN(2)
			case x < 70:
				op.adv = time.Duration(rng.Int64N(int64(iv) * 15))
			case x < 80:
				op.adv = -time.Duration(rng.Int64N(int64(2 * time.Second)))
			case x < 83:
				op.adv = admit.OnceWindow + time.Duration(rng.Int64N(int64(time.Second)))
			default:
				op.adv = time.Duration(rng.Int64N(int64(2 * iv)))
			}
			op.adv = op.adv.Truncate(time.Microsecond)
		case "settle":
			op.part = rng.IntN(max(op.c1, 1) + 1)
		case "wait":
			op.wait = time.Duration(1+rng.IntN(4)) * time.Millisecond
		}
		ops = append(ops, op)
	}
	return ops
}

func (op propOp) describe(w propWorld) string {
	if op.kind == "deploy" {
		return fmt.Sprintf("deploy %q's other Spec, %v in place of %v", propShort(w.keys[op.i]), w.alts[op.i], w.specs[op.i])
	}
	if op.kind == "advance" {
		switch op.advTo {
		case 1:
			return "advance the clock to the last RetryAfter"
		case 2:
			return "advance the clock to 1µs before the last RetryAfter"
		}
		return "advance the clock " + op.adv.String()
	}
	if op.kind == "reuse" {
		return fmt.Sprintf("reuse the id of a live record for another request (variant %d; with no record: once on %q, id %q)", op.pick, propShort(w.keys[op.i]), propShort(w.ids[op.id]))
	}
	s := fmt.Sprintf("%s %q (%v, cost %d)", op.kind, propShort(w.keys[op.i]), w.specs[op.i], op.c1)
	if op.j >= 0 {
		s += fmt.Sprintf(" then %q (%v, cost %d)", propShort(w.keys[op.j]), w.specs[op.j], op.c2)
	}
	switch op.kind {
	case "once", "settle", "lost", "reuse", "foreign":
		s += fmt.Sprintf(", id %q", propShort(w.ids[op.id]))
	}
	switch op.kind {
	case "settle":
		s += fmt.Sprintf(", refund %d unless replayed", op.part)
	case "wait":
		s += fmt.Sprintf(", deadline %v", op.wait)
	case "foreign", "invalid":
		s += fmt.Sprintf(", variant %d", op.pick)
	}
	if op.cached {
		s += ", on the Limiter WithDenialCache"
	}
	return s
}

// propShort quotes long strings by their start and length.
func propShort(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%s...(%d bytes)", s[:24], len(s))
	}
	return s
}

// propBackend is a server the property test runs on, with three Limiters:
// a plain one, one WithDenialCache whose scripts are counted, and a plain
// one behind a proxy that can lose a reply.
type propBackend interface {
	plain() *admit.Limiter
	cached() *admit.Limiter
	lossy() *admit.Limiter
	// warmLossy makes sure the lossy Limiter's client is connected.
	warmLossy(ctx context.Context) error
	sentCached() int64 // scripts the cached Limiter sent so far
	proxy() *delayproxy.Proxy
	// advance moves the server's clock by d.
	advance(ctx context.Context, d time.Duration) error
	// clock reads the server's clock, in µs.
	clock(ctx context.Context) (int64, error)
	snapshot(ctx context.Context) (propSnap, error)
	// reap makes the server drop every key whose time has come.
	reap(ctx context.Context) error
	// setString SETs key to value with the absolute expiry atMs.
	setString(ctx context.Context, key, value string, atMs int64) error
	expiry() model.Expiry
	// exact reports whether clock is the script's clock exactly (a server
	// whose clock stands still between the test's steps).
	exact() bool
}

// propKey is one key as a snapshot holds it.
type propKey struct {
	typ string // "hash", "string", or another TYPE
	val string // a hash: its fields, sorted, "f=v" joined with "\n"; a string: itself
	// exp is when the key goes, in µs on the server's clock; 0 with no
	// expiry.
	exp int64
}

// propSnap is every key on the server.
type propSnap map[string]propKey

func (s propSnap) equal(o propSnap) bool {
	if len(s) != len(o) {
		return false
	}
	for k, v := range s {
		if o[k] != v {
			return false
		}
	}
	return true
}

// diff describes how o differs from s.
func (s propSnap) diff(o propSnap) string {
	var d []string
	for _, k := range propSortedKeys(s, o) {
		a, aok := s[k]
		b, bok := o[k]
		if a != b || aok != bok {
			d = append(d, fmt.Sprintf("%q: %s -> %s", propShort(k), a.describe(aok), b.describe(bok)))
		}
	}
	return strings.Join(d, "; ")
}

func (k propKey) describe(ok bool) string {
	if !ok {
		return "absent"
	}
	return fmt.Sprintf("%s %q expiring at %d", k.typ, k.val, k.exp)
}

func propSortedKeys(snaps ...propSnap) []string {
	set := map[string]bool{}
	for _, m := range snaps {
		for k := range m {
			set[k] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// propFailure is a broken property: the operation it broke at and what.
type propFailure struct {
	step     int
	category string // what kind of property broke, for shrinking
	msg      string
	history  []string
}

func (f *propFailure) Error() string {
	return fmt.Sprintf("%s: %s\nafter:\n\t%s", f.category, f.msg, strings.Join(f.history, "\n\t"))
}

// propCall is one call to a Limiter.
type propCall struct {
	method   string // AllowOrdered, AllowOrderedOnce, Peek, Refund, Wait
	via      int
	id       string
	first    admit.Request
	second   *admit.Request
	deadline time.Duration // Wait
}

const (
	viaPlain = iota
	viaCached
	viaLossy
)

func (c propCall) String() string {
	s := fmt.Sprintf("%s(%q cost %d", c.method, propShort(c.first.Key), c.first.Cost)
	if c.second != nil {
		s += fmt.Sprintf(", %q cost %d", propShort(c.second.Key), c.second.Cost)
	}
	if c.method == "AllowOrderedOnce" {
		s += fmt.Sprintf(", id %q", propShort(c.id))
	}
	s += ")"
	switch c.via {
	case viaCached:
		s += " on the cached Limiter"
	case viaLossy:
		s += " through the proxy that loses its reply"
	}
	return s
}

// propGot is what a call returned.
type propGot struct {
	d    admit.Decision
	err  error
	sent bool // the cached Limiter sent a script
	lost bool // the proxy lost the reply
	// took is the host time the call took: a Wait whose deadline came
	// before it sent anything took at least its deadline.
	took time.Duration
}

// propRun is one run: the backend, the model, and the bookkeeping of the
// invariants that do not need the model.
type propRun struct {
	b propBackend
	w propWorld
	// ms are the model's states that agree with everything seen so far:
	// one, but for a call whose outcome the test did not see (a lost
	// reply) on a server whose clock runs on, where each moment the call
	// may have run at is a state until a later call tells them apart.
	ms      []*model.Server
	cache   *model.Cache
	foreign map[string]string // values the run SET, by key

	step      int
	history   []string
	lastRetry time.Duration
	clock     int64 // the server's clock at the last call, µs
	fwd       int64 // server time elapsed forward so far, µs
	net       map[string]int64
	netFrom   map[string]int64         // fwd when net[key] started counting
	charged   map[model.RecordID]int64 // fwd of each id's last charge
	snapAt    int64                    // the server's clock after the last snapshot
	callT0    int64                    // the server's clock before the last call
	callT1    int64                    // and after it
	waited    time.Duration            // slept away from expiries and for commands in flight
	maxStates int                      // the most states of the model at once
	lost      *propLost                // the last call, if its reply was lost
	learnt    int                      // clocks of lost calls learnt from a replay
	// Keys whose time came while the clock was being stepped back, which
	// the server had kept or dropped (stepBack).
	keptLate, droppedLate int
}

// propExec runs ops on b, until deadline unless it is zero, and returns
// the first broken property, or nil, and the number of operations run.
func propExec(tb testing.TB, b propBackend, w propWorld, ops []propOp, deadline time.Time) (*propFailure, int) {
	ctx := context.Background()
	now, err := b.clock(ctx)
	if err != nil {
		tb.Fatalf("read the server clock: %v", err)
	}
	ran := len(ops)
	// A deploy swaps a key's Spec with its other one: the run's own copy.
	w.specs, w.alts = slices.Clone(w.specs), slices.Clone(w.alts)
	r := &propRun{
		b: b, w: w, ms: []*model.Server{model.NewServer(now, b.expiry())}, cache: model.NewCache(), foreign: map[string]string{},
		clock: now, net: map[string]int64{}, netFrom: map[string]int64{}, charged: map[model.RecordID]int64{},
	}
	for i, op := range ops {
		if !deadline.IsZero() && time.Now().After(deadline) {
			ran = i
			break
		}
		r.step = i
		if r.history = append(r.history, fmt.Sprintf("%d. %s", i+1, op.describe(r.w))); len(r.history) > 8 {
			r.history = r.history[1:]
		}
		if f := r.exec(ctx, op); f != nil {
			f.step, f.history = i, r.history
			return f, i + 1
		}
		r.maxStates = max(r.maxStates, len(r.ms))
	}
	tb.Logf("%d replies lost; slept %v (away from expiries, for commands in flight); at most %d states of the model at once; %d clocks of lost calls learnt from their replays; %d keys kept and %d dropped whose time came during a step back",
		b.proxy().Lost(), r.waited.Round(time.Millisecond), r.maxStates, r.learnt, r.keptLate, r.droppedLate)
	return nil, ran
}

func (r *propRun) fail(category, format string, args ...any) *propFailure {
	return &propFailure{category: category, msg: fmt.Sprintf(format, args...)}
}

func (r *propRun) request(k, cost int) admit.Request {
	return admit.Request{Key: r.w.keys[k], Spec: r.w.specs[k], Cost: cost}
}

func (r *propRun) requests(op propOp) (admit.Request, *admit.Request) {
	first := r.request(op.i, op.c1)
	if op.j < 0 {
		return first, nil
	}
	second := r.request(op.j, op.c2)
	return first, &second
}

// propMethods are the operations that are one call of a method on
// first (and second), by the method they call.
var propMethods = map[string]string{"allow": "AllowOrdered", "all": "AllowAll", "peek": "Peek", "refund": "Refund"}

// exec runs one operation: its calls, each checked.
func (r *propRun) exec(ctx context.Context, op propOp) *propFailure {
	if op.kind == "deploy" {
		// The key's bucket is then decided with another Spec: its stored
		// tokens capped at the new burst, its expiry lengthened, never
		// shortened, by a denial, and a cached denial of the old Spec not
		// served. The charged-tokens bound starts again with the new Spec.
		k := r.w.keys[op.i]
		r.w.specs[op.i], r.w.alts[op.i] = r.w.alts[op.i], r.w.specs[op.i]
		r.net[k], r.netFrom[k] = 0, r.fwd
		return nil
	}
	first, second := r.requests(op)
	via := viaPlain
	if op.cached {
		via = viaCached
	}
	once := propCall{method: "AllowOrderedOnce", via: via, id: r.w.ids[op.id], first: first, second: second}
	switch op.kind {
	case "advance":
		d := op.adv
		switch op.advTo {
		case 1:
			d = r.lastRetry
		case 2:
			d = max(r.lastRetry-time.Microsecond, 0)
		}
		if d < 0 && !r.b.exact() {
			return r.stepBack(ctx, d)
		}
		if err := r.b.advance(ctx, d); err != nil {
			return r.fail("error", "advance the clock: %v", err)
		}
		if r.b.exact() {
			for _, m := range r.ms {
				m.Advance(d)
			}
			if d > 0 {
				r.fwd += d.Microseconds()
			}
			r.clock = r.ms[0].Now
		}
		return nil
	case "allow", "all", "peek", "refund":
		_, f := r.call(ctx, propCall{method: propMethods[op.kind], via: via, first: first, second: second})
		return f
	case "wait":
		_, f := r.call(ctx, propCall{method: "Wait", via: via, first: first, second: second, deadline: op.wait})
		return f
	case "once":
		_, f := r.call(ctx, once)
		return f
	case "settle":
		return r.settle(ctx, op, once)
	case "lost":
		// The reply is lost after the server ran the call; the caller
		// retries with the same id and settles only a fresh admission.
		r.b.proxy().LoseReply([]byte("EVAL"))
		lossy := once
		lossy.via = viaLossy
		got, f := r.call(ctx, lossy)
		r.b.proxy().LoseReply([]byte("\x00never\x00")) // disarmed
		if f != nil || got.err == nil {
			return f
		}
		return r.settle(ctx, op, once)
	case "reuse":
		c, ok := r.reuse(op)
		if !ok { // no live record: decide under the op's id
			c = once
		}
		_, f := r.call(ctx, c)
		return f
	case "foreign":
		return r.setForeign(ctx, op)
	case "invalid":
		_, f := r.call(ctx, r.invalid(op, via))
		return f
	}
	return r.fail("error", "unknown operation %q", op.kind)
}

// settle reserves then settles (docs/budgets.md): it runs once, an
// AllowOrderedOnce, and refunds the unused part (op.part) of a fresh
// admission's first Cost, never of a replay.
func (r *propRun) settle(ctx context.Context, op propOp, once propCall) *propFailure {
	got, f := r.call(ctx, once)
	if f != nil || got.err != nil || !got.d.Allowed() || got.d.Replayed() || op.part == 0 {
		return f
	}
	unused := once.first
	unused.Cost = min(op.part, max(once.first.Cost, 1))
	_, f = r.call(ctx, propCall{method: "Refund", via: once.via, first: unused})
	return f
}

// reuse builds a call that reuses the id of a live record for another
// request: another Spec, Cost, second key, or number of buckets.
func (r *propRun) reuse(op propOp) (propCall, bool) {
	var live []model.RecordID
	for rid, rec := range r.ms[0].Records {
		if !rec.Foreign {
			live = append(live, rid)
		}
	}
	if len(live) == 0 {
		return propCall{}, false
	}
	sort.Slice(live, func(a, b int) bool {
		return live[a].Key < live[b].Key || live[a].Key == live[b].Key && live[a].ID < live[b].ID
	})
	rid := live[op.pick%len(live)]
	rec := r.ms[0].Records[rid]
	fi := slices.Index(r.w.keys, rid.Key)
	first := admit.Request{Key: rid.Key, Spec: rec.Request.FirstSpec, Cost: rec.Request.FirstCost}
	var second *admit.Request
	if rec.Request.Buckets == 2 {
		second = &admit.Request{Key: rec.Request.SecondKey, Spec: rec.Request.SecondSpec, Cost: rec.Request.SecondCost}
	}
	orig := model.FingerprintOf(first, second)
	for v := range 6 {
		f, s := first, second
		switch (op.pick/7 + v) % 6 {
		case 0: // another first Spec
			f.Spec = r.w.alts[fi]
			f.Cost = min(f.Cost, f.Spec.Burst())
		case 1: // another first Cost
			f.Cost = f.Cost%f.Spec.Burst() + 1
		case 2: // one bucket instead of two, or two instead of one
			if s != nil {
				s = nil
			} else {
				other := r.request((fi+1+op.pick%(len(r.w.keys)-1))%len(r.w.keys), 1)
				s = &other
			}
		case 3: // another second key
			if s == nil {
				continue
			}
			sk := slices.Index(r.w.keys, s.Key)
			k := (sk + 1 + op.pick%(len(r.w.keys)-1)) % len(r.w.keys)
			if k == fi {
				k = (k + 1) % len(r.w.keys)
			}
			other := r.request(k, 1)
			s = &other
		case 4: // another second Cost
			if s == nil {
				continue
			}
			other := *s
			other.Cost = other.Cost%other.Spec.Burst() + 1
			s = &other
		case 5: // another second Spec
			if s == nil {
				continue
			}
			other := *s
			other.Spec = r.w.alts[slices.Index(r.w.keys, s.Key)]
			other.Cost = min(other.Cost, other.Spec.Burst())
			s = &other
		}
		if s != nil && s.Key == f.Key {
			continue
		}
		if model.FingerprintOf(f, s) != orig {
			return propCall{method: "AllowOrderedOnce", via: viaPlain, id: rid.ID, first: f, second: s}, true
		}
	}
	return propCall{}, false
}

// invalid builds a call that admit refuses before sending.
func (r *propRun) invalid(op propOp, via int) propCall {
	first, second := r.requests(op)
	switch op.pick % 9 {
	case 0:
		first.Cost = first.Spec.Burst() + 1
		return propCall{method: "AllowOrdered", via: via, first: first, second: second}
	case 1:
		first.Cost = -1
		return propCall{method: "Refund", via: via, first: first, second: second}
	case 2:
		first.Key = ""
		return propCall{method: "AllowOrdered", via: via, first: first, second: second}
	case 3:
		first.Spec = admit.Spec{}
		return propCall{method: "Peek", via: via, first: first, second: second}
	case 4:
		s := first
		return propCall{method: "AllowOrdered", via: via, first: first, second: &s}
	case 5:
		return propCall{method: "AllowOrderedOnce", via: via, id: "", first: first, second: second}
	case 6:
		return propCall{method: "AllowOrderedOnce", via: via, id: r.w.ids[len(r.w.ids)-1] + "x", first: first, second: second}
	case 7:
		first.Key = "b}" + first.Key // untagged and holding "}"
		if strings.Contains(first.Key, "{") {
			first.Key = "b}"
		}
		return propCall{method: "AllowOrderedOnce", via: via, id: "x", first: first, second: second}
	default:
		first.Cost = first.Spec.Burst() + 1
		return propCall{method: "Wait", via: via, first: first, second: second, deadline: time.Millisecond}
	}
}

// setForeign SETs a string where admit keeps a bucket or a once-record, as
// an operator might, with an expiry.
func (r *propRun) setForeign(ctx context.Context, op propOp) *propFailure {
	values := []string{"hello", "0 0 4 -1", "", "0 0 4 -1|", "1 5 0 -1"}
	value := values[op.pick%len(values)]
	now, err := r.b.clock(ctx)
	if err != nil {
		return r.fail("error", "read the clock: %v", err)
	}
	atMs := now/1000 + 1000 + int64(op.pick%5000)
	key := r.w.keys[op.i]
	rid := model.RecordID{Key: key, ID: r.w.ids[op.id]}
	if op.pick%2 == 1 {
		name, err := admit.OnceKey(rid.Key, rid.ID)
		if err != nil {
			return nil // no record for this pair
		}
		key = name
	}
	if err := r.b.setString(ctx, key, value, atMs); err != nil {
		return r.fail("error", "SET %q: %v", key, err)
	}
	r.foreign[key] = value
	for _, m := range r.ms {
		if !r.b.exact() {
			m.SetNow(now)
		}
		if op.pick%2 == 1 {
			m.SetForeignRecord(rid, atMs*1000)
		} else {
			m.SetForeign(key, atMs*1000)
		}
	}
	if op.pick%2 == 1 {
		delete(r.charged, rid) // an operator overwrote the record
		return nil
	}
	r.net[key], r.netFrom[key] = 0, r.fwd // an operator reset the bucket
	return nil
}

var propReasons = []error{admit.ErrOnceIDReused, admit.ErrCorruptState, admit.ErrWrongType, admit.ErrCrossSlot, admit.ErrInvalidRequest}

// run sends one call.
func (r *propRun) send(ctx context.Context, c propCall) propGot {
	l := r.b.plain()
	switch c.via {
	case viaCached:
		l = r.b.cached()
	case viaLossy:
		l = r.b.lossy()
	}
	var got propGot
	switch c.method {
	case "AllowOrdered":
		got.d, got.err = l.AllowOrdered(ctx, c.first, c.second)
	case "AllowAll":
		got.d, got.err = l.AllowAll(ctx, c.first, c.second)
	case "AllowOrderedOnce":
		got.d, got.err = l.AllowOrderedOnce(ctx, c.id, c.first, c.second)
	case "Peek":
		got.d, got.err = l.Peek(ctx, c.first, c.second)
	case "Refund":
		got.err = l.Refund(ctx, c.first, c.second)
	case "Wait":
		wctx, cancel := context.WithTimeout(ctx, c.deadline)
		got.d, got.err = l.Wait(wctx, c.first, c.second)
		cancel()
	}
	return got
}

// expect is the model's answer to c.
func expect(m *model.Server, c propCall) (model.Outcome, error) {
	switch c.method {
	case "AllowOrdered":
		return m.AllowOrdered(c.first, c.second)
	case "AllowAll":
		return m.AllowAll(c.first, c.second)
	case "AllowOrderedOnce":
		return m.AllowOrderedOnce(c.id, c.first, c.second)
	case "Peek":
		return m.Peek(c.first, c.second)
	case "Refund":
		return model.Outcome{}, m.Refund(c.first, c.second)
	case "Wait":
		return m.WaitAttempt(c.first, c.second)
	}
	panic("unknown method " + c.method)
}

// validation is the refusal admit gives c before sending anything.
func validation(c propCall) error {
	if c.method == "AllowOrderedOnce" {
		return model.ValidateOnce(c.id, c.first, c.second)
	}
	return model.Validate(c.first, c.second)
}

// call sends c, checks every property, and updates the model.
func (r *propRun) call(ctx context.Context, c propCall) (propGot, *propFailure) {
	if c.method == "Wait" && !r.b.exact() {
		// The server's clock moves while Wait sleeps: only a Wait that the
		// model decides at its first attempt is predictable.
		o, err := expect(r.ms[0].Clone(), c)
		if err == nil && !o.Allowed && o.RetryAfter < 20*c.deadline {
			return propGot{}, nil
		}
	}
	if !r.b.exact() {
		if err := r.awayFromExpiries(ctx); err != nil {
			return propGot{}, r.fail("error", "%v", err)
		}
	}
	before, err := r.b.snapshot(ctx)
	if err != nil {
		return propGot{}, r.fail("error", "snapshot: %v", err)
	}
	t0, err := r.b.clock(ctx)
	if err != nil {
		return propGot{}, r.fail("error", "read the clock: %v", err)
	}
	if c.via == viaLossy {
		// Connect before the clock is read: the call's interval is then
		// one round trip, not a dial.
		if err := r.b.warmLossy(ctx); err != nil {
			return propGot{}, r.fail("error", "%v", err)
		}
	}
	sent0, lost0 := r.b.sentCached(), r.b.proxy().Lost()
	local0 := time.Now()
	got := r.send(ctx, c)
	local1 := time.Now()
	got.took = local1.Sub(local0)
	got.sent = r.b.sentCached() > sent0
	got.lost = r.b.proxy().Lost() > lost0
	if errors.Is(got.err, admit.ErrOutcomeUnknown) && !got.lost {
		// A command may still be in flight (a Wait's deadline came while
		// it was): let it land before looking.
		if err := r.quiesce(ctx); err != nil {
			return got, r.fail("error", "%v", err)
		}
	}
	t1, err := r.b.clock(ctx)
	if err != nil {
		return got, r.fail("error", "read the clock: %v", err)
	}
	after, err := r.b.snapshot(ctx)
	if err != nil {
		return got, r.fail("error", "snapshot: %v", err)
	}
	r.snapAt = t1
	if !r.b.exact() {
		// A key may go between the call and the snapshot's reading of it.
		if r.snapAt, err = r.b.clock(ctx); err != nil {
			return got, r.fail("error", "read the clock: %v", err)
		}
	}
	desc := c.String()
	if got.err != nil {
		desc += fmt.Sprintf(": error %v", got.err)
	} else if c.method == "Refund" {
		desc += ": ok"
	} else {
		desc += fmt.Sprintf(": %v", model.Of(got.d))
	}
	r.history[len(r.history)-1] += "\n\t   " + desc

	// Every error has one class, and a not-executed call changed nothing;
	// but for Wait, whose not-executed error means that no token stays
	// taken (ErrNotExecuted's doc): its attempts may have written, and
	// the state is the model's after them (checked below).
	if got.err != nil {
		ne, ou := errors.Is(got.err, admit.ErrNotExecuted), errors.Is(got.err, admit.ErrOutcomeUnknown)
		if ne == ou {
			return got, r.fail("class", "%s: the error is classed not executed %v and outcome unknown %v: want exactly one", c, ne, ou)
		}
		if ne && c.method != "Wait" && !r.unchanged(before, after) {
			return got, r.fail("class", "%s: classed not executed, but it changed %s", c, before.diff(after))
		}
	}
	if f := r.checkExpiries(c, after); f != nil {
		return got, f
	}

	// A call admit refuses before sending.
	if verr := validation(c); verr != nil {
		for _, s := range propReasons {
			if errors.Is(verr, s) && !errors.Is(got.err, s) {
				return got, r.fail("decision", "%s: %v; the model refuses it before sending: %v", c, got.err, verr)
			}
		}
		if !errors.Is(got.err, admit.ErrNotExecuted) || got.d.Allowed() || got.sent {
			return got, r.fail("decision", "%s: %v, %v (sent %v); want a refusal before sending: %v", c, model.Of(got.d), got.err, got.sent, verr)
		}
		return got, nil
	}
	if c.method == "AllowOrderedOnce" {
		if _, err := admit.OnceKey(c.first.Key, c.id); err != nil {
			return got, r.fail("decision", "onceKey(%q, %q) refuses a pair the model accepts: %v", c.first.Key, c.id, err)
		}
	}

	// A call the cached Limiter answered without the server.
	if c.via == viaCached && !got.sent {
		if !r.unchanged(before, after) {
			return got, r.fail("state", "%s sent nothing, yet the state changed: %s", c, before.diff(after))
		}
		switch {
		case c.method == "Wait" && got.err != nil && got.d == (admit.Decision{}):
			if errors.Is(got.err, admit.ErrNotExecuted) && errors.Is(got.err, context.DeadlineExceeded) && got.took >= c.deadline {
				break // the deadline came before anything was sent (a loaded machine)
			}
			if !r.cache.Holds(c.first, local0) {
				return got, r.fail("cache", "%s: Wait ended with %v without sending anything, with no cached denial in force", c, got.err)
			}
		case c.method == "Wait" && got.err == nil:
			return got, r.fail("cache", "%s: Wait returned %v without the server", c, model.Of(got.d))
		case c.method == "AllowOrdered" || c.method == "AllowAll" || c.method == "Wait" || c.method == "Peek":
			if err := r.cache.Check(c.first, local0, model.Of(got.d)); err != nil {
				return got, r.fail("cache", "%s: %v", c, err)
			}
		default:
			return got, r.fail("cache", "%s: %v, %v without sending anything", c, model.Of(got.d), got.err)
		}
		return got, nil
	}

	// The server answered: compare with the model at the script's clock.
	if l := r.lost; l != nil && got.err == nil && got.d.Replayed() && got.d.RetryAfter > 0 {
		// The call before lost its reply, so the clock its script read
		// was not known; this replay of its decision tells it: the
		// candidates for the replayed RetryAfter hold the clock it was
		// made at, and the states there that make exactly the decision
		// replayed, and every key as it was after that call (its record's
		// expiry taken from the server, as compareState does), are added.
		replayed := model.Of(got.d)
		replayed.Replayed = false
		snapAt := r.snapAt
		r.callT0, r.callT1, r.snapAt = l.t0, l.t1, l.snapAt
		var learnt []*model.Server
		for _, p := range l.pre {
			for _, x := range r.candidates(p, l.c, got, l.after, l.t0, l.t1) {
				m := p.Clone()
				m.SetNow(x)
				if o, err := expect(m, l.c); err == nil && o == replayed && r.compareState(m, l.after) == nil &&
					!slices.ContainsFunc(learnt, func(o *model.Server) bool { return propSameState(o, m) }) {
					learnt = append(learnt, m)
				}
			}
		}
		r.snapAt = snapAt
		r.ms = append(r.ms, learnt...)
		r.learnt += len(learnt)
	}
	r.callT0, r.callT1 = t0, t1
	r.lost = nil
	pre := r.ms
	matches, diffs := r.expectAt(c, got, after, t0, t1)
	if diffs != nil {
		return got, r.fail(diffs[0], "%s:\n\t%s", c, strings.Join(diffs[1:], "\n\t"))
	}
	r.ms = nil
	for _, m := range matches {
		r.ms = append(r.ms, m.m)
	}
	if c.via == viaLossy && got.lost && !r.b.exact() {
		r.lost = &propLost{pre: pre, c: c, after: after, snapAt: r.snapAt, t0: t0, t1: t1}
	}
	want, werr := matches[0].want, matches[0].werr
	if !r.b.exact() {
		r.observe(t1)
	}
	if werr != nil {
		return got, nil
	}
	r.lastRetry = want.RetryAfter
	return got, r.account(c, want, got, local1)
}

// propLost is a call whose reply was lost on a server whose clock runs
// on: the states before it, and the interval its script ran in.
type propLost struct {
	pre    []*model.Server
	c      propCall
	after  propSnap // the state after it
	snapAt int64    // the server's clock after that snapshot
	t0, t1 int64
}

// propMatch is a state of the model that agrees with a call: the model's
// answer, and its state after the call.
type propMatch struct {
	want model.Outcome
	werr error
	m    *model.Server
}

// expectAt finds, for each of the model's states, the clocks in [t0, t1]
// at which the model's answer to c is what the server did: the call's
// outcome (as far as the test saw it) and the whole state. On a server
// whose clock is exact, t0 = t1 is the model's clock. It returns every
// distinct state that agrees (at most 64), or the differences at the clock
// that came closest (the fewest), the first being their category.
func (r *propRun) expectAt(c propCall, got propGot, after propSnap, t0, t1 int64) ([]propMatch, []string) {
	var first []string // the differences at the clock that came closest
	tried := 0
	var matches []propMatch
	add := func(want model.Outcome, werr error, m *model.Server) {
		for _, o := range matches {
			if propSameState(o.m, m) {
				return
			}
		}
		if len(matches) < 64 {
			matches = append(matches, propMatch{want, werr, m})
		}
	}
	for _, h := range r.ms {
		for _, now := range r.candidates(h, c, got, after, t0, t1) {
			m := h.Clone()
			if r.b.exact() {
				if now != m.Now {
					return nil, []string{"error", fmt.Sprintf("the server's clock reads %d µs, the model's %d", now, m.Now)}
				}
			} else {
				m.SetNow(now)
			}
			done := m.Clone()
			want, werr := expect(done, c)
			diffs := r.compare(c, got, want, werr, done, after)
			if diffs != nil && c.method == "Wait" && !r.b.exact() && werr == nil && want.Denied == 2 {
				// The attempt and its refund are two scripts, each with
				// its own clock: the refund's is a later one.
				for _, later := range r.candidates(h, c, got, after, now, t1) {
					twice := m.Clone()
					if _, err := twice.AllowOrdered(c.first, c.second); err != nil {
						break
					}
					twice.SetNow(later)
					if err := twice.Refund(c.first, nil); err != nil {
						break
					}
					if d := r.compare(c, got, want, werr, twice, after); d == nil {
						done, diffs = twice, nil
						break
					}
				}
			}
			if diffs == nil {
				if !(c.via == viaLossy && got.lost) {
					// The outcome was seen: two clocks that agree with it
					// and with every key leave the same state.
					return []propMatch{{want, werr, done}}, nil
				}
				add(want, werr, done)
				continue
			}
			if c.method == "Wait" && errors.Is(got.err, admit.ErrOutcomeUnknown) {
				// The deadline came with an attempt in flight: it may not
				// have run, or its refund may not have.
				none, charged := m.Clone(), m.Clone()
				if r.compareState(none, after) == nil {
					add(model.Outcome{}, nil, none)
					continue
				}
				if o, err := charged.AllowOrdered(c.first, c.second); err == nil && o.Denied == 2 && r.compareState(charged, after) == nil {
					add(model.Outcome{}, nil, charged)
					continue
				}
			}
			if c.method == "Wait" && got.d == (admit.Decision{}) && errors.Is(got.err, admit.ErrNotExecuted) &&
				errors.Is(got.err, context.DeadlineExceeded) && got.took >= c.deadline {
				// The deadline came before the first attempt was sent (a
				// loaded machine): nothing ran.
				if none := m.Clone(); r.compareState(none, after) == nil {
					add(model.Outcome{}, nil, none)
					continue
				}
			}
			tried++
			if first == nil || len(diffs) < len(first)-1 {
				first = append(diffs, fmt.Sprintf("(the model at server clock %d µs, of the clocks tried the one with the fewest differences; the call ran within [%d, %d]; %d state(s) of the model)", now, t0, t1, len(r.ms)))
			}
		}
	}
	if matches == nil && first != nil {
		first[len(first)-1] = strings.TrimSuffix(first[len(first)-1], ")") + fmt.Sprintf(", %d clocks tried)", tried)
	}
	if matches == nil {
		return nil, first
	}
	return matches, nil
}

// propSameState reports whether two states of the model hold the same keys.
func propSameState(a, b *model.Server) bool {
	return maps.Equal(a.Buckets, b.Buckets) && maps.Equal(a.Records, b.Records) && maps.Equal(a.Foreign, b.Foreign)
}

// compare returns what differs between what the server did and the
// model's answer, want or werr, and state m: nil when nothing does, else
// a category and the differences.
func (r *propRun) compare(c propCall, got propGot, want model.Outcome, werr error, m *model.Server, after propSnap) []string {
	var d []string
	category := "decision"
	switch {
	case c.via == viaLossy && got.lost:
		if !errors.Is(got.err, admit.ErrOutcomeUnknown) || errors.Is(got.err, admit.ErrNotExecuted) {
			d = append(d, fmt.Sprintf("the reply was lost after the script ran: %v; want ErrOutcomeUnknown", got.err))
		}
	case werr != nil:
		for _, s := range propReasons {
			if errors.Is(werr, s) && !errors.Is(got.err, s) {
				d = append(d, fmt.Sprintf("got %v, %v; the model refuses it: %v", model.Of(got.d), got.err, werr))
				break
			}
		}
		if got.err == nil || !errors.Is(got.err, admit.ErrNotExecuted) || got.d.Allowed() {
			d = append(d, fmt.Sprintf("got %v, %v; want a not-executed refusal: %v", model.Of(got.d), got.err, werr))
		}
	case c.method == "Refund":
		if got.err != nil {
			d = append(d, fmt.Sprintf("error %v", got.err))
		}
	case c.method == "Wait" && got.err != nil:
		// The deadline came: after the model's denial, or with the last
		// attempt in flight (outcome unknown), or, on the cached Limiter,
		// after a denial from the cache.
		denial := got.d == (admit.Decision{}) || model.Of(got.d) == want || c.via == viaCached && got.d.Denied == 1
		if !errors.Is(got.err, context.DeadlineExceeded) || got.d.Allowed() || !denial ||
			want.Allowed && !errors.Is(got.err, admit.ErrOutcomeUnknown) {
			d = append(d, fmt.Sprintf("got %v, %v; the model's attempt %v: want that denial (or none) and the deadline's error", model.Of(got.d), got.err, want))
		}
	default:
		if got.err != nil || model.Of(got.d) != want {
			d = append(d, fmt.Sprintf("got %v, %v; the model: %v", model.Of(got.d), got.err, want))
			if model.Of(got.d).Replayed != want.Replayed {
				category = "replayed"
			}
		}
	}
	if sd := r.compareState(m, after); sd != nil {
		if d == nil {
			category = sd[0]
		}
		d = append(d, sd[1:]...)
	}
	if d == nil {
		return nil
	}
	return append([]string{category}, d...)
}

// compareState compares every key on the server with the model's: nil
// when they agree, else a category and the differences.
func (r *propRun) compareState(m *model.Server, s propSnap) []string {
	want := propSnap{}
	var d []string
	category := "state"
	slack := map[string]bool{}
	for k, b := range m.Buckets {
		want[k] = propKey{typ: "hash", val: "tokens=" + strconv.FormatInt(b.Tokens, 10) + "\nts=" + strconv.FormatInt(b.TS, 10), exp: b.ExpireAt}
	}
	for k, at := range m.Foreign {
		want[k] = propKey{typ: "string", val: r.foreign[k], exp: at}
	}
	owner := map[string]model.RecordID{}
	for rid, rec := range m.Records {
		name, err := admit.OnceKey(rid.Key, rid.ID)
		if err != nil {
			d = append(d, fmt.Sprintf("the record of (%q, %q) has no name: %v", rid.Key, rid.ID, err))
			continue
		}
		if admit.KeySlot(name) != admit.KeySlot(rid.Key) {
			d = append(d, fmt.Sprintf("the record of (%q, %q), %q, is in slot %d, its key in %d", rid.Key, propShort(rid.ID), propShort(name), admit.KeySlot(name), admit.KeySlot(rid.Key)))
		}
		o, shared := owner[name]
		if shared {
			category = "collision"
			d = append(d, fmt.Sprintf("the records of (%q, %q) and (%q, %q) share the key %q", o.Key, propShort(o.ID), rid.Key, propShort(rid.ID), propShort(name)))
		}
		if _, ok := want[name]; ok && !shared {
			category = "collision"
			d = append(d, fmt.Sprintf("the record of (%q, %q) is named %q, a bucket's key", rid.Key, propShort(rid.ID), propShort(name)))
		}
		owner[name] = rid
		k := propKey{typ: "string", val: "*", exp: rec.ExpireAt}
		if rec.Foreign {
			k.val = r.foreign[name]
		}
		want[name] = k
		slack[name] = !rec.Foreign
	}
	for _, k := range propSortedKeys(want, s) {
		w, wok := want[k]
		g, gok := s[k]
		if wok && gok && w.val == "*" && g.typ == "string" {
			w.val = g.val // a record's encoding is admit's own
		}
		if wok && gok && slack[k] && !r.b.exact() && w.exp != g.exp && max(w.exp-g.exp, g.exp-w.exp) <= r.callT1-r.callT0+1000 {
			// A real server sets a record's expiry from its clock in whole
			// ms, read when the script starts (Valkey 8) or when it runs
			// SET (Redis 7.0), not from the script's TIME: any ms of the
			// call will do, and the model takes the server's.
			rid := owner[k]
			rec := m.Records[rid]
			rec.ExpireAt = g.exp
			m.Records[rid] = rec
			w.exp = g.exp
		}
		if wok && !gok && !r.b.exact() && r.snapAt/1000 >= w.exp/1000 {
			// Gone between the call and the snapshot; or in its last ms:
			// Redis 7.0 deletes a key whose PEXPIREAT time is not after
			// its clock's ms when the command runs (checkAlreadyExpired:
			// when <= mstime()), which a script preempted for the
			// bucket's TTL between its TIME and its PEXPIREAT reaches.
			continue
		}
		if w == g && wok == gok {
			continue
		}
		what := "key"
		if rid, ok := owner[k]; ok {
			what = fmt.Sprintf("record of (%q, %q)", rid.Key, propShort(rid.ID))
		} else if !wok && g.typ == "string" {
			what = "unexpected string key (a record the model does not have?)"
		}
		d = append(d, fmt.Sprintf("%s %q: server %s, model %s", what, propShort(k), g.describe(gok), w.describe(wok)))
	}
	if d == nil {
		return nil
	}
	return append([]string{category}, d...)
}

// checkExpiries: every key has an expiry.
func (r *propRun) checkExpiries(c propCall, s propSnap) *propFailure {
	for k, v := range s {
		if v.exp <= 0 {
			return r.fail("expiry", "after %s the key %q has no expiry", c, propShort(k))
		}
	}
	return nil
}

// account updates the model-free bookkeeping after a call the server
// answered and checks its invariants: the tokens charged minus refunded
// per bucket, each id charged once, and the denial cache's entries.
func (r *propRun) account(c propCall, want model.Outcome, got propGot, local1 time.Time) *propFailure {
	charge := func(req admit.Request, sign int64) {
		if _, ok := r.netFrom[req.Key]; !ok {
			r.netFrom[req.Key] = r.fwd
		}
		r.net[req.Key] += sign * int64(max(req.Cost, 1))
	}
	switch c.method {
	case "AllowOrdered", "AllowAll", "AllowOrderedOnce", "Wait":
		if want.Replayed {
			break
		}
		if want.Allowed {
			charge(c.first, 1)
			if c.second != nil {
				charge(*c.second, 1)
			}
		} else if want.Denied == 2 && c.method != "Wait" && c.method != "AllowAll" { // Wait refunds it; AllowAll never charges it
			charge(c.first, 1)
		}
	case "Refund":
		charge(c.first, -1)
		if c.second != nil {
			charge(*c.second, -1)
		}
	}
	for _, req := range []*admit.Request{&c.first, c.second} {
		if req == nil {
			continue
		}
		k := slices.Index(r.w.keys, req.Key)
		if k < 0 || req.Spec != r.w.specs[k] {
			r.net[req.Key], r.netFrom[req.Key] = 0, r.fwd // another Spec: a new bound
			continue
		}
		iv := req.Spec.Interval().Microseconds()
		if bound := int64(req.Spec.Burst()) + (r.fwd-r.netFrom[req.Key])/iv; r.net[req.Key] > bound {
			return r.fail("bound", "%s: bucket %q has had %d tokens charged net in %v of server time, over burst + elapsed/interval = %d",
				c, propShort(req.Key), r.net[req.Key], time.Duration(r.fwd-r.netFrom[req.Key])*time.Microsecond, bound)
		}
	}
	if c.method == "AllowOrderedOnce" && want.Charged() {
		rid := model.RecordID{Key: c.first.Key, ID: c.id}
		if at, ok := r.charged[rid]; ok && r.fwd-at < admit.OnceWindow.Microseconds() {
			return r.fail("twice", "%s: id %q charged again %v after its first charge, within OnceWindow", c, propShort(c.id), time.Duration(r.fwd-at)*time.Microsecond)
		}
		r.charged[rid] = r.fwd
	}
	if c.via == viaCached && !want.Replayed {
		switch {
		case c.method == "Refund":
			keys := []string{c.first.Key}
			if c.second != nil {
				keys = append(keys, c.second.Key)
			}
			r.cache.Refunded(keys...)
		case c.method == "Wait" && want.Denied == 2:
			r.cache.Refunded(c.first.Key)
		case want.Denied == 1:
			r.cache.Denied(c.first, local1, want)
		}
	}
	return nil
}

// candidates are the server clocks, within [t0, t1], at which the model
// is worth asking: the bounds, and every moment where the model's answer
// changes (a millisecond, a token of a bucket the call names) or from which
// the server's answer says it ran (a RetryAfter, a ts stored as now).
func (r *propRun) candidates(h *model.Server, c propCall, got propGot, after propSnap, t0, t1 int64) []int64 {
	if r.b.exact() {
		return []int64{t0}
	}
	cands := []int64{t0, t1}
	add := func(x int64) {
		if x >= t0 && x <= t1 && !slices.Contains(cands, x) {
			cands = append(cands, x)
		}
	}
	for ms := t0/1000 + 1; ms*1000 <= t1; ms++ {
		// Either side of a whole ms, and of rounding up to one (an
		// expiry from max(ts, now) rounded up).
		add(ms*1000 - 1)
		add(ms * 1000)
		add(ms*1000 + 1)
	}
	for _, req := range []*admit.Request{&c.first, c.second} {
		if req == nil {
			continue
		}
		iv, burst := req.Spec.Interval().Microseconds(), int64(req.Spec.Burst())
		if b, ok := h.Buckets[req.Key]; ok {
			for _, base := range []int64{b.TS, b.TS - (burst-1)*iv} {
				if base < t0 {
					base += (t0 - base) / iv * iv
				}
				for x := base; x <= t1+1; x += iv {
					add(x - 1)
					add(x)
				}
			}
		}
		if k, ok := after[req.Key]; ok && k.typ == "hash" {
			for _, line := range strings.Split(k.val, "\n") {
				if ts, ok := strings.CutPrefix(line, "ts="); ok {
					if v, err := strconv.ParseInt(ts, 10, 64); err == nil {
						add(v)
						add(v - (burst-1)*iv)
					}
				}
			}
		}
	}
	if got.d.RetryAfter > 0 { // a denial (Wait's error comes with its own)
		// Between two of the clocks above the decision is the same, and
		// its RetryAfter falls by as much as the clock moves on: the
		// clock that gives got's RetryAfter is a candidate.
		for _, x := range slices.Clone(cands) {
			m := h.Clone()
			m.SetNow(x)
			if o, err := expect(m, c); err == nil && o.Denied == got.d.Denied && o.RetryAfter > 0 {
				add(x + (o.RetryAfter - got.d.RetryAfter).Microseconds())
			}
		}
	}
	return cands
}

// unchanged reports whether after is before, but for keys whose time came
// before the snapshot (on a server whose clock runs on).
func (r *propRun) unchanged(before, after propSnap) bool {
	for k, v := range before {
		if w, ok := after[k]; ok && w != v || !ok && (r.b.exact() || r.snapAt/1000 <= v.exp/1000) {
			return false
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			return false
		}
	}
	return true
}

// stepBack steps a real server's clock back by -d (d < 0). A server
// drops an expired key only when a command touches it (or its expiry
// cycle samples it), and after the step back a key it left would live
// again; so every key whose time has come goes first: the harness reads
// the clock (t0), then touches every key (reap). A key gone at t0 is gone
// from the server after the reap, and the model drops it (SetNow(t0)).
// The server's clock runs on until the step, to at most t1 - d, t1 read
// after it; a key whose time came after t0 and by then was dropped or not
// as the server's touches and its expiry cycle fell: the model keeps
// exactly the keys the server kept (and notes the clock the server
// reached, from the dropped keys' expiries). Every other key must be as
// the model has it, which the next call checks.
func (r *propRun) stepBack(ctx context.Context, d time.Duration) *propFailure {
	t0, err := r.b.clock(ctx)
	if err != nil {
		return r.fail("error", "read the clock: %v", err)
	}
	if err := r.b.reap(ctx); err != nil {
		return r.fail("error", "%v", err)
	}
	for _, m := range r.ms {
		m.SetNow(t0)
	}
	r.observe(t0)
	if err := r.b.advance(ctx, d); err != nil {
		return r.fail("error", "advance the clock: %v", err)
	}
	t1, err := r.b.clock(ctx)
	if err != nil {
		return r.fail("error", "read the clock: %v", err)
	}
	s, err := r.b.snapshot(ctx)
	if err != nil {
		return r.fail("error", "snapshot: %v", err)
	}
	reached := t0
	for _, m := range r.ms {
		late := m.Clone()
		late.SetNow(t1 - d.Microseconds())
		drop := func(key string, at int64) bool {
			if _, ok := s[key]; ok {
				r.keptLate++
				return false
			}
			r.droppedLate++
			reached = max(reached, (at/1000+1)*1000) // the ms after at: the key was gone
			return true
		}
		for k, b := range m.Buckets {
			if _, ok := late.Buckets[k]; !ok && drop(k, b.ExpireAt) {
				delete(m.Buckets, k)
			}
		}
		for rid, rec := range m.Records {
			name, err := admit.OnceKey(rid.Key, rid.ID)
			if _, ok := late.Records[rid]; !ok && err == nil && drop(name, rec.ExpireAt) {
				delete(m.Records, rid)
			}
		}
		for k, at := range m.Foreign {
			if _, ok := late.Foreign[k]; !ok && drop(k, at) {
				delete(m.Foreign, k)
			}
		}
	}
	r.observe(reached)
	return nil
}

// observe notes the server's clock read at t: the server time elapsed
// forward since the last reading counts towards the rate bound.
func (r *propRun) observe(t int64) {
	if t > r.clock {
		r.fwd += t - r.clock
	}
	r.clock = t
}

// quiesce waits (at most 200 ms) until the state stays the same for 20
// ms: a command in flight has run by then.
func (r *propRun) quiesce(ctx context.Context) error {
	prev, err := r.b.snapshot(ctx)
	if err != nil {
		return err
	}
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		r.waited += 20 * time.Millisecond
		s, err := r.b.snapshot(ctx)
		if err != nil {
			return err
		}
		if s.equal(prev) {
			return nil
		}
		prev = s
	}
	return nil
}

// awayFromExpiries waits (at most 50 ms) until no key the model holds
// goes within 3 ms of the server's clock, so that whether a key is there
// at the script's clock is certain.
func (r *propRun) awayFromExpiries(ctx context.Context) error {
	for range 25 {
		now, err := r.b.clock(ctx)
		if err != nil {
			return err
		}
		near := false
		check := func(at int64) {
			if at/1000 >= now/1000-2 && at/1000 <= now/1000+3 {
				near = true
			}
		}
		for _, m := range r.ms {
			for _, b := range m.Buckets {
				check(b.ExpireAt)
			}
			for _, rec := range m.Records {
				check(rec.ExpireAt)
			}
			for _, at := range m.Foreign {
				check(at)
			}
		}
		if !near {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
		r.waited += 2 * time.Millisecond
	}
	return nil
}

// miniBackend is the fast tier: miniredis, whose clock and TTLs move only
// when the test moves them.
type miniBackend struct {
	propLimiters
	srv *miniredis.Miniredis
	now time.Time
}

func newMiniBackend(tb testing.TB) *miniBackend {
	tb.Helper()
	srv, c := minitest.Start(tb)
	return &miniBackend{propLimiters: newPropLimiters(tb, c, srv.Addr()), srv: srv, now: minitest.Epoch}
}

// propLimiters are a backend's three Limiters: plain, with a denial cache
// whose commands it counts, and lossy, through a proxy that can lose a
// reply.
type propLimiters struct {
	pl, ca, lo *admit.Limiter
	lc         valkey.Client // the lossy Limiter's
	sent       *atomic.Int64
	px         *delayproxy.Proxy
}

// newPropLimiters builds them on c, a client to the server at addr, each
// with opts.
func newPropLimiters(tb testing.TB, c valkey.Client, addr string, opts ...admit.Option) propLimiters {
	tb.Helper()
	// The proxy's script must be loaded, so that the command whose reply
	// it loses is the script, not a NOSCRIPT answer.
	if err := c.Do(context.Background(), c.B().ScriptLoad().Script(admit.ScriptSource).Build()).Error(); err != nil {
		tb.Fatalf("SCRIPT LOAD: %v", err)
	}
	px, err := delayproxy.Start(addr, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { px.Close() })
	lc, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{px.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		tb.Fatalf("dial the proxy: %v", err)
	}
	tb.Cleanup(lc.Close)
	l := propLimiters{px: px, sent: new(atomic.Int64), lc: lc}
	l.pl = admit.New(c, opts...)
	l.ca = admit.New(countingClient{c, l.sent}, append([]admit.Option{admit.WithDenialCache(64)}, opts...)...)
	l.lo = admit.New(l.lc, opts...)
	return l
}

func (l *propLimiters) warmLossy(ctx context.Context) error {
	return l.lc.Do(ctx, l.lc.B().Ping().Build()).Error()
}

func (l *propLimiters) plain() *admit.Limiter    { return l.pl }
func (l *propLimiters) cached() *admit.Limiter   { return l.ca }
func (l *propLimiters) lossy() *admit.Limiter    { return l.lo }
func (l *propLimiters) sentCached() int64        { return l.sent.Load() }
func (l *propLimiters) proxy() *delayproxy.Proxy { return l.px }

func (b *miniBackend) expiry() model.Expiry { return model.Countdown }
func (b *miniBackend) exact() bool          { return true }

func (b *miniBackend) advance(_ context.Context, d time.Duration) error {
	b.now = b.now.Add(d)
	b.srv.SetTime(b.now)
	// miniredis counts TTLs down when a command touches the database, by
	// the clock's advance since the last such moment, and forgets a
	// forward step that a backward one undoes before that: touch it now,
	// so that every step counts, as on a server whose clock runs on.
	b.srv.Keys()
	return nil
}

func (b *miniBackend) clock(context.Context) (int64, error) { return b.now.UnixMicro(), nil }

func (b *miniBackend) reap(context.Context) error { return nil } // TTLs are exact

func (b *miniBackend) snapshot(context.Context) (propSnap, error) {
	s := propSnap{}
	for _, k := range b.srv.Keys() {
		var v propKey
		v.typ = b.srv.Type(k)
		switch v.typ {
		case "hash":
			fields, err := b.srv.HKeys(k)
			if err != nil {
				return nil, err
			}
			sort.Strings(fields)
			var parts []string
			for _, f := range fields {
				parts = append(parts, f+"="+b.srv.HGet(k, f))
			}
			v.val = strings.Join(parts, "\n")
		case "string":
			val, err := b.srv.Get(k)
			if err != nil {
				return nil, err
			}
			v.val = val
		}
		if ttl := b.srv.TTL(k); ttl > 0 {
			v.exp = b.now.UnixMicro() + ttl.Microseconds()
		}
		s[k] = v
	}
	return s, nil
}

func (b *miniBackend) setString(_ context.Context, key, value string, atMs int64) error {
	b.srv.Del(key) // SET replaces a value of any type
	if err := b.srv.Set(key, value); err != nil {
		return err
	}
	b.srv.SetTTL(key, time.UnixMilli(atMs).Sub(b.now))
	return nil
}

// countingClient counts the commands a Limiter sends.
type countingClient struct {
	valkey.Client
	n *atomic.Int64
}

func (c countingClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	c.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c countingClient) DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	c.n.Add(int64(len(cmds)))
	return c.Client.DoMulti(ctx, cmds...)
}

// The property test's real-server tier: the same
// generated operations against a valkey-server or redis-server started
// with the clock-shift shim (testserver.StartClockShifted), so that the
// test steps the server's clock forward and back; and concurrent callers
// with lost replies and retries (TestIntegrationPropertyConcurrent).
//
// A real server's clock runs on between the test's steps, so each call is
// compared with the model at the clock its script read: the test reads the
// server's TIME before and after the call and asks the model at every
// moment of that interval where its answer could change (propRun.candidates);
// one of them must match the call's outcome and the whole state exactly.

// propIntegrationSteps is the default number of operations on a real
// server: about 6 s on 2 idle CPUs; a quarter under the race detector, a
// tenth with -short. propIntegrationBudget bounds the time on a loaded
// machine: the run stops at the operation it is at.
const (
	propIntegrationSteps  = 6000
	propIntegrationBudget = 10 * time.Second
)

// TestIntegrationProperty runs the property test's operations on a real
// server whose clock the test steps (testserver.StartClockShifted).
// The server's clock runs on between the test's readings of it, so the
// harness allows a key whose time comes while it steps the clock back to
// be gone or not (propRun.stepBack), a call to have run at any clock
// between its readings (propRun.candidates), and nothing else.
func TestIntegrationProperty(t *testing.T) {
	cfg := propConfigFromEnv(t, propScaled(propIntegrationSteps), propIntegrationBudget)
	srv, clock := testserver.StartClockShifted(t)
	t.Logf("server %s", srv.Version)
	propCheck(t, cfg, func(tb testing.TB) propBackend { return newRealBackend(tb, srv, clock) })
}

// realBackend is a real server started with the clock-shift shim. Each
// run flushes it and sets its clock back to the host's.
type realBackend struct {
	propLimiters
	tb     testing.TB
	c      valkey.Client
	clk    *testserver.Clock
	offset time.Duration
}

// newRealBackend builds its Limiters with opts too.
func newRealBackend(tb testing.TB, srv *testserver.Server, clock *testserver.Clock, opts ...admit.Option) *realBackend {
	tb.Helper()
	b := &realBackend{tb: tb, c: testserver.NewClient(tb, srv), clk: clock}
	clock.Set(tb, 0)
	if err := b.c.Do(context.Background(), b.c.B().Flushall().Build()).Error(); err != nil {
		tb.Fatalf("FLUSHALL: %v", err)
	}
	b.propLimiters = newPropLimiters(tb, b.c, srv.Addr, opts...)
	return b
}

func (b *realBackend) expiry() model.Expiry { return model.Absolute }
func (b *realBackend) exact() bool          { return false }

func (b *realBackend) advance(_ context.Context, d time.Duration) error {
	b.offset += d
	b.clk.Set(b.tb, b.offset)
	return nil
}

func (b *realBackend) clock(ctx context.Context) (int64, error) {
	v, err := b.c.Do(ctx, b.c.B().Time().Build()).AsStrSlice()
	if err != nil || len(v) != 2 {
		return 0, fmt.Errorf("TIME: %v %v", v, err)
	}
	s, err1 := strconv.ParseInt(v[0], 10, 64)
	us, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("TIME: %v", v)
	}
	return s*1_000_000 + us, nil
}

// propDump returns every key with its type, expiry (PEXPIRETIME) and
// value, in one round trip: a test's server is small. Built on first use:
// valkey-go computes a script's SHA-1 when it builds it, which panics at
// package init under GODEBUG=fips140=only (TestIntegrationFIPSOnly's child).
var propDump = sync.OnceValue(func() *valkey.Lua {
	return valkey.NewLuaScript(propDumpSource)
})

const propDumpSource = `
local out = {}
for _, k in ipairs(redis.call('KEYS', '*')) do
  local t = redis.call('TYPE', k).ok
  local v = ''
  if t == 'hash' then
    v = redis.call('HGETALL', k)
  elseif t == 'string' then
    v = redis.call('GET', k)
  end
  out[#out + 1] = {k, t, redis.call('PEXPIRETIME', k), v}
end
return out
`

// reap touches every key with EXISTS (commands, not a script, which
// would leave an expired key in place): the server drops those whose time
// has come.
func (b *realBackend) reap(ctx context.Context) error {
	var cursor uint64
	for range 1000 {
		e, err := b.c.Do(ctx, b.c.B().Scan().Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("SCAN: %w", err)
		}
		if len(e.Elements) > 0 {
			cmds := make(valkey.Commands, 0, len(e.Elements))
			for _, k := range e.Elements {
				cmds = append(cmds, b.c.B().Exists().Key(k).Build())
			}
			for _, r := range b.c.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					return fmt.Errorf("EXISTS: %w", err)
				}
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			return nil
		}
	}
	return nil
}

func (b *realBackend) snapshot(ctx context.Context) (propSnap, error) {
	return dumpSnapshot(ctx, b.c)
}

func dumpSnapshot(ctx context.Context, c valkey.Client) (propSnap, error) {
	rows, err := propDump().Exec(ctx, c, nil, nil).ToArray()
	if err != nil {
		return nil, fmt.Errorf("dump: %w", err)
	}
	s := propSnap{}
	for _, row := range rows {
		f, err := row.ToArray()
		if err != nil || len(f) != 4 {
			return nil, fmt.Errorf("dump: a row of %d fields, %v", len(f), err)
		}
		k, err1 := f[0].ToString()
		typ, err2 := f[1].ToString()
		at, err3 := f[2].AsInt64()
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("dump: %w", err)
		}
		v := propKey{typ: typ}
		if at > 0 {
			v.exp = at * 1000
		}
		switch typ {
		case "hash":
			fv, err := f[3].AsStrSlice()
			if err != nil {
				return nil, fmt.Errorf("dump %q: %w", k, err)
			}
			var parts []string
			for i := 0; i+1 < len(fv); i += 2 {
				parts = append(parts, fv[i]+"="+fv[i+1])
			}
			sort.Strings(parts)
			v.val = strings.Join(parts, "\n")
		case "string":
			if v.val, err = f[3].ToString(); err != nil {
				return nil, fmt.Errorf("dump %q: %w", k, err)
			}
		}
		s[k] = v
	}
	return s, nil
}

func (b *realBackend) setString(ctx context.Context, key, value string, atMs int64) error {
	return b.c.Do(ctx, b.c.B().Set().Key(key).Value(value).Pxat(time.UnixMilli(atMs)).Build()).Error()
}

// TestIntegrationPropertyConcurrent: goroutines share buckets and ids on
// a real server, some through a proxy that loses replies after the server
// ran the call, and every caller retries an outcome-unknown
// AllowOrderedOnce with the same id and settles (refunds the unused part)
// only a fresh admission. The buckets refill once an hour, so that the
// exact state at the end is known: every id was charged once, whatever
// was lost and retried, and each bucket holds its burst minus the charges
// plus the refunds. Then: the admissions of AllowOrdered callers on
// buckets that refill fast stay within burst + elapsed/interval, and every
// key has an expiry. Bounded: ADMIT_PROPERTY_CONCURRENT (a duration; default
// 4s, 1s under -race or -short) of traffic.
func TestIntegrationPropertyConcurrent(t *testing.T) {
	srv := testserver.Own(t)
	ctx := context.Background()
	c := testserver.NewClient(t, srv)
	if err := c.Do(ctx, c.B().ScriptLoad().Script(admit.ScriptSource).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	px, err := delayproxy.Start(srv.Addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	seed := propConfigFromEnv(t, 1, 0).seed
	budget := 4 * time.Second
	if admit.RaceEnabled || testing.Short() {
		budget = time.Second
	}
	if s := os.Getenv("ADMIT_PROPERTY_CONCURRENT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > 10*time.Minute {
			t.Fatalf("ADMIT_PROPERTY_CONCURRENT=%q: want a duration such as 4s, at most 10m", s)
		}
		budget = d
	}
	t.Logf("seed %d (ADMIT_PROPERTY_SEED), %v of traffic", seed, budget)

	const workers = 8
	type bucket struct {
		req      admit.Request
		mu       sync.Mutex
		refunded int64 // tokens the callers settled
	}
	// What the callers saw of each id: a charge made once, replayed to all.
	type observed struct {
		first model.Outcome // Replayed cleared
		calls int           // decisions that charged, fresh or replayed
		fresh int           // of which not replayed: must be 1 at most
		cost  int
	}
	slow := admit.MustSpec(admit.Every(time.Hour), 50)
	fast := admit.MustSpec(admit.Every(2*time.Millisecond), 5)
	slowBuckets := []*bucket{{req: admit.Request{Key: "c:{k}", Spec: slow}}, {req: admit.Request{Key: "c:k", Spec: slow}}, {req: admit.Request{Key: "c:{k}:once:x", Spec: slow}}}
	fastBuckets := []*bucket{{req: admit.Request{Key: "f:{a}", Spec: fast}}, {req: admit.Request{Key: "f:{a}:2", Spec: fast}}}
	ids := []string{"x", "y", "x:once:y", "{", "}", "\x00\xff", "a", "b"}

	var mu sync.Mutex
	seen := map[model.RecordID]observed{}
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	var admitted [2]atomic.Int64
	clientFor := func(lossy bool) valkey.Client {
		addr := srv.Addr
		if lossy {
			addr = px.Addr()
		}
		cl, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	direct, lossy := admit.New(clientFor(false)), admit.New(clientFor(true))
	start, err := (&realBackend{c: c}).clock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(budget)
	var wg sync.WaitGroup
	var calls, retries atomic.Int64
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; time.Now().Before(deadline) && i < 100_000; i++ {
				calls.Add(1)
				if rng.IntN(3) == 0 { // a fast bucket, AllowOrdered
					b := fastBuckets[rng.IntN(2)]
					d, err := direct.AllowOrdered(ctx, b.req, nil)
					if err != nil {
						fail("AllowOrdered %q: %v", b.req.Key, err)
						return
					}
					if d.Allowed() {
						admitted[slices.Index(fastBuckets, b)].Add(1)
					}
					continue
				}
				// Reserve then settle under retries, with ids shared by all
				// workers: most calls replay.
				b := slowBuckets[rng.IntN(len(slowBuckets))]
				id := ids[rng.IntN(len(ids))] + ":" + strconv.Itoa(rng.IntN(40))
				req := b.req
				req.Cost = 1 + int(admit.KeySlot(id+req.Key)%3) // one request per (key, id)
				part := int(admit.KeySlot(req.Key+id) % uint16(req.Cost+1))
				l := direct
				if rng.IntN(4) == 0 {
					l = lossy
					if rng.IntN(2) == 0 {
						px.LoseReply([]byte("EVAL"))
					}
				}
				var d admit.Decision
				var err error
				for attempt := 0; attempt < 5; attempt++ {
					d, err = l.AllowOrderedOnce(ctx, id, req, nil)
					if !errors.Is(err, admit.ErrOutcomeUnknown) {
						break
					}
					retries.Add(1)
					l = direct
				}
				if err != nil {
					fail("AllowOrderedOnce %q id %q: %v", req.Key, id, err)
					return
				}
				rid := model.RecordID{Key: req.Key, ID: id}
				o := model.Of(d)
				if o.Charged() || o.Replayed {
					mu.Lock()
					ob := seen[rid]
					if ob.calls == 0 {
						ob.cost = req.Cost
					}
					ob.calls++
					if o.Charged() {
						ob.fresh++
					}
					plain := o
					plain.Replayed = false
					switch {
					case o.Replayed && o.Denied == 1:
						failures = append(failures, fmt.Sprintf("id %q on %q: a first-bucket denial replayed (%v): it charged nothing and must not be recorded", id, req.Key, o))
					case ob.fresh > 1:
						failures = append(failures, fmt.Sprintf("id %q on %q charged twice: %v, then %v", id, req.Key, ob.first, o))
					case ob.calls > 1 && plain != ob.first:
						failures = append(failures, fmt.Sprintf("id %q on %q: %v, and before %v: a replay must be the decision made", id, req.Key, o, ob.first))
					}
					if ob.calls == 1 {
						ob.first = plain
					}
					seen[rid] = ob
					mu.Unlock()
				}
				if o.Allowed && !o.Replayed && part > 0 { // settle a fresh admission
					unused := req
					unused.Cost = part
					if err := direct.Refund(ctx, unused, nil); err != nil {
						fail("Refund: %v", err)
					} else {
						b.mu.Lock()
						b.refunded += int64(part)
						b.mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	end, err := (&realBackend{c: c}).clock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d calls by %d workers, %d lost replies retried, %d ids charged", calls.Load(), workers, retries.Load(), len(seen))
	if px.Lost() == 0 {
		t.Error("the proxy lost no reply: the retries were not exercised")
	}
	// Every id charged once: its record is there (OnceWindow is longer
	// than the test), and each slow bucket holds exactly its burst minus
	// the Costs of its records plus what the callers settled.
	charges := map[string]int64{}
	for rid, ob := range seen {
		name, err := admit.OnceKey(rid.Key, rid.ID)
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.Do(ctx, c.B().Exists().Key(name).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("id %q on %q was charged (%v), but its record %q is gone", rid.ID, rid.Key, ob.first, name)
		}
		charges[rid.Key] += int64(ob.cost)
	}
	for _, b := range slowBuckets {
		tk, err := c.Do(ctx, c.B().Hget().Key(b.req.Key).Field("tokens").Build()).ToString()
		if valkey.IsValkeyNil(err) {
			tk = strconv.Itoa(b.req.Spec.Burst())
		} else if err != nil {
			t.Fatal(err)
		}
		if want := strconv.FormatInt(int64(b.req.Spec.Burst())-charges[b.req.Key]+b.refunded, 10); tk != want {
			t.Errorf("bucket %q holds %s tokens; its ids were charged %d and %d refunded, so want %s", b.req.Key, tk, charges[b.req.Key], b.refunded, want)
		}
	}
	// The rate bound on the fast buckets.
	elapsed := end - start
	for i, b := range fastBuckets {
		bound := int64(b.req.Spec.Burst()) + elapsed/b.req.Spec.Interval().Microseconds()
		if n := admitted[i].Load(); n > bound {
			t.Errorf("bucket %q admitted %d in %v of server time, over burst + elapsed/interval = %d", b.req.Key, n, time.Duration(elapsed)*time.Microsecond, bound)
		}
	}
	// Every key has an expiry.
	s, err := dumpSnapshot(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range s {
		if v.exp <= 0 {
			t.Errorf("key %q has no expiry", k)
		}
	}
}
