package admit

import (
	"errors"

	"github.com/admitkit/admit/internal/deciderhook"
)

// The edges (package edge) refuse, when they are built, a Limiter that
// could decide nothing, without sending anything.
func init() {
	deciderhook.Check = func(d any) error {
		if l, ok := d.(*Limiter); ok && (l == nil || l.client == nil) {
			return errors.New("the admit.Limiter has no client; build it with admit.New(client) and a non-nil valkey.Client")
		}
		return nil
	}
}
