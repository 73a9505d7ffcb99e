//go:build !unix

package testserver

import "testing"

// Pause skips the test: it needs SIGSTOP.
func Pause(tb testing.TB, _ *Server) (resume func()) {
	tb.Skip("pausing a server needs SIGSTOP (unix)")
	return func() {}
}
