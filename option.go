package admit

// An Option configures a Limiter; pass Options to [New].
type Option interface{ apply(*Limiter) }

type optionFunc func(*Limiter)

func (f optionFunc) apply(l *Limiter) { f(l) }

// WithDenialCache has the Limiter remember up to size first-bucket denials
// and refuse the same first key, Spec and Cost locally, with no round trip,
// until the denial's RetryAfter has passed. It never admits. size < 1 leaves
// it off, the default (docs/overload.md).
func WithDenialCache(size int) Option {
	return optionFunc(func(l *Limiter) {
		if size > 0 {
			l.denials = newDenialCache(size)
		}
	})
}

// WithoutACLPrecheck runs a copy of the script without its ACL precheck.
// Use it only when the ACL user may run every command on every key admit
// writes: otherwise a call refused a write after its first fails as
// [ErrOutcomeUnknown], and the first write stays (docs/acl.md).
func WithoutACLPrecheck() Option {
	return optionFunc(func(l *Limiter) {
		l.script, l.source = scripts().unchecked, withoutACLPrecheck(scriptSource)
	})
}
