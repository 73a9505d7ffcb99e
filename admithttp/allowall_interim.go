package admithttp

import (
	"context"

	"github.com/admitkit/admit"
)

// allowAllCompat stands in for admit's all-or-nothing call until it lands:
// AllowOrdered, then a refund of the first bucket's charge when the second
// refuses.
func allowAllCompat(ctx context.Context, lim *admit.Limiter, first admit.Request, second *admit.Request) (admit.Decision, error) {
	d, err := lim.AllowOrdered(ctx, first, second)
	if err != nil || d.Denied != 2 {
		return d, err
	}
	if lim.Refund(ctx, first, nil) == nil {
		c := first.Cost
		if c == 0 {
			c = 1
		}
		d.Remaining[0] = min(d.Remaining[0]+c, first.Spec.Burst())
	}
	return d, nil
}
