package admit_test

import (
	"context"
	"testing"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admittest"
	"github.com/valkey-io/valkey-go"
)

// TestConformanceWithoutACLPrecheck runs every conformance rule against
// Limiters built with WithoutACLPrecheck, on the deployment TestConformance
// uses, whose user may run every command: there the option changes no
// rule's verdict. (The one rule with an ACL user of its own,
// peek-read-only-user, only peeks, which the option leaves alone.)
func TestConformanceWithoutACLPrecheck(t *testing.T) {
	c, opts := openTarget(t)
	newLimiter := func(c valkey.Client) *admit.Limiter { return admit.New(c, admit.WithoutACLPrecheck()) }
	for _, r := range admittest.Rules(t, c, newLimiter, opts...) {
		t.Run(r.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), ruleTimeout)
			defer cancel()
			err := r.Run(ctx)
			if reason, ok := admittest.IsSkip(err); ok {
				t.Skip(reason)
			}
			if err != nil {
				t.Errorf("rule %s broken with WithoutACLPrecheck:\n%v", r.Name, err)
			}
		})
	}
}
