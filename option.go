package admit

// An Option configures a Limiter; pass Options to [New].
type Option interface{ apply(*Limiter) }

type optionFunc func(*Limiter)

func (f optionFunc) apply(l *Limiter) { f(l) }

// WithDenialCache has the Limiter keep up to size first-bucket denials and
// refuse the same key, Spec and Cost locally until their RetryAfter has
// passed. It never admits. size < 1, the default, is off (docs/overload.md).
func WithDenialCache(size int) Option {
	return optionFunc(func(l *Limiter) {
		if size > 0 {
			l.denials = newDenialCache(size)
		}
	})
}

// WithoutACLPrecheck runs the script without its ACL precheck. Use it only if
// the ACL user may write every key admit writes: otherwise a write refused
// after a call's first fails it as [ErrOutcomeUnknown], the first write kept
// (docs/acl.md).
func WithoutACLPrecheck() Option {
	return optionFunc(func(l *Limiter) {
		l.script, l.source = scripts().unchecked, withoutACLPrecheck(scriptSource)
	})
}
