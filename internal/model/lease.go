package model

import (
	"fmt"
	"maps"
	"time"

	"github.com/admitkit/admit"
)

// Concurrency leases, as admit's Limiter.Acquire and its Lease's Extend and
// Release document them, on the server's clock.
//
// A lease key is a set of holders: a name and the moment its lease
// expires, in µs on the server's clock. A holder is live while that moment
// is ahead of the server's clock. A holder that crashes is simply one
// that never calls again: nothing in the model distinguishes it from a
// slow one, and its slot frees when its lease expires. The model's promises:
//
//   - an Acquire is granted only while fewer than the Spec's limit holders
//     are live, so there are never more than limit live holders (for a
//     key whose limit never changed);
//   - a refused Acquire writes nothing, and says how long until the oldest
//     live lease expires;
//   - an Acquire with buckets is all or nothing: the slot, first bucket and
//     second bucket are decided in that order, and when any part refuses
//     nothing is taken (a denied bucket's expiry may be lengthened, as a
//     denial's is);
//   - an Acquire under a name that is live returns that lease, marked as
//     a replay, and takes nothing;
//   - a granted Acquire prunes every expired holder of the key;
//   - Extend renews a live lease to now + the lease duration (never
//     shortening it) and is refused, writing nothing, once it has expired;
//   - Release removes the holder and reports whether it was live; it is
//     idempotent.

// A LeaseSet is a stored lease key: its holders and when the key goes.
type LeaseSet struct {
	// Holders maps each holder's name to its lease's expiry, in µs since
	// the epoch on the server's clock (the sorted set's scores).
	Holders map[string]int64
	// ExpireAt is when the key is gone, as Bucket.ExpireAt.
	ExpireAt int64
}

// A LeaseRequest is an Acquire's concurrency part: the lease key, its Spec, and
// the holder's name (as admit sends it: a name the caller gave, or the
// random one admit drew).
type LeaseRequest struct {
	Key  string
	Spec admit.Concurrency
	Name string
}

// A LeaseOutcome is what Acquire returns, as the model predicts it.
type LeaseOutcome struct {
	Granted  bool
	Replayed bool
	// Denied names the part that refused: admit.PartConcurrency or the bucket
	// (admit.PartFirst, admit.PartSecond); 0 when granted.
	Denied     admit.Part
	RetryAfter time.Duration
	// Remaining is the buckets' tokens after the call, as
	// Decision.Remaining: -1 for a bucket not evaluated.
	Remaining [2]int
	// Holders is the number of live holders of the key after the call.
	Holders int
	// Left is the granted lease's time left on the server's clock; 0 when
	// refused.
	Left time.Duration
}

func (o LeaseOutcome) String() string {
	s := fmt.Sprintf("granted, %v left, %d holders", o.Left, o.Holders)
	if !o.Granted {
		s = fmt.Sprintf("refused by %v, retry after %dµs, %d holders", o.Denied, o.RetryAfter.Microseconds(), o.Holders)
	}
	s += fmt.Sprintf(", remaining %d %d", o.Remaining[0], o.Remaining[1])
	if o.Replayed {
		s += ", replayed"
	}
	return s
}

// LeaseServer is Server with lease keys. Its Advance and SetNow move the
// lease keys' clock too; use them, not the embedded Server's.
type LeaseServer struct {
	*Server
	Sets map[string]LeaseSet
}

// NewLeaseServer returns an empty server whose clock reads now.
func NewLeaseServer(now int64, expiry Expiry) *LeaseServer {
	return &LeaseServer{Server: NewServer(now, expiry), Sets: map[string]LeaseSet{}}
}

// Clone returns an independent copy of s.
func (s *LeaseServer) Clone() *LeaseServer {
	c := &LeaseServer{Server: s.Server.Clone(), Sets: make(map[string]LeaseSet, len(s.Sets))}
	for k, v := range s.Sets {
		c.Sets[k] = LeaseSet{Holders: maps.Clone(v.Holders), ExpireAt: v.ExpireAt}
	}
	return c
}

// Advance moves the server's clock by d, which may be negative, and drops
// the keys whose time has come. On a Countdown server a clock stepped back
// leaves every key's TTL as it was, but not the holders' expiries, which
// are scores, not TTLs.
func (s *LeaseServer) Advance(d time.Duration) {
	s.Server.Advance(d)
	if us := d.Microseconds(); s.Expiry == Countdown && us < 0 {
		for k, v := range s.Sets {
			v.ExpireAt += us
			s.Sets[k] = v
		}
	}
	s.expireSets()
}

// SetNow sets the server's clock to now.
func (s *LeaseServer) SetNow(now int64) { s.Advance(time.Duration(now-s.Now) * time.Microsecond) }

func (s *LeaseServer) expireSets() {
	for k, v := range s.Sets {
		if s.Gone(v.ExpireAt) {
			delete(s.Sets, k)
		}
	}
}

// Live returns the number of live holders of key.
func (s *LeaseServer) Live(key string) int {
	n := 0
	for _, at := range s.Sets[key].Holders {
		if at > s.Now {
			n++
		}
	}
	return n
}

// ValidateLease returns the refusal admit gives an Acquire before sending
// anything (admit.ErrInvalidRequest), or nil.
func ValidateLease(slot LeaseRequest, first, second *admit.Request) error {
	switch {
	case slot.Key == "":
		return fmt.Errorf("%w: the slot has an empty Key", admit.ErrInvalidRequest)
	case len(slot.Key) > admit.MaxKeyLen:
		return fmt.Errorf("%w: the slot's Key of %d bytes", admit.ErrInvalidRequest, len(slot.Key))
	case slot.Spec.IsZero():
		return fmt.Errorf("%w: the slot has the zero Concurrency", admit.ErrInvalidRequest)
	case slot.Name == "" || len(slot.Name) > admit.MaxLeaseNameLen:
		return fmt.Errorf("%w: lease name of %d bytes", admit.ErrInvalidRequest, len(slot.Name))
	case first == nil && second != nil:
		return fmt.Errorf("%w: a second bucket without a first", admit.ErrInvalidRequest)
	}
	if first == nil {
		return nil
	}
	if err := Validate(*first, second); err != nil {
		return err
	}
	if first.Key == slot.Key || (second != nil && second.Key == slot.Key) {
		return fmt.Errorf("%w: a bucket and the slot name the same key", admit.ErrInvalidRequest)
	}
	return nil
}

// wrongTypeLease refuses a lease call whose lease key holds something that
// is not a lease key.
func (s *LeaseServer) wrongTypeLease(key string) error {
	_, foreign := s.Foreign[key]
	_, bucket := s.Buckets[key]
	if foreign || bucket {
		return fmt.Errorf("%w: lease key %q", admit.ErrWrongType, key)
	}
	return nil
}

// Acquire is admit's Limiter.Acquire, with slot.Name the name admit sends.
// first and second may be nil (a lease alone), or first alone.
func (s *LeaseServer) Acquire(slot LeaseRequest, first, second *admit.Request) (LeaseOutcome, error) {
	if err := ValidateLease(slot, first, second); err != nil {
		return LeaseOutcome{}, err
	}
	s.Server.expire()
	s.expireSets()
	// The script reads the buckets, then the lease key.
	if first != nil {
		for _, r := range []*admit.Request{first, second} {
			if r == nil {
				continue
			}
			if _, ok := s.Sets[r.Key]; ok {
				return LeaseOutcome{}, fmt.Errorf("%w: bucket key %q holds a lease key", admit.ErrWrongType, r.Key)
			}
		}
		if err := s.wrongType(*first, second); err != nil {
			return LeaseOutcome{}, err
		}
	}
	if err := s.wrongTypeLease(slot.Key); err != nil {
		return LeaseOutcome{}, err
	}
	set := s.Sets[slot.Key]
	live := s.Live(slot.Key)
	o := LeaseOutcome{Remaining: [2]int{-1, -1}, Holders: live}
	if at, ok := set.Holders[slot.Name]; ok && at > s.Now {
		o.Granted, o.Replayed, o.Left = true, true, micros(at-s.Now)
		return o, nil
	}
	if live >= slot.Spec.Limit() {
		oldest := int64(-1)
		for _, at := range set.Holders {
			if at > s.Now && (oldest < 0 || at < oldest) {
				oldest = at
			}
		}
		o.Denied, o.RetryAfter = admit.PartConcurrency, micros(oldest-s.Now)
		return o, nil
	}
	if first != nil {
		d, writes := DecideAll(s.Now, s.States(), *first, second)
		s.apply(writes)
		o.Remaining = d.Remaining
		if d.Denied != 0 {
			o.Denied, o.RetryAfter = admit.Part(d.Denied), d.RetryAfter
			return o, nil
		}
	}
	// Granted: prune every expired holder, add this one.
	holders := map[string]int64{}
	for name, at := range set.Holders {
		if at > s.Now {
			holders[name] = at
		}
	}
	exp := s.Now + slot.Spec.Lease().Microseconds()
	holders[slot.Name] = exp
	latest := exp
	for _, at := range holders {
		latest = max(latest, at)
	}
	s.Sets[slot.Key] = LeaseSet{Holders: holders, ExpireAt: (latest + 999) / 1000 * 1000}
	o.Granted, o.Holders, o.Left = true, len(holders), slot.Spec.Lease()
	return o, nil
}

// Extend is admit's Lease.Extend: a live lease of name at key is renewed
// to now + spec's lease duration, never shortened, and the key's expiry
// lengthened to match; a lease that is not live is refused (false) and
// nothing is written. It returns whether it extended, and the time left.
func (s *LeaseServer) Extend(key, name string, spec admit.Concurrency) (bool, time.Duration, error) {
	s.Server.expire()
	s.expireSets()
	if err := s.wrongTypeLease(key); err != nil {
		return false, 0, err
	}
	set, ok := s.Sets[key]
	at, held := set.Holders[name]
	if !ok || !held || at <= s.Now {
		return false, 0, nil
	}
	at = max(at, s.Now+spec.Lease().Microseconds())
	set.Holders[name] = at
	set.ExpireAt = max(set.ExpireAt, (at+999)/1000*1000)
	s.Sets[key] = set
	return true, micros(at - s.Now), nil
}

// Release is admit's Lease.Release: the holder name is removed from key
// (the key with it, when it was the last), and Release reports whether its
// lease was live. A name the key does not hold writes nothing.
func (s *LeaseServer) Release(key, name string) (bool, error) {
	s.Server.expire()
	s.expireSets()
	if err := s.wrongTypeLease(key); err != nil {
		return false, err
	}
	set, ok := s.Sets[key]
	at, held := set.Holders[name]
	if !ok || !held {
		return false, nil
	}
	delete(set.Holders, name)
	if len(set.Holders) == 0 {
		delete(s.Sets, key)
	}
	return at > s.Now, nil
}
