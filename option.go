package admit

// An Option configures a Limiter; pass Options to [New].
type Option interface{ apply(*Limiter) }

type optionFunc func(*Limiter)

func (f optionFunc) apply(l *Limiter) { f(l) }

// WithDenialCache turns on a local denial cache of at most size keys
// (size < 1 leaves it off, the default).
//
// After the server denies a request at its first bucket with RetryAfter r,
// the Limiter denies the same first key with the same Spec and Cost
// locally, with no round trip, until r has passed on the local monotonic
// clock, counted from before the denied request was sent. It answers with
// Denied 1, the RetryAfter left, and the Remaining the server reported.
// Only denials are cached: the cache never admits anything, so it can
// never admit what the server would deny.
//
// It can under-admit, that is deny locally what the server would admit:
//   - when the local monotonic clock runs slower than the server's clock,
//     by at most that rate difference times RetryAfter;
//   - when another process refunds tokens to the bucket, or an operator
//     deletes or edits the key, before r has passed (this Limiter's own
//     [Limiter.Refund], and so [Limiter.Wait]'s, drops the entries of the
//     keys it refunds, unless a refund whose outcome is unknown runs on the
//     server only after it has returned);
//   - never because of a Spec or Cost change: a call whose Spec or Cost
//     differs from the cached one goes to the server.
//
// When the cache is full, a new key takes the place of the oldest one
// inserted (a key already cached is updated in place), and a lookup that
// meets an expired entry drops it. A lookup or an insert costs O(1), one
// mutex and one map access, however large the cache and whatever floods
// it. Use it where denials dominate: a retry storm, an abusive client, a
// flood after an upstream 429.
func WithDenialCache(size int) Option {
	return optionFunc(func(l *Limiter) {
		if size > 0 {
			l.denials = newDenialCache(size)
		}
	})
}

// WithoutACLPrecheck runs a copy of the script without its ACL precheck,
// for every call that writes (takes, refunds, AllowOrderedOnce, Acquire,
// Extend, Release). Use it only when the ACL user may run every command on
// every key admit writes: a refused later write then fails the call after
// its first write, which stays, as [ErrOutcomeUnknown] (docs/acl.md).
func WithoutACLPrecheck() Option {
	return optionFunc(func(l *Limiter) {
		l.script, l.source = scripts().unchecked, withoutACLPrecheck(scriptSource)
	})
}
