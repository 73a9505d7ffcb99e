package admit

// An Option configures a Limiter; pass Options to [New].
type Option interface{ apply(*Limiter) }

type optionFunc func(*Limiter)

func (f optionFunc) apply(l *Limiter) { f(l) }

// WithDenialCache has the Limiter keep up to size first-bucket denials and
// refuse the same request locally until its RetryAfter (docs/overload.md).
func WithDenialCache(size int) Option {
	return optionFunc(func(l *Limiter) {
		if size > 0 {
			l.denials = newDenialCache(size)
		}
	})
}

// WithoutACLPrecheck runs the script without its ACL precheck, for a user
// that may write every key admit writes; otherwise a refused later write
// fails a call as [ErrOutcomeUnknown] (docs/acl.md).
func WithoutACLPrecheck() Option {
	return optionFunc(func(l *Limiter) {
		l.script, l.source = scripts().unchecked, withoutACLPrecheck(scriptSource)
	})
}
