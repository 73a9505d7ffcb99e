package admit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/alicebob/miniredis/v2"
	"github.com/valkey-io/valkey-go"
)

// check is one conformance rule. run returns nil when the deployment obeys
// the rule, a skip (see skipf) when the rule cannot be checked here, and
// otherwise an error that says what was seen. Checks report instead of
// failing, so TestMutants can run them against broken scripts.
type check struct {
	rule string
	run  func(ctx context.Context, e *env) error
}

// skipError marks a check that cannot run on this deployment.
type skipError struct{ reason string }

func (s *skipError) Error() string { return "skipped: " + s.reason }

func skipf(format string, args ...any) error { return &skipError{fmt.Sprintf(format, args...)} }

func isSkip(err error) (string, bool) {
	var s *skipError
	if errors.As(err, &s) {
		return s.reason, true
	}
	return "", false
}

// checkTimeout bounds every check, whatever a broken script does.
const checkTimeout = 60 * time.Second

// deployment is the server or cluster under test, with one client to it.
// It is shared by the envs of every script TestMutants tries.
type deployment struct {
	target *testserver.Target
	c      valkey.Client
	slots  []slotRange // cluster slot map; nil on a standalone server
	base   string      // every key the suite writes starts with base
	seq    atomic.Int64

	keyslot struct { // a cluster-enabled server for keyslot-matches-server
		once sync.Once
		c    valkey.Client
		err  error
	}
}

type slotRange struct {
	lo, hi int64
	addr   string
}

// openDeployment connects to the target of testserver.Deployment. At the
// end it deletes every key under its own prefix, and nothing else.
func openDeployment(t *testing.T) *deployment {
	t.Helper()
	target := testserver.Deployment(t)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: target.Addrs, DisableCache: true})
	if err != nil {
		t.Fatalf("dial %s: %v", strings.Join(target.Addrs, ","), err)
	}
	t.Cleanup(c.Close)
	if got := c.Mode() == valkey.ClientModeCluster; got != target.Cluster {
		t.Fatalf("%s: client cluster mode %v, want %v", target.Name, got, target.Cluster)
	}
	var random [6]byte
	rand.Read(random[:])
	d := &deployment{target: target, c: c, base: "admit-conformance:" + hex.EncodeToString(random[:]) + ":"}
	t.Cleanup(func() { testserver.DeleteWithPrefix(c, d.base) })
	if target.Cluster {
		if d.slots, err = readSlots(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if d.keyslot.c != nil {
			d.keyslot.c.Close()
		}
	})
	return d
}

func readSlots(ctx context.Context, c valkey.Client) ([]slotRange, error) {
	entries, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	var slots []slotRange
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: unexpected entry %v", e)
		}
		lo, _ := f[0].AsInt64()
		hi, _ := f[1].AsInt64()
		node, _ := f[2].ToArray()
		if len(node) < 2 {
			return nil, fmt.Errorf("CLUSTER SLOTS: unexpected node %v", f[2])
		}
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		slots = append(slots, slotRange{lo, hi, host + ":" + strconv.FormatInt(port, 10)})
	}
	return slots, nil
}

// env is a deployment with a script under test: the shipped script, or a
// mutant of it.
type env struct {
	*deployment
	src  string                            // script source under test
	wrap func(valkey.Client) valkey.Client // a mutant's change to what is sent; nil for none
	l    *Limiter                          // the Limiter under test, on d.c
}

func newEnv(d *deployment, src string, wrap func(valkey.Client) valkey.Client) *env {
	e := &env{deployment: d, src: src, wrap: wrap}
	e.l = e.limiterOn(d.c)
	return e
}

// limiterOn returns a Limiter running the script under test on c.
func (e *env) limiterOn(c valkey.Client) *Limiter {
	return e.limiterWith(c, e.src)
}

func (e *env) limiterWith(c valkey.Client, src string) *Limiter {
	if e.wrap != nil {
		c = e.wrap(c)
	}
	return newLimiter(c, valkey.NewLuaScript(src))
}

// prefix returns a fresh key prefix under the deployment's base, with a
// hash tag, so every key of one check is in one cluster slot.
func (e *env) prefix(rule string) string {
	return fmt.Sprintf("%s{%s:%d}:", e.base, rule, e.seq.Add(1))
}

// node returns a client for the node that holds key, and its address.
func (e *env) node(key string) (valkey.Client, string, error) {
	if e.slots == nil {
		return e.c, e.target.Addrs[0], nil
	}
	slot := int64(keySlot(key))
	for _, r := range e.slots {
		if r.lo <= slot && slot <= r.hi {
			if n, ok := e.c.Nodes()[r.addr]; ok {
				return n, r.addr, nil
			}
			return nil, "", fmt.Errorf("no client for node %s", r.addr)
		}
	}
	return nil, "", fmt.Errorf("slot %d of %q has no node", slot, key)
}

// nodeClient returns a standalone client to the node that holds key,
// through dial if given (a proxy address), closed by the returned func.
func (e *env) nodeClient(key, dial string) (valkey.Client, error) {
	if dial == "" {
		_, addr, err := e.node(key)
		if err != nil {
			return nil, err
		}
		dial = addr
	}
	// One connection, so that which connection carries a command is known;
	// otherwise the options users have by default (retries included).
	return valkey.NewClient(valkey.ClientOption{InitAddress: []string{dial}, DisableCache: true, ForceSingleClient: true, PipelineMultiplex: -1})
}

// quiet reports whether the server's command counters move only with the
// suite's own commands, so they can be compared exactly.
func (e *env) quiet() bool { return e.target.Destructive() }

// serverTime returns TIME, in µs, of the node that holds key.
func (e *env) serverTime(ctx context.Context, key string) (int64, error) {
	n, _, err := e.node(key)
	if err != nil {
		return 0, err
	}
	t, err := n.Do(ctx, n.B().Time().Build()).AsIntSlice()
	if err != nil || len(t) != 2 {
		return 0, fmt.Errorf("TIME: %v %v", t, err)
	}
	return t[0]*1_000_000 + t[1], nil
}

func (e *env) stats(ctx context.Context, key string) (map[string]testserver.CmdStat, error) {
	n, _, err := e.node(key)
	if err != nil {
		return nil, err
	}
	return testserver.ReadCommandStats(ctx, n)
}

// snapshot is a key's state byte for byte: its DUMP payload and its
// absolute expiry (PEXPIRETIME, which does not tick down as PTTL does).
type snapshot struct {
	exists   bool
	dump     string
	expireAt int64 // ms since the epoch; -1 without expiry
}

func (s snapshot) String() string {
	if !s.exists {
		return "absent"
	}
	return fmt.Sprintf("DUMP %q PEXPIRETIME %d", s.dump, s.expireAt)
}

func (e *env) snap(ctx context.Context, key string) (snapshot, error) {
	dump, err := e.c.Do(ctx, e.c.B().Dump().Key(key).Build()).ToString()
	if valkey.IsValkeyNil(err) {
		return snapshot{}, nil
	}
	if err != nil {
		return snapshot{}, fmt.Errorf("DUMP %s: %w", key, err)
	}
	at, err := e.c.Do(ctx, e.c.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		return snapshot{}, fmt.Errorf("PEXPIRETIME %s: %w", key, err)
	}
	return snapshot{exists: true, dump: dump, expireAt: at}, nil
}

// bucketObs is a stored bucket as the server holds it.
type bucketObs struct {
	exists   bool
	fields   map[string]string
	expireAt int64
}

func (e *env) readBucket(ctx context.Context, key string) (bucketObs, error) {
	m, err := e.c.Do(ctx, e.c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return bucketObs{}, fmt.Errorf("HGETALL %s: %w", key, err)
	}
	if len(m) == 0 {
		return bucketObs{}, nil
	}
	at, err := e.c.Do(ctx, e.c.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		return bucketObs{}, fmt.Errorf("PEXPIRETIME %s: %w", key, err)
	}
	return bucketObs{exists: true, fields: m, expireAt: at}, nil
}

// parse returns the schema fields of a bucket, or an error naming what
// breaks the key schema: exactly the fields tokens and ts, each a decimal
// integer in canonical form.
func (b bucketObs) parse() (tokens, ts int64, err error) {
	if !b.exists {
		return 0, 0, errors.New("bucket absent")
	}
	if got := slices.Sorted(maps.Keys(b.fields)); !slices.Equal(got, []string{"tokens", "ts"}) {
		return 0, 0, fmt.Errorf("hash fields %v, want exactly [tokens ts]", got)
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"tokens", &tokens}, {"ts", &ts}} {
		s := b.fields[f.name]
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || strconv.FormatInt(n, 10) != s {
			return 0, 0, fmt.Errorf("field %s = %q, want a decimal integer", f.name, s)
		}
		*f.v = n
	}
	return tokens, ts, nil
}

// seed stores a bucket as given, with an expiry that the script never sets
// (hours past any TTL it writes), so any refresh of the expiry shows.
func (e *env) seed(ctx context.Context, key string, st mstate, nowMicros int64) error {
	cmds := valkey.Commands{
		e.c.B().Del().Key(key).Build(),
		e.c.B().Hset().Key(key).FieldValue().FieldValue("tokens", strconv.FormatInt(st.tokens, 10)).FieldValue("ts", strconv.FormatInt(st.ts, 10)).Build(),
		e.c.B().Pexpireat().Key(key).MillisecondsTimestamp(nowMicros/1000 + 7777*time.Hour.Milliseconds()).Build(),
	}
	for _, r := range e.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("seeding %s: %w", key, err)
		}
	}
	return nil
}

// seedAt is a bucket to seed before a decision: tokens, and ts relative to
// the server's TIME when seeding.
type seedAt struct{ tokens, tsOffset int64 }

const sec = int64(1_000_000) // µs

// decideAndCompare seeds buckets, reads the server's TIME, makes one
// decision with l, reads TIME again, and compares everything with the
// model at both ends of that window: the decision, RetryAfter, the fields
// and expiry of every bucket the model writes, and, byte for byte, every
// key it does not write. Fields that depend on the exact instant (a fresh
// ts, an expiry) must lie between the two ends; all else must be equal.
func (e *env) decideAndCompare(ctx context.Context, l *Limiter, first Request, second *Request, seeds map[string]seedAt) (Decision, error) {
	keys := []string{first.Key}
	if second != nil {
		keys = append(keys, second.Key)
	}
	t0, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return Decision{}, err
	}
	states := map[string]mstate{}
	for _, k := range keys {
		if s, ok := seeds[k]; ok {
			states[k] = mstate{s.tokens, t0 + s.tsOffset}
			if err := e.seed(ctx, k, states[k], t0); err != nil {
				return Decision{}, err
			}
		} else if err := e.c.Do(ctx, e.c.B().Del().Key(k).Build()).Error(); err != nil {
			return Decision{}, err
		}
	}
	before := map[string]snapshot{}
	for _, k := range keys {
		if before[k], err = e.snap(ctx, k); err != nil {
			return Decision{}, err
		}
	}
	tBefore, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return Decision{}, err
	}
	d, callErr := l.AllowOrdered(ctx, first, second)
	tAfter, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return Decision{}, err
	}
	if callErr != nil {
		return d, fmt.Errorf("AllowOrdered: %w", callErr)
	}
	dLo, wLo := modelDecide(tBefore, states, first, second)
	dHi, wHi := modelDecide(tAfter, states, first, second)
	if dLo.Denied != dHi.Denied || len(wLo) != len(wHi) {
		return d, fmt.Errorf("inconclusive: the model's decision changes within the server window of %dµs", tAfter-tBefore)
	}
	var errs []error
	if d.Denied != dLo.Denied || !between(dLo.RetryAfter.Microseconds(), dHi.RetryAfter.Microseconds(), d.RetryAfter.Microseconds()) {
		errs = append(errs, fmt.Errorf("decision %v, want %v (RetryAfter %v..%v by the server clock)", d, dLo, dLo.RetryAfter, dHi.RetryAfter))
	}
	for _, k := range keys {
		short := strings.TrimPrefix(k, e.base)
		lo, written := wLo[k]
		if !written {
			after, err := e.snap(ctx, k)
			if err != nil {
				return d, err
			}
			if after != before[k] {
				errs = append(errs, fmt.Errorf("%s must not change: before %v, after %v", short, before[k], after))
			}
			continue
		}
		hi := wHi[k]
		obs, err := e.readBucket(ctx, k)
		if err != nil {
			return d, err
		}
		tk, ts, err := obs.parse()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", short, err))
			continue
		}
		// The expiry is the server's ms clock when the script ran plus the
		// TTL the model gives at that instant; each lies between its
		// values at the two ends of the window.
		expLo := tBefore/1000 + min(lo.ttlMs, hi.ttlMs)
		expHi := (tAfter+999)/1000 + max(lo.ttlMs, hi.ttlMs)
		if !between(lo.tokens, hi.tokens, tk) || !between(lo.ts, hi.ts, ts) || !between(expLo, expHi, obs.expireAt) {
			errs = append(errs, fmt.Errorf("%s = tokens %d ts %d PEXPIRETIME %d; want tokens %d..%d ts %d..%d PEXPIRETIME %d..%d",
				short, tk, ts, obs.expireAt, lo.tokens, hi.tokens, lo.ts, hi.ts, expLo, expHi))
		}
	}
	return d, errors.Join(errs...)
}

func between(a, b, x int64) bool {
	return min(a, b) <= x && x <= max(a, b)
}

// mini starts an in-process miniredis whose clock is set by the check,
// running the script under test. stop closes it.
func (e *env) mini() (u *unitEnv, stop func(), err error) {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		return nil, nil, err
	}
	srv.SetTime(unitEpoch)
	srv.ClockTTL(true)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	u = &unitEnv{srv: srv, c: c, l: e.limiterWith(c, e.src), now: unitEpoch}
	return u, func() { c.Close(); srv.Close() }, nil
}

// keyslotClient returns a client that answers CLUSTER KEYSLOT: the
// cluster itself, or a cluster-enabled server started for the purpose.
func (d *deployment) keyslotClient() (valkey.Client, error) {
	if d.target.Cluster {
		return d.c, nil
	}
	d.keyslot.once.Do(func() {
		bin := testserver.Binary()
		if bin == "" || !d.target.Owned {
			d.keyslot.err = skipf("needs a cluster, or a server binary to start a cluster-enabled server")
			return
		}
		srv, err := testserver.Start(bin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		if err != nil {
			d.keyslot.err = err
			return
		}
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			srv.Stop()
			d.keyslot.err = err
			return
		}
		d.keyslot.c = &stopOnClose{Client: c, stop: srv.Stop}
	})
	return d.keyslot.c, d.keyslot.err
}

// stopOnClose stops a server when its client is closed.
type stopOnClose struct {
	valkey.Client
	stop func()
}

func (s *stopOnClose) Close() { s.Client.Close(); s.stop() }

// runConcurrently runs call goroutines × calls times, all goroutines
// released at once, and counts the decisions by Denied. The first error
// ends the run.
func runConcurrently(ctx context.Context, goroutines, calls int, call func(g int) (Decision, error)) ([3]int, error) {
	var counts [3]atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for range calls {
				if ctx.Err() != nil || firstErr.Load() != nil {
					return
				}
				d, err := call(g)
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if int(d.Denied) < len(counts) {
					counts[d.Denied].Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return [3]int{}, *p
	}
	if err := ctx.Err(); err != nil {
		return [3]int{}, err
	}
	return [3]int{int(counts[0].Load()), int(counts[1].Load()), int(counts[2].Load())}, nil
}

// atomic64 counts across goroutines.
type atomic64 struct{ atomic.Int64 }

func (a *atomic64) addIf(b bool) {
	if b {
		a.Add(1)
	}
}

func (a *atomic64) get() int { return int(a.Load()) }
