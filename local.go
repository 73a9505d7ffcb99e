package admit

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"sync"
	"time"
)

// A Decider decides ordered admissions against one or two token buckets:
// [Limiter] on Valkey, shared by every process; [Local] in one process; and
// [Degraded], a Local at a fraction of every Spec, for store outages.
type Decider interface {
	// AllowOrdered takes first's Cost and, only when first admits,
	// second's: a second-bucket denial (Denied 2) leaves first charged.
	AllowOrdered(ctx context.Context, first Request, second *Request) (Decision, error)
	// AllowAll is AllowOrdered, all or nothing: a second-bucket denial
	// charges neither bucket.
	AllowAll(ctx context.Context, first Request, second *Request) (Decision, error)
	// Peek returns what AllowOrdered would decide now, and takes nothing.
	Peek(ctx context.Context, first Request, second *Request) (Decision, error)
	// Refund gives each Request's Cost back, capped at its burst.
	Refund(ctx context.Context, first Request, second *Request) error
}

var (
	_ Decider = (*Limiter)(nil)
	_ Decider = (*Local)(nil)
	_ Decider = (*Degraded)(nil)
)

// localEvictSample is how many buckets, from the least recently used, an
// insertion into a full Local looks at to choose the one it evicts.
const localEvictSample = 8

// A Local decides ordered admissions in one process, with no store: the
// same Specs, Requests and decisions as [Limiter], in the same integer
// arithmetic. It holds at most maxKeys buckets, evicting those that lose
// nothing first (docs/local.md), and is safe for concurrent use.
type Local struct {
	mu      sync.Mutex
	now     func() int64 // µs since the epoch
	max     int
	index   map[string]int32
	slots   []localBucket
	head    int32 // most recently used; -1 when empty
	tail    int32 // least recently used; -1 when empty
	onEvict func(key string, full bool)
}

// A localBucket is one key's state: its hash fields as the script stores
// them, the Spec it was last decided with, and its place in the
// least-recently-used list.
type localBucket struct {
	key        string
	tokens, ts int64
	per, burst int64 // of the Spec last decided with: when the bucket is full
	prev, next int32 // towards head, towards tail; -1 at the ends
}

// A LocalOption configures a Local or a Degraded. It is not an [Option],
// so that an option that means nothing to one kind does not compile there.
type LocalOption interface{ applyLocal(*Local) }

type localOptionFunc func(*Local)

func (f localOptionFunc) applyLocal(l *Local) { f(l) }

// WithLocalClock has a Local read the time from now instead of the
// monotonic clock, for tests and simulations (docs/local.md).
func WithLocalClock(now func() time.Time) LocalOption {
	return localOptionFunc(func(l *Local) {
		if now != nil {
			l.now = func() int64 { return now().UnixMicro() }
		}
	})
}

// WithEvictFunc has a Local call f with each key it evicts, and whether
// its bucket was full (an eviction that loses nothing); a steady count of
// non-full evictions says maxKeys is too small (docs/local.md).
func WithEvictFunc(f func(key string, full bool)) LocalOption {
	return localOptionFunc(func(l *Local) { l.onEvict = f })
}

// NewLocal returns an empty Local that holds at most maxKeys buckets
// (2 to math.MaxInt32), configured by opts.
func NewLocal(maxKeys int, opts ...LocalOption) (*Local, error) {
	if maxKeys < 2 || maxKeys > math.MaxInt32 {
		return nil, fmt.Errorf("admit: NewLocal: maxKeys %d must be at least 2 (both buckets of a call are held at once) "+
			"and at most %d; size it to the keys in use, such as 100000", maxKeys, math.MaxInt32)
	}
	start := time.Now()
	base := start.UnixMicro()
	l := &Local{
		now:   func() int64 { return base + time.Since(start).Microseconds() }, // monotonic
		max:   maxKeys,
		index: make(map[string]int32, min(maxKeys, 1024)),
		head:  -1,
		tail:  -1,
	}
	for _, o := range opts {
		if o != nil {
			o.applyLocal(l)
		}
	}
	return l, nil
}

// Len returns the number of buckets the Local holds, at most its maxKeys.
func (l *Local) Len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.index)
}

// Local call modes.
const (
	localOrdered = iota // AllowOrdered: a second-bucket denial charges first
	localAll            // AllowAll: a second-bucket denial charges nothing
	localPeek           // Peek: decides as localOrdered, writes nothing
	localRefund         // Refund
)

// AllowOrdered decides as [Limiter.AllowOrdered] does, in this process.
// Its only errors are [ErrInvalidRequest] and a context already done.
func (l *Local) AllowOrdered(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.call(ctx, localOrdered, first, second)
}

// AllowAll decides as [Limiter.AllowAll] does, in this process.
func (l *Local) AllowAll(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.call(ctx, localAll, first, second)
}

// Peek returns what AllowOrdered would decide now, and changes nothing.
func (l *Local) Peek(ctx context.Context, first Request, second *Request) (Decision, error) {
	return l.call(ctx, localPeek, first, second)
}

// Refund gives each Request's Cost back, capped at its burst, as
// [Limiter.Refund] does. Refund only what was charged.
func (l *Local) Refund(ctx context.Context, first Request, second *Request) error {
	_, err := l.call(ctx, localRefund, first, second)
	return err
}

// check refuses bad input as Limiter.check does, with the same errors.
func (l *Local) check(ctx context.Context, first Request, second *Request) error {
	switch {
	case l == nil || l.index == nil:
		return invalidRequest("the Local is nil or zero; build it with admit.NewLocal")
	case ctx == nil:
		return invalidRequest("nil context")
	}
	if err := checkBuckets(first, second, false); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return notDecided(err)
	}
	return nil
}

// A localRead is one bucket as a call found it: refilled to now.
type localRead struct {
	slot   int32 // -1: the Local does not hold the key (a full bucket)
	tk, ts int64
	pulled bool // ts was in the future by more than a refill: store it pulled back
	per    int64
	burst  int64
	cost   int64
}

// read returns r's bucket refilled to now, and its cost.
func (l *Local) read(now int64, r Request) localRead {
	b := localRead{slot: -1, per: r.Spec.interval.Microseconds(), burst: int64(r.Spec.burst), cost: int64(r.cost())}
	i, ok := l.index[r.Key]
	if !ok {
		b.tk, b.ts = b.burst, now // a new bucket is full
		return b
	}
	b.slot = i
	s := &l.slots[i]
	b.tk, b.ts, b.pulled = localRefill(now, b.per, b.burst, s.tokens, s.ts)
	return b
}

// localRefill credits the whole tokens earned from ts to now, keeping the
// part of a token earned in ts, as the script does. A ts beyond now plus
// one full refill less a token (a clock that stepped back) is pulled back
// to it, so that the freeze never outlasts one refill; a clock behind ts
// earns nothing.
func localRefill(now, per, burst, tk, ts int64) (int64, int64, bool) {
	pulled := false
	if tk > burst { // a smaller burst caps old state
		tk = burst
	}
	if latest := now + (burst-1)*per; ts > latest {
		ts, pulled = latest, true
	}
	if now > ts {
		gained := (now - ts) / per
		if tk+gained >= burst {
			return burst, now, pulled
		}
		tk, ts = tk+gained, ts+gained*per
	}
	return tk, ts, pulled
}

// wait is the time until a bucket holds its cost.
func (b localRead) wait(now int64) time.Duration {
	return time.Duration(b.ts+(b.cost-b.tk)*b.per-now) * time.Microsecond
}

// An eviction to report after the lock is released.
type localEviction struct {
	key  string
	full bool
}

func (l *Local) call(ctx context.Context, mode int, first Request, second *Request) (Decision, error) {
	if err := l.check(ctx, first, second); err != nil {
		return Decision{}, err
	}
	var ev [2]localEviction
	nev := 0
	l.mu.Lock()
	now := l.now()
	b1 := l.read(now, first)
	var b2 localRead
	if second != nil {
		b2 = l.read(now, *second)
	}
	d := Decision{Remaining: [2]int{-1, -1}, decided: true}
	// Each bucket's write: store its tokens and ts, or keep it (a denial:
	// only a ts pulled back from the future is stored).
	const none, keep, store = 0, 1, 2
	how1, how2 := none, none
	switch {
	case mode == localRefund:
		if b1.slot >= 0 {
			b1.tk, how1 = min(b1.burst, b1.tk+b1.cost), store
		}
		if second != nil && b2.slot >= 0 {
			b2.tk, how2 = min(b2.burst, b2.tk+b2.cost), store
		}
		d.Remaining = [2]int{int(b1.tk), -1}
		if second != nil {
			d.Remaining[1] = int(b2.tk)
		}
	case b1.tk < b1.cost:
		d.Denied, d.RetryAfter, d.Remaining[0] = 1, b1.wait(now), int(b1.tk)
		how1 = keep
	case second != nil && b2.tk < b2.cost:
		d.Denied, d.RetryAfter = 2, b2.wait(now)
		if mode == localAll {
			how1 = keep
		} else {
			b1.tk, how1 = b1.tk-b1.cost, store
		}
		how2 = keep
		d.Remaining = [2]int{int(b1.tk), int(b2.tk)}
	default:
		b1.tk, how1 = b1.tk-b1.cost, store
		d.Remaining[0] = int(b1.tk)
		if second != nil {
			b2.tk, how2 = b2.tk-b2.cost, store
			d.Remaining[1] = int(b2.tk)
		}
	}
	if mode != localPeek {
		protect := "" // the other key of the call: never evicted by its write
		if second != nil {
			protect = second.Key
		}
		if how1 == store || (how1 == keep && b1.pulled) {
			// a denied bucket the Local does not hold is full: pulled is false
			if e, ok := l.write(now, first.Key, b1, protect); ok {
				ev[nev], nev = e, nev+1
			}
		} else if how1 == keep && b1.slot >= 0 {
			l.touch(b1.slot)
		}
		if second != nil {
			if how2 == store || (how2 == keep && b2.pulled) {
				if e, ok := l.write(now, second.Key, b2, first.Key); ok {
					ev[nev], nev = e, nev+1
				}
			} else if how2 == keep && b2.slot >= 0 {
				l.touch(b2.slot)
			}
		}
	}
	l.mu.Unlock()
	if l.onEvict != nil {
		for _, e := range ev[:nev] {
			l.onEvict(e.key, e.full)
		}
	}
	return d, nil
}

// write stores b's tokens and ts at key, inserting the bucket (and evicting
// another, never protect) when the Local does not hold it, and makes it the
// most recently used.
func (l *Local) write(now int64, key string, b localRead, protect string) (localEviction, bool) {
	var ev localEviction
	evicted := false
	i := b.slot
	if i < 0 {
		if len(l.index) < l.max {
			l.slots = append(l.slots, localBucket{prev: -1, next: -1})
			i = int32(len(l.slots) - 1)
		} else {
			i = l.victim(now, protect)
			ev = localEviction{key: l.slots[i].key, full: l.full(now, i)}
			evicted = true
			delete(l.index, l.slots[i].key)
			l.unlink(i)
		}
		l.slots[i].key = key
		l.index[key] = i
		l.pushFront(i)
	} else {
		l.touch(i)
	}
	s := &l.slots[i]
	s.tokens, s.ts, s.per, s.burst = b.tk, b.ts, b.per, b.burst
	return ev, evicted
}

// full reports whether bucket i, under the Spec it was last decided with,
// has refilled to full at now: its state then decides as no state does.
func (l *Local) full(now int64, i int32) bool {
	s := &l.slots[i]
	tk, ts, _ := localRefill(now, s.per, s.burst, s.tokens, s.ts)
	return tk == s.burst && ts == now
}

// victim chooses the bucket to evict: among the localEvictSample least
// recently used buckets other than protect's, the first that is full, or
// else the one that misses the fewest tokens.
func (l *Local) victim(now int64, protect string) int32 {
	best, bestMissing := int32(-1), int64(math.MaxInt64)
	seen := 0
	for i := l.tail; i >= 0 && seen < localEvictSample; i = l.slots[i].prev {
		s := &l.slots[i]
		if s.key == protect {
			continue
		}
		seen++
		tk, ts, _ := localRefill(now, s.per, s.burst, s.tokens, s.ts)
		if tk == s.burst && ts == now {
			return i
		}
		if missing := s.burst - tk; missing < bestMissing {
			best, bestMissing = i, missing
		}
	}
	return best // maxKeys >= 2: some bucket other than protect's exists
}

func (l *Local) touch(i int32) {
	if l.head == i {
		return
	}
	l.unlink(i)
	l.pushFront(i)
}

func (l *Local) unlink(i int32) {
	s := &l.slots[i]
	if s.prev >= 0 {
		l.slots[s.prev].next = s.next
	} else {
		l.head = s.next
	}
	if s.next >= 0 {
		l.slots[s.next].prev = s.prev
	} else {
		l.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

func (l *Local) pushFront(i int32) {
	s := &l.slots[i]
	s.prev, s.next = -1, l.head
	if l.head >= 0 {
		l.slots[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// Scale returns s at fraction (above 0, at most 1) of its rate and burst,
// never faster than asked, with a burst of at least 1 ([Degraded]). It
// returns an error wrapping [ErrInvalidSpec] for another fraction or the
// zero Spec (docs/local.md).
func (s Spec) Scale(fraction float64) (Spec, error) {
	switch {
	case s.IsZero():
		return Spec{}, fmt.Errorf("%w: Scale of the zero Spec; build one with admit.NewSpec", ErrInvalidSpec)
	case math.IsNaN(fraction) || fraction <= 0 || fraction > 1:
		return Spec{}, fmt.Errorf("%w: fraction %v must be above 0 and at most 1, such as 0.25 for a quarter of every Spec", ErrInvalidSpec, fraction)
	}
	// Exact rational arithmetic: fraction is a binary fraction, exactly.
	f := new(big.Rat).SetFloat64(fraction)
	per := new(big.Rat).SetInt64(s.interval.Microseconds())
	per.Quo(per, f)
	q, r := new(big.Int).QuoRem(per.Num(), per.Denom(), new(big.Int)) // positive: the quotient is the floor
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1)) // ceil: never faster than fraction × rate
	}
	burst := new(big.Rat).SetInt64(int64(s.burst))
	burst.Mul(burst, f)
	b := new(big.Int).Quo(burst.Num(), burst.Denom()) // floor
	if b.Sign() == 0 {
		b.SetInt64(1)
	}
	if !q.IsInt64() || q.Int64() > maxRefillMicros || q.Int64()*b.Int64() > maxRefillMicros {
		return Spec{}, fmt.Errorf("%w: %v scaled by %v would take longer than %v to refill from empty",
			ErrInvalidSpec, s, fraction, time.Duration(maxRefillMicros)*time.Microsecond)
	}
	// Every(d) of a whole number of microseconds is exact in NewSpec.
	return NewSpec(Every(time.Duration(q.Int64())*time.Microsecond), int(b.Int64()))
}

// degradedSpecs bounds the Specs a Degraded keeps scaled; beyond it, a
// Spec is scaled on each call (which allocates).
const degradedSpecs = 1024

// A Degraded is a [Local] that decides every Request at a fraction of its
// Spec ([Spec.Scale]): a fleet's fallback while the store is down, where N
// processes admit at most N × fraction of what the store would
// (docs/outages.md). It is safe for concurrent use.
type Degraded struct {
	fraction float64
	local    *Local
	mu       sync.RWMutex
	scaled   map[[2]int64]Spec // by interval (µs) and burst: a Spec is those two
}

// NewDegraded returns a Degraded at fraction (above 0, at most 1) of every
// Spec, on a Local of at most maxKeys buckets that opts configure.
func NewDegraded(fraction float64, maxKeys int, opts ...LocalOption) (*Degraded, error) {
	if math.IsNaN(fraction) || fraction <= 0 || fraction > 1 {
		return nil, fmt.Errorf("admit: NewDegraded: %w: fraction %v must be above 0 and at most 1; "+
			"for a fleet of N processes, about 1/N keeps the fleet near the limit", ErrInvalidSpec, fraction)
	}
	l, err := NewLocal(maxKeys, opts...)
	if err != nil {
		return nil, err
	}
	return &Degraded{fraction: fraction, local: l, scaled: map[[2]int64]Spec{}}, nil
}

// Fraction returns the fraction of every Spec the Degraded decides with.
func (g *Degraded) Fraction() float64 { return g.fraction }

// Local returns the Local the Degraded decides on, with scaled Specs.
func (g *Degraded) Local() *Local { return g.local }

// Scale returns spec as the Degraded decides it ([Spec.Scale]).
func (g *Degraded) Scale(spec Spec) (Spec, error) {
	k := [2]int64{int64(spec.interval), int64(spec.burst)}
	g.mu.RLock()
	s, ok := g.scaled[k]
	g.mu.RUnlock()
	if ok {
		return s, nil
	}
	s, err := spec.Scale(g.fraction)
	if err != nil {
		return Spec{}, err
	}
	g.mu.Lock()
	if len(g.scaled) < degradedSpecs {
		g.scaled[k] = s
	}
	g.mu.Unlock()
	return s, nil
}

// scale returns the Requests with scaled Specs; second points into buf.
func (g *Degraded) scale(first Request, second *Request, buf *Request) (Request, *Request, error) {
	if g == nil || g.local == nil {
		return Request{}, nil, invalidRequest("the Degraded is nil or zero; build it with admit.NewDegraded")
	}
	one := func(which string, r Request) (Request, error) {
		if err := checkRequest(which, r); err != nil {
			return Request{}, err
		}
		s, err := g.Scale(r.Spec)
		if err != nil {
			return Request{}, invalidRequestCause(which+" request for key "+strconv.Quote(r.Key)+": its Spec cannot be scaled", err)
		}
		if r.Cost > s.burst {
			return Request{}, invalidRequest(which + " request for key " + strconv.Quote(r.Key) + " has Cost " + strconv.Itoa(r.Cost) +
				" above its degraded burst " + strconv.Itoa(s.burst) + " (burst " + strconv.Itoa(r.Spec.burst) + " scaled by " +
				strconv.FormatFloat(g.fraction, 'g', -1, 64) + "): it can never pass while degraded")
		}
		r.Spec = s
		return r, nil
	}
	f, err := one("first", first)
	if err != nil {
		return Request{}, nil, err
	}
	if second == nil {
		return f, nil, nil
	}
	*buf, err = one("second", *second)
	if err != nil {
		return Request{}, nil, err
	}
	return f, buf, nil
}

// AllowOrdered is [Local.AllowOrdered] with every Spec scaled.
func (g *Degraded) AllowOrdered(ctx context.Context, first Request, second *Request) (Decision, error) {
	var buf Request
	f, s, err := g.scale(first, second, &buf)
	if err != nil {
		return Decision{}, err
	}
	return g.local.AllowOrdered(ctx, f, s)
}

// AllowAll is [Local.AllowAll] with every Spec scaled.
func (g *Degraded) AllowAll(ctx context.Context, first Request, second *Request) (Decision, error) {
	var buf Request
	f, s, err := g.scale(first, second, &buf)
	if err != nil {
		return Decision{}, err
	}
	return g.local.AllowAll(ctx, f, s)
}

// Peek is [Local.Peek] with every Spec scaled.
func (g *Degraded) Peek(ctx context.Context, first Request, second *Request) (Decision, error) {
	var buf Request
	f, s, err := g.scale(first, second, &buf)
	if err != nil {
		return Decision{}, err
	}
	return g.local.Peek(ctx, f, s)
}

// Refund is [Local.Refund] with every Spec scaled: give back only what a
// call of this Degraded charged.
func (g *Degraded) Refund(ctx context.Context, first Request, second *Request) error {
	var buf Request
	f, s, err := g.scale(first, second, &buf)
	if err != nil {
		return err
	}
	return g.local.Refund(ctx, f, s)
}
