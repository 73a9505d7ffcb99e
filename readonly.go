package admit

import (
	"context"
	"strings"
)

// readOnlyTimeRefused is what miniredis answers when a read-only script
// calls TIME, which it does not count as a read-only command. Real
// servers run TIME in read-only scripts.
const readOnlyTimeRefused = "Write commands are not allowed in read-only scripts"

// peekReadWrite is Peek's way around a server that refused TIME in its
// read-only script with err (miniredis, the embedded server of unit
// tests): nothing ran, since TIME is the script's first command, so the
// peek runs again through the read-write script, in the same read-only
// mode, which writes nothing; the Limiter goes straight there afterwards.
// Any other err is returned as it is.
func (l *Limiter) peekReadWrite(ctx context.Context, c *call, err error) (Decision, error) {
	if !strings.Contains(err.Error(), readOnlyTimeRefused) {
		return Decision{}, err
	}
	l.peekRW.Store(true)
	return decode(execScript(ctx, l.script, l.client, c.keys(), c.args()), c.buckets)
}
