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
// wake late). The goroutine never unlocks: when it exits, the runtime ends
// the thread instead of reusing it with the changed slack.
func preciseThread() {
	runtime.LockOSThread()
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerslack, 1, 0)
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
