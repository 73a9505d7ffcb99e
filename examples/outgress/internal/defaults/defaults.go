// Package defaults is the rule every outgress configuration follows for a
// field left at zero: it takes the default its documentation names.
package defaults

import "time"

// Positive returns v, or def when v is zero or negative (a count or a
// duration left unset).
func Positive[T ~int | ~int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Clock returns now, or time.Now when now is nil.
func Clock(now func() time.Time) func() time.Time {
	if now == nil {
		return time.Now
	}
	return now
}
