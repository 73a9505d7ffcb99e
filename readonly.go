package admit

import "strings"

// readOnlyTimeRefused is what miniredis answers when a read-only script
// calls TIME, which it does not count as a read-only command. Real
// servers run TIME in read-only scripts.
const readOnlyTimeRefused = "Write commands are not allowed in read-only scripts"

// readOnlyRefused reports whether err, the error of a Peek's read-only
// script, is a server that refused TIME there (miniredis, the embedded
// server of unit tests). Nothing ran then, since TIME is the script's
// first command: the peek runs again through the read-write script, in the
// same read-only mode, which writes nothing, and from then on the Limiter
// sends its peeks there.
func (l *Limiter) readOnlyRefused(err error) bool {
	if !strings.Contains(err.Error(), readOnlyTimeRefused) {
		return false
	}
	l.peekRW.Store(true)
	return true
}
