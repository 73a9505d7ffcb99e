package admittest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/model"
	"github.com/admitkit/admit/internal/serverinfo"
)

// deployment is the server or cluster under test: the client under test, the
// admin client that prepares and inspects keys, and the suite's key prefix.
// It is shared by the envs of every Limiter builder (TestMutants tries
// many).
type deployment struct {
	client  valkey.Client
	admin   valkey.Client
	opt     valkey.ClientOption // what proxy clients copy
	owned   bool
	cluster bool
	version string
	slots   []slotRange // cluster slot map; nil on a standalone server
	// What the server can do, probed once: a server that lacks something
	// is checked another way, which target says.
	counts     bool   // INFO commandstats, compared on a server the suite owns
	dumpHashes bool   // DUMP of a hash; else snapshots compare contents
	addr       string // the standalone server's address
	base       string // every key the suite writes starts with base
	seq        atomic.Int64
	slotOfKey  sync.Map // key → its slot, as CLUSTER KEYSLOT said
}

type slotRange struct {
	lo, hi int64
	addr   string
}

func newDeployment(client valkey.Client, cfg config) (*deployment, error) {
	d := &deployment{client: client, admin: cfg.admin, owned: cfg.owned, base: cfg.prefix}
	if d.admin == nil {
		d.admin = client
	}
	if cfg.clientOpt != nil {
		d.opt = *cfg.clientOpt
	}
	d.cluster = client.Mode() == valkey.ClientModeCluster
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := d.admin.Do(ctx, d.admin.B().Info().Section("server").Build()).ToString()
	switch f := serverinfo.Fields(info); {
	case isRefusal(err):
		d.version = "a server that refuses INFO server"
	case err != nil:
		return nil, fmt.Errorf("INFO server: %w", err)
	case f["valkey_version"] != "":
		d.version = "valkey " + f["valkey_version"]
	default:
		d.version = "redis " + f["redis_version"]
	}
	if d.counts, err = d.probeCounts(ctx); err != nil {
		return nil, err
	}
	if d.dumpHashes, err = d.probeDump(ctx); err != nil {
		return nil, err
	}
	if d.cluster {
		if d.slots, err = readSlots(ctx, d.admin); err != nil {
			return nil, err
		}
		return d, nil
	}
	for addr := range client.Nodes() {
		d.addr = addr
	}
	return d, nil
}

// isRefusal reports whether err is the server's error reply (an unknown
// command, say), not a failure to reach it.
func isRefusal(err error) bool {
	var ve *valkey.ValkeyError
	return errors.As(err, &ve) && !ve.IsNil()
}

// probeCounts reports whether the suite compares the server's command
// counters: only on a server the suite owns, and only if it answers INFO
// commandstats.
func (d *deployment) probeCounts(ctx context.Context) (bool, error) {
	if !d.owned {
		return false, nil
	}
	_, err := serverinfo.CommandStats(ctx, d.admin)
	if isRefusal(err) {
		return false, nil
	}
	return err == nil, err
}

// probeDump reports whether the server dumps a hash (DUMP), by dumping one
// under the suite's prefix. Without it, a snapshot compares a key's type,
// contents and expiry instead of its DUMP payload.
func (d *deployment) probeDump(ctx context.Context) (bool, error) {
	a, key := d.admin, d.base+"{dump-probe}"
	if err := a.Do(ctx, a.B().Hset().Key(key).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
		return false, fmt.Errorf("HSET %s: %w", key, err)
	}
	defer a.Do(ctx, a.B().Del().Key(key).Build())
	err := a.Do(ctx, a.B().Dump().Key(key).Build()).Error()
	if isRefusal(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("DUMP %s: %w", key, err)
	}
	return true, nil
}

// target describes the deployment, for logs and failures.
func (d *deployment) target() string {
	s := d.version + ", standalone"
	if d.cluster {
		primaries := map[string]bool{}
		for _, r := range d.slots {
			primaries[r.addr] = true
		}
		s = fmt.Sprintf("%s, cluster of %d primaries", d.version, len(primaries))
	}
	if !d.dumpHashes {
		s += ", no DUMP of a hash (keys compared by type, contents and expiry)"
	}
	switch {
	case d.owned && !d.counts:
		return s + ", the suite's alone, no INFO commandstats (the proxy's counts stand in)"
	case d.owned:
		return s + ", the suite's alone"
	}
	return s + ", shared (no SCRIPT FLUSH, no server command counts)"
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
		slots = append(slots, slotRange{lo, hi, net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	return slots, nil
}

// env is a deployment with a Limiter builder under test: admit.New, or one
// that builds Limiters around a deliberately broken script.
type env struct {
	*deployment
	newLimiter func(valkey.Client) *admit.Limiter
	l          *admit.Limiter // the Limiter under test, on the client under test
}

// prefix returns a fresh key prefix under the deployment's base, with a
// hash tag, so every key of one rule is in one cluster slot.
func (e *env) prefix(rule string) string {
	return fmt.Sprintf("%s{%s:%d}:", e.base, rule, e.seq.Add(1))
}

// short is key without the suite's base, for messages.
func (e *env) short(key string) string { return strings.TrimPrefix(key, e.base) }

// slotOf returns the cluster slot of key, as the server computes it.
func (e *env) slotOf(ctx context.Context, key string) (int64, error) {
	if s, ok := e.slotOfKey.Load(key); ok {
		return s.(int64), nil
	}
	n, err := e.slotNode()
	if err != nil {
		return 0, err
	}
	s, err := n.Do(ctx, n.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER KEYSLOT %q: %w", key, err)
	}
	e.slotOfKey.Store(key, s)
	return s, nil
}

// slotNode returns a node client of the admin client; any node answers
// CLUSTER KEYSLOT for every key.
func (e *env) slotNode() (valkey.Client, error) {
	for _, r := range e.slots {
		if n, ok := e.admin.Nodes()[r.addr]; ok {
			return n, nil
		}
	}
	return nil, errors.New("no admin client for any node of the slot map")
}

// node returns an admin client for the node that holds key, and the
// node's address.
func (e *env) node(ctx context.Context, key string) (valkey.Client, string, error) {
	if !e.cluster {
		return e.admin, e.addr, nil
	}
	slot, err := e.slotOf(ctx, key)
	if err != nil {
		return nil, "", err
	}
	for _, r := range e.slots {
		if r.lo <= slot && slot <= r.hi {
			if n, ok := e.admin.Nodes()[r.addr]; ok {
				return n, r.addr, nil
			}
			return nil, "", fmt.Errorf("no admin client for node %s", r.addr)
		}
	}
	return nil, "", fmt.Errorf("slot %d of %q has no node", slot, key)
}

// proxyClient returns a standalone client through the proxy at addr, with
// the credentials of the client under test, and one connection, so that
// which connection carries a command is known. Otherwise it has the options
// users have by default, retries included.
func (e *env) proxyClient(addr string) (valkey.Client, error) {
	o := e.opt
	return valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true, PipelineMultiplex: -1,
		Username: o.Username, Password: o.Password, AuthCredentialsFn: o.AuthCredentialsFn,
		SelectDB: o.SelectDB, ClientName: o.ClientName, Dialer: o.Dialer,
	})
}

// proxied is a Limiter under test (l) on a one-connection client (c)
// through a fault proxy in front of a node.
type proxied struct {
	*faultProxy
	c valkey.Client
	l *admit.Limiter
}

// close closes the client, then the proxy.
func (p proxied) close() {
	p.c.Close()
	p.faultProxy.close()
}

// viaProxy returns a fault proxy in front of the node that holds prefix,
// a one-connection client through it, and a Limiter under test on it.
// With warm, the Limiter has loaded the script (one call, on
// prefix+"warm"), so that a fault meets the script, not a NOSCRIPT answer.
func (e *env) viaProxy(ctx context.Context, prefix string, warm bool) (proxied, error) {
	_, addr, err := e.node(ctx, prefix)
	if err != nil {
		return proxied{}, err
	}
	proxy, err := startFaultProxy(addr, e.opt.TLSConfig)
	if err != nil {
		return proxied{}, err
	}
	c, err := e.proxyClient(proxy.addr())
	if err != nil {
		proxy.close()
		return proxied{}, fmt.Errorf("a client through the proxy to %s (WithClientOption gives it credentials and TLS): %w", addr, err)
	}
	px := proxied{faultProxy: proxy, c: c, l: e.newLimiter(c)}
	if warm {
		if _, err := px.l.AllowOrdered(ctx, req(prefix+"warm", hourly3), nil); err != nil {
			px.close()
			return proxied{}, err
		}
	}
	return px, nil
}

// quiet reports whether the server's command counters move only with the
// suite's own commands, so they can be compared exactly, and the server
// reports them.
func (e *env) quiet() bool { return e.owned && e.counts }

// serverTime returns TIME, in µs, of the node that holds key.
func (e *env) serverTime(ctx context.Context, key string) (int64, error) {
	n, _, err := e.node(ctx, key)
	if err != nil {
		return 0, err
	}
	t, err := n.Do(ctx, n.B().Time().Build()).AsIntSlice()
	if err != nil || len(t) != 2 {
		return 0, fmt.Errorf("TIME: %v %v", t, err)
	}
	return t[0]*1_000_000 + t[1], nil
}

// stats returns INFO commandstats of the node that holds key, by
// lower-case command name, on a quiet server; nil otherwise.
func (e *env) stats(ctx context.Context, key string) (serverinfo.Stats, error) {
	if !e.quiet() {
		return nil, nil
	}
	n, _, err := e.node(ctx, key)
	if err != nil {
		return nil, err
	}
	return serverinfo.CommandStats(ctx, n)
}

// snapshot is a key's state byte for byte: its DUMP payload (or, on a
// server that does not dump hashes, its type and contents) and its absolute
// expiry (PEXPIRETIME, which does not tick down as PTTL does).
type snapshot struct {
	exists   bool
	how      string // "DUMP", or "contents"
	state    string
	expireAt int64 // ms since the epoch; -1 without expiry
}

func (s snapshot) String() string {
	if !s.exists {
		return "absent"
	}
	return fmt.Sprintf("%s %q PEXPIRETIME %d", s.how, s.state, s.expireAt)
}

func (e *env) snap(ctx context.Context, key string) (snapshot, error) {
	a := e.admin
	s := snapshot{exists: true, how: "DUMP"}
	if e.dumpHashes {
		dump, err := a.Do(ctx, a.B().Dump().Key(key).Build()).ToString()
		if valkey.IsValkeyNil(err) {
			return snapshot{}, nil
		}
		if err != nil {
			return snapshot{}, fmt.Errorf("DUMP %s: %w", key, err)
		}
		s.state = dump
	} else {
		state, err := e.contents(ctx, key)
		if err != nil || state == "" {
			return snapshot{}, err
		}
		s.how, s.state = "contents", state
	}
	at, err := a.Do(ctx, a.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		return snapshot{}, fmt.Errorf("PEXPIRETIME %s: %w", key, err)
	}
	s.expireAt = at
	return s, nil
}

// contents returns key's type and every byte it holds, for the types the
// suite writes (hash, string, list, zset), or "" when key is absent: what a
// snapshot compares where the server does not DUMP hashes.
func (e *env) contents(ctx context.Context, key string) (string, error) {
	a := e.admin
	typ, err := a.Do(ctx, a.B().Type().Key(key).Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("TYPE %s: %w", key, err)
	}
	switch typ {
	case "none":
		return "", nil
	case "hash":
		m, err := a.Do(ctx, a.B().Hgetall().Key(key).Build()).AsStrMap()
		if err != nil {
			return "", fmt.Errorf("HGETALL %s: %w", key, err)
		}
		var b strings.Builder
		b.WriteString("hash")
		for _, f := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, " %q=%q", f, m[f])
		}
		return b.String(), nil
	case "string":
		v, err := a.Do(ctx, a.B().Get().Key(key).Build()).ToString()
		if err != nil {
			return "", fmt.Errorf("GET %s: %w", key, err)
		}
		return fmt.Sprintf("string %q", v), nil
	case "zset":
		v, err := a.Do(ctx, a.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			return "", fmt.Errorf("ZRANGE %s: %w", key, err)
		}
		return fmt.Sprintf("zset %v", v), nil
	case "list":
		v, err := a.Do(ctx, a.B().Lrange().Key(key).Start(0).Stop(-1).Build()).AsStrSlice()
		if err != nil {
			return "", fmt.Errorf("LRANGE %s: %w", key, err)
		}
		return fmt.Sprintf("list %q", v), nil
	}
	return "", fmt.Errorf("%s holds a %s, which the suite cannot compare on a server that does not DUMP hashes", key, typ)
}

// bucketObs is a stored bucket as the server holds it.
type bucketObs struct {
	exists   bool
	fields   map[string]string
	expireAt int64
}

func (e *env) readBucket(ctx context.Context, key string) (bucketObs, error) {
	a := e.admin
	m, err := a.Do(ctx, a.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return bucketObs{}, fmt.Errorf("HGETALL %s: %w", key, err)
	}
	if len(m) == 0 {
		return bucketObs{}, nil
	}
	at, err := a.Do(ctx, a.B().Pexpiretime().Key(key).Build()).AsInt64()
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

// tokensLeft returns a bucket's stored tokens, checking the key schema.
func (e *env) tokensLeft(ctx context.Context, key string) (int64, error) {
	obs, err := e.readBucket(ctx, key)
	if err != nil {
		return 0, err
	}
	tk, _, err := obs.parse()
	return tk, err
}

// seed stores a bucket as given, with an expiry that the script never sets
// (hours past any TTL it writes), so any refresh of the expiry shows.
func (e *env) seed(ctx context.Context, key string, st model.State, nowMicros int64) error {
	a := e.admin
	cmds := valkey.Commands{
		a.B().Del().Key(key).Build(),
		a.B().Hset().Key(key).FieldValue().FieldValue("tokens", strconv.FormatInt(st.Tokens, 10)).FieldValue("ts", strconv.FormatInt(st.TS, 10)).Build(),
		a.B().Pexpireat().Key(key).MillisecondsTimestamp(nowMicros/1000 + 7777*time.Hour.Milliseconds()).Build(),
	}
	for _, r := range a.DoMulti(ctx, cmds...) {
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

// seedKeys reads the server's TIME, seeds each key of seeds relative to it
// and deletes every other key of keys. It returns the model's states.
func (e *env) seedKeys(ctx context.Context, keys []string, seeds map[string]seedAt) (map[string]model.State, error) {
	t0, err := e.serverTime(ctx, keys[0])
	if err != nil {
		return nil, err
	}
	states := map[string]model.State{}
	for _, k := range keys {
		if s, ok := seeds[k]; ok {
			states[k] = model.State{Tokens: s.tokens, TS: t0 + s.tsOffset}
			if err := e.seed(ctx, k, states[k], t0); err != nil {
				return nil, err
			}
		} else if err := e.admin.Do(ctx, e.admin.B().Del().Key(k).Build()).Error(); err != nil {
			return nil, err
		}
	}
	return states, nil
}

// keysOf returns the keys of a call.
func keysOf(first admit.Request, second *admit.Request) []string {
	if second == nil {
		return []string{first.Key}
	}
	return []string{first.Key, second.Key}
}

// decideAndCompare seeds buckets (seedKeys) and compares one decision with
// the model (compareDecision).
func (e *env) decideAndCompare(ctx context.Context, l *admit.Limiter, first admit.Request, second *admit.Request, seeds map[string]seedAt) (admit.Decision, error) {
	states, err := e.seedKeys(ctx, keysOf(first, second), seeds)
	if err != nil {
		return admit.Decision{}, err
	}
	return e.compareDecision(ctx, l, first, second, states)
}

// compareDecision reads the server's TIME, makes one decision with l on
// buckets that hold states, reads TIME again, and compares everything with
// the model at both ends of that window: the decision, RetryAfter, the
// fields and expiry of every bucket the model writes, and, byte for byte,
// every key it does not write. Fields that depend on the exact instant (a
// fresh ts, an expiry) must lie between the two ends; all else must be
// equal.
func (e *env) compareDecision(ctx context.Context, l *admit.Limiter, first admit.Request, second *admit.Request, states map[string]model.State) (admit.Decision, error) {
	return e.compareCall(ctx, l, false, first, second, states)
}

// compareCall is compareDecision for AllowOrdered (all false) or AllowAll
// (all true), each against its own model.
func (e *env) compareCall(ctx context.Context, l *admit.Limiter, all bool, first admit.Request, second *admit.Request, states map[string]model.State) (admit.Decision, error) {
	call, decide, name := l.AllowOrdered, model.Decide, "AllowOrdered"
	if all {
		call, decide, name = l.AllowAll, model.DecideAll, "AllowAll"
	}
	keys := keysOf(first, second)
	var err error
	before := map[string]snapshot{}
	for _, k := range keys {
		if before[k], err = e.snap(ctx, k); err != nil {
			return admit.Decision{}, err
		}
	}
	tBefore, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return admit.Decision{}, err
	}
	d, callErr := call(ctx, first, second)
	tAfter, err := e.serverTime(ctx, first.Key)
	if err != nil {
		return admit.Decision{}, err
	}
	if callErr != nil {
		return d, fmt.Errorf("%s: %w", name, callErr)
	}
	dLo, wLo := decide(tBefore, states, first, second)
	dHi, wHi := decide(tAfter, states, first, second)
	if dLo.Denied != dHi.Denied || len(wLo) != len(wHi) {
		return d, fmt.Errorf("inconclusive: the model's decision changes within the server window of %dµs", tAfter-tBefore)
	}
	var errs []error
	if d.Denied != dLo.Denied || d.Allowed() != (dLo.Denied == 0) || !between(dLo.RetryAfter.Microseconds(), dHi.RetryAfter.Microseconds(), d.RetryAfter.Microseconds()) {
		errs = append(errs, fmt.Errorf("decision %v, want Denied %d (RetryAfter %v..%v by the server clock)", d, dLo.Denied, dLo.RetryAfter, dHi.RetryAfter))
	}
	for i := range d.Remaining {
		if lo, hi := dLo.Remaining[i], dHi.Remaining[i]; !between(int64(lo), int64(hi), int64(d.Remaining[i])) {
			errs = append(errs, fmt.Errorf("Remaining[%d] = %d, want %d..%d (-1 for a bucket not evaluated)", i, d.Remaining[i], lo, hi))
		}
	}
	if err := remainingBetween(d, dLo, dHi); err != nil {
		errs = append(errs, err)
	}
	diffs, err := e.compareWrites(ctx, keys, before, wLo, wHi, tAfter-tBefore)
	if err != nil {
		return d, err
	}
	errs = append(errs, diffs...)
	return d, errors.Join(errs...)
}

// compareWrites compares every key with the model's writes at both ends of
// a server window of window µs (wLo, wHi): the fields and expiry of every
// bucket the model writes; a denied bucket's fields byte for byte, its
// expiry only ever lengthened; and, byte for byte, every key it does not
// write (before is each key as it was before the call). It returns what
// differs, and an error when it cannot tell.
func (e *env) compareWrites(ctx context.Context, keys []string, before map[string]snapshot, wLo, wHi map[string]model.Write, window int64) ([]error, error) {
	var diffs []error
	for _, k := range keys {
		lo, written := wLo[k]
		if !written {
			after, err := e.snap(ctx, k)
			if err != nil {
				return nil, err
			}
			if after != before[k] {
				diffs = append(diffs, fmt.Errorf("%s must not change: before %v, after %v", e.short(k), before[k], after))
			}
			continue
		}
		hi := wHi[k]
		if lo.Keep != hi.Keep {
			return nil, fmt.Errorf("inconclusive: the model's write of %s changes within the server window of %dµs", e.short(k), window)
		}
		if lo.Keep {
			// A denial: the fields byte for byte as before; the expiry
			// only ever lengthened, to at least the time to full.
			after, err := e.snap(ctx, k)
			if err != nil {
				return nil, err
			}
			minLo, minHi := min(lo.ExpireAtMs, hi.ExpireAtMs), max(lo.ExpireAtMs, hi.ExpireAtMs)
			switch {
			case !before[k].exists || !after.exists:
				// An absent bucket is a full one: a denial's PEXPIREAT GT
				// must not create it, nor remove a present one.
				if after != before[k] {
					diffs = append(diffs, fmt.Errorf("%s was denied and must not change: before %v, after %v", e.short(k), before[k], after))
				}
			case after.state != before[k].state:
				diffs = append(diffs, fmt.Errorf("%s was denied and must keep its fields: before %v, after %v", e.short(k), before[k], after))
			case (before[k].expireAt == -1 || before[k].expireAt >= minHi) && after.expireAt != before[k].expireAt:
				diffs = append(diffs, fmt.Errorf("%s: PEXPIRETIME %d changed to %d; a denial never shortens an expiry that outlives the refill (%d..%d)", e.short(k), before[k].expireAt, after.expireAt, minLo, minHi))
			case before[k].expireAt < minLo && !between(minLo, minHi, after.expireAt):
				diffs = append(diffs, fmt.Errorf("%s: PEXPIRETIME %d, want it lengthened to the time to full: %d..%d", e.short(k), after.expireAt, minLo, minHi))
			}
			continue
		}
		obs, err := e.readBucket(ctx, k)
		if err != nil {
			return nil, err
		}
		tk, ts, err := obs.parse()
		if err != nil {
			diffs = append(diffs, fmt.Errorf("%s: %v", e.short(k), err))
			continue
		}
		// The expiry the model gives at each end of the window.
		expLo := min(lo.ExpireAtMs, hi.ExpireAtMs)
		expHi := max(lo.ExpireAtMs, hi.ExpireAtMs)
		if !between(lo.Tokens, hi.Tokens, tk) || !between(lo.TS, hi.TS, ts) || !between(expLo, expHi, obs.expireAt) {
			diffs = append(diffs, fmt.Errorf("%s = tokens %d ts %d PEXPIRETIME %d; want tokens %d..%d ts %d..%d PEXPIRETIME %d..%d",
				e.short(k), tk, ts, obs.expireAt, lo.Tokens, hi.Tokens, lo.TS, hi.TS, expLo, expHi))
		}
	}
	return diffs, nil
}

func between(a, b, x int64) bool {
	return min(a, b) <= x && x <= max(a, b)
}

// req is a Request for key with spec.
func req(key string, spec admit.Spec) admit.Request { return admit.Request{Key: key, Spec: spec} }
