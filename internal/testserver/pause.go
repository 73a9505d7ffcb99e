//go:build unix

package testserver

import (
	"syscall"
	"testing"
)

// Pause stops the process of srv, a server this test binary started, with
// SIGSTOP: it keeps its connections and answers nothing, as a stalled
// store does. It returns the function that resumes it (SIGCONT), which
// also runs when the test ends. A server it did not start skips the test.
func Pause(tb testing.TB, srv *Server) (resume func()) {
	tb.Helper()
	if srv.cmd == nil || srv.cmd.Process == nil {
		tb.Skip("pauses a server process this test started; skipped on VALKEY_ADDR and containers")
	}
	pid := srv.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		tb.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	resume = func() { syscall.Kill(pid, syscall.SIGCONT) } //nolint:errcheck // the server may have stopped already
	tb.Cleanup(resume)
	return resume
}
