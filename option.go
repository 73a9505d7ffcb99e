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

// WithoutACLPrecheck has the Limiter's takes, refunds and
// [Limiter.AllowOrderedOnce] run a copy of the script without its ACL
// precheck; the default is to run it. Before its first write the script asks
// the server (redis.acl_check_cmd) whether the ACL user may run each later
// write of the call: PEXPIREAT on bucket 1's key, HSET and PEXPIREAT on
// bucket 2's, SET on AllowOrderedOnce's record. That is 1 check for a
// one-bucket admission, 3 for a two-bucket one, 2 for a second-bucket
// denial, none for a first-bucket denial. Skipping them saves a few
// percent of the server's work per admission (BENCHMARKS.md gives the
// figures for each server).
// [Limiter.Peek] writes nothing and is unchanged. Every other guarantee
// stays: each bucket is read and validated before the first write, and a
// user refused bucket 1's write (the first, run under pcall) gets NOPERM,
// classed [ErrNotExecuted], with nothing written.
//
// What can go wrong: for a user refused a later write, the call fails after
// its first write, which stays, with an error classed [ErrOutcomeUnknown]
// (with the precheck: NOPERM, not executed, nothing written). Refused
// PEXPIREAT, a one-bucket admission leaves its bucket charged with no
// expiry: the key never expires. Refused HSET or PEXPIREAT on bucket 2's
// key, a two-bucket admission leaves bucket 1 charged and bucket 2 unwritten
// or charged with no expiry, a second-bucket denial is an error (bucket 1
// charged, as the denial charges it), and a two-bucket refund refunds bucket
// 1 only. Refused SET on the record, AllowOrderedOnce charges the buckets
// and records nothing, so each retry with the same id charges them again. So
// use it only when the ACL user may run HSET, PEXPIREAT and SET on every key
// admit writes: the default user, a user with +@all ~*, or docs/acl.md's
// least-privilege rules on a key pattern that covers every bucket and record
// key.
func WithoutACLPrecheck() Option {
	return optionFunc(func(l *Limiter) {
		l.script = scripts().unchecked
	})
}
