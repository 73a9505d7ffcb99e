// Package suitehook lets this module's own tests run the rules of package
// admittest one by one, against Limiters they build themselves: TestMutants
// runs every rule against Limiters whose script carries a deliberate bug, and
// needs each rule's verdict, not a failed test. Being internal, only this
// module can use it; admittest's exported API stays the one users see.
package suitehook

import (
	"context"
	"errors"
	"testing"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// Rule is one conformance rule. Run returns nil when the server and the
// Limiter obey the rule, an error wrapping a *SkipError when the rule cannot
// be checked on this deployment, and otherwise an error that says what was
// seen.
type Rule struct {
	Name string
	Run  func(ctx context.Context) error
}

// Suite is the conformance suite opened on one deployment.
type Suite interface {
	// Target describes the deployment, for example
	// "valkey 8.0.1, standalone, the suite's alone".
	Target() string
	// Rules returns every rule, in order, testing the Limiters newLimiter
	// builds on the clients the rules use.
	Rules(newLimiter func(valkey.Client) *admit.Limiter) []Rule
}

// Open opens the suite on client with admittest's options, as admittest.Run
// does; it deletes the suite's keys when t ends. Package admittest sets it
// when it is initialised.
var Open func(t *testing.T, client valkey.Client, opts ...any) Suite

// SkipError marks a rule that cannot be checked on this deployment.
type SkipError struct{ Reason string }

func (s *SkipError) Error() string { return "skipped: " + s.Reason }

// IsSkip reports whether err says the rule was skipped, and why.
func IsSkip(err error) (string, bool) {
	var s *SkipError
	if errors.As(err, &s) {
		return s.Reason, true
	}
	return "", false
}
