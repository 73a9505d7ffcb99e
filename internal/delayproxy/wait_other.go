//go:build !linux

package delayproxy

import (
	"runtime"
	"time"
)

// spinWindow is how long before a chunk is due the writer stops sleeping
// and yields in a loop instead: Go timers can wake a millisecond or more
// late.
const spinWindow = 2 * time.Millisecond

// preciseThread does nothing outside Linux: there is no timer slack to set.
func preciseThread() (restore func()) { return func() {} }

// waitUntil returns at due, never before: time.Sleep covers all but the
// last spinWindow, then the goroutine yields in a loop until due.
func waitUntil(due time.Time) {
	if d := time.Until(due); d > spinWindow {
		time.Sleep(d - spinWindow)
	}
	for time.Now().Before(due) {
		runtime.Gosched()
	}
}
