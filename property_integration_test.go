package admit_test

// The property test's real-server tier (see property_test.go): the same
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

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"slices"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/delayproxy"
	"github.com/admitkit/admit/internal/model"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

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

// TestIntegrationPropertyWithoutACLPrecheck runs the same operations, with
// every Limiter built with WithoutACLPrecheck, against the same model: for
// a user allowed every write (the test's), the option changes no decision
// and no byte of state. A third of TestIntegrationProperty's operations.
func TestIntegrationPropertyWithoutACLPrecheck(t *testing.T) {
	cfg := propConfigFromEnv(t, propScaled(propIntegrationSteps/3), propIntegrationBudget/2)
	srv, clock := testserver.StartClockShifted(t)
	t.Logf("server %s", srv.Version)
	propCheck(t, cfg, func(tb testing.TB) propBackend {
		return newRealBackend(tb, srv, clock, admit.WithoutACLPrecheck())
	})
}

// realBackend is a real server started with the clock-shift shim. Each
// run flushes it and sets its clock back to the host's.
type realBackend struct {
	tb         testing.TB
	c          valkey.Client
	clk        *testserver.Clock
	offset     time.Duration
	pl, ca, lo *admit.Limiter
	lc         valkey.Client // the lossy Limiter's
	sent       *atomic.Int64
	px         *delayproxy.Proxy
}

// newRealBackend builds its Limiters with opts too.
func newRealBackend(tb testing.TB, srv *testserver.Server, clock *testserver.Clock, opts ...admit.Option) *realBackend {
	tb.Helper()
	ctx := context.Background()
	b := &realBackend{tb: tb, c: testserver.NewClient(tb, srv), clk: clock, sent: new(atomic.Int64)}
	clock.Set(tb, 0)
	if err := b.c.Do(ctx, b.c.B().Flushall().Build()).Error(); err != nil {
		tb.Fatalf("FLUSHALL: %v", err)
	}
	if err := b.c.Do(ctx, b.c.B().ScriptLoad().Script(admit.ScriptSource).Build()).Error(); err != nil {
		tb.Fatalf("SCRIPT LOAD: %v", err)
	}
	px, err := delayproxy.Start(srv.Addr, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { px.Close() })
	b.px = px
	lc, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{px.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		tb.Fatalf("dial the proxy: %v", err)
	}
	tb.Cleanup(lc.Close)
	b.pl = admit.New(b.c, opts...)
	b.ca = admit.New(countingClient{b.c, b.sent}, append([]admit.Option{admit.WithDenialCache(64)}, opts...)...)
	b.lc, b.lo = lc, admit.New(lc, opts...)
	return b
}

func (b *realBackend) warmLossy(ctx context.Context) error {
	return b.lc.Do(ctx, b.lc.B().Ping().Build()).Error()
}

func (b *realBackend) plain() *admit.Limiter    { return b.pl }
func (b *realBackend) cached() *admit.Limiter   { return b.ca }
func (b *realBackend) lossy() *admit.Limiter    { return b.lo }
func (b *realBackend) sentCached() int64        { return b.sent.Load() }
func (b *realBackend) proxy() *delayproxy.Proxy { return b.px }
func (b *realBackend) expiry() model.Expiry     { return model.Absolute }
func (b *realBackend) exact() bool              { return false }

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
// package init under GODEBUG=fips140=only (TestFIPSOnly's child).
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
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
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
