package delayproxy

import (
	"runtime"
	"syscall"
	"time"
)

// spinWindow is how long before a chunk is due the writer stops sleeping and
// spins. With a 1ns timer slack, nanosleep on Linux wakes a few tens of
// microseconds late at worst, so most waits end in a short spin.
const spinWindow = 50 * time.Microsecond

// prSetTimerslack is PR_SET_TIMERSLACK from <linux/prctl.h>.
const prSetTimerslack = 29

// preciseThread pins the calling goroutine to its OS thread and sets that
// thread's timer slack to 1ns (the default of 50µs would make nanosleep
// wake late). It returns a function that undoes both, to be deferred.
//
// The thread must be handed back rather than left to die with a locked
// goroutine: a process started with Pdeathsig from a thread (as the test
// helpers start valkey-server) is killed when that thread exits, and the
// runtime may have forked it from any thread, this one included.
func preciseThread() (restore func()) {
	runtime.LockOSThread()
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerslack, 1, 0)
	return func() {
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerslack, 0, 0) // 0: back to the thread's default
		runtime.UnlockOSThread()
	}
}

// waitUntil returns at due, never before: nanosleep covers all but the last
// spinWindow, then a spin covers the rest. The calling thread is blocked,
// not parked, so the wait does not go through Go's millisecond-grained
// timers.
func waitUntil(due time.Time) {
	for range 1000 { // each pass sleeps or returns; EINTR only shortens a pass
		d := time.Until(due)
		if d <= spinWindow {
			break
		}
		ts := syscall.NsecToTimespec(int64(d - spinWindow))
		syscall.Nanosleep(&ts, nil)
	}
	for time.Now().Before(due) {
	}
}
